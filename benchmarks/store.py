"""The work dir on a local S3 server (SeaweedFS) against a local disk: download, clean, tokenizer,
shard and a short training run, stage by stage.

One config (configs/multi30k_en_de.yaml on the real Multi30k mirror in ../shared/data/multi30k,
with a tiny model trained for ``--steps`` steps) runs with ``workdir`` a temporary folder and
with ``workdir: s3://tfm/<random>/{name}`` on a SeaweedFS this script starts on loopback (MLflow
on a local SQLite file for both), in one process and one Ray session, each from nothing. Of the
``--repeats`` rounds (2 by default) every second one runs the store first; each stage keeps its
best time. Measured: each stage's wall time on disk and on the store and their ratio (the disk
run is the reference, measured on the same cores within minutes); the bytes each stage's
folder holds (and Ray Train's checkpoints, ``train_ray``); the files whose bytes differ between
the two runs (their manifests' sizes and hashes) and whether the final weights are equal; and
the shard folder's node copy (``filesystem.storage.node_copy``: what each training node fetches
once) filled into a fresh cache, then asked for again. Ray's start and a warm-up of its workers
come before both runs, so neither pays them.

    python benchmarks/store.py                       # ~5 minutes on 2 cores
    python benchmarks/store.py --steps 30 --repeats 1 --json store.json
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIRROR = ROOT.parent / "shared" / "data" / "multi30k"
CONFIG = ROOT / "configs" / "multi30k_en_de.yaml"
STAGES = ("download", "clean", "tokenizer", "shard", "train")
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
# SeaweedFS is started by the tests' own launcher (one launcher, not two): tests/helpers.
sys.path.insert(0, str(ROOT / "tests"))

import figures  # noqa: E402
from common import parse_overrides, report  # noqa: E402

from filesystem.storage import Store, node_copy  # noqa: E402
from tasks.framework.config import RunConfig, load_config  # noqa: E402
from tasks.framework.runner import run_stage  # noqa: E402

MB = 2**20


def shared_overrides(steps: int) -> dict[str, object]:
    """What both runs change in the Multi30k config: the real data stages as shipped, then a
    tiny model (the integration tests' shape) trained for ``steps`` steps, checkpointed twice."""
    return {
        "data.mirror": MIRROR.resolve().as_uri(),
        "model.n_layers": 1,
        "model.d_model": 32,
        "model.d_ff": 64,
        "model.n_heads": 2,
        "train.steps": steps,
        "train.tokens_per_step": 1024,
        "train.max_tokens_per_batch": 1024,
        "train.eval_every": steps,
        "train.bleu_sentences": 100,
        "train.checkpoint_every": max(1, steps // 2),
        "train.log_every": 10,
    }


def configs(base: Path, endpoint: str, overrides: dict[str, object]) -> tuple[RunConfig, RunConfig]:
    """The disk run's config and the store run's: the same but for the work dir, the node cache
    and where MLflow's SQLite file lives (it cannot live in a bucket)."""
    disk = load_config(CONFIG, {
        **overrides, "workdir": str(base / "disk"), "mlflow.tracking_uri": f"sqlite:///{base}/disk-mlflow.db",
    })  # fmt: skip
    store = load_config(CONFIG, {
        **overrides, "workdir": f"s3://tfm/bench-{secrets.token_hex(4)}/{{name}}",
        "storage.endpoint": endpoint, "storage.cache_dir": str(base / "node-cache"),
        "mlflow.tracking_uri": f"sqlite:///{base}/store-mlflow.db",
    })  # fmt: skip
    return disk, store


def run_stages(config: RunConfig) -> dict[str, float]:
    """Each stage run from nothing, in order; its wall seconds (the runner's own work included:
    fingerprints, manifest, upload)."""
    seconds = {}
    for name in STAGES:
        start = time.perf_counter()
        result = run_stage(config, name)
        seconds[name] = time.perf_counter() - start
        if not result.ran:  # a skipped stage would time nothing: the work dir was not empty
            raise SystemExit(
                f"stage {name} was skipped ({result.reason}): the work dir is not fresh"
            )
        print(f"{config.store.uri}: {name} {seconds[name]:.1f} s", flush=True)
    return seconds


def folder_bytes(store: Store, rel: str) -> int:
    """The bytes of every file under ``rel``, as the store (or the disk) lists them."""
    import pyarrow.fs as pafs

    selector = pafs.FileSelector(store.path(rel), recursive=True, allow_not_found=True)
    return sum(
        i.size for i in store.filesystem.get_file_info(selector) if i.type == pafs.FileType.File
    )


def differing(a: Store, b: Store, rel: str) -> str:
    """The files whose size or sha256 differ between both folders' manifests ("same": none)."""
    files_a, files_b = ((s.read_manifest(rel) or {}).get("files", {}) for s in (a, b))
    names = sorted(n for n in files_a.keys() | files_b.keys() if files_a.get(n) != files_b.get(n))
    return ", ".join(names) if names else "same"


def same_weights(disk: RunConfig, store: RunConfig, cache: Path) -> bool:
    """Whether both runs' final weights are equal tensor by tensor (model.pt's bytes differ by
    its ``time`` field, config.json by the work dir)."""
    import torch

    paths = (Path(disk.store.path("train")), node_copy(store.store, "train", cache))
    a, b = (
        torch.load(p / "final" / "model.pt", map_location="cpu", weights_only=False)["model"]
        for p in paths
    )
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def cache_fill(store: Store, cache: Path) -> tuple[float, float, int]:
    """Seconds of the shard folder's first node copy into the empty ``cache``, seconds of a
    second call (a reuse: sizes checked, nothing fetched), and the bytes copied."""
    start = time.perf_counter()
    first = node_copy(store, "shard", cache)
    first_s = time.perf_counter() - start
    start = time.perf_counter()
    again = node_copy(store, "shard", cache)
    again_s = time.perf_counter() - start
    assert again == first, (first, again)
    return first_s, again_s, sum(p.stat().st_size for p in first.rglob("*") if p.is_file())


def stage_rows(disk: RunConfig, store: RunConfig, times: dict[str, dict[str, float]]) -> list[dict]:
    """One row per stage, then Ray Train's checkpoints and the total."""
    rows = []
    for name in STAGES:
        d, s = times["disk"][name], times["store"][name]
        rows.append({
            "what": name, "disk s": d, "store s": s, "store/disk": s / d,
            "disk MB": folder_bytes(disk.store, name) / MB,
            "store MB": folder_bytes(store.store, name) / MB,
            "MB/s": "", "files": differing(disk.store, store.store, name),
        })  # fmt: skip
    rows.append({
        "what": "train_ray (Ray Train checkpoints)", "disk s": "", "store s": "", "store/disk": "",
        "disk MB": folder_bytes(disk.store, "train_ray") / MB,
        "store MB": folder_bytes(store.store, "train_ray") / MB,
        "MB/s": "", "files": "",
    })  # fmt: skip
    d, s = sum(times["disk"].values()), sum(times["store"].values())
    rows.append({
        "what": "all (each stage's best; bytes with checkpoints)",
        "disk s": d, "store s": s, "store/disk": s / d,
        "disk MB": sum(r["disk MB"] for r in rows), "store MB": sum(r["store MB"] for r in rows),
        "MB/s": "", "files": "",
    })  # fmt: skip
    return rows


def cache_rows(first_s: float, again_s: float, size: int, server_s: float) -> list[dict]:
    """The shard cache's first fill and reuse, and what starting SeaweedFS took."""
    blank = {"disk s": "", "store/disk": "", "disk MB": "", "files": ""}
    return [
        {"what": "shard node copy: first fill", **blank, "store s": first_s, "store MB": size / MB,
         "MB/s": size / MB / first_s},
        {"what": "shard node copy: second call (reuse)", **blank, "store s": again_s,
         "store MB": "", "MB/s": ""},
        {"what": "SeaweedFS start (not in the stages)", **blank, "store s": server_s,
         "store MB": "", "MB/s": ""},
    ]  # fmt: skip


def warm_ray(config: RunConfig) -> None:
    """Start Ray, its Data workers and the driver's imports before either run is timed."""
    import ray
    import ray.train.torch  # noqa: F401  (the train stage's driver side: seconds to import)

    # Ray's workers import data.py too: the driver's script folder (benchmarks/) is on their path.
    from data import warm_up

    from tasks.framework.graph import stage_module
    from tasks.framework.runtime import ensure_ray

    for name in STAGES:
        stage_module(name)
    ensure_ray(config.ray)
    ray.data.DataContext.get_current().enable_progress_bars = False
    warm_up(config.ray.num_cpus or os.cpu_count() or 1)


def run_rounds(
    base: Path, endpoint: str, overrides: dict[str, object], repeats: int
) -> tuple[dict[str, dict[str, float]], RunConfig, RunConfig]:
    """``repeats`` rounds of both runs, each from nothing, the disk first in even rounds and the
    store first in odd ones; each stage's best seconds per work dir, and the last round's
    configs."""
    times: dict[str, list[dict[str, float]]] = {"disk": [], "store": []}
    for round_ in range(repeats):
        disk, store = configs(base / f"round{round_}", endpoint, overrides)
        if round_ == 0:
            warm_ray(disk)
        runs = [("disk", disk), ("store", store)]
        for label, config in runs if round_ % 2 == 0 else reversed(runs):
            times[label].append(run_stages(config))
    best = {
        label: {name: min(r[name] for r in rounds) for name in STAGES}
        for label, rounds in times.items()
    }
    return best, disk, store


def measure(base: Path, steps: int, repeats: int, extra: dict[str, object]) -> list[dict]:
    """Start SeaweedFS, run both work dirs and fill a fresh shard cache; the table's rows. Without
    the weed binary, exit with one line that says so."""
    import pytest
    import ray
    from helpers.s3_server import SeaweedS3

    start = time.perf_counter()
    try:
        server = SeaweedS3(base / "s3")
    except pytest.skip.Exception as exc:  # the launcher skips a test when weed is absent
        sys.exit(f"bench-store needs SeaweedFS: {exc}")
    server_s = time.perf_counter() - start
    try:
        # Ray's workers take the keys from the environment they start in: set before Ray starts.
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            os.environ[name] = server.env[name]
        times, disk, store = run_rounds(
            base, server.endpoint, {**shared_overrides(steps), **extra}, repeats
        )
        ray.shutdown()
        fill = cache_fill(store.store, base / "fresh-cache")
        rows = stage_rows(disk, store, times) + cache_rows(*fill, server_s)
        equal = same_weights(disk, store, base / "weights-cache")
        blank = {c: "" for c in rows[0] if c not in ("what", "files")}
        return [
            *rows,
            {
                "what": "train: final weights, tensor by tensor",
                **blank,
                "files": "equal" if equal else "differ",
            },
        ]
    finally:
        ray.shutdown()
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="training steps of each run")
    parser.add_argument("--repeats", type=int, default=2,
                        help="rounds of both runs (the store first in every second one); "
                        "each stage's best")  # fmt: skip
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for both runs, as `tfm --set`")  # fmt: skip
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if not (MIRROR / "data" / "task1" / "raw" / "train.en.gz").is_file():
        sys.exit(
            f"bench-store needs the Multi30k mirror at {MIRROR}: a clone of "
            "https://github.com/multi30k/dataset there (docs/data.md, Mirrors and offline use)"
        )
    base = Path(tempfile.mkdtemp(prefix="bench-store-"))
    try:
        rows = measure(base, args.steps, args.repeats, parse_overrides(args.set))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    title = (
        "Work dir on SeaweedFS (S3, loopback) vs a local disk: Multi30k en-de data stages "
        f"and {args.steps} training steps of a tiny model, best of {args.repeats}"
    )
    report(title, rows, args.json)
    total = next(r for r in rows if r["what"].startswith("all "))
    figures.record("store", "store-s3-vs-disk", f"{total['store/disk']:.2f}")


if __name__ == "__main__":
    main()
