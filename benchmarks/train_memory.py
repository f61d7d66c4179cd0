"""Training memory per worker: token data memory-mapped from the shards' Arrow IPC files vs the
Parquet shards read into every worker's memory (the reading before the IPC files existed).

The real WMT14 sample (../shared/data/wmt14_ende_sample; without it, data.py's synthetic
stand-in) is replicated to ``--pairs`` pairs (each replica numbered, as benchmarks/data.py does)
and run through the download, clean, tokenizer and shard stages once (reused from ``--workdir``
when it holds them). The "parquet" reading is the same shard folder without its ``arrow/`` files
(hard links to the rest), which ``TokenData.read`` then reads from Parquet, as it did before. A
third, "no corpus", memory-maps the dev split (3,000 rows)
as the training split: what a training worker costs without a corpus, so ``corpus_MiB`` = USS minus
its USS is what the corpus costs each worker. Each reading trains the debug model for ``--steps``
steps under Ray Train with 1 and with 2 workers (this node), each worker recording, after its last
step, psutil's RSS, USS (pages only it maps) and PSS, the private anonymous memory (``Anonymous`` in
/proc/self/smaps_rollup: what no other process can share and the kernel cannot drop) and the peak
RSS, and the same before it read any data (its ``*_start``). tokens/s is the Trainer's own figure
(real tokens over its timed intervals), the best of ``--repeats`` interleaved runs (other load on
the machine only slows a run); the memory is the last run's. A summary compares the two readings per
worker count: mean per-worker USS, its corpus share and private anonymous memory, memory-mapped over
Parquet, and tokens/s.

A touched page of a memory-mapped file counts in USS while only one process maps it: with one
worker the token pages it touched are in its USS although they are page cache (clean,
evictable, shared with any later reader); with two they are shared and leave USS.

    python benchmarks/train_memory.py                        # 1M pairs, 1 and 2 workers
    python benchmarks/train_memory.py --pairs 100000 --steps 12 --workdir /tmp/tm --json tm.json
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import figures  # noqa: E402
from common import report  # noqa: E402
from data import FULL_PAIRS, SAMPLE, replicate, sample_folder  # noqa: E402

from tasks.framework.config import CleanConfig, RayConfig, RunConfig, ShardConfig, TokenizerConfig  # noqa: E402
from tasks.framework.manifest import read_manifest  # noqa: E402
from tasks.framework.runner import build_folder, run_stage  # noqa: E402
from training.config import TrainConfig  # noqa: E402
from transformer_core import presets  # noqa: E402

SEED = 1234
MIB = 2**20


def build_shards(work: Path, pairs: int, vocab: int, cpus: int, sample: Path) -> Path:
    """The shard stage folder for ``pairs`` replicated pairs of ``sample`` (each stage skipped
    when ``work`` already holds it)."""
    import shutil as sh

    from corpora.filters import normalize_array
    from tasks.framework.runtime import ensure_ray

    config = RunConfig(
        name="bench",
        workdir=str(work),
        clean=CleanConfig(batch_size=4096),
        tokenizer=TokenizerConfig(vocab_size=vocab, sample_size=100_000, threads=cpus),
        shard=ShardConfig(
            rows_per_shard=200_000, num_actors=cpus, batch_size=4096, cpus_per_actor=0.5
        ),
        ray=RayConfig(num_cpus=cpus),
    )

    def write_download(tmp: Path) -> dict:
        (tmp / "train").mkdir()
        for lang in ("en", "de"):
            replicate(sample / f"train.{lang}", tmp / "train" / f"sample.{lang}", pairs)
            sh.copyfile(sample / f"newstest2012.{lang}", tmp / f"dev.{lang}")
            sh.copyfile(sample / f"newstest2014.full.{lang}", tmp / f"test.{lang}")
        return {}

    def write_tok_input(tmp: Path) -> dict:  # the tokenizer learns from the sample itself
        import pyarrow as pa
        import pyarrow.parquet as pq

        (tmp / "train").mkdir()
        src = (sample / "train.en").read_text(encoding="utf-8").splitlines()
        tgt = (sample / "train.de").read_text(encoding="utf-8").splitlines()
        table = pa.table(
            {"src": normalize_array(pa.array(src)), "tgt": normalize_array(pa.array(tgt))}
        )
        pq.write_table(table, tmp / "train" / "part-00000.parquet")
        return {}

    download = build_folder(
        "download", work / "download", {"pairs": pairs}, {}, write_download, hash_files=False
    ).path
    tok_input = build_folder("tok_input", work / "tok_input", {}, {}, write_tok_input).path
    tok_dir = run_stage(config, "tokenizer", {"clean": tok_input}).path
    ensure_ray(config.ray)
    clean_dir = run_stage(config, "clean", {"download": download}).path
    return run_stage(config, "shard", {"clean": clean_dir, "tokenizer": tok_dir}).path


def parquet_only(shards: Path, out: Path) -> Path:
    """``shards`` without its Arrow IPC files (hard links): what a shard folder was before them."""
    if out.exists():
        shutil.rmtree(out)
    for path in sorted(shards.rglob("*")):
        if path.is_file() and path.suffix != ".arrow":
            target = out / path.relative_to(shards)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, target)
    return out


def no_corpus(shards: Path, out: Path) -> Path:
    """A shard folder whose training split is ``shards``' dev split (hard links), memory-mapped."""
    if out.exists():
        shutil.rmtree(out)
    for split in ("train", "dev"):
        for source, target in (
            (shards / "dev", out / split),
            (shards / "arrow" / "dev", out / "arrow" / split),
        ):
            target.mkdir(parents=True)
            for path in sorted(source.glob("part-*")):
                os.link(path, target / path.name)
    return out


