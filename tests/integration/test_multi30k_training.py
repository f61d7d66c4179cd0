"""The Multi30k recipe on the real shared files learns to translate: dev BLEU rises above a
measured floor and the encoder never collapses (skipped without ../shared/data/multi30k)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.framework.config import load_config
from tasks.framework.manifest import read_manifest
from tasks.framework.runner import run_stage

REPO = Path(__file__).resolve().parents[2]
MIRROR = REPO.parent / "shared" / "data" / "multi30k"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.shared_data("multi30k/data/task1/raw"),
    pytest.mark.usefixtures("ray_local"),
    # Its time budget: 107 s alone on 2 idle cores; 400 s under CI's heaviest load.
    pytest.mark.timeout(900),
]

# Measured with these settings (the laptop recipe: 4 layers, d_model 128, two 1-thread workers of
# 1,024 tokens a step, seed 1234, 2026-11-28): dev BLEU 5.5, 19.7 and val_encoder_spread 0.81,
# 0.90 at steps 150 and 300, in 107 s on the idle 2-core VM (one worker of 2,048 tokens,
# 2026-11-25: 2.0, 5.6, 11.0 and 0.66, 0.84, 0.90 at steps 100, 200, 300). The collapsed encoder
# of docs/training.md had spread 0.06 at step 50 and 100, and 0.0007 at 300, with a dev
# perplexity stuck near 150: it scores ~0-2 however long it trains. The floor keeps a margin
# under the measured 19.7 for another machine's arithmetic. Two validations (150, 300) are
# enough for "rises above the floor" and cost one less dev pass.
STEPS, EVERY = 300, 150
BLEU_FLOOR = 12.0
SPREAD_FLOOR = 0.15


def test_the_multi30k_recipe_learns_to_translate(tmp_path):
    from mlflow.tracking import MlflowClient

    config = load_config(
        REPO / "configs" / "multi30k_en_de.yaml",
        {
            "workdir": str(tmp_path),
            "data.mirror": MIRROR.resolve().as_uri(),
            "train.steps": STEPS,
            "train.eval_every": EVERY,
            "train.checkpoint_every": EVERY,
            "train.bleu_sentences": 200,
        },
    )
    raw = run_stage(config, "download", {}).path
    assert read_manifest(raw)["stats"]["train_lines"] == 29_000
    cleaned = run_stage(config, "clean", {"download": raw}).path
    tok = run_stage(config, "tokenizer", {"clean": cleaned}).path
    shards = run_stage(config, "shard", {"clean": cleaned, "tokenizer": tok}).path
    out = run_stage(config, "train", {"shard": shards, "tokenizer": tok}).path

    stats = read_manifest(out)["stats"]
    client = MlflowClient(stats["tracking_uri"])

    def history(key: str) -> dict[int, float]:
        return {m.step: m.value for m in client.get_metric_history(stats["mlflow_run_id"], key)}

    bleu, spread = history("val_bleu"), history("val_encoder_spread")
    print(f"Multi30k {STEPS} steps: dev BLEU {bleu}, encoder spread {spread}")
    assert sorted(bleu) == list(range(EVERY, STEPS + 1, EVERY))
    assert bleu[STEPS] > bleu[EVERY] and bleu[STEPS] >= BLEU_FLOOR, bleu
    assert min(spread.values()) >= SPREAD_FLOOR, spread
    assert "warning.encoder_collapse" not in client.get_run(stats["mlflow_run_id"]).data.tags
