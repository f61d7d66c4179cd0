"""Training throughput: the Trainer under Ray Train (1 worker) vs the same Trainer in one process.

Both run the same ``training.trainer.Trainer`` (same model, seed, token-budget batches of
synthetic shards with random ids and lengths 8..64, same accumulation), timed by the Trainer
itself: real (non-pad) source plus target tokens over its logging intervals, the first one
(warm-up) skipped. The plain path steps it in this process; the Ray path is
``training.worker.train_loop_per_worker`` under ``TorchTrainer`` (DDP is not wrapped with one
worker), so the difference is Ray Train's overhead; target: >= 90% of the plain loop.
With CUDA: bf16 autocast, tokens/s per GPU and model-FLOPs utilisation (MFU) for base and big.

    python benchmarks/train.py                       # debug on CPU (or base,big with CUDA)
    python benchmarks/train.py --sizes base --steps 40 --json out.json
    python benchmarks/train.py --model d_model=128 --model d_ff=256 --model n_layers=4 \
        --vocab 10000 --max-tokens 8192 --tokens-per-step 8192   # the Multi30k tiny shape
    python benchmarks/train.py --shards runs/multi30k_en_de/shard --model ...  # real batches
    python benchmarks/train.py --shards ... --layouts 1x2:8192,1x2:4096,2x1:4096 ...

With ``--layouts`` the rows are Ray Train layouts instead of plain vs Ray: ``WxT:M`` is W workers
of T torch threads each, micro-batches of M padded tokens, the same ``--tokens-per-step`` (so
``1x2:4096`` and ``2x1:4096`` train on the same batches, accumulated on one worker or split over
two and all-reduced); rates are over all workers, the first layout is the reference.

With ``--glibc-defaults`` each Ray Train path is timed a second time with glibc's allocator
defaults (``train.keep_freed_memory: false``), with the workers' minor page faults a step and
peak resident memory beside the rates.

With ``--shards`` (a shard stage's folder) both paths train on its real batches and vocabulary
instead of random ids.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import figures  # noqa: E402
from common import parse_overrides, report, vocab_for  # noqa: E402

from training.config import TrainConfig  # noqa: E402
from training.data import TokenData  # noqa: E402
from training.trainer import Trainer  # noqa: E402
from transformer_core import presets  # noqa: E402
from transformer_core.config import ModelConfig  # noqa: E402
from transformer_core.model import Transformer, count_parameters  # noqa: E402

SEED = 1234
# Dense bf16 peak FLOP/s by device name (vendor datasheets, no sparsity).
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12}


def write_shards(folder: Path, rows: int, vocab: int, seed: int = 0) -> None:
    """``train/`` and ``dev/`` Parquet parts of random ids (lengths 8..64, ending with EOS)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    for split, n in (("train", rows), ("dev", max(rows // 50, 8))):
        (folder / split).mkdir(parents=True)
        src = [
            np.r_[rng.integers(4, vocab, int(k) - 1), 3].tolist() for k in rng.integers(8, 65, n)
        ]
        tgt = [
            np.r_[rng.integers(4, vocab, int(k) - 1), 3].tolist() for k in rng.integers(8, 65, n)
        ]
        table = pa.table(
            {
                "src_ids": pa.array(src, type=pa.list_(pa.int32())),
                "tgt_ids": pa.array(tgt, type=pa.list_(pa.int32())),
                "src_len": pa.array([len(r) for r in src], type=pa.int32()),
                "tgt_len": pa.array([len(r) for r in tgt], type=pa.int32()),
            }
        )
        pq.write_table(table, folder / split / "part-00000.parquet")


Layout = tuple[int, int, int]
"""Ray Train workers, torch threads per worker, padded tokens per micro-batch."""


def parse_layout(text: str) -> Layout:
    """``WxT:M`` -> (W, T, M)."""
    shape, _, tokens = text.partition(":")
    workers, _, threads = shape.partition("x")
    return int(workers), int(threads), int(tokens)


def train_settings(
    args: argparse.Namespace, warm: int, layout: Layout | None = None, keep_freed: bool = True
) -> TrainConfig:
    """No evaluation or checkpoint before the last step; a logging interval of ``warm`` steps;
    one worker on every core unless ``layout`` says otherwise; ``keep_freed``:
    ``train.keep_freed_memory``."""
    cores = os.cpu_count() or 1
    workers, threads, max_tokens = layout or (1, None, args.max_tokens)
    return TrainConfig(
        steps=args.steps,
        tokens_per_step=args.tokens_per_step,
        max_tokens_per_batch=max_tokens,
        warmup_steps=4000,
        num_workers=workers,
        torch_threads=threads,
        use_gpu=torch.cuda.is_available(),
        cpus_per_worker=float(cores) / workers,
        eval_every=args.steps,
        checkpoint_every=0,
        checkpoint_minutes=0.0,
        log_every=warm,
        keep_freed_memory=keep_freed,
    )


def model_config(size: str, args: argparse.Namespace) -> ModelConfig:
    """The preset ``size`` with the ``--model KEY=VALUE`` changes (values read as YAML)."""
    return presets.get(size).replace(**parse_overrides(args.model))


def ray_loop(
    size: str,
    shard_dir: Path,
    vocab: int,
    args: argparse.Namespace,
    warm: int,
    niceness: int | None = None,
    layout: Layout | None = None,
    keep_freed: bool = True,
) -> dict:
    """tokens/s as measured by the Trainer in Ray Train (after its first logging interval, over
    all workers); ``niceness``: the workers', instead of Ray's default (15); ``layout``: workers,
    threads and micro-batch (default: one worker on every core, ``--max-tokens``);
    ``keep_freed``: ``train.keep_freed_memory``, through the pipeline's runtime env."""
    import ray.train
    from ray.train.torch import TorchTrainer

    from filesystem.location import open_location
    from filesystem.storage import folder_at
    from training.allocator import worker_runtime_env
    from training.job_spec import TrainJob
    from training.worker import JOB_KEY, train_loop_per_worker

    with tempfile.TemporaryDirectory() as storage:
        tc = train_settings(args, warm, layout, keep_freed)
        env = dict(worker_runtime_env(tc).get("env_vars", {}))
        if niceness is not None:
            env["RAY_worker_niceness"] = str(niceness)
        job = TrainJob(
            model=model_config(size, args),
            train=tc,
            seed=SEED,
            vocab_size=vocab,
            shard_folder=folder_at(str(shard_dir)),
            storage=open_location(storage),
            run_name="bench",
        )
        trainer = TorchTrainer(
            train_loop_per_worker,
            train_loop_config={JOB_KEY: job},
            scaling_config=ray.train.ScalingConfig(
                num_workers=tc.num_workers,
                use_gpu=tc.use_gpu,
                resources_per_worker={
                    "CPU": tc.cpus_per_worker,
                    **({"GPU": 1} if tc.use_gpu else {}),
                },
            ),
            run_config=ray.train.RunConfig(
                name="bench",
                storage_path=storage,
                worker_runtime_env={"env_vars": env} if env else None,
            ),
        )
        summary = trainer.fit().return_value
    return {
        "tokens_per_s": summary["tokens_per_s"],
        "seconds": summary["timed_seconds"],
        "threads": summary["torch_threads"],
        "page_faults_per_step": summary["page_faults_per_step"],
        "max_rss_mib": summary["max_rss_mib"],
    }


def plain_loop(size: str, shard_dir: Path, vocab: int, args: argparse.Namespace, warm: int) -> dict:
    """The same Trainer stepped in this process: no Ray, no DDP, no checkpoints, no MLflow."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train = TokenData.read(str(shard_dir / "train"), vocab)
    dev = TokenData.read(str(shard_dir / "dev"), vocab)
    torch.manual_seed(SEED)
    module = Transformer(model_config(size, args), vocab).to(device)
    trainer = Trainer(module, train_settings(args, warm), train, dev, seed=SEED)
    while trainer.step < trainer.last_step:
        trainer.train_step()
    return {
        "tokens_per_s": trainer.timed_tokens / trainer.timed_seconds,
        "seconds": trainer.timed_seconds,
        "threads": torch.get_num_threads(),
    }


def flops_per_token(size: str, args: argparse.Namespace, vocab: int, mean_len: float) -> float:
    """Training FLOPs per real token (source and target alike, both about ``mean_len`` long):
    6 x the matmul weights a token passes through, plus attention scores and sums."""
    mc = model_config(size, args)
    d, ff, n = mc.d_model, mc.d_ff, mc.n_layers
    enc = n * (4 * d * d + 2 * d * ff)  # self-attention projections + FFN, per source token
    dec = n * (8 * d * d + 2 * d * ff) + d * vocab  # + cross-attention and the output layer
    attn = n * (2 * d * mean_len) * 2  # QK^T and AV: encoder self, decoder self + cross (avg)
    return 6 * ((enc + dec) / 2 + attn)


def peak_flops() -> float | None:
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


def parse_args(argv: list[str] | None, cuda: bool) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="base,big" if cuda else "debug")
    parser.add_argument("--steps", type=int, default=30 if cuda else 16)
    parser.add_argument("--warm", type=int, default=0, help="untimed first steps (default steps/4)")
    parser.add_argument("--max-tokens", type=int, default=8192 if cuda else 2048)
    parser.add_argument("--tokens-per-step", type=int, default=25_000 if cuda else 4096)
    parser.add_argument("--rows", type=int, default=40_000 if cuda else 4_000)
    parser.add_argument("--repeats", type=int, default=1 if cuda else 3, help="best of N")
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change the preset's model config, e.g. d_model=128 (repeatable)",
    )
    parser.add_argument(
        "--vocab", type=int, default=None, help="vocabulary size (default: by preset)"
    )
    parser.add_argument(
        "--shards", default=None, help="a shard stage's folder: train on its real batches"
    )
    parser.add_argument(
        "--niceness",
        type=int,
        default=None,
        metavar="N",
        help="also time a Ray Train worker at this niceness (Ray's default: 15)",
    )
    parser.add_argument(
        "--layouts",
        default=None,
        metavar="WxT:M,...",
        help="time these Ray Train layouts instead (W workers of T threads, M-token micro-batches)",
    )
    parser.add_argument(
        "--glibc-defaults",
        action="store_true",
        help="also time each Ray Train path with glibc's allocator defaults "
        "(train.keep_freed_memory: false)",
    )
    parser.add_argument("--json", default=None)
    return parser.parse_args(argv)


def timed_paths(
    size: str, shard_dir: Path, vocab: int, args: argparse.Namespace, warm: int
) -> dict[str, Callable[[], dict]]:
    """The loops to time, by name: plain and Ray Train, or the ``--layouts``; with the glibc
    defaults and the niceness variants when asked."""
    loop_args = (size, shard_dir, vocab, args, warm)
    paths: dict[str, Callable[[], dict]] = {
        "plain": partial(plain_loop, *loop_args),
        "ray_train": partial(ray_loop, *loop_args),
    }
    if args.layouts:
        paths = {
            f"ray_train {text}": partial(ray_loop, *loop_args, layout=parse_layout(text))
            for text in args.layouts.split(",")
        }
    if args.glibc_defaults:
        paths.update(
            {
                f"{path} glibc defaults": partial(run, keep_freed=False)
                for path, run in paths.items()
                if path.startswith("ray_train")
            }
        )
    if args.niceness is not None:
        paths[f"ray_train nice {args.niceness}"] = partial(
            ray_loop, *loop_args, niceness=args.niceness
        )
    return paths


def time_interleaved(
    paths: dict[str, Callable[[], dict]], repeats: int, cuda: bool
) -> tuple[dict[str, dict], dict[str, float]]:
    """Each path's best run and median tokens/s over ``repeats`` interleaved rounds."""
    # Other load on the machine only slows a run, so the best of each path is its figure; the
    # medians show how far the runs scatter.
    runs: dict[str, list[dict]] = {path: [] for path in paths}
    for _ in range(repeats):
        for path, run in paths.items():
            runs[path].append(run())
            if cuda:
                torch.cuda.empty_cache()
    best = {path: max(results, key=lambda r: r["tokens_per_s"]) for path, results in runs.items()}
    medians = {
        path: float(np.median([r["tokens_per_s"] for r in results]))
        for path, results in runs.items()
    }
    return best, medians


def measure_size(size: str, args: argparse.Namespace, warm: int, cuda: bool) -> list[dict]:
    """One size's rows: each path against the first (plain, or the first layout)."""
    vocab = args.vocab or vocab_for(size)
    with tempfile.TemporaryDirectory() as tmp:
        shard_dir = Path(args.shards).resolve() if args.shards else Path(tmp)
        if args.shards:
            manifest = json.loads((shard_dir / "manifest.json").read_text())
            vocab = manifest["stats"]["vocab_size"]
        else:
            write_shards(shard_dir, args.rows, vocab)
        paths = timed_paths(size, shard_dir, vocab, args, warm)
        best, medians = time_interleaved(paths, args.repeats, cuda)
        reference = next(iter(paths))  # "plain", or the first layout
        plain = best[reference]
    fpt = flops_per_token(size, args, vocab, mean_len=36.0)
    params = count_parameters(Transformer(model_config(size, args), vocab))
    peak = peak_flops()
    return [
        {
            "size": size,
            "device": "cuda bf16" if cuda else f"cpu fp32 x{r['threads']}",
            "path": path,
            "params_M": params / 1e6,
            "tokens_per_s": r["tokens_per_s"],
            "tokens_per_s_per_gpu": r["tokens_per_s"] if cuda else None,
            "mfu": r["tokens_per_s"] * fpt / peak if peak else None,
            "vs_plain": r["tokens_per_s"] / plain["tokens_per_s"],
            "median_vs_plain": medians[path] / medians[reference],
            "timed_s": r["seconds"],
            "faults_per_step": r.get("page_faults_per_step"),
            "worker_rss_mib": r.get("max_rss_mib"),
        }
        for path, r in best.items()
    ]


ROW_LAYOUTS = {"1x2:2048,2x1:1024": "layout-2x1-vs-1x2", "2x1:4096,1x2:4096": "keep-freed-memory"}
"""The ``--layouts`` of docs/benchmarks.md's rows, and each row."""


def record_rows(rows: list[dict], args: argparse.Namespace) -> None:
    """The CPU rows of docs/benchmarks.md measured on real batches (``--shards``): Ray Train
    against the plain loop, the laptop recipe's two layouts, and freed memory kept."""
    by_path = {r["path"]: r for r in rows}
    row_id = ROW_LAYOUTS.get(args.layouts or "")
    if not args.shards or (args.layouts and row_id is None):
        return
    if not args.layouts and not args.glibc_defaults:
        ray, plain = by_path["ray_train"], by_path["plain"]
        figures.record(
            "train",
            "ray-train-vs-plain-loop-cpu",
            f"**{ray['vs_plain']:.2f}** ({ray['tokens_per_s']:,.0f} against "
            f"{plain['tokens_per_s']:,.0f} tokens/s, best of {args.repeats} interleaved runs)",
        )
    elif row_id == "layout-2x1-vs-1x2" and not args.glibc_defaults:
        two, one = by_path["ray_train 2x1:1024"], by_path["ray_train 1x2:2048"]
        figures.record(
            "train",
            row_id,
            f"**{two['tokens_per_s'] / one['tokens_per_s']:.2f}** ({two['tokens_per_s']:,.0f} "
            f"against {one['tokens_per_s']:,.0f} tokens/s)",
        )
    elif row_id == "keep-freed-memory" and args.glibc_defaults:
        kept, glibc = by_path["ray_train 2x1:4096"], by_path["ray_train 2x1:4096 glibc defaults"]
        figures.record(
            "train",
            row_id,
            f"**{kept['tokens_per_s'] / glibc['tokens_per_s']:.2f}x** tokens/s "
            f"({kept['tokens_per_s']:,.0f} against {glibc['tokens_per_s']:,.0f}), "
            f"{glibc['faults_per_step'] / kept['faults_per_step']:.0f}x fewer page faults, "
            f"{kept['worker_rss_mib'] - glibc['worker_rss_mib']:+,.0f} MiB "
            f"({kept['worker_rss_mib'] / glibc['worker_rss_mib'] - 1:+.0%}) resident memory "
            "a worker",
        )


def main(argv: list[str] | None = None) -> None:
    cuda = torch.cuda.is_available()
    args = parse_args(argv, cuda)
    warm = args.warm or max(args.steps // 4, 2)

    import ray

    ray.init(include_dashboard=False, logging_level="WARNING")
    rows = []
    try:
        for size in args.sizes.split(","):
            rows += measure_size(size, args, warm, cuda)
    finally:
        ray.shutdown()
    report(
        f"Training throughput (best of {args.repeats}), {args.steps} steps ({warm} untimed), "
        f"{args.tokens_per_step} tokens/step, "
        + (
            "micro-batches as each layout says"
            if args.layouts
            else f"{args.max_tokens} tokens/micro-batch"
        ),
        rows,
        args.json,
    )
    if not math.isfinite(rows[-1]["vs_plain"]):
        raise SystemExit("no timing")
    if not cuda:
        record_rows(rows, args)


if __name__ == "__main__":
    main()
