"""The decoding side of ``benchmarks/peers`` (steps 4 and 5 of ``peers.run``): each generator on
the model its toolkit trained, and fairseq's model imported and decoded by ours on the same
weights; scored by one path, with the share of hypotheses identical to fairseq-generate's."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from . import eole, fairseq
from .data import CONFIG, Corpus
from .env import Peer, last_line
from .procs import guarded, ours, run
from .report import GENERATE, SAME_WEIGHTS

BEAM, DECODE_TOKENS, MAX_LEN_B = 5, 4096, 50


def decode_fairseq(peer: Peer, trained: dict, corpus: Corpus, out: Path, args) -> dict:
    cmd = fairseq.generate_command(
        peer,
        Path(trained["data_bin"]),
        Path(trained["checkpoint"]),
        BEAM,
        DECODE_TOKENS,
        MAX_LEN_B,
        languages=corpus.languages,
        remove_bpe=False,  # compared piece for piece with ours on its weights; removed in score
    )
    code, text, seconds = run(cmd, peer.env(args.threads), out / "fairseq" / "generate.log")
    if code != 0:
        return {"problem": f"fairseq-generate: exit {code}: {last_line(text)}"}
    rates = fairseq.generate_rates(text)
    return rates | {
        "wall_s": seconds,
        "hypotheses": fairseq.hypotheses(text),
        "pieces": True,
    }


def decode_eole(peer: Peer, trained: dict, corpus: Corpus, out: Path, args) -> dict:
    output = out / "eole" / "test.hyp"
    cmd = eole.predict_command(
        peer,
        Path(trained["checkpoint"]),
        corpus.text / f"test.{corpus.languages[0]}",
        output,
        BEAM,
        DECODE_TOKENS,
        args.threads,
    )
    code, text, seconds = run(cmd, peer.env(args.threads), out / "eole" / "predict.log")
    if code != 0:
        return {"problem": f"eole predict: exit {code}: {last_line(text)}"}
    hypotheses = eole.hypotheses(output)
    return eole.predict_rates(text) | {
        "sentences": len(hypotheses),
        "wall_s": seconds,
        "hypotheses": hypotheses,
        "tokenized": True,
    }


def decode_ours(engine: str, trained: dict, corpus: Corpus, out: Path, args) -> dict:
    argv = [str(corpus.workdir), trained["checkpoint"], "--engine", engine,
            "--source", str(corpus.raw_test()), "--beam", str(BEAM)]  # fmt: skip
    return ours("decode", argv, args.threads, out / "logs" / f"ours-decode-{engine}.log")


def import_fairseq(trained: dict, corpus: Corpus, out: Path) -> Path:
    """fairseq's checkpoint (``trained``: the one fairseq-generate decodes) as ``tfm import
    fairseq`` imports it: its stage ``fairseq_import`` (the run config's, without the register
    stage after it) in a work dir of its own, with fairseq-preprocess's dictionary and the BPE
    codes of the corpus' tokenizer; up to date when the checkpoint is unchanged."""
    from corpora.pretokenize import CODES_FILE
    from tasks.framework.config import load_config
    from tasks.framework.runner import run_stage

    files = {
        "fairseq.checkpoint": trained["checkpoint"],
        "fairseq.dict_dir": trained["data_bin"],
        "fairseq.bpe_codes": str(corpus.tokenizer / CODES_FILE),
    }
    workdir = out / "fairseq" / "import"
    config = load_config(CONFIG, {"workdir": str(workdir), **files})
    return run_stage(config, "fairseq_import").path


def decode_imported(engine: str, folder: str, corpus: Corpus, out: Path, args) -> dict:
    """Our translator with engine ``engine`` on the imported fairseq model, fairseq-generate's
    settings (``peers.ours.fairseq_decoding``): its symbols, as fairseq-generate's output."""
    src = corpus.languages[0]
    argv = [folder, "--engine", engine, "--source", str(corpus.raw_test()),
            "--prepared", str(corpus.text / f"test.{src}"), "--beam", str(BEAM),
            "--export-dir", str(out / "fairseq" / "import-ct2")]  # fmt: skip
    log = out / "logs" / f"ours-imported-{engine}.log"
    return ours("imported", argv, args.threads, log)


