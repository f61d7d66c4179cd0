"""configs/ptb_sample.yaml trained briefly on the NLTK WSJ sample parses: every stage from the
treebank to the scores, constrained decoding, and an F1 above a measured floor (skipped without
../shared/data/ptb_sample)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parsing.linearize import POS_TAGS, structure_tokens
from tasks.framework import runner
from tasks.framework.config import load_config
from tasks.framework.manifest import read_manifest

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO.parent / "shared" / "data" / "ptb_sample" / "combined"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.shared_data("ptb_sample/combined"),
    pytest.mark.usefixtures("ray_local"),
    # 1.5 minutes on the 2-core machine (2026-11-23, words form); 4.6 with the t2t form.
    pytest.mark.timeout(1800),
]

STAGES = (
    "treebank", "linearize", "tokenizer", "shard", "train", "average", "translate", "parse_score",
)  # fmt: skip
STEPS = 400
# Measured with these settings (seed 1234, 2026-11-24, the words form, 1,024-token batches,
# alpha 3.0, dropout 0.2, tied embeddings; 1.4 minutes on the 2-core machine): test F1 31.3
# (P 38.9, R 26.2), tagging accuracy 78.6 (untied: 30.1 and 81.7; dropout 0.1 gave 31.1 and 83.6;
# 2,048-token batches and alpha 0.3 32.9 and 84.5). After 20 steps (2,048-token batches) the
# pipeline gave F1 0.04 and tagging 8.7, so the floors sit between the two. (The t2t form gave
# 7.0 and 16.7 after 400 steps.)
F1_FLOOR = 20.0
TAGGING_FLOOR = 60.0


def test_the_sample_config_learns_to_parse(tmp_path):
    config = load_config(
        REPO / "configs" / "ptb_sample.yaml",
        {
            "workdir": str(tmp_path),
            "parsing.treebank_dir": str(SAMPLE),
            "parsing.beam_size": 4,
            "parsing.constrained": True,
            "train.steps": STEPS,
            "train.eval_every": STEPS,
            "train.checkpoint_every": STEPS // 4,
        },
    )
    for name in STAGES:
        runner.run_stage(config, name)
    root = config.root

    # Every label, closing label and tag is one piece.
    symbols = read_manifest(root / "tokenizer")["stats"]["target_symbols"]
    assert 90 <= symbols <= 110, symbols
    train = read_manifest(root / "train")["stats"]
    assert train["step"] == STEPS

    scores = json.loads((root / "parse_score" / "scores.json").read_text())
    print(f"ptb_sample, {STEPS} steps, beam 4, constrained: {scores}")
    # Constrained decoding leaves repair nothing structural to do: at most punctuation tags.
    assert set(scores["fixes"]) <= {"punct_tag"}, scores["fixes"]
    assert scores["length_errors"] <= 1  # the sample's own quirk ("Wa" tagged ",")
    hyps = (root / "translate" / "hyp.tree").read_text().splitlines()
    words = (root / "linearize" / "test.words").read_text().splitlines()
    form = config.parsing.form
    slots = [sum(tok in POS_TAGS for tok in structure_tokens(h, form)) for h in hyps]
    assert slots == [len(w.split()) for w in words]
    assert scores["f1"] >= F1_FLOOR, scores
    assert scores["tagging_accuracy"] >= TAGGING_FLOOR, scores
