"""Translate stage: beam search over the test set with a Ray Data actor pool.

The driver encodes the test set, sorts it by length and cuts it into token-budget batches
(``decode.max_tokens_per_batch`` source tokens); each planned batch is one Ray Data row. A pool
of ``decode.num_actors`` actors (one GPU each when the cluster has GPUs) loads the model and
the tokenizer once and decodes whole batches. Every result carries its row index, so the output
file's line i is always the translation of input line i.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tasks.artifacts import StageError, read_manifest, run_stage
from tasks.config import DecodeConfig, RunConfig, to_dict
from tasks.translator import (
    Translator,
    encode_texts,
    model_file,
    plan_decode_batches,
    restore_order,
)

log = logging.getLogger(__name__)

STAGE = "translate"
ATTENTION_PLOT = "attention.png"


def decode_config(config: RunConfig) -> DecodeConfig:
    """``config.decode``; the parsing pipeline takes beam, alpha and offset from ``parsing``
    (the paper: 21, 0.3, input + 300)."""
    if config.data.source == "treebank":
        p = config.parsing
        return dataclasses.replace(
            config.decode, beam_size=p.beam_size, alpha=p.alpha, max_len_offset=p.max_len_offset
        )
    return config.decode


def stage_config(config: RunConfig, split: str = "test") -> dict[str, Any]:
    """What the stage fingerprints besides its inputs."""
    return {"decode": to_dict(decode_config(config)), "pair": config.data.pair, "split": split}


def output_dir(config: RunConfig, split: str = "test") -> Path:
    """``<root>/translate`` for the test set, ``<root>/translate-<split>`` for another split."""
    return config.root / (STAGE if split == "test" else f"{STAGE}-{split}")


def languages(config: RunConfig) -> tuple[str, str]:
    """(source, target) language codes from ``data.pair``."""
    src, _, tgt = config.data.pair.partition("-")
    return src, tgt


def read_lines(path: Path) -> list[str]:
    """One segment per line (only ``\\n`` ends a line; a trailing ``\\r`` is dropped)."""
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line.rstrip("\n").rstrip("\r") for line in f]


def translate_texts(
    model_dir: str | Path,
    tokenizer_dir: str | Path,
    texts: Sequence[str],
    decode_cfg: DecodeConfig | None = None,
) -> list[str]:
    """Translate in this process (no Ray): the reference the distributed stage must equal."""
    return Translator.load(model_dir, tokenizer_dir, decode_cfg or DecodeConfig()).translate(texts)


class BatchTranslator:
    """Ray Data actor: loads the model and tokenizer once, decodes planned batches.

    Each input row is one planned batch (``idx``: row indices, ``src_ids``: their token ids);
    the output has one row per sentence: ``idx``, ``hyp`` (text), ``hyp_tokens`` and ``seconds``
    (its share of its batch's decoding time).
    """

    def __init__(self, model_path: str, tokenizer_dir: str, decode: dict[str, Any]):
        self.translator = Translator.load(model_path, tokenizer_dir, DecodeConfig(**decode))

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        idx: list[int] = []
        hyps: list[str] = []
        n_tokens: list[int] = []
        seconds: list[float] = []
        for rows, src_ids in zip(batch["idx"], batch["src_ids"], strict=True):
            started = time.perf_counter()
            out = self.translator.translate_batch([[int(t) for t in seq] for seq in src_ids])
            idx.extend(int(i) for i in rows)
            hyps.extend(self.translator.detokenize(out))
            n_tokens.extend(len(seq) for seq in out)
            seconds.extend([(time.perf_counter() - started) / len(rows)] * len(rows))
        return {
            "idx": np.asarray(idx, dtype=np.int64),
            "hyp": np.asarray(hyps, dtype=object),
            "hyp_tokens": np.asarray(n_tokens, dtype=np.int64),
            "seconds": np.asarray(seconds, dtype=np.float64),
        }


def translate_distributed(
    model_path: Path,
    tokenizer_dir: Path,
    src_ids: Sequence[Sequence[int]],
    decode: DecodeConfig,
    ray_config: Any = None,
) -> tuple[list[str], list[int], dict[str, Any]]:
    """Decode ``src_ids`` with a Ray Data actor pool; (texts, output token counts, run info),
    in input order."""
    import ray

    from tasks.runtime import ensure_ray

    ensure_ray(ray_config)
    batches = plan_decode_batches([len(s) for s in src_ids], decode.max_tokens_per_batch)
    items = [
        {"idx": rows.tolist(), "src_ids": [list(map(int, src_ids[i])) for i in rows]}
        for rows in batches
    ]
    cluster = ray.cluster_resources()
    gpus = int(cluster.get("GPU", 0))
    resources: dict[str, Any] = {}
    # One GPU (or one CPU) per actor; more actors than the cluster holds would wait forever.
    if gpus:
        actors = min(decode.num_actors, gpus)
        resources["num_gpus"] = 1
    else:
        actors = max(1, min(decode.num_actors, int(cluster.get("CPU", 1))))
    if actors != decode.num_actors:
        log.warning(
            "translate: %d actors instead of %d (cluster resources)", actors, decode.num_actors
        )
    ds = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
        BatchTranslator,
        fn_constructor_kwargs={
            "model_path": str(model_path),
            "tokenizer_dir": str(tokenizer_dir),
            "decode": to_dict(decode),
        },
        batch_size=1,  # one planned batch per call: the plan already holds the token budget
        compute=ray.data.ActorPoolStrategy(size=actors),
        batch_format="numpy",
        **resources,
    )
    idx: list[int] = []
    hyps: list[str] = []
    counts: list[int] = []
    busy = 0.0
    for out in ds.iter_batches(batch_size=None, batch_format="numpy"):
        idx.extend(int(i) for i in out["idx"])
        hyps.extend(str(h) for h in out["hyp"])
        counts.extend(int(c) for c in out["hyp_tokens"])
        busy += float(out["seconds"].sum())
    # restore_order checks every row came back exactly once.
    texts = restore_order([idx], [hyps], len(src_ids))
    n_tokens = restore_order([idx], [counts], len(src_ids))
    info = {
        "actors": actors,
        "gpus_per_actor": 1 if gpus else 0,
        "batches": len(batches),
        "actor_decode_seconds": round(busy, 3),
    }
    return texts, n_tokens, info


def plot_attention(
    weights: Path,
    tokenizer_dir: Path,
    src_ids: Sequence[Sequence[int]],
    hyps: Sequence[str],
    path: Path,
    *,
    n: int = 4,
    max_src: int = 30,
    max_tgt: int = 40,
) -> int:
    """Heat maps of the last decoder layer's encoder-decoder attention (mean over heads) for the
    first ``n`` test sentences short enough to read (pieces on the axes); how many were drawn.
    ``src_ids`` are the encoded sources, ``hyps`` their translations as text."""
    import torch
    from matplotlib.figure import Figure

    from tasks import tokenizer as tokenizer_lib
    from transformer_core import checkpoint

    tok = tokenizer_lib.load(Path(tokenizer_dir))
    picked = []
    for src, hyp in zip(src_ids, hyps, strict=True):
        if not 2 <= len(src) <= max_src:
            continue
        tgt = encode_texts(tok, [hyp])[0]
        if 2 <= len(tgt) <= max_tgt:
            picked.append((list(src), tgt))
        if len(picked) == n:
            break
    if not picked:
        log.info("translate: no test sentence short enough for the attention plot")
        return 0
    model = checkpoint.load_model(weights, None, map_location="cpu")
    fig = Figure(figsize=(6 * len(picked), 6))
    axes = fig.subplots(1, len(picked), squeeze=False)[0]
    for ax, (src, tgt) in zip(axes, picked, strict=True):
        tgt_in = [model.config.bos_id] + tgt[:-1]  # the decoder input that predicts tgt
        maps = model.cross_attention(torch.tensor([src]), torch.tensor([tgt_in]))
        w = maps[-1][0].mean(dim=0).numpy()  # (T, S), last layer, mean over heads
        ax.imshow(w, cmap="viridis", aspect="auto", vmin=0.0, vmax=1.0)
        ax.set_xticks(range(len(src)), [tok.sp.id_to_piece(i) for i in src], rotation=90, fontsize=7)
        ax.set_yticks(range(len(tgt)), [tok.sp.id_to_piece(i) for i in tgt], fontsize=7)
        ax.set_xlabel("source pieces")
        ax.set_ylabel("output pieces")
    fig.suptitle(f"encoder-decoder attention, layer {model.config.n_layers} (mean of heads)")
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={"Software": None})
    return len(picked)


def run(
    config: RunConfig,
    inputs: Mapping[str, Path],
    *,
    force: bool = False,
    split: str = "test",
) -> Path:
    """Translate ``<download>/<split>.<src>`` into ``hyp.<tgt>`` (one line per input line)."""
    src_lang, tgt_lang = languages(config)
    decode = decode_config(config)
    average, tokenizer_dir, download = (
        Path(inputs[k]) for k in ("average", "tokenizer", "download")
    )

    def build(tmp: Path) -> dict[str, Any]:
        source_file = download / f"{split}.{src_lang}"
        if not source_file.is_file():
            raise StageError(f"translate: source file {source_file} does not exist")
        texts = read_lines(source_file)
        if not texts:
            raise StageError(
                f"translate: {source_file} is empty (0 segments); nothing to translate"
            )
        weights = model_file(average)
        if not weights.is_file():
            raise StageError(
                f"translate: no checkpoint at {weights} (run `tfm stage average` first)"
            )

        # The driver encodes only to plan batches; the actors load the model.
        from tasks import tokenizer as tokenizer_lib

        src_ids = encode_texts(tokenizer_lib.load(tokenizer_dir), texts)

        started = time.perf_counter()
        hyps, n_tokens, info = translate_distributed(
            weights, tokenizer_dir, src_ids, decode, config.ray
        )
        seconds = time.perf_counter() - started
        (tmp / f"hyp.{tgt_lang}").write_text(
            "".join(h + "\n" for h in hyps), encoding="utf-8", newline="\n"
        )
        out_tokens = int(sum(n_tokens))
        try:  # a picture for people; a failure here must not cost the decoded test set
            plotted = plot_attention(weights, tokenizer_dir, src_ids, hyps, tmp / ATTENTION_PLOT)
        except Exception as exc:  # noqa: BLE001
            log.warning("translate: no attention plot (%s: %s)", type(exc).__name__, exc)
            plotted = 0
        return {
            "attention_plot_sentences": plotted,
            "model_fingerprint": (read_manifest(average) or {}).get("fingerprint"),
            "decode": to_dict(decode),
            "split": split,
            "source_file": source_file.name,
            "segments": len(hyps),
            "src_tokens": int(sum(len(s) for s in src_ids)),
            "hyp_tokens": out_tokens,
            # Wall time of the whole actor pool (start-up included) and the actors' own time.
            "decode_seconds": round(seconds, 3),
            "tokens_per_s": round(out_tokens / max(seconds, 1e-9), 2),
            "tokens_per_actor_s": round(out_tokens / max(info["actor_decode_seconds"], 1e-9), 2),
            **info,
        }

    return run_stage(
        STAGE,
        output_dir(config, split),
        stage_config(config, split),
        {"average": average, "tokenizer": tokenizer_dir, "download": download},
        build,
        force=force,
    )
