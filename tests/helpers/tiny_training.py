"""The reversal task (``helpers.trainer``, vocabulary 20) as real tokenizer and shard stage
folders, and the debug model's training config on 2 CPU workers: what the train, resume,
multi-node and elastic tests share, with the traces and weights they compare."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from helpers.stage_folders import tokenizer_folder
from helpers.trainer import reversal_rows
from tasks.framework.config import RunConfig, config_from_dict
from tasks.framework.manifest import read_manifest
from tasks.framework.runner import build_folder
from transformer_core import checkpoint

VOCAB = 20


def make_tokenizer(root: Path) -> Path:
    """A character sentencepiece model with exactly VOCAB pieces (4 specials + 16 letters)."""
    letters = "abcdefghijklmnop"
    rng = np.random.default_rng(0)
    lines = ["".join(rng.choice(list(letters), size=12)) for _ in range(200)] + [letters]
    return tokenizer_folder(
        root / "tokenizer", lines, VOCAB, model_type="char", add_dummy_prefix=False
    )


def write_split(folder: Path, n: int, seed: int, parts: int) -> None:
    """Rows of the reversal task (``reversal_rows``, 2 to 8 pieces) as the shard stage writes
    them: Parquet parts and their Arrow IPC twins in ``../arrow/<split>/`` (what the workers
    memory-map)."""
    import pyarrow as pa
    import pyarrow.ipc
    import pyarrow.parquet as pq

    rows = reversal_rows(n, seed, VOCAB, shortest=2, longest=8)
    src, tgt = ([r.tolist() for r in side] for side in rows)
    folder.mkdir(parents=True)
    bounds = np.linspace(0, n, parts + 1).astype(int)
    for i in range(parts):
        a, b = bounds[i], bounds[i + 1]
        table = pa.table(
            {
                "src_ids": pa.array(src[a:b], type=pa.list_(pa.int32())),
                "tgt_ids": pa.array(tgt[a:b], type=pa.list_(pa.int32())),
                "src_len": pa.array([len(r) for r in src[a:b]], type=pa.int32()),
                "tgt_len": pa.array([len(r) for r in tgt[a:b]], type=pa.int32()),
            }
        )
        pq.write_table(table, folder / f"part-{i:05d}.parquet")
        twins = folder.parent / "arrow" / folder.name
        twins.mkdir(parents=True, exist_ok=True)
        with pyarrow.ipc.new_file(twins / f"part-{i:05d}.arrow", table.schema) as ipc:
            ipc.write_table(table)


def make_shards(root: Path, n_train: int = 384, n_dev: int = 48, stats: dict | None = None) -> Path:
    """A shard stage folder with train (2 parts) and dev (1 part)."""

    def build(tmp: Path) -> dict:
        write_split(tmp / "train", n_train, seed=1, parts=2)
        write_split(tmp / "dev", n_dev, seed=2, parts=1)
        return {"vocab_size": VOCAB} if stats is None else stats

    cfg = {"test": "reverse", "n": n_train, "stats": stats}
    return build_folder("shard", root / "shard", cfg, {}, build).path


def make_inputs(root: Path) -> dict[str, Path]:
    """Tokenizer and shard stage folders under ``root``."""
    return {"shard": make_shards(root), "tokenizer": make_tokenizer(root)}


def tiny_config(root: Path, mlflow_root: Path | None = None, **train: object) -> RunConfig:
    """The debug model on 2 CPU workers, a few steps, everything logged; MLflow (SQLite) in
    ``mlflow_root`` (default ``root``)."""
    import mlflow

    mlflow_root = mlflow_root or root
    uri = f"sqlite:///{mlflow_root / 'mlflow.db'}"
    # Created here so MLflow's artifacts land in tmp, not in the working directory.
    client = mlflow.tracking.MlflowClient(uri)
    if client.get_experiment_by_name("transformer") is None:
        client.create_experiment("transformer", artifact_location=str(mlflow_root / "mlartifacts"))
    settings = {
        "steps": 24,
        "tokens_per_step": 256,
        "max_tokens_per_batch": 128,
        "warmup_steps": 8,
        "lr_scale": 0.5,
        "num_workers": 2,
        "cpus_per_worker": 0.5,
        "eval_every": 8,
        "checkpoint_every": 6,
        "checkpoint_minutes": 0.0,
        "keep_checkpoints": 20,
        "max_failures": 0,
        "log_every": 1,
        **train,
    }
    return config_from_dict(
        {
            "name": "tiny",
            "workdir": str(root),
            "seed": 7,
            "model": {"preset": "debug"},
            "tokenizer": {"vocab_size": VOCAB},
            "train": settings,
            "mlflow": {"tracking_uri": uri},
        }
    )


def metric_history(config: RunConfig, run_id: str, key: str) -> dict[int, float]:
    """``{step: value}`` of one MLflow metric (the last value logged for a step wins)."""
    from mlflow.tracking import MlflowClient

    history = MlflowClient(config.tracking_uri).get_metric_history(run_id, key)
    out: dict[int, float] = {}
    for m in sorted(history, key=lambda m: m.timestamp):
        out[m.step] = m.value
    return out


TRACES = ("loss", "nll", "lr", "grad_norm", "epoch", "batch_index")


def traces(config, out) -> dict[str, dict[int, float]]:
    run_id = read_manifest(out)["stats"]["mlflow_run_id"]
    return {key: metric_history(config, run_id, key) for key in TRACES}


def final_weights(out) -> dict[str, torch.Tensor]:
    return checkpoint.load(out / "final" / "model.pt")["model"]


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)
