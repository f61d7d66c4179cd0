"""The real 10k-pair WMT14 En-De sample through clean, tokenizer and shard (skipped without it)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from serving.tokenizer import load as load_tokenizer
from tasks.framework.config import (
    CleanConfig,
    DataConfig,
    RayConfig,
    RunConfig,
    ShardConfig,
    TokenizerConfig,
)
from tasks.framework.manifest import read_manifest
from tasks.framework.runner import run_stage
from transformer_core.special_ids import UNK_ID

SAMPLE = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "wmt14_ende_sample"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.shared_data("wmt14_ende_sample/train.en"),
    pytest.mark.usefixtures("ray_local"),
]


def test_wmt_sample_through_clean_tokenizer_shard(tmp_path):
    config = RunConfig(
        name="wmt",
        workdir=str(tmp_path),
        # The sample as a local source: train, newstest2012 as dev, newstest2014 (full) as test.
        data=DataConfig(
            source="local",
            local_dir=str(SAMPLE),
            local_dev="newstest2012",
            local_test="newstest2014.full",
        ),
        clean=CleanConfig(batch_size=1000),
        tokenizer=TokenizerConfig(vocab_size=8000, sample_size=100_000, threads=2),
        shard=ShardConfig(rows_per_shard=4000, num_actors=2, batch_size=1000, cpus_per_actor=0.5),
        ray=RayConfig(num_cpus=2),
    )
    raw = run_stage(config, "download", {}).path
    clean_dir = run_stage(config, "clean", {"download": raw}).path
    stats = read_manifest(clean_dir)["stats"]
    print("WMT sample clean:", json.dumps({k: stats[k] for k in ("input", "dropped", "kept")}))
    assert stats["input"] == 10_000
    assert stats["kept"] + sum(stats["dropped"].values()) == 10_000
    assert 5_000 < stats["kept"] < 10_000
    assert stats["dev"]["lines"] == 3000 and stats["test"]["lines"] == 3003

    tok_dir = run_stage(config, "tokenizer", {"clean": clean_dir}).path
    tok = load_tokenizer(tok_dir)
    assert tok.vocab_size == 8000
    test_lines = (clean_dir / "test.de").read_text(encoding="utf-8").splitlines()
    train_lines = pq.read_table(clean_dir / "train")["tgt"].to_pylist()
    assert all(tok.decode(tok.encode(line)) == line for line in train_lines[:2000])
    # newstest2014 has characters the 10k training sample lacks („ “ – ›): those become UNK.
    # Every line without an UNK must round-trip exactly.
    covered = [line for line in test_lines if UNK_ID not in tok.encode(line)]
    assert all(tok.decode(tok.encode(line)) == line for line in covered)
    print(
        f"WMT sample tokenizer: {len(covered)}/{len(test_lines)} test.de lines free of UNK, "
        "all round-trip"
    )
    assert len(covered) > 0.8 * len(test_lines)

    shard_dir = run_stage(config, "shard", {"clean": clean_dir, "tokenizer": tok_dir}).path
    shard_stats = read_manifest(shard_dir)["stats"]
    print("WMT sample shard:", json.dumps(shard_stats))
    assert shard_stats["train"]["rows"] == stats["kept"]
    assert shard_stats["test"]["rows"] == 3003
    assert shard_stats["train"]["shards"] == -(-stats["kept"] // 4000)
