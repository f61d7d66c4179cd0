"""An offline install for a GPU machine with no package index: one site-packages archive.

``make gpu-recipe RECIPE_FLAGS="--site ARCHIVE"`` installs from what this script writes. It

1. resolves the project's dependencies for the GPU machine's Python (``--python-version``, a
   manylinux x86-64 platform, wheels only) with pip's resolver, from the package index here;
2. keeps those the GPU machine lacks: ``--have`` names what it holds (a file of names or
   ``name==version`` lines, e.g. its ``python3 -m pip list --format=freeze``), and its CUDA torch
   with torch's CUDA libraries is never taken; ``--also`` names small packages taken anyway, so
   that the versions resolved together with Ray, Prefect and MLflow are the ones that run;
3. installs them into one folder (``pip install --target --no-deps``), leaves out what a run
   never loads (Ray's Java jars, RLlib and LLM packages, source maps, MLflow's web UI, console
   scripts whose first line names this machine's Python) and strips Ray's three binaries;
4. writes it as one ``.tar.xz``: xz over the whole tree packs a third tighter than the wheels
   (the device tool carries 64 MiB a call, the project included).

    python benchmarks/gpu_bundle.py --have have.txt --out .whl/site-py312.tar.xz

Hand-written because it is glue around pip, strip and xz; pip has no "install for another
machine, minus what it has" of its own.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
# glibc 2.17-2.35 manylinux tags: pip matches each tag exactly, so every one a wheel may carry.
PLATFORMS = ["manylinux1_x86_64", "manylinux2014_x86_64"] + [
    f"manylinux_2_{n}_x86_64" for n in (5, 17, 24, 27, 28, 31, 34, 35)
]
# The GPU machine's own torch and the CUDA libraries that come with it: never carried.
NEVER = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$")
# Small, often pinned by Ray / Prefect / MLflow: the resolved versions go along even when the
# machine has its own.
ALSO = (
    "anyio attrs certifi click cloudpickle h11 httpcore httpx markdown-it-py mdurl msgpack "
    "packaging protobuf rich typing-extensions"
)
# Paths under site-packages that a pipeline run never loads.
PRUNE = (
    "bin",  # console scripts: their first line names this machine's Python
    "ray/jars",  # Java workers
    "ray/rllib",
    "ray/llm",
    "mlflow/server/js",  # MLflow's web UI (runs log to SQLite; no server starts)
    "virtualenv",  # Ray's pip runtime envs only
)
STRIP = ("ray/_raylet.so", "ray/core/src/ray/gcs/gcs_server", "ray/core/src/ray/raylet/raylet")


def read_have(path: Path) -> set[str]:
    """Canonical names in a ``pip list --format=freeze`` file (or one name a line)."""
    names = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        name = re.split(r"[=<>@ ;\[]", line.strip(), maxsplit=1)[0]
        if name and not name.startswith("#"):
            names.add(canonicalize_name(name))
    return names


def select(report: dict, have: set[str], also: set[str], project: str) -> list[str]:
    """``name==version`` of each resolved package to carry, from pip's install report."""
    chosen = []
    for item in report["install"]:
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        key = canonicalize_name(name)
        if key == canonicalize_name(project) or NEVER.match(key):
            continue
        if key not in have or key in also:
            chosen.append(f"{name}=={version}")
    return sorted(chosen, key=str.lower)


def prune(site: Path) -> int:
    """Remove what a run never loads, and bytecode caches; bytes freed."""
    before = _size(site)
    for rel in PRUNE:
        shutil.rmtree(site / rel, ignore_errors=True)
    for info in site.glob("virtualenv-*.dist-info"):  # its files are gone: no half install
        shutil.rmtree(info)
    for path in [*site.rglob("__pycache__"), *site.glob("ray/dashboard/client/build/**/*.map")]:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    strip = shutil.which("strip")
    for rel in STRIP:
        if strip and (site / rel).exists():
            subprocess.run([strip, "--strip-unneeded", str(site / rel)], check=True)
    return before - _size(site)


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def pip_target_flags(python_version: str) -> list[str]:
    """pip's flags for wheels that the GPU machine's CPython on x86-64 Linux can load."""
    flags = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
    return flags + [a for p in PLATFORMS for a in ("--platform", p)]


def resolve(work: Path, python_version: str) -> tuple[dict, str]:
    """pip's install report for the project's wheel on the target Python, and the project name."""
    _pip(["wheel", "--no-deps", "-q", "-w", str(work / "project"), str(ROOT)])
    wheel = next((work / "project").glob("*.whl"))
    report = work / "report.json"
    _pip(
        [
            "install",
            "--dry-run",
            "--ignore-installed",
            "-q",
            "--report",
            str(report),
            "--target",
            str(work / "resolve"),
            *pip_target_flags(python_version),
            str(wheel),
        ]
    )
    return json.loads(report.read_text(encoding="utf-8")), wheel.name.split("-")[0]


def pack(site: Path, out: Path) -> None:
    """``site`` as ``out`` (.tar.xz), written under a temporary name and then moved."""
    partial = out.with_name(out.name + ".partial")
    out.parent.mkdir(parents=True, exist_ok=True)
    if shutil.which("xz"):  # multithreaded; Python's lzma uses one core
        with partial.open("wb") as sink:
            tar = subprocess.Popen(
                ["tar", "-C", str(site), "-cf", "-", "."], stdout=subprocess.PIPE
            )
            subprocess.run(["xz", "-9", "-T0"], stdin=tar.stdout, stdout=sink, check=True)
            if tar.wait() != 0:
                raise SystemExit(f"gpu-bundle: tar of {site} failed")
    else:
        import tarfile

        with tarfile.open(partial, "w:xz", preset=9) as archive:
            archive.add(site, arcname=".")
    partial.replace(out)


def _pip(args: list[str]) -> None:
    code = subprocess.run([sys.executable, "-m", "pip", *args]).returncode
    if code != 0:
        raise SystemExit(f"gpu-bundle: `pip {' '.join(args[:2])} ...` failed with exit code {code}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--have", type=Path, required=True, help="what the GPU machine holds")
    parser.add_argument("--out", type=Path, default=ROOT / ".whl" / "site-py312.tar.xz")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python")
    parser.add_argument("--also", default=ALSO, help="names taken even when the machine has them")
    args = parser.parse_args(argv)
    if not args.have.is_file():
        print(f"gpu-bundle: --have {args.have} does not exist", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gpu-bundle-") as tmp:
        work = Path(tmp)
        report, project = resolve(work, args.python_version)
        also = {canonicalize_name(n) for n in args.also.split()}
        chosen = select(report, read_have(args.have), also, project)
        site = work / "site"
        _pip(
            [
                "install",
                "-q",
                "--no-deps",
                "--no-compile",
                "--target",
                str(site),
                *pip_target_flags(args.python_version),
                *chosen,
            ]
        )
        freed = prune(site)
        pack(site, args.out)
    mib = args.out.stat().st_size / 2**20
    print(
        f"gpu-bundle: {len(chosen)} packages of {len(report['install'])} resolved, "
        f"{freed / 2**20:.0f} MiB left out or stripped, {args.out} {mib:.1f} MiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
