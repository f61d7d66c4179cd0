"""The peers on a GPU (``benchmarks/gpu.py --peers-wheels DIR``, issue 58 item 4): fairseq
(``--fp16``: its ``--bf16`` means a TPU) and eole (``compute_dtype: bf16``) train Transformer
base and big on the synthetic corpus our rows of ``gpu.py`` train on, one after the other on the
same GPU, with the same 25k-token updates: target tokens/s and MFU (``transformer_core/flops.py``'s
FLOPs of the same rows against the device's bf16 peak) beside ours.

The GPU machine has no package index and its own CUDA torch, so the peers travel as files:

    python benchmarks/gpu_peers.py wheels --out .whl/peers [--have have.txt]   # here

downloads, for the GPU machine's Python (``--python-version``, 3.12), each distribution the
peers' commands import in their environments here (``.peers/``, made by ``make bench-peers``),
less torch and its kin (the GPU machine's own are used) and less what ``--have`` says it holds:
wheels where the index has them, else sources (fairseq-fixed's, which builds there against that
torch, no build isolation). ``--list`` prints them (about 60 names; ctranslate2, scipy and
scikit-learn alone pass the 64 MiB a device call carries, so on a bare machine the folder goes
in two calls or the peers wait for a machine that has them). ``gpu.py --peers-wheels
.whl/peers`` then makes one environment a peer under ``.peers-gpu/`` that sees the machine's
Python and its torch (``--system-site-packages``) and installs every file of the folder into it,
with no index and no resolving. A peer that cannot be installed or run is one
row that says why. Data: the synthetic rows written as text, ids as words (``w123``), the
same 37k-id vocabulary once binarized (fairseq-preprocess) or counted (eole build_vocab).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
from peers import eole, fairseq
from peers.env import PEERS_DIR, REQUIREMENTS, ROOT, Peer, Recipe, Shape, last_line, shape_of

GPU_PEERS_DIR = ROOT / ".peers-gpu"
# The torch family: the GPU machine's own CUDA torch and what comes with it, never carried.
TORCH_FAMILY = {
    "torch", "triton", "filelock", "fsspec", "jinja2", "markupsafe", "networkx", "sympy",
    "mpmath", "typing-extensions", "setuptools", "pip", "torchaudio", "torchcodec",
}  # fmt: skip
GPU_RECIPE = Recipe(max_tokens=25_000, update_freq=1, lr=7e-4, warmup=4000, threads=8)
"""One 25k-token batch an update, as ``gpu.py``'s rows; lr and warm-up do not change the speed."""


