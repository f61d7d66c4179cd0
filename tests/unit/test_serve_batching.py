"""What a replica of ``tfm serve`` does with a gathered batch (``serving.model_server``, without
Ray): requests of one version and one decoding share a search, and each still gets exactly the
answer it would get decoded alone, in its own order."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.stage_folders import tiny_sentences, tokenizer_folder

from serving.decode_config import DecodeConfig
from serving.model_server import Job, decode_jobs
from serving.scoring_protocol import Decoding, RequestLimits, predictions
from serving.tokenizer import load
from serving.translator import Translator
from serving.version_follower import LoadedVersion
from transformer_core import presets
from transformer_core.model import Transformer


@pytest.fixture(scope="module")
def version(tmp_path_factory) -> LoadedVersion:
    import torch

    folder = tmp_path_factory.mktemp("serve-batch")
    tokenizer = load(tokenizer_folder(folder / "tokenizer", tiny_sentences(200, seed=0), 64))
    torch.manual_seed(0)
    model = Transformer(presets.debug().replace(max_len=64), 64).eval()
    translator = Translator(model, tokenizer, DecodeConfig(beam_size=3, max_len_offset=4))
    return LoadedVersion("tiny", 1, translator, RequestLimits(), 63, Path(folder))


def job(version: LoadedVersion, texts: list[str], decoding: Decoding) -> Job:
    src = version.translator.encode(texts)
    return Job(version, decoding, src, len(src))


def same(batched: list, alone: list) -> bool:
    """The same translations; n-best scores equal but for padding's float noise."""
    if batched and isinstance(batched[0], list):
        texts = [[h["translation"] for h in hyps] for hyps in batched]
        scores = [h["score"] for hyps in batched for h in hyps]
        expected = [h["score"] for hyps in alone for h in hyps]
        return texts == [[h["translation"] for h in hyps] for hyps in alone] and scores == (
            pytest.approx(expected, abs=1e-4)
        )
    return batched == alone


def test_a_batch_answers_each_request_as_alone(version: LoadedVersion):
    own = Decoding(version.translator.decode)
    wide = Decoding(DecodeConfig(beam_size=3, max_len_offset=4, alpha=0.0), n_best=2)
    texts = tiny_sentences(9, seed=3)
    jobs = [
        job(version, texts[0:3], own),
        job(version, texts[3:4], wide),
        job(version, texts[4:8], own),
        job(version, texts[8:9], wide),
    ]
    answers = decode_jobs(jobs)
    assert [len(a.predictions) for a in answers] == [3, 1, 4, 1]
    for one, answer in zip(jobs, answers, strict=True):
        alone = predictions(version.translator, one.src_ids, one.decoding)
        assert same(answer.predictions, alone)
    # The two requests with the version's decoding shared one search of 7 sentences; the
    # n-best ones another of 2.
    assert [a.batch_sentences for a in answers] == [7, 2, 7, 2]
    assert all(isinstance(h, list) and len(h) == 2 for h in answers[1].predictions)
