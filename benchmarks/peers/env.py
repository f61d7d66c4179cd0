"""What ``benchmarks/peers`` shares between the toolkits: the model shape and recipe every one
of them trains, and each peer's own Python environment.

A peer (fairseq, eole) lives in a virtual environment of its own under ``.peers/<name>`` (git
ignores it), never in ``.venv`` and never a dependency of the package: the CPU torch wheel the
Makefile pins is installed first and every later pip step is constrained to it, so that pip
pulls no CUDA build. fairseq is built without pip's build isolation: its build requirements
name an unpinned torch, which an isolated build would fetch (a CUDA build, several GB). On a GPU
machine with no package index the same packages come from a folder of files
(``benchmarks/gpu_peers.py``), over that machine's own CUDA torch.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEERS_DIR = ROOT / ".peers"
TORCH = "torch==2.13.0"  # the Makefile's pin: a local CPU wheel here, never a CUDA download
BUILD = {"fairseq": ("setuptools", "wheel", "cython", "numpy>=1.21.3")}
"""What a peer's build needs in its environment (installed before it, no build isolation)."""
REQUIREMENTS = {
    "fairseq": ("fairseq-fixed==0.12.3.1",),  # fairseq 0.12.2 itself does not build on 3.11
    # eole 0.6.4 imports aiohttp (its load-test tool, imported by its command line) without
    # declaring it: without it `eole` stops with ModuleNotFoundError.
    "eole": ("eole==0.6.*", "aiohttp"),
}
"""What pip installs for each peer (after torch)."""
ENTRY = {"fairseq": "fairseq-train", "eole": "eole"}
"""A console script whose presence says the peer is installed."""
MODULES = {"fairseq": "fairseq_cli.train", "eole": "eole.bin.main"}
"""A module each peer's commands run, imported to check that the peer runs here."""


@dataclass(frozen=True, kw_only=True)
class Shape:
    """The Transformer every toolkit builds (the published Multi30k recipe's by default)."""

    layers: int = 4
    """Encoder and decoder layers each."""
    d_model: int = 128
    d_ff: int = 256
    heads: int = 4
    dropout: float = 0.3
    share: bool = True
    """One matrix for source and target embeddings and the output projection."""


def shape_of(config) -> Shape:
    """The peers' ``Shape`` of one of our ``ModelConfig`` presets."""
    return Shape(
        layers=config.n_layers,
        d_model=config.d_model,
        d_ff=config.d_ff,
        heads=config.n_heads,
        dropout=config.dropout,
        share=config.share_embeddings,
    )


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """How every toolkit trains: the same tokens an update, schedule and loss."""

    max_tokens: int = 4096
    """Padded tokens of the longer side per batch (fairseq's --max-tokens)."""
    update_freq: int = 2
    """Batches accumulated into one update: 2 x 4,096 = 8,192 tokens an update."""
    lr: float = 5e-3
    """Peak learning rate, reached after ``warmup`` updates, then ``decay``."""
    warmup: int = 2000
    decay: str = "inverse_sqrt"
    """After the peak: inverse_sqrt (the paper's), or linear to zero at the run's last update
    (fairseq's polynomial_decay at power 1)."""
    label_smoothing: float = 0.1
    clip_norm: float = 25.0
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-8
    seed: int = 1234
    threads: int = 2
    """torch intra-op threads of a peer's process (and OMP/MKL's)."""


@dataclass
class Peer:
    """A peer toolkit's environment: its ``bin`` folder, or why it is not usable."""

    name: str
    venv: Path
    problem: str | None = None
    """One line: why it could not be installed or run (None: usable)."""
    notes: list[str] = field(default_factory=list)

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    def module(self, name: str) -> list[str]:
        """The command that runs module ``name`` in this environment (``python -m``: an
        environment unpacked from an archive has no console scripts)."""
        return [str(self.bin / "python"), "-m", name]

    def env(self, threads: int) -> dict[str, str]:
        """The environment its commands run in: ``threads`` threads, nothing of ours on the path."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(
            OMP_NUM_THREADS=str(threads),
            MKL_NUM_THREADS=str(threads),
            PATH=f"{self.bin}{os.pathsep}{env.get('PATH', '')}",
            PYTHONUNBUFFERED="1",
            # fairseq 0.12 loads its own checkpoints (argparse namespaces inside) with torch.load's
            # defaults, which torch >= 2.6 restricts to plain tensors
            TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1",
        )
        return env


def ensure(name: str, root: Path = PEERS_DIR, install: bool = True, torch: str = TORCH) -> Peer:
    """``root/name`` as a usable environment: made and installed when missing (``install``),
    then its commands' module imported; ``problem`` names in one line what failed (pip's log
    stays in ``root/name.log``)."""
    venv = root / name
    peer = Peer(name, venv)
    if not (venv / "bin" / ENTRY[name]).exists():
        if not install:
            peer.problem = f"{name}: not installed in {venv} (run without --no-install)"
            return peer
        peer.problem = _install(name, venv, root, torch)
        if peer.problem:
            return peer
    check = subprocess.run(
        [str(peer.bin / "python"), "-c", f"import {MODULES[name]}"],
        env=peer.env(1),
        capture_output=True,
        text=True,
    )
    if check.returncode != 0:
        peer.problem = f"{name}: import {MODULES[name]} failed: {last_line(check.stderr)}"
    return peer


def _install(name: str, venv: Path, root: Path, torch: str) -> str | None:
    """A fresh ``venv`` with torch, then the peer; None, or what failed in one line."""
    log = root / f"{name}.log"
    root.mkdir(parents=True, exist_ok=True)
    constraint = root / "torch-constraint.txt"
    constraint.write_text(torch + "\n", encoding="utf-8")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-c", str(constraint)]
    steps = [("venv", [sys.executable, "-m", "venv", str(venv)]), (torch, pip + [torch])]
    if name in BUILD:
        steps.append((" ".join(BUILD[name]), pip + list(BUILD[name])))
        steps.append(
            (" ".join(REQUIREMENTS[name]), pip + ["--no-build-isolation", *REQUIREMENTS[name]])
        )
    else:
        steps.append((" ".join(REQUIREMENTS[name]), pip + list(REQUIREMENTS[name])))
    with log.open("a", encoding="utf-8") as sink:
        for what, cmd in steps:
            print(f"  {name}: {what}", flush=True)
            code = subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT).returncode
            if code != 0:
                return f"{name}: installing {what} failed (exit {code}; {log})"
    if not (venv / "bin" / ENTRY[name]).exists():
        return f"{name}: installed but {ENTRY[name]} is missing from {venv / 'bin'}"
    return None


def last_line(text: str) -> str:
    """The last non-empty line of a command's output (its error, usually), shortened."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"