def write_text(corpus: Any, folder: Path, rows: int, valid_rows: int = 500) -> Path:
    """``folder/{train,valid}.{en,de}``: the first ``rows`` rows of a ``TokenData`` split, each id
    a word ``w<id>`` (the EOS at the end of each row left out: the toolkits add their own)."""
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, take in (("train", range(rows)), ("valid", range(valid_rows))):
        src, tgt = corpus.ids(np.fromiter(take, dtype=np.int64))
        for lang, side in (("en", src), ("de", tgt)):
            lines = [" ".join(f"w{i}" for i in row[:-1]) for row in side]
            (folder / f"{prefix}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def flops_per_target(config: Any, vocab: int, corpus: Any, rows: int) -> float:
    """Training FLOPs a target token over the rows the peers train on (3x the forward)."""
    from transformer_core.flops import train_flops

    take = np.arange(rows)
    src_lens, tgt_lens = corpus.src_lens[take], corpus.tgt_lens[take]
    return train_flops(config, vocab, src_lens, tgt_lens) / float(tgt_lens.sum())


# ------------------------------------------------------------------------------ environments


def ensure_gpu(name: str, wheels: Path, root: Path = GPU_PEERS_DIR) -> Peer:
    """``root/name`` over this Python and its torch, the peer installed from ``wheels`` alone;
    ``problem`` says in one line what failed."""
    import torch

    venv, log = root / name, root / f"{name}.log"
    peer = Peer(name, venv)
    if not wheels.is_dir():
        peer.problem = f"{name}: no wheels folder {wheels} (gpu_peers.py wheels makes it)"
        return peer
    root.mkdir(parents=True, exist_ok=True)
    pin = root / "torch-constraint.txt"  # the machine's torch stays: pip must not replace it
    pin.write_text(f"torch=={torch.__version__}\n", encoding="utf-8")
    # Every file of the folder, without resolving: it holds what the peers' commands import,
    # not every dependency their metadata names (eole's name spacy, pandas, pyarrow).
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    pip += ["-c", str(pin), "--no-build-isolation"]
    files = sorted(str(f) for f in wheels.iterdir() if f.suffix in (".whl", ".gz", ".zip"))
    build = [f for f in files if Path(f).name.lower().startswith(("cython-", "wheel-"))]
    steps = [
        [sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
        pip + build if build else None,  # fairseq-fixed's source builds with them
        pip + [f for f in files if f not in build],
    ]
    with log.open("a", encoding="utf-8") as sink:
        for cmd in filter(None, steps):
            if subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT).returncode != 0:
                peer.problem = f"{name}: installing from {wheels} failed ({log})"
                return peer
    check = subprocess.run(
        [str(peer.bin / "python"), "-c", "import torch; assert torch.cuda.is_available()"],
        capture_output=True,
        text=True,
    )
    if check.returncode != 0:
        peer.problem = f"{name}: its environment sees no CUDA torch: {last_line(check.stderr)}"
    return peer


IMPORTS = {
    "fairseq": ("fairseq_cli.train", "fairseq_cli.preprocess", "fairseq_cli.generate"),
    "eole": ("eole.bin",),  # and every command module under it
}
"""What each peer's commands import: the packages carried are the distributions of these."""
BUILD_ALSO = {"fairseq": ("Cython",)}
"""What a peer's build needs besides its imports (fairseq-fixed is built from source there)."""
DISTRIBUTIONS = """
import importlib, importlib.metadata as md, pkgutil, sys
for name in sys.argv[1:]:
    module = importlib.import_module(name)
    if name.endswith(".bin"):
        for found in pkgutil.walk_packages(module.__path__, name + "."):
            try:
                importlib.import_module(found.name)
            except Exception:
                pass
tops = {m.split(".")[0] for m in list(sys.modules)} - set(sys.stdlib_module_names)
owners = md.packages_distributions()
for dist in sorted({d for top in tops for d in owners.get(top, [])}):
    print(dist + "==" + md.version(dist))
"""
"""Run in a peer's environment: ``name==version`` of each distribution its commands import."""


def wheel_list(peers_dir: Path, have: set[str]) -> list[str]:
    """``name==version`` of every distribution the peers' commands import in their environments
    here (and what their builds need), less the torch family and what the GPU machine ``have``s:
    not the whole environment (eole's pulls spacy, pandas and pyarrow, which its commands never
    import)."""
    from packaging.utils import canonicalize_name

    wanted: dict[str, str] = {}
    for name in REQUIREMENTS:
        python = peers_dir / name / "bin" / "python"
        found = subprocess.run(
            [str(python), "-c", DISTRIBUTIONS, *IMPORTS[name]],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        frozen = subprocess.run(
            [str(python), "-m", "pip", "list", "--format=freeze"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        build = {canonicalize_name(b) for b in BUILD_ALSO.get(name, ())}
        found += [line for line in frozen if canonicalize_name(line.partition("==")[0]) in build]
        for line in found:
            package, _, version = line.partition("==")
            key = canonicalize_name(package)
            if version and key not in TORCH_FAMILY and key not in have:
                wanted[key] = f"{package}=={version.split('+')[0]}"
    return sorted(wanted.values(), key=str.lower)


# ------------------------------------------------------------------------------ training


def train_row(
    peer: Peer, size: str, shape: Shape, text: Path, work: Path, steps: int, flops: float, peak
) -> dict[str, Any]:
    """``2 x steps`` updates of ``shape`` in ``peer`` (the first ``steps`` the warm-up): its
    target tokens/s, TFLOP/s and MFU, or ``problem``."""
    row: dict[str, Any] = {"model": size, "toolkit": peer.name}
    if peer.problem:
        return row | {"problem": peer.problem}
    folder = work / f"{peer.name}-{size}"
    env = peer.env(GPU_RECIPE.threads)
    try:
        if peer.name == "fairseq":
            rates = _fairseq(peer, shape, text, folder, steps, env)
        else:
            rates = _eole(peer, shape, text, folder, steps, env)
    except RuntimeError as err:
        return row | {"problem": str(err)}
    rate = rates["target_tokens_per_s"]
    return row | {
        "tgt_tokens/s": rate,
        "TFLOP/s": rate * flops / 1e12,
        "MFU": rate * flops / peak if peak else None,
        "tgt_tokens/update": rates["target_tokens_per_update"],
    }


def rows(
    wheels: Path, sizes: list[str], corpus: Any, vocab: int, steps: int, out: Path, ours: list[dict]
) -> list[dict]:
    """Every peer on every size (``2 x steps`` updates, the first half the warm-up), beside our
    default rows of the same sizes from ``ours`` (gpu.py's training section)."""
    import torch

    from transformer_core import presets
    from transformer_core.flops import peak_flops

    peak = peak_flops(torch.cuda.get_device_name(0))
    text = write_text(corpus, out / "text", rows=min(len(corpus), 200_000))
    peers = [ensure_gpu(name, wheels) for name in REQUIREMENTS]
    table = []
    for size in sizes:
        config = presets.get(size)
        flops = flops_per_target(config, vocab, corpus, min(len(corpus), 200_000))
        for row in ours:
            if row["model"] == size and not (row["compile"] or row["fused_loss"]):
                table.append({"model": size, "toolkit": "ours", "tgt_tokens/s": row["tgt_tokens/s"],
                              "TFLOP/s": row["TFLOP/s"], "MFU": row["MFU"]})  # fmt: skip
        for peer in peers:
            table.append(train_row(peer, size, shape_of(config), text, out, steps, flops, peak))
    return table


def _run(cmd: list[str], env: dict[str, str], log: Path) -> str:
    log.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log.write_text(" ".join(cmd) + "\n\n" + done.stdout, encoding="utf-8")
    if done.returncode != 0:
        raise RuntimeError(
            f"{Path(cmd[2]).name if len(cmd) > 2 else cmd[0]}: {last_line(done.stdout)}"
        )
    return done.stdout


def _fairseq(peer: Peer, shape: Shape, text: Path, folder: Path, steps: int, env) -> dict:
    data_bin = folder.parent / "fairseq-data-bin"
    if not (data_bin / "dict.en.txt").is_file():
        cmd = fairseq.preprocess_command(
            peer, text, ("en", "de"), data_bin, workers=8, splits=("train", "valid")
        )
        _run(cmd, env, folder / "preprocess.log")
    cmd = fairseq.train_command(
        peer,
        data_bin,
        folder / "checkpoints",
        shape,
        GPU_RECIPE,
        2 * steps,
        steps,
        gpu=True,
        bf16=True,
    )
    return fairseq.train_rates(_run(cmd, env, folder / "train.log"), steps)


def _eole(peer: Peer, shape: Shape, text: Path, folder: Path, steps: int, env) -> dict:
    config = eole.write_config(
        folder, text, ("en", "de"), shape, GPU_RECIPE, 2 * steps, steps, gpu=True, fp16=True
    )
    _run(eole.vocab_command(peer, config), env, folder / "vocab.log")
    return eole.train_rates(
        _run(eole.train_command(peer, config), env, folder / "train.log"), steps
    )


def main(argv: list[str] | None = None) -> int:
    """``wheels``: the folder of files the GPU machine installs the peers from."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["wheels"])
    parser.add_argument("--out", type=Path, default=ROOT / ".whl" / "peers")
    parser.add_argument("--have", type=Path, help="the GPU machine's `pip list --format=freeze`")
    parser.add_argument("--python-version", default="3.12")
    parser.add_argument("--list", action="store_true", help="print what it would download")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_bundle import PLATFORMS, read_have

    have = read_have(args.have) if args.have else set()
    missing = [n for n in REQUIREMENTS if not (PEERS_DIR / n / "bin" / "python").exists()]
    if missing:
        print(
            f"gpu-peers: no .peers/{missing[0]} here (make bench-peers makes it)", file=sys.stderr
        )
        return 2
    wanted = wheel_list(PEERS_DIR, have)
    if args.list:
        print("\n".join(wanted))
        return 0
    platform = [a for p in PLATFORMS for a in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(args.out)]
    cmd += ["--python-version", args.python_version, "--implementation", "cp", *platform]
    code = subprocess.run(cmd + wanted).returncode
    if code != 0:
        print(f"gpu-peers: pip download failed (exit {code})", file=sys.stderr)
        return code
    mib = sum(p.stat().st_size for p in args.out.iterdir()) / 2**20
    print(f"gpu-peers: {len(wanted)} packages in {args.out}, {mib:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
