"""eole (OpenNMT-py's successor) in ``benchmarks/peers`` (and ``benchmarks/gpu.py --peers``):
its config and commands, built from the shared shape and recipe, and what its logs say.

Training is ``eole train`` on the same BPE text with one shared vocabulary (``eole
build_vocab``), batches of ``max_tokens`` tokens accumulated ``update_freq`` times, Adam, the
recipe's schedule, label smoothing and clipping. The schedule is eole's ``noam`` (the paper's:
``learning_rate x d_model^-0.5 x min(step^-0.5, step x warmup^-1.5)``) with ``learning_rate``
scaled so that its peak, at ``warmup``, is the recipe's ``lr``: eole's ``rsqrt`` is
``learning_rate / sqrt(max(step, warmup))``, no warm-up and a peak of ``lr / sqrt(warmup)``.
eole's transformer is pre-norm (its decoder has no post-norm layer style); the shape, biases and
shared embeddings match. Its ``Step N/M; ...`` lines report, per interval, the target tokens a
batch (``bsz: src/tgt/sents``), the sentences and target tokens a second; the first interval is
the warm-up. Decoding is ``eole predict`` with ``report_time``: the encoder's first step and the
steps after it, which sum to its generation time.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from .env import Peer, Recipe, Shape

STEP_LINE = re.compile(
    r"Step\s+(\d+)/\s*\d+;.*?sents:\s*([\d.]+); bsz:\s*([\d.]+)/\s*([\d.]+)/\s*([\d.]+);"
    r"\s*([\d.]+)/\s*([\d.]+) tok/s"
)
TIMES = {
    "step0": re.compile(r"Step 0 time \(s\): ([\d.]+)"),
    "rest": re.compile(r"Subsequent prediction time including all \(s\): ([\d.]+)"),
}


def model_section(shape: Shape) -> dict:
    """eole's ``model`` section: our Transformer's shape in its words."""
    return {
        "architecture": "transformer",
        "hidden_size": shape.d_model,
        "layers": shape.layers,
        "heads": shape.heads,
        "transformer_ff": shape.d_ff,
        "add_qkvbias": True,
        "add_ffnbias": True,
        "share_embeddings": shape.share,
        "share_decoder_embeddings": shape.share,
        "embeddings": {
            "word_vec_size": shape.d_model,
            "position_encoding_type": "SinusoidalConcat",
        },
    }


def config(
    folder: Path,
    text: Path,
    languages: tuple[str, str],
    shape: Shape,
    recipe: Recipe,
    updates: int,
    log_every: int,
    *,
    gpu: bool = False,
    bf16: bool = False,
) -> dict:
    """eole's run config for ``shape`` trained with ``recipe`` for ``updates`` updates, logging
    every ``log_every``, saving only at the end, no validation."""
    src, tgt = languages
    vocab = str(folder / "vocab.shared")
    training = {
        "model_path": str(folder / "model"),
        "train_steps": updates,
        "valid_steps": 10 * updates,  # none before the end
        "save_checkpoint_steps": updates,
        "keep_checkpoint": 1,
        "batch_type": "tokens",
        "batch_size": recipe.max_tokens,
        "accum_count": [recipe.update_freq],
        "accum_steps": [0],
        "normalization": "tokens",
        "optim": "adam",
        "adam_beta1": recipe.adam_betas[0],
        "adam_beta2": recipe.adam_betas[1],
        "adam_eps": recipe.adam_eps,
        "learning_rate": recipe.lr * (shape.d_model * recipe.warmup) ** 0.5,
        "decay_method": "noam",
        "warmup_steps": recipe.warmup,
        "max_grad_norm": recipe.clip_norm,
        "label_smoothing": recipe.label_smoothing,
        "dropout": [shape.dropout],
        "dropout_steps": [0],
        "attention_dropout": [0.0],
        "param_init_method": "xavier_uniform",
        "num_workers": 0 if not gpu else 2,
        "world_size": 1,
        "gpu_ranks": [0] if gpu else [],
    }
    if gpu and bf16:
        training["compute_dtype"] = "bf16"
    return {
        "seed": recipe.seed,
        "report_every": log_every,
        "src_vocab": vocab,
        "tgt_vocab": vocab,
        "share_vocab": True,
        "overwrite": True,
        "data": {
            "corpus_1": {
                "path_src": str(text / f"train.{src}"),
                "path_tgt": str(text / f"train.{tgt}"),
                "transforms": [],
            },
            "valid": {
                "path_src": str(text / f"valid.{src}"),
                "path_tgt": str(text / f"valid.{tgt}"),
                "transforms": [],
            },
        },
        "model": model_section(shape),
        "training": training,
    }


def write_config(
    folder: Path,
    text: Path,
    languages: tuple[str, str],
    shape: Shape,
    recipe: Recipe,
    updates: int,
    log_every: int,
    **device: bool,
) -> Path:
    """``config(...)`` as ``folder/train.yaml``; its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "train.yaml"
    body = config(folder, text, languages, shape, recipe, updates, log_every, **device)
    path.write_text(yaml.safe_dump(body, sort_keys=False), encoding="utf-8")
    return path


