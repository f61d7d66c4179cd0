"""fairseq in ``benchmarks/peers`` (and ``benchmarks/gpu.py --peers``): its commands, built
from the shared shape and recipe, and what its logs say.

Training is ``fairseq-train`` as a fairseq user runs the published recipe (``--arch transformer``
with the tiny shape's sizes, ``--share-all-embeddings``, label-smoothed cross-entropy, Adam,
inverse-sqrt, ``--max-tokens 4096 --update-freq 2``) for a fixed number of updates, logged as
JSON every ``log_interval`` updates. Its ``train_inner`` lines give, per interval, ``wpb`` (target
tokens an update) and ``wps`` (target tokens a second over the interval's wall time, from the
previous log line to this one), so an interval lasted ``wpb x updates / wps`` seconds; the first
interval is the warm-up and is not counted. Decoding is ``fairseq-generate`` on the binarized
test set; its ``D-`` lines hold the hypotheses and its last line the sentences, tokens and
seconds of generation alone.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .env import Peer, Recipe, Shape

TRAIN_LINE = re.compile(r"\| train_inner \| (\{.*\})\s*$")
GENERATED = re.compile(
    r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s "
    r"\(([\d.]+) sentences/s, ([\d.]+) tokens/s\)"
)
BLEU_LINE = re.compile(r"BLEU4? = ([\d.]+)")


def preprocess_command(
    peer: Peer,
    text: Path,
    languages: tuple[str, str],
    dest: Path,
    workers: int = 2,
    splits: tuple[str, ...] = ("train", "valid", "test"),
) -> list[str]:
    """``fairseq-preprocess`` of ``text/<split>.<lang>`` with one dictionary for both languages
    (shared embeddings)."""
    src, tgt = languages
    cmd = [
        *peer.module("fairseq_cli.preprocess"),
        "--source-lang", src, "--target-lang", tgt,
        "--destdir", str(dest),
        "--joined-dictionary",
        "--workers", str(workers),
    ]  # fmt: skip
    for split in splits:
        cmd += [f"--{split}pref", str(text / split)]
    return cmd


def schedule_flags(recipe: Recipe, updates: int) -> list[str]:
    """fairseq-train's learning-rate scheduler for ``recipe`` over ``updates`` updates."""
    warmup = ["--warmup-updates", str(recipe.warmup)]
    if recipe.decay == "inverse_sqrt":
        return ["--lr-scheduler", "inverse_sqrt", *warmup, "--warmup-init-lr", "1e-07"]
    if recipe.decay == "linear":
        return ["--lr-scheduler", "polynomial_decay", *warmup, "--power", "1",
                "--end-learning-rate", "0", "--total-num-update", str(updates)]  # fmt: skip
    raise ValueError(f"decay {recipe.decay!r}: fairseq's flags for it are not known here")