def identical(hypotheses: list[str], reference: list[str]) -> float:
    """The share of ``hypotheses`` equal to ``reference``'s, line for line (both the same
    dictionary's symbols, BPE marks kept: the same subword sequence, nothing detokenized)."""
    if len(hypotheses) != len(reference) or not reference:
        raise ValueError(f"{len(hypotheses)} hypotheses against {len(reference)}")
    return sum(a == b for a, b in zip(hypotheses, reference, strict=True)) / len(reference)


def score(result: dict, corpus: Corpus) -> dict:
    """bleu_tok_lc and the mean output length (Moses tokens) of a decode's hypotheses."""
    from corpora.text import read_lines
    from evaluation.bleu import moses_tokenize, score_texts

    hyps, lang = result.pop("hypotheses"), corpus.languages[1]
    if result.pop("pieces", False):  # BPE marks kept: removed as fairseq's --remove-bpe does
        hyps = [(h + " ").replace("@@ ", "").rstrip() for h in hyps]
        result["tokenized"] = True
    if result.pop("tokenized", False):  # a peer's output: Moses tokens, as its input was
        from sacremoses import MosesDetokenizer

        detokenizer = MosesDetokenizer(lang=lang)
        hyps = [detokenizer.detokenize(h.split()) for h in hyps]
    refs = read_lines(corpus.reference())
    scores = score_texts(hyps, refs, lang)
    lengths = [len(t.split()) for t in moses_tokenize(hyps, lang)]
    return result | {
        "bleu_tok_lc": scores["bleu_tok_lc"],
        "mean_output_tokens": sum(lengths) / len(lengths),
    }


def decode_all(
    peers: dict[str, Peer], train: dict[str, Any], corpus: Corpus, work: Path, args
) -> dict[str, Any]:
    """Each generator on the model its toolkit trained, then our translator on fairseq's
    weights (``SAME_WEIGHTS``), scored: a row each; a same-weights row also says the share of
    its hypotheses identical to fairseq-generate's."""
    ray = "ours (Ray Train, as tfm run)"
    jobs = [
        (GENERATE, "fairseq", lambda t: decode_fairseq(peers["fairseq"], t, corpus, work, args)),
        ("eole predict", "eole", lambda t: decode_eole(peers["eole"], t, corpus, work, args)),
        ("tfm translate, engine torch", ray, lambda t: decode_ours("torch", t, corpus, work, args)),
        (
            "tfm translate, engine ctranslate2",
            ray,
            lambda t: decode_ours("ctranslate2", t, corpus, work, args),
        ),
    ]
    for label, engine in SAME_WEIGHTS.items():
        job = functools.partial(decode_same_weights, engine, corpus=corpus, out=work, args=args)
        jobs.append((label, "fairseq", job))
    decode: dict[str, Any] = {}
    reference = None  # fairseq-generate's hypotheses
    for label, trained_by, job in jobs:
        trained = train.get(trained_by)
        if trained is None:
            continue
        print(f"decoding: {label}", flush=True)
        if "problem" in trained:
            decode[label] = {"problem": f"no model ({trained_by} did not train)"}
            continue
        result = guarded(label, job, trained)
        if label == GENERATE and "hypotheses" in result:
            reference = result["hypotheses"]
        if label in SAME_WEIGHTS and "hypotheses" in result:
            result = guarded(label, compare, result, reference)
        decode[label] = result if "problem" in result else guarded(label, score, result, corpus)
    return decode


def decode_same_weights(engine: str, trained: dict, *, corpus: Corpus, out: Path, args) -> dict:
    """fairseq's model (``trained``) imported, then decoded by our translator with ``engine``;
    ``problem`` in one line when the import failed (any error: the other rows go on)."""
    try:
        folder = import_fairseq(trained, corpus, out)
    except Exception as err:  # the stage's errors are of many kinds; one row reports it
        return {"problem": f"fairseq_import: {type(err).__name__}: {err}"[:300]}
    return decode_imported(engine, str(folder), corpus, out, args)


def compare(result: dict, reference: list[str] | None) -> dict:
    """``result`` with the share of its hypotheses identical to fairseq-generate's."""
    if reference is None:
        return result | {"identical": None}
    return result | {"identical": identical(result["hypotheses"], reference)}