def memory() -> dict[str, int]:
    """This process's RSS, USS, PSS, private anonymous memory and peak RSS, in bytes."""
    import psutil

    full = psutil.Process().memory_full_info()
    anonymous = 0
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Anonymous:"):
                anonymous = int(line.split()[1]) * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {"rss": full.rss, "uss": full.uss, "pss": full.pss, "anon": anonymous, "peak_rss": peak}


class RecordMemory:
    """A Trainer callback: after the last step, this worker's memory and the Trainer's tokens/s
    (with its memory before reading the data) to ``<folder>/rank-<r>.json``."""

    def __init__(self, folder: str, start: dict[str, int]):
        self.folder, self.start = folder, start

    def __call__(self, trainer: Any) -> None:
        import json

        if trainer.step != trainer.last_step:
            return
        timed = trainer.timed_seconds
        record = {
            **memory(),
            **{f"{k}_start": v for k, v in self.start.items()},
            "tokens_per_s": trainer.timed_tokens / timed if timed > 0 else None,
            "chunks": len(trainer.train_data.chunks),
        }
        Path(self.folder, f"rank-{trainer.rank}.json").write_text(json.dumps(record))


def measured_loop(cfg: dict[str, Any]) -> dict[str, Any]:
    """``train_loop_per_worker`` with this worker's memory recorded before the data is read and
    after the last step."""
    from dataclasses import replace

    from training.worker import JOB_KEY, train_loop_per_worker

    start = memory()
    job = replace(cfg[JOB_KEY], callbacks=(RecordMemory(cfg["record_dir"], start),))
    return train_loop_per_worker({JOB_KEY: job})


