"""Translating text with a trained checkpoint: ``DecodeConfig`` and the ``Translator``.

``Translator`` loads a checkpoint and a sentencepiece tokenizer once and translates lists of
strings with the paper's beam search (section 6.1). Sentences are sorted by length and cut into
token-budget batches so that each batch pads little; the results always come back in input
order. The translate stage's Ray actors and the registered pyfunc both use it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from transformer_core.config import ConfigError

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- settings


DECODE_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True, kw_only=True)
class DecodeConfig:
    """Beam search settings (paper section 6.1)."""

    beam_size: int = 4
    """Beam width."""
    alpha: float = 0.6
    """Length penalty exponent of ((5+len)/6)^alpha."""
    max_len_offset: int = 50
    """Maximum output length = source length + this."""
    max_tokens_per_batch: int = 4096
    """Source tokens per decoding batch."""
    num_actors: int = 1
    """Ray Data decoding actors of the translate stage."""
    dtype: str = "float32"
    """Weights and activations while decoding: float32, or bfloat16 (on GPUs, and on CPUs with
    AVX512-BF16 or AMX about 2.5x faster than float32; slow on CPUs without them)."""

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ConfigError("beam_size", f"{self.beam_size} must be >= 1")
        if self.dtype not in DECODE_DTYPES:
            raise ConfigError("dtype", f"{self.dtype!r} is not one of {', '.join(DECODE_DTYPES)}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DecodeConfig:
        """From stored JSON (a registered model's decode.json), ignoring fields this code
        version does not know."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


# ----------------------------------------------------------------------------- batching


def plan_decode_batches(lengths: Sequence[int] | np.ndarray, max_tokens: int) -> list[np.ndarray]:
    """Row indices per batch: rows sorted by length (longest first), each batch's padded size
    ``rows * longest`` within ``max_tokens``; a row longer than the budget gets a batch alone.

    Every row appears exactly once. Ties keep index order, so the plan is deterministic.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens {max_tokens} must be >= 1")
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    # Longest first: an out-of-memory batch shows up at once, not at the end of a long run.
    order = np.argsort(-lengths, kind="stable")
    batches: list[np.ndarray] = []
    start = 0
    while start < order.size:
        longest = max(int(lengths[order[start]]), 1)
        rows = max(1, max_tokens // longest)
        batches.append(order[start : start + rows])
        start += rows
    return batches


def restore_order(
    batches: Sequence[Sequence[int]], results: Sequence[Sequence[Any]], n: int
) -> list[Any]:
    """Put per-batch results back at their rows: ``out[batches[b][j]] = results[b][j]``.

    Each of the ``n`` rows must be covered exactly once; anything else is a ValueError.
    """
    out: list[Any] = [None] * n
    seen = np.zeros(n, dtype=bool)
    if len(batches) != len(results):
        raise ValueError(f"{len(batches)} batches but {len(results)} result lists")
    for rows, values in zip(batches, results, strict=True):
        if len(rows) != len(values):
            raise ValueError(f"a batch of {len(rows)} rows came back with {len(values)} results")
        for row, value in zip(rows, values, strict=True):
            row = int(row)
            if not 0 <= row < n or seen[row]:
                raise ValueError(f"row {row} is out of range or appears twice")
            seen[row] = True
            out[row] = value
    if not seen.all():
        raise ValueError(f"rows {np.flatnonzero(~seen)[:10].tolist()} got no result")
    return out


# ----------------------------------------------------------------------------- translator


def model_file(path: str | Path) -> Path:
    """The checkpoint file: ``path`` itself, or ``path/model.pt`` for an artifact folder."""
    path = Path(path)
    return path / "model.pt" if path.is_dir() else path


def default_device() -> str:
    """``cuda`` when a GPU is visible (Ray sets CUDA_VISIBLE_DEVICES per actor), else ``cpu``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class Translator:
    """A model and its tokenizer, loaded once; ``translate(texts) -> texts`` in input order."""

    def __init__(self, model: Any, tokenizer: Any, decode: DecodeConfig, device: str = "cpu"):
        self.model = model
        self.tokenizer = tokenizer
        self.decode = decode
        self.device = device
        config = model.config
        self.max_src_len = config.max_len  # beam_search itself caps the output at max_len
        self.pad_id = config.pad_id
        self.eos_id = config.eos_id

    @classmethod
    def load(
        cls,
        model_path: str | Path,
        tokenizer_dir: str | Path,
        decode: DecodeConfig | None = None,
        *,
        expected_config: Any = None,
        device: str | None = None,
    ) -> Translator:
        """Load ``model.pt`` (a file or the average stage's folder) and the folder's ``spm.model``;
        the weights are cast to ``decode.dtype``."""
        import torch

        from serving import tokenizer as tokenizer_lib
        from transformer_core import checkpoint

        device = device or default_device()
        model = checkpoint.load_model(model_file(model_path), expected_config, map_location="cpu")
        decode = decode or DecodeConfig()
        model = model.to(device=device, dtype=getattr(torch, decode.dtype)).eval()
        tok = tokenizer_lib.load(Path(tokenizer_dir))
        return cls(model, tok, decode, device)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids per text (pieces + EOS)."""
        return encode_texts(self.tokenizer, texts)

    def detokenize(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Text per id list, on one line each."""
        return [_one_line(self.tokenizer.decode(list(seq))) for seq in ids]

    def translate_batch(self, src_ids: Sequence[Sequence[int]]) -> list[list[int]]:
        """Beam search on one batch as given (no re-batching); output ids without BOS/EOS."""
        import torch

        from transformer_core.search import beam_search

        if not src_ids:
            return []
        src_ids = [self._fit(seq) for seq in src_ids]
        width = max(len(s) for s in src_ids)
        src = torch.full((len(src_ids), width), self.pad_id, dtype=torch.long)  # (B, S)
        for i, seq in enumerate(src_ids):
            src[i, : len(seq)] = torch.as_tensor(list(seq), dtype=torch.long)
        with torch.inference_mode():
            out = beam_search(
                self.model,
                src.to(self.device),
                beam_size=self.decode.beam_size,
                alpha=self.decode.alpha,
                max_len_offset=self.decode.max_len_offset,
            )
        return [[int(t) for t in seq] for seq in out]

    def _fit(self, seq: Sequence[int]) -> list[int]:
        # The encoder's positions must stay inside the positional table.
        seq = list(seq)
        if len(seq) <= self.max_src_len:
            return seq
        log.warning(
            "a %d-token source is cut to %d tokens (model max_len)", len(seq), self.max_src_len
        )
        return seq[: self.max_src_len - 1] + [self.eos_id]

    def translate_ids(self, src_ids: Sequence[Sequence[int]]) -> list[list[int]]:
        """Beam search over token-budget batches in sorted-length order; results in input order."""
        batches = plan_decode_batches([len(s) for s in src_ids], self.decode.max_tokens_per_batch)
        results = [self.translate_batch([src_ids[i] for i in rows]) for rows in batches]
        return restore_order(batches, results, len(src_ids))

    def translate(self, texts: Sequence[str]) -> list[str]:
        """Translations of ``texts``, one per text, in input order."""
        if not texts:
            return []
        return self.detokenize(self.translate_ids(self.encode(texts)))


def encode_texts(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Token ids per text (pieces + EOS), each text first joined onto one line."""
    return [list(tokenizer.encode(_one_line(t))) for t in texts]


def _one_line(text: str) -> str:
    # One segment per line in and out: a stray newline would shift every later line of a file.
    return " ".join(str(text).splitlines())
