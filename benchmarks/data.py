"""Data pipeline throughput: clean + encode + write (Ray Data) against raw sentencepiece encoding.

The real WMT14 sample (../shared/data/wmt14_ende_sample; where it is absent, a synthetic corpus
of the same shape from ``corpora.synthetic``) is replicated to ``--pairs`` pairs (each replica
numbered, so deduplication keeps them), a tokenizer is trained on the sample once,
then the clean and shard stages run and are timed. In the same run, on the same cores,
``SentencePieceProcessor.encode`` encodes the same sentences with all threads: the pipeline
should keep at least half of that speed.

Ray's fixed costs are timed apart: starting Ray (``ray.init``) and a warm-up job that starts the
worker processes and imports the stages' modules in them. The steady-state rate (clean + shard
on warm workers) and the end-to-end rate (Ray start-up and warm-up included) are both reported.
Memory: the driver's and all Ray processes' resident memory, sampled during the clean and
shard stages (not the tokenizer training or the raw reference, which run outside that window).

    python benchmarks/data.py --pairs 100000          # quick
    python benchmarks/data.py --json data.json        # 1M pairs
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT.parent / "shared" / "data" / "wmt14_ende_sample"
FULL_PAIRS = 1_000_000
"""The full-size run (``make bench BENCH_FULL=1``): its figure is the one the docs give."""
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import figures  # noqa: E402

from corpora.filters import normalize_array  # noqa: E402
from tasks.framework.config import CleanConfig, RayConfig, RunConfig, ShardConfig, TokenizerConfig  # noqa: E402
from tasks.framework.manifest import read_manifest  # noqa: E402
from tasks.framework.runner import build_folder, run_stage  # noqa: E402


def sample_folder() -> Path:
    """The WMT14 sample beside the clone, or where it is absent a synthetic stand-in of the same
    shape (the quickstart's grammar, written once under benchmarks/results/); one line says so."""
    if (SAMPLE / "train.en").is_file():
        return SAMPLE
    out = ROOT / "benchmarks" / "results" / "synthetic_sample"
    if not (out / "newstest2014.full.de").is_file():  # the last file written
        from corpora.synthetic import write_corpus

        with tempfile.TemporaryDirectory() as tmp:
            made = Path(tmp)
            write_corpus(made, pair="en-de", seed=1, train=10_000, dev=3_000, test=3_003)
            out.mkdir(parents=True, exist_ok=True)
            for lang in ("en", "de"):
                shutil.copyfile(made / "train" / f"synthetic.{lang}", out / f"train.{lang}")
                shutil.copyfile(made / f"dev.{lang}", out / f"newstest2012.{lang}")
                shutil.copyfile(made / f"test.{lang}", out / f"newstest2014.full.{lang}")
    print(f"{SAMPLE} is absent: the synthetic corpus stands in for the WMT14 sample")
    return out


def replicate(src: Path, dst: Path, pairs: int) -> None:
    """``pairs`` lines from ``src``, cycled; replica k > 0 gets " k" appended."""
    lines = src.read_text(encoding="utf-8").splitlines()
    with open(dst, "w", encoding="utf-8") as out:
        for i in range(pairs):
            k, j = divmod(i, len(lines))
            out.write(lines[j] + (f" {k}" if k else "") + "\n")


class PeakMemory:
    """Peak resident memory, sampled every 0.2 s, of the driver and of all Ray processes
    together."""

    def __init__(self) -> None:
        self.ray_peak = 0
        self.driver_peak_sampled = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.wait(0.2):
            self.driver_peak_sampled = max(self.driver_peak_sampled, me.memory_info().rss)
            total = 0
            for proc in psutil.process_iter(["name", "cmdline"]):
                try:
                    cmd = " ".join(proc.info["cmdline"] or [])
                    if (
                        proc.info["name"].startswith("ray::")
                        or "ray/_private/workers" in cmd
                        or "raylet" in cmd
                    ):
                        total += proc.memory_info().rss
                except (psutil.Error, AttributeError):
                    continue
            self.ray_peak = max(self.ray_peak, total)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @staticmethod
    def driver_peak() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _import_stages(batch: dict) -> dict:
    """Warm-up map function: what the stages' tasks import, imported once per worker process."""
    import pandas  # noqa: F401  (pair_hashes)
    import sentencepiece  # noqa: F401

    from corpora import cleaning, encoding  # noqa: F401

    return batch


def warm_up(cpus: int) -> None:
    """One small Ray Data job on every CPU: starts the worker processes and imports the stages."""
    import ray

    ray.data.range(4 * cpus, override_num_blocks=4 * cpus).map_batches(_import_stages).materialize()


def raw_encode(texts_file: list[Path], model: Path, threads: int) -> tuple[float, int]:
    """Seconds to encode every line of the files with sentencepiece on ``threads`` threads."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model))
    seconds, tokens = 0.0, 0
    for path in texts_file:
        with open(path, encoding="utf-8") as f:
            while chunk := [line.rstrip("\n") for _, line in zip(range(200_000), f, strict=False)]:
                start = time.perf_counter()
                ids = sp.encode(chunk, num_threads=threads)
                seconds += time.perf_counter() - start
                tokens += sum(map(len, ids))
    return seconds, tokens


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=FULL_PAIRS)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--cpus", type=int, default=os.cpu_count())
    parser.add_argument(
        "--actors", type=int, default=None, help="encoding actors (default: --cpus)"
    )
    parser.add_argument("--workdir", default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--json", default=None)
    return parser.parse_args()


def bench_config(args: argparse.Namespace, work: Path) -> RunConfig:
    """The stages' config: ``--cpus`` for Ray and the tokenizer, ``--actors`` encoders."""
    actors = args.actors or args.cpus
    return RunConfig(
        name="bench",
        workdir=str(work),
        clean=CleanConfig(batch_size=4096),
        tokenizer=TokenizerConfig(vocab_size=args.vocab, sample_size=100_000, threads=args.cpus),
        shard=ShardConfig(
            rows_per_shard=200_000,
            num_actors=actors,
            batch_size=4096,
            cpus_per_actor=max(0.25, (args.cpus - 1) / actors),
        ),
        ray=RayConfig(num_cpus=args.cpus),
    )


def prepare_inputs(config: RunConfig, work: Path, pairs: int, sample: Path) -> tuple[Path, Path]:
    """The download folder (``sample`` replicated to ``pairs``) and the tokenizer trained on the
    sample, both outside the timed window."""

    def write_download(tmp: Path) -> dict:
        (tmp / "train").mkdir()
        for lang in ("en", "de"):
            replicate(sample / f"train.{lang}", tmp / "train" / f"sample.{lang}", pairs)
            shutil.copyfile(sample / f"newstest2012.{lang}", tmp / f"dev.{lang}")
            shutil.copyfile(sample / f"newstest2014.full.{lang}", tmp / f"test.{lang}")
        return {}

    def write_tok_input(
        tmp: Path,
    ) -> dict:  # the tokenizer learns from the sample, not the replicas
        import pyarrow as pa
        import pyarrow.parquet as pq

        (tmp / "train").mkdir()
        src = (sample / "train.en").read_text(encoding="utf-8").splitlines()
        tgt = (sample / "train.de").read_text(encoding="utf-8").splitlines()
        pq.write_table(
            pa.table(
                {"src": normalize_array(pa.array(src)), "tgt": normalize_array(pa.array(tgt))}
            ),
            tmp / "train" / "part-00000.parquet",
        )
        return {}

    download = build_folder(
        "download", work / "download", {"pairs": pairs}, {}, write_download, hash_files=False
    ).path
    tok_input = build_folder("tok_input", work / "tok_input", {}, {}, write_tok_input).path
    tok_dir = run_stage(config, "tokenizer", {"clean": tok_input}).path
    return download, tok_dir


@dataclass
class Timed:
    """Seconds of each timed step, the stages' output folders and the memory sampled."""

    ray_init_s: float
    warm_up_s: float
    clean_s: float
    shard_s: float
    clean_dir: Path
    shard_dir: Path
    memory: PeakMemory


def time_pipeline(config: RunConfig, cpus: int, download: Path, tok_dir: Path) -> Timed:
    """Ray's start and warm-up, then the clean and shard stages on warm workers, timed apart."""
    import ray

    from tasks.framework.runtime import ensure_ray

    start = time.perf_counter()
    ensure_ray(config.ray)
    ray_init_s = time.perf_counter() - start
    ray.data.DataContext.get_current().enable_progress_bars = False
    start = time.perf_counter()
    warm_up(cpus)
    warm_up_s = time.perf_counter() - start

    with PeakMemory() as memory:
        start = time.perf_counter()
        clean_dir = run_stage(config, "clean", {"download": download}, force=True).path
        clean_s = time.perf_counter() - start
        start = time.perf_counter()
        shard_dir = run_stage(
            config, "shard", {"clean": clean_dir, "tokenizer": tok_dir}, force=True
        ).path
        shard_s = time.perf_counter() - start
    ray.shutdown()
    return Timed(ray_init_s, warm_up_s, clean_s, shard_s, clean_dir, shard_dir, memory)


def result_rows(
    args: argparse.Namespace, t: Timed, raw_s: float, raw_tokens: int
) -> tuple[list[dict], dict]:
    """The table's rows and the summary (ratios to raw sentencepiece, memory, counts)."""
    pairs = args.pairs
    kept = read_manifest(t.clean_dir)["stats"]["kept"]
    shard_stats = read_manifest(t.shard_dir)["stats"]["train"]
    pipeline_pps = pairs / (t.clean_s + t.shard_s)
    fixed_s = t.ray_init_s + t.warm_up_s
    end_to_end_pps = pairs / (fixed_s + t.clean_s + t.shard_s)
    raw_pps = pairs / raw_s
    rows = [
        {
            "what": "clean (Ray Data)",
            "pairs": pairs,
            "seconds": t.clean_s,
            "pairs/s": pairs / t.clean_s,
        },
        {
            "what": "shard: encode+write (Ray Data)",
            "pairs": kept,
            "seconds": t.shard_s,
            "pairs/s": kept / t.shard_s,
        },
        {
            "what": "pipeline clean+encode+write (warm Ray)",
            "pairs": pairs,
            "seconds": t.clean_s + t.shard_s,
            "pairs/s": pipeline_pps,
        },
        {
            "what": "Ray fixed costs: ray.init + worker warm-up",
            "pairs": "",
            "seconds": fixed_s,
            "pairs/s": "",
        },
        {
            "what": "pipeline end to end (Ray start-up included)",
            "pairs": pairs,
            "seconds": fixed_s + t.clean_s + t.shard_s,
            "pairs/s": end_to_end_pps,
        },
        {
            "what": f"raw sentencepiece encode ({args.cpus} threads)",
            "pairs": pairs,
            "seconds": raw_s,
            "pairs/s": raw_pps,
        },
    ]
    summary = {
        "ratio_pipeline_to_raw": pipeline_pps / raw_pps,
        "ratio_end_to_end_to_raw": end_to_end_pps / raw_pps,
        "target": ">= 0.5",
        "ray_init_s": t.ray_init_s,
        "warm_up_s": t.warm_up_s,
        "peak_driver_mb": t.memory.driver_peak_sampled / 2**20,
        "peak_driver_mb_whole_run": PeakMemory.driver_peak() / 2**20,
        "peak_ray_processes_mb": t.memory.ray_peak / 2**20,
        "kept_pairs": kept,
        "tokens": shard_stats["src_tokens"] + shard_stats["tgt_tokens"],
        "raw_tokens": raw_tokens,
        "cpus": args.cpus,
        "encode_actors": args.actors or args.cpus,
    }
    return rows, summary


def write_report(title: str, rows: list[dict], summary: dict, json_path: str | None) -> None:
    try:
        from common import report

        report(
            title,
            rows
            + [{"what": k, "pairs": "", "seconds": "", "pairs/s": v} for k, v in summary.items()],
            json_path,
        )
    except ImportError:  # common.py needs torch; this benchmark does not
        import json

        print(f"\n{title}")
        for row in rows:
            print(
                f"{row['what']:<46} {row['pairs']:>10} pairs {row['seconds']:>8.1f} s "
                f"{row['pairs/s']:>10} pairs/s"
            )
        for key, value in summary.items():
            print(f"{key:<44} {value:.3g}" if isinstance(value, float) else f"{key:<44} {value}")
        if json_path:
            Path(json_path).write_text(
                json.dumps({"title": title, "rows": rows, "summary": summary}, indent=2) + "\n"
            )


def main() -> None:
    args = parse_args()
    sample = sample_folder()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-data-"))
    config = bench_config(args, work)
    download, tok_dir = prepare_inputs(config, work, args.pairs, sample)
    timed = time_pipeline(config, args.cpus, download, tok_dir)
    raw_s, raw_tokens = raw_encode(
        [download / "train" / "sample.en", download / "train" / "sample.de"],
        tok_dir / "spm.model",
        args.cpus,
    )
    rows, summary = result_rows(args, timed, raw_s, raw_tokens)
    title = (
        f"Data pipeline throughput, {args.pairs:,} pairs ({sample.name} replicated), "
        f"vocab {args.vocab}"
    )
    write_report(title, rows, summary, args.json)
    if sample == SAMPLE and args.pairs == FULL_PAIRS:  # the row's measurement, not a quick one
        end_to_end, raw = rows[4]["pairs/s"], rows[5]["pairs/s"]
        figures.record(
            "data",
            "data-stages",
            f"**{summary['ratio_end_to_end_to_raw']:.2f}** ({end_to_end:,.0f} against "
            f"{raw:,.0f} pairs/s; {summary['ratio_pipeline_to_raw']:.2f} once Ray is up)",
        )
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