def run(shards: Path, vocab: int, workers: int, args: argparse.Namespace) -> list[dict]:
    """One Ray Train run on ``shards``; the workers' records."""
    import json

    import ray.train
    from ray.train.torch import TorchTrainer

    warm = max(args.steps // 4, 2)
    tc = TrainConfig(
        steps=args.steps,
        tokens_per_step=args.tokens_per_step,
        max_tokens_per_batch=args.max_tokens,
        warmup_steps=4000,
        num_workers=workers,
        cpus_per_worker=0.5,
        torch_threads=max(1, args.cpus // workers),
        eval_every=args.steps,
        checkpoint_every=0,
        checkpoint_minutes=0.0,
        log_every=warm,
    )
    from filesystem.location import open_location
    from filesystem.storage import folder_at
    from training.job_spec import TrainJob
    from training.worker import JOB_KEY

    with tempfile.TemporaryDirectory() as storage, tempfile.TemporaryDirectory() as records:
        job = TrainJob(
            model=presets.get("debug"),
            train=tc,
            seed=SEED,
            vocab_size=vocab,
            shard_folder=folder_at(str(shards)),
            storage=open_location(storage),
            run_name="bench",
        )
        trainer = TorchTrainer(
            measured_loop,
            train_loop_config={JOB_KEY: job, "record_dir": records},
            scaling_config=ray.train.ScalingConfig(
                num_workers=workers, resources_per_worker={"CPU": tc.cpus_per_worker}
            ),
            run_config=ray.train.RunConfig(name="bench", storage_path=storage),
        )
        trainer.fit()
        return [json.loads(p.read_text()) for p in sorted(Path(records).glob("rank-*.json"))]


def mean_mib(ranks: list[dict], key: str) -> float:
    """The mean of ``key`` over the workers' records, in MiB."""
    return sum(r[key] for r in ranks) / len(ranks) / MIB


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=FULL_PAIRS)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--tokens-per-step", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=2, help="best tokens/s of N runs")
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--workdir", default=None, help="keeps the shards between runs")
    parser.add_argument("--json", default=None)
    return parser.parse_args(argv)


def measure_workers(
    readings: dict[str, Path], workers: int, args: argparse.Namespace
) -> tuple[list[dict], dict]:
    """Each reading run ``--repeats`` times with ``workers`` workers: a row per rank and the
    summary of memory-mapped over Parquet."""
    records: dict[str, list[dict]] = {}
    best: dict[str, float] = {}
    for _ in range(args.repeats):  # interleaved: a busy moment slows one reading only
        for reading, folder in readings.items():
            records[reading] = run(folder, args.vocab, workers, args)
            speed = records[reading][0]["tokens_per_s"]
            best[reading] = max(best.get(reading, 0.0), speed)
    base = mean_mib(records["no corpus"], "uss")
    rows = [
        {
            "reading": reading,
            "workers": workers,
            "rank": rank,
            "rss_MiB": r["rss"] / MIB,
            "uss_MiB": r["uss"] / MIB,
            "corpus_MiB": r["uss"] / MIB - base,
            "pss_MiB": r["pss"] / MIB,
            "anon_MiB": r["anon"] / MIB,
            "peak_rss_MiB": r["peak_rss"] / MIB,
            "uss_start_MiB": r["uss_start"] / MIB,
            "tokens_per_s": best[reading] if rank == 0 else None,
        }
        for reading, ranks in records.items()
        for rank, r in enumerate(ranks)
    ]
    uss = {k: mean_mib(v, "uss") for k, v in records.items()}
    anon = {k: mean_mib(v, "anon") for k, v in records.items()}
    summary = {
        "workers": workers,
        "uss_parquet_MiB": uss["parquet"],
        "uss_mapped_MiB": uss["memory-mapped"],
        "uss_no_corpus_MiB": base,
        "uss_ratio": uss["memory-mapped"] / uss["parquet"],
        "corpus_ratio": (uss["memory-mapped"] - base) / (uss["parquet"] - base),
        "anon_ratio": anon["memory-mapped"] / anon["parquet"],
        "tokens_per_s_ratio": best["memory-mapped"] / best["parquet"],
    }
    return rows, summary


def write_report(
    args: argparse.Namespace, stats: dict, rows: list[dict], summary: list[dict]
) -> None:
    tokens = stats["src_tokens"] + stats["tgt_tokens"]
    title = (
        f"Training memory per worker (rows after the last of {args.steps} steps; tokens/s from "
        f"rank 0's Trainer), {stats['rows']:,} pairs, {tokens / 1e6:.1f}M tokens "
        f"({4 * tokens / MIB:,.0f} MiB as int32), vocab {args.vocab}, debug model"
    )
    report(title, rows, args.json)
    report("Memory-mapped over Parquet (per-worker means)", summary)
    if args.json:
        import json

        payload = json.loads(Path(args.json).read_text())
        Path(args.json).write_text(json.dumps({**payload, "summary": summary}, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sample = sample_folder()

    import ray

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-train-memory-"))
    started = time.perf_counter()
    shards = build_shards(work, args.pairs, args.vocab, args.cpus, sample)
    print(f"shards ready in {time.perf_counter() - started:.0f} s: {shards}")
    stats = read_manifest(shards)["stats"]["train"]
    readings = {
        "parquet": parquet_only(shards, work / "shard-parquet-only"),
        "memory-mapped": shards,
        "no corpus": no_corpus(shards, work / "shard-no-corpus"),
    }
    rows, summary = [], []
    try:
        for workers in (int(w) for w in args.workers.split(",")):
            worker_rows, worker_summary = measure_workers(readings, workers, args)
            rows += worker_rows
            summary.append(worker_summary)
    finally:
        ray.shutdown()
    write_report(args, stats, rows, summary)
    two = next((s for s in summary if s["workers"] == 2), None)
    if sample == SAMPLE and args.pairs == FULL_PAIRS and two is not None:  # the row's run
        figures.record(
            "train",
            "training-memory",
            f"USS {two['uss_ratio']:.2f}, the corpus's share {two['corpus_ratio']:.2f}",
        )
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
