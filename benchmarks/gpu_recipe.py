"""The published Multi30k recipe end to end on one NVIDIA GPU: install, `tfm run`, the test figure.

``make gpu-recipe`` runs this with ``GPU_PYTHON`` (the machine's Python whose torch is a CUDA
build). It

1. stops in one line when that torch sees no CUDA device;
2. makes ``.venv-gpu`` with that Python's site packages visible (its CUDA torch satisfies our torch
   range, so pip installs no other torch) and installs the project there, from the package index
   or, offline, from a folder of wheels (``--wheels DIR``, pip's ``--no-index --find-links``) or
   from one site-packages archive (``--site FILE``, made by benchmarks/gpu_bundle.py: the
   dependencies the GPU machine lacks, packed to fit where a whole wheel set does not);
3. runs ``tfm run configs/multi30k_en_de_tiny.yaml`` with ``train.use_gpu=true``,
   ``train.num_workers=1``, ``train.merge_micro_batches=true``, ``train.static_shapes=true``,
   ``train.eval_max_tokens=32768``, ``train.precision=float32`` and the plain loss (the config as
   committed otherwise: its two workers' 4,096-token batches of an update go through the one GPU
   as one padded batch, the same sentences, replayed as a CUDA graph of its bucketed shape,
   validated in one batch, in float32 as the reference ran; a mirror with ``--mirror``) in a
   fresh work dir;
4. prints test2016 ``bleu_tok_lc`` beside the published 41.02 and the wall time of each part,
   and writes them as JSON.

    python benchmarks/gpu_recipe.py --preflight       # exit 2 with one line without CUDA
    python benchmarks/gpu_recipe.py [--seed 4321] [--mirror file:///data/multi30k] [--wheels .whl]
    python benchmarks/gpu_recipe.py --site .whl/site-py312.tar.xz --keep   # continue a cut run
    python benchmarks/gpu_recipe.py --site .whl/site-py312.tar.xz --install-only  # .venv-gpu only

Hand-written because it is glue around two commands (pip, tfm), each with its own progress.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import site
import subprocess
import sys
import tarfile
import time
from collections.abc import Sequence
from datetime import date
from pathlib import Path

import figures

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "configs/multi30k_en_de_tiny.yaml"
PUBLISHED = (
    41.02  # Wu et al. 2021, text-only Transformer-tiny, test2016 BLEU4 (tokenized, lowercased)
)


def cuda_device() -> str | None:
    """The first CUDA device's name, or None (also when torch is missing)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def install(venv: Path, wheels: str | None, site_archive: str | None = None) -> float:
    """The project in ``venv`` on top of this Python's packages; seconds taken (0 when present)."""
    tfm = venv / "bin" / "tfm"
    if (
        tfm.exists()
        and _run(
            [str(venv / "bin" / "python"), "-c", "import ray.train, prefect, mlflow"], check=False
        )
        == 0
    ):
        return 0.0
    start = time.time()
    _run([sys.executable, "-m", "venv", str(venv)])
    packages = venv_site_packages(venv)
    # This Python's packages (its CUDA torch) after the venv's own: a .pth line, since a venv made
    # from another venv's Python (`--system-site-packages`) would see the base install instead.
    parent = "\n".join(site.getsitepackages()) + "\n"
    (packages / "_gpu_python.pth").write_text(parent, encoding="utf-8")
    if site_archive:
        # An offline machine: every dependency the GPU Python lacks, prepared elsewhere by
        # benchmarks/gpu_bundle.py; the project itself from this checkout.
        try:
            with tarfile.open(site_archive) as archive:
                archive.extractall(packages, filter="data")  # refuses links and paths leaving it
        except (OSError, tarfile.TarError) as err:
            raise SystemExit(f"gpu-recipe: --site {site_archive}: {err}") from None
        (packages / "_attention_pipeline.pth").write_text(f"{ROOT}\n", encoding="utf-8")
        entry = "import sys\nfrom pipelines.cli import main\nsys.exit(main())\n"
        tfm.write_text(f"#!{venv / 'bin' / 'python'}\n{entry}", encoding="utf-8")
        tfm.chmod(0o755)
    else:
        source = ["--no-index", "--find-links", str(Path(wheels).resolve())] if wheels else []
        _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *source, "-e", str(ROOT)])
    return time.time() - start


def venv_site_packages(venv: Path) -> Path:
    """``venv``'s site-packages folder."""
    return next((venv / "lib").glob("python3*/site-packages"))


def run_recipe(
    venv: Path, workdir: Path, seed: int | None, mirror: str | None, extra: Sequence[str] = ()
) -> float:
    """``tfm run`` of the published recipe on the GPU (``extra``: more ``--set`` overrides, e.g.
    ``train.compile=[model]``, after ours); seconds taken."""
    # One GPU: the two workers' 4,096-token batches of an update as one batch on it (the same
    # sentences), its forward and backward replayed as the CUDA graph of its bucketed shape (this
    # small model's update is bound by launching kernels); the dev set validated in one batch;
    # float32 as the reference's fairseq run (no --fp16), not our bf16 default; the recipe's CPU
    # loss (fused, compiled chunks) off: CUDA graphs hold the plain one.
    overrides = ["train.use_gpu=true", "train.num_workers=1", "train.merge_micro_batches=true"]
    overrides += ["train.static_shapes=true", "train.eval_max_tokens=32768"]
    overrides += ["train.fused_loss=false", "train.compile=[]"]
    overrides += ["train.precision=float32", f"workdir={workdir}"]
    overrides += [f"seed={seed}"] if seed is not None else []
    overrides += [f"data.mirror={mirror}"] if mirror else []
    overrides += list(extra)
    start = time.time()
    _run([str(venv / "bin" / "tfm"), "run", CONFIG, *(a for o in overrides for a in ("--set", o))])
    return time.time() - start


