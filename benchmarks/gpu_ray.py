"""``benchmarks/gpu.py``'s Ray row: the same Trainer loop inside a Ray Train worker (1 GPU) against
the plain loop in this process, interleaved so that drift hits both alike."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from gpu_training import ROWS, VOCAB, measure, synthetic_corpus, train_config

from training.data import TokenData
from training.trainer import Trainer
from transformer_core import Transformer, presets

ROOT = Path(__file__).resolve().parents[1]


def ray_worker(cfg: dict[str, Any]) -> None:
    """Inside a Ray Train worker: the same model, Trainer and measurement as the plain loop."""
    import ray.train.torch

    torch.manual_seed(0)
    module = Transformer(presets.get(cfg["size"]), VOCAB)
    model = ray.train.torch.prepare_model(module)  # one worker: moved to its GPU, no DDP
    corpus = synthetic_corpus(ROWS)
    tc = train_config(log_every=cfg["steps"])
    trainer = Trainer(module, tc, corpus, corpus, seed=1, model=model)
    m = measure(trainer, cfg["steps"], cfg["steps"])
    trainer.close()
    # Ray Train 2.60 keeps reported metrics only with a checkpoint: a file on this machine it is.
    Path(cfg["result"]).write_text(json.dumps({"tokens_per_s": m["tokens_per_s"]}))


def ray_vs_plain(size: str, steps: int, corpus: TokenData) -> list[dict]:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    def plain() -> float:
        torch.manual_seed(0)
        module = Transformer(presets.get(size), VOCAB).cuda()
        trainer = Trainer(module, train_config(log_every=steps), corpus, corpus, seed=1)
        value = measure(trainer, steps, steps)["tokens_per_s"]
        trainer.close()
        del trainer, module
        torch.cuda.empty_cache()
        return value

    def in_ray() -> float:
        with tempfile.TemporaryDirectory() as storage:
            result = Path(storage) / "result.json"
            TorchTrainer(
                ray_worker,
                train_loop_config={"size": size, "steps": steps, "result": str(result)},
                scaling_config=ScalingConfig(num_workers=1, use_gpu=True),
                run_config=RunConfig(storage_path=storage, name="bench"),
            ).fit()
            return float(json.loads(result.read_text())["tokens_per_s"])

    # Interleaved, plain first and last, so drift hits both paths alike.
    runs: list[tuple[str, float]] = [("plain", plain())]
    # The worker imports this module and gpu_training by name: both folders on its path.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH")) if p
    )
    ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        for _ in range(2):
            runs.append(("Ray Train, 1 worker", in_ray()))
            runs.append(("plain", plain()))
    finally:
        ray.shutdown()
    mean = {
        name: sum(v for n, v in runs if n == name) / sum(1 for n, _ in runs if n == name)
        for name, _ in runs
    }
    rows = [
        {
            "run": i + 1,
            "loop": name,
            "model": size,
            "tokens/s": value,
            "vs_plain_mean": value / mean["plain"],
        }
        for i, (name, value) in enumerate(runs)
    ]
    rows.append(
        {
            "run": "mean",
            "loop": "Ray Train / plain",
            "model": size,
            "tokens/s": mean["Ray Train, 1 worker"],
            "vs_plain_mean": mean["Ray Train, 1 worker"] / mean["plain"],
        }
    )
    return rows