def train_command(
    peer: Peer,
    data_bin: Path,
    save_dir: Path,
    shape: Shape,
    recipe: Recipe,
    updates: int,
    log_interval: int,
    *,
    languages: tuple[str, str] = ("en", "de"),
    gpu: bool = False,
    fp16: bool = False,
    rank: tuple[int, int, int] | None = None,
) -> list[str]:
    """``fairseq-train`` of ``shape`` with ``recipe`` for ``updates`` updates; no validation
    (a last checkpoint only), JSON log lines every ``log_interval`` updates. On CPU
    (``gpu=False``) its data loading stays in the training process (``--num-workers 0``).

    ``rank`` ``(rank, processes, port)`` (CPU): one of ``processes`` fairseq-train processes on
    this machine, fairseq's own data parallelism, their gradients summed over gloo (its
    ``legacy_ddp``: torch's DDP takes no device ids for a CPU model), met at 127.0.0.1:``port``;
    each accumulates ``update_freq / processes`` batches, so an update holds the recipe's
    tokens as in one process. fairseq 0.12.3 cannot take torchrun's rendezvous on a machine
    without CUDA (it divides the rank by the GPU count), so each process is told its rank."""
    processes = rank[1] if rank else 1
    if recipe.update_freq % processes:
        raise ValueError(f"update_freq {recipe.update_freq} is not split by {processes} processes")
    d, ff, layers, heads = str(shape.d_model), str(shape.d_ff), str(shape.layers), str(shape.heads)
    cmd = [
        *peer.module("fairseq_cli.train"), str(data_bin),
        "--task", "translation", "--source-lang", languages[0], "--target-lang", languages[1],
        "--arch", "transformer",
        "--encoder-layers", layers, "--decoder-layers", layers,
        "--encoder-embed-dim", d, "--decoder-embed-dim", d,
        "--encoder-ffn-embed-dim", ff, "--decoder-ffn-embed-dim", ff,
        "--encoder-attention-heads", heads, "--decoder-attention-heads", heads,
        "--dropout", str(shape.dropout),
        "--criterion", "label_smoothed_cross_entropy",
        "--label-smoothing", str(recipe.label_smoothing),
        "--optimizer", "adam", "--adam-betas", str(tuple(recipe.adam_betas)),
        "--adam-eps", str(recipe.adam_eps),
        "--lr", str(recipe.lr), *schedule_flags(recipe, updates),
        "--clip-norm", str(recipe.clip_norm),
        "--max-tokens", str(recipe.max_tokens),
        "--update-freq", str(recipe.update_freq // processes),
        "--max-update", str(updates),
        "--seed", str(recipe.seed),
        "--save-dir", str(save_dir),
        "--disable-validation", "--no-epoch-checkpoints",
        "--log-format", "json", "--log-interval", str(log_interval),
    ]  # fmt: skip
    if shape.share:
        cmd.append("--share-all-embeddings")
    if gpu:
        # fairseq 0.12's --bf16 implies --tpu (torch_xla); on a GPU its mixed precision is --fp16
        # (fp16 weights and activations, a float32 master copy, dynamic loss scaling)
        cmd += ["--fp16"] if fp16 else []
    else:
        cmd += ["--cpu", "--num-workers", "0"]
    if rank:
        cmd += ["--distributed-init-method", f"tcp://127.0.0.1:{rank[2]}",
                "--distributed-rank", str(rank[0]), "--distributed-world-size", str(processes),
                "--distributed-no-spawn", "--distributed-backend", "gloo",
                "--ddp-backend", "legacy_ddp"]  # fmt: skip
    return cmd


def generate_command(
    peer: Peer,
    data_bin: Path,
    checkpoint: Path,
    beam: int,
    max_tokens: int,
    max_len_b: int,
    *,
    languages: tuple[str, str] = ("en", "de"),
    gpu: bool = False,
    remove_bpe: bool | str = True,
    subset: str = "test",
) -> list[str]:
    """``fairseq-generate`` of the ``subset`` split with ``checkpoint``: beam ``beam``, batches
    of ``max_tokens``, outputs at most the source's length + ``max_len_b`` tokens before their
    EOS (``--max-len-a 1``; fairseq's source length is its batch's width, EOS included); BPE
    marks removed (``remove_bpe=False``: kept, the dictionary's symbols as they were generated;
    a string: that kind of marks, e.g. ``sentencepiece``)."""
    cmd = [
        *peer.module("fairseq_cli.generate"), str(data_bin),
        "--task", "translation", "--source-lang", languages[0], "--target-lang", languages[1],
        "--gen-subset", subset, "--path", str(checkpoint),
        "--beam", str(beam), "--max-tokens", str(max_tokens),
        "--max-len-a", "1", "--max-len-b", str(max_len_b),
    ]  # fmt: skip
    if remove_bpe:
        cmd += ["--remove-bpe"] + ([remove_bpe] if isinstance(remove_bpe, str) else [])
    return cmd + ([] if gpu else ["--cpu"])


def train_rates(log: str, updates_per_line: int) -> dict[str, float]:
    """Target tokens a second over the ``train_inner`` intervals after the first (warm-up):
    their target tokens over their seconds; the intervals and updates counted."""
    lines = [json.loads(m.group(1)) for m in map(TRAIN_LINE.search, log.splitlines()) if m]
    if len(lines) < 2:
        raise ValueError(f"fairseq logged {len(lines)} train_inner lines; 2 or more are needed")
    tokens = seconds = 0.0
    for stats in lines[1:]:
        interval_tokens = float(stats["wpb"]) * updates_per_line
        tokens += interval_tokens
        seconds += interval_tokens / float(stats["wps"])
    return {
        "target_tokens_per_s": tokens / seconds,
        "target_tokens_per_update": tokens / (updates_per_line * (len(lines) - 1)),
        "timed_updates": updates_per_line * (len(lines) - 1),
        "timed_seconds": seconds,
        "last_loss": float(lines[-1]["loss"]),
    }


def generate_rates(log: str) -> dict[str, float]:
    """Sentences, tokens and seconds of ``fairseq-generate``'s own timer (generation alone)."""
    found = GENERATED.search(log)
    if found is None:
        raise ValueError("fairseq-generate printed no 'Translated N sentences' line")
    sentences, tokens = (int(found.group(i).replace(",", "")) for i in (1, 2))
    bleu = BLEU_LINE.search(log)
    return {
        "sentences": sentences,
        "output_tokens": tokens,
        "decode_seconds": float(found.group(3)),
        "bleu_tok_lc": float(bleu.group(1)) if bleu else None,
    }


def hypotheses(log: str) -> list[str]:
    """The best hypothesis of each test sentence, in the test set's order, from
    fairseq-generate's ``D-<id>`` lines (Moses-tokenized and lowercased as its input; BPE
    removed unless ``generate_command`` kept it)."""
    found = {}
    for line in log.splitlines():
        if line.startswith("D-"):
            key, _, rest = line.partition("\t")
            found[int(key[2:])] = rest.partition("\t")[2]
    return [found[i] for i in range(len(found))]