def _run(cmd: list[str], check: bool = True) -> int:
    print("+", " ".join(cmd), flush=True)
    code = subprocess.run(cmd, cwd=ROOT).returncode
    if check and code != 0:
        raise SystemExit(f"gpu-recipe: `{' '.join(cmd[:3])} ...` failed with exit code {code}")
    return code


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preflight", action="store_true", help="only check that CUDA is here")
    parser.add_argument("--seed", type=int, default=None, help="default: the config's (1234)")
    parser.add_argument("--mirror", default=None, help="data.mirror, e.g. file:///data/multi30k")
    parser.add_argument("--wheels", default=None, help="install offline from this folder of wheels")
    parser.add_argument(
        "--site", default=None, help="install offline from this archive (gpu_bundle.py)"
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="continue the work dir's run (stages done are skipped, training resumes from its "
        "last checkpoint) instead of starting afresh: for a run cut by a time limit",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another config override for `tfm run` (repeatable), e.g. train.compile=[model]",
    )
    parser.add_argument(
        "--install-only",
        action="store_true",
        help="make the venv and stop (e.g. for `make test-gpu GPU_PYTHON=.venv-gpu/bin/python`)",
    )
    parser.add_argument("--venv", default=str(ROOT / ".venv-gpu"))
    parser.add_argument("--workdir", default=None, help="default: runs/gpu-recipe-seed<seed>")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_recipe.json"))
    return parser.parse_args(argv)


def result_of(
    args: argparse.Namespace,
    device: str,
    workdir: Path,
    install_s: float,
    run_s: float,
    started: float,
) -> dict:
    """What the run scored and where its time went, read from the work dir's score and train
    manifests."""
    scores = json.loads((workdir / "score" / "scores.json").read_text(encoding="utf-8"))
    train = json.loads((workdir / "train" / "manifest.json").read_text(encoding="utf-8"))
    split = train.get("stats", {}).get("loop_split") or {}  # where training's wall time went
    return {
        "date": date.today().isoformat(),
        "device": device,
        "seed": args.seed or 1234,
        "overrides": args.set,  # beyond the GPU's own three: none for the recipe as committed
        "bleu_tok_lc": scores["bleu_tok_lc"],
        "published": PUBLISHED,
        "chrf": scores["chrf"],
        "install_s": round(install_s, 1),
        "run_s": round(run_s, 1),
        "train_loop_split_s": split,
        "wall_s": round(time.time() - started, 1),
        "continued": args.keep,  # then the times are this call's alone
        "workdir": str(workdir),
    }


def write_result(result: dict, out: Path, install_s: float, run_s: float) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    split = result["train_loop_split_s"]
    print(
        f"gpu-recipe: test2016 bleu_tok_lc {result['bleu_tok_lc']:.2f} against the published "
        f"{PUBLISHED:.2f} ({result['bleu_tok_lc'] - PUBLISHED:+.2f}), seed {result['seed']}, "
        f"{result['device']}; {result['wall_s'] / 60:.1f} min in all (install {install_s:.0f} s, "
        f"tfm run {run_s:.0f} s{', continued' if result['continued'] else ''}); {out}"
    )
    print(
        "gpu-recipe: training's loop, seconds: " + ", ".join(f"{k} {v}" for k, v in split.items())
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = cuda_device()
    if device is None:
        print(
            f"gpu-recipe: no CUDA device visible to {sys.executable} (an NVIDIA GPU and a CUDA "
            "build of torch are needed; set GPU_PYTHON to such a Python)",
            file=sys.stderr,
        )
        return 2
    if args.preflight:
        print(f"gpu-recipe: {device}")
        return 0
    started = time.time()
    workdir = Path(args.workdir or ROOT / "runs" / f"gpu-recipe-seed{args.seed or 1234}").resolve()
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)  # a fresh run, not a resumed or skipped one
    install_s = install(Path(args.venv), args.wheels, args.site)
    if args.install_only:
        print(f"gpu-recipe: {args.venv} ready ({install_s:.0f} s)")
        return 0
    run_s = run_recipe(Path(args.venv), workdir, args.seed, args.mirror, args.set)
    result = result_of(args, device, workdir, install_s, run_s, started)
    write_result(result, Path(args.out), install_s, run_s)
    if not (args.keep or args.set):  # the committed recipe, timed whole: the README's row
        figures.record(
            "recipes",
            "multi30k-published-gpu",
            f"**{result['bleu_tok_lc']:.2f}** test2016 `bleu_tok_lc` beside the published "
            f"{PUBLISHED:.2f}, seed {result['seed']}",
            machine=device,
            time=f"{result['wall_s'] / 60:.1f} min from install to score on one GPU",
        )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