def vocab_command(peer: Peer, config_path: Path) -> list[str]:
    """``eole build_vocab`` over the whole training text (``-n_sample -1``) into the config's
    ``src_vocab``."""
    return [
        *peer.module("eole.bin.main"),
        "build_vocab",
        "-config",
        str(config_path),
        "-n_sample",
        "-1",
    ]


def train_command(peer: Peer, config_path: Path) -> list[str]:
    return [*peer.module("eole.bin.main"), "train", "-config", str(config_path)]


def predict_command(
    peer: Peer,
    model: Path,
    source: Path,
    output: Path,
    beam: int,
    max_tokens: int,
    threads: int,
    *,
    gpu: bool = False,
) -> list[str]:
    """``eole predict`` of ``source`` with ``model``: beam ``beam``, batches of ``max_tokens``,
    outputs at most twice the source (eole's ratio cap) and 250 tokens."""
    cmd = [
        *peer.module("eole.bin.main"), "predict", "-model_path", str(model), "-src", str(source),
        "-output", str(output), "-beam_size", str(beam), "-batch_size", str(max_tokens),
        "-batch_type", "tokens", "-report_time",
    ]  # fmt: skip
    return cmd + (["-gpu_ranks", "0", "-world_size", "1"] if gpu else [])


def train_rates(log: str, log_every: int) -> dict[str, float]:
    """Target tokens a second over the ``Step`` intervals after the first (warm-up)."""
    steps = [m for m in map(STEP_LINE.search, log.splitlines()) if m]
    if len(steps) < 2:
        raise ValueError(f"eole logged {len(steps)} training step lines; 2 or more are needed")
    tokens = seconds = 0.0
    for m in steps[1:]:
        sents, per_batch_tgt, per_batch_sents, tgt_rate = (float(m.group(i)) for i in (2, 4, 5, 7))
        batches = round(sents / per_batch_sents)
        interval_tokens = batches * per_batch_tgt
        tokens += interval_tokens
        seconds += interval_tokens / tgt_rate
    timed = log_every * (len(steps) - 1)
    return {
        "target_tokens_per_s": tokens / seconds,
        "target_tokens_per_update": tokens / timed,
        "timed_updates": timed,
        "timed_seconds": seconds,
    }


def predict_rates(log: str) -> dict[str, float]:
    """eole predict's own time: its first step (the encoder with it) and the steps after."""
    found = {k: pattern.search(log) for k, pattern in TIMES.items()}
    if found["rest"] is None:
        raise ValueError("eole predict printed no 'Subsequent prediction time' line")
    seconds = sum(float(m.group(1)) for m in found.values() if m)
    return {"decode_seconds": seconds}


def last_checkpoint(model_path: Path) -> Path:
    """The latest ``step_N`` folder eole saved."""
    steps = sorted(model_path.glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    if not steps:
        raise FileNotFoundError(f"eole saved no step_* folder in {model_path}")
    return steps[-1]


def hypotheses(output: Path) -> list[str]:
    """eole's output lines with the BPE marks removed (Moses-tokenized, lowercased)."""
    from corpora.pretokenize import join_pieces

    return [join_pieces(line) for line in output.read_text(encoding="utf-8").splitlines()]
