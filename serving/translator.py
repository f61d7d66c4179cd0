"""Translating text with a trained checkpoint: the ``Translator`` (its settings,
``DecodeConfig``, live in ``serving.decode_config`` and are imported from here too).

``Translator`` loads a checkpoint and a sentencepiece tokenizer once and translates lists of
strings with the paper's beam search (section 6.1). Sentences are sorted by length and cut into
token-budget batches so that each batch pads little; the results always come back in input
order. The translate stage's Ray actors and the registered pyfunc both use it.

Two engines run the search: ``torch`` (``transformer_core.search`` on the torch model) and
``ctranslate2`` (the checkpoint exported to CTranslate2, ``serving/ct2.py``), chosen by
``DecodeConfig.engine``; beam size, alpha, the length penalty and the output limit mean the same
on both.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

import numpy as np

from serving.decode_config import DecodeConfig
from serving.tokenizer import Tokenizer
from transformer_core.config import ModelConfig
from transformer_core.search_settings import Hypothesis, SearchSettings

if TYPE_CHECKING:  # imported where they are used: the ctranslate2 engine needs no torch model
    from serving.ct2 import CTranslate2Engine
    from transformer_core.constraints import BracketVocab
    from transformer_core.model import Transformer

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- batching

T = TypeVar("T")


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
    batches: Sequence[Sequence[int] | np.ndarray], results: Sequence[Sequence[T]], n: int
) -> list[T]:
    """Put per-batch results back at their rows: ``out[batches[b][j]] = results[b][j]``.

    Each of the ``n`` rows must be covered exactly once; anything else is a ValueError.
    """
    out: list[T | None] = [None] * n
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
    return cast(list[T], out)  # every row was set: no None is left


# ----------------------------------------------------------------------------- translator


def default_device() -> str:
    """``cuda`` when a GPU is visible (Ray sets CUDA_VISIBLE_DEVICES per actor), else ``cpu``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class TranslationEngine(Protocol):
    """What runs a ``Translator``'s search: ``TorchEngine`` or ``serving.ct2.CTranslate2Engine``."""

    name: str
    """``DecodeConfig.engine``'s name for it."""
    config: ModelConfig
    """The model's architecture (its ``max_len`` and special ids)."""
    device: str
    """Where it runs: ``cpu``, ``cuda``, ``cuda:1``."""

    def search(self, src_ids: Sequence[Sequence[int]], decode: DecodeConfig) -> list[list[int]]:
        """The best output ids (no BOS/EOS) per source."""
        ...

    def nbest(
        self, src_ids: Sequence[Sequence[int]], decode: DecodeConfig, n_best: int
    ) -> list[list[Hypothesis]]:
        """The ``n_best`` best hypotheses per source, best first."""
        ...


class TorchEngine:
    """Our beam search (``transformer_core.search``) on the torch model."""

    name = "torch"

    def __init__(
        self, model: Transformer, device: str = "cpu", constraint: BracketVocab | None = None
    ):
        self.model = model
        self.device = device
        self.config = model.config
        self.constraint = constraint

    def search(self, src_ids: Sequence[Sequence[int]], decode: DecodeConfig) -> list[list[int]]:
        """The best output ids (no BOS/EOS) per source, decoded as one padded batch."""
        return [hyps[0].tokens for hyps in self.nbest(src_ids, decode, 1)]

    def nbest(
        self, src_ids: Sequence[Sequence[int]], decode: DecodeConfig, n_best: int
    ) -> list[list[Hypothesis]]:
        """The ``n_best`` best hypotheses (ids and length-penalised scores) per source."""
        import torch

        from transformer_core.constraints import TreeConstraint
        from transformer_core.search import search

        width = max(len(s) for s in src_ids)
        src = torch.full((len(src_ids), width), self.config.pad_id, dtype=torch.long)  # (B, S)
        for i, seq in enumerate(src_ids):
            src[i, : len(seq)] = torch.as_tensor(list(seq), dtype=torch.long)
        settings = SearchSettings.of(decode, n_best=n_best)
        # The constraint's state is one search's, so each call gets its own.
        step = None if self.constraint is None else TreeConstraint(self.constraint)
        with torch.inference_mode():
            return search(self.model, src.to(self.device), settings, step)


class Translator:
    """A model and its tokenizer, loaded once; ``translate(texts) -> texts`` in input order."""

    def __init__(
        self,
        model: Transformer | TranslationEngine,
        tokenizer: Tokenizer,
        decode: DecodeConfig,
        device: str = "cpu",
    ):
        """``model``: the torch model (run by a ``TorchEngine``), or an engine standing in for
        it (``serving.ct2.CTranslate2Engine``)."""
        from transformer_core.model import Transformer

        self.model = model
        self.tokenizer = tokenizer
        self.decode = decode
        self.device = device
        self.engine: TranslationEngine
        if isinstance(model, Transformer):
            constraint = None
            if decode.tree_constraint:
                from parsing.constrain import bracket_vocab

                constraint = bracket_vocab(tokenizer, decode.tree_constraint, model.tgt_vocab_size)
            self.engine = TorchEngine(model, device, constraint)
        else:
            self.engine = model
        config = self.engine.config
        self.max_src_len = config.max_len  # the search itself caps the output at max_len
        self.pad_id = config.pad_id
        self.eos_id = config.eos_id

    @classmethod
    def load(
        cls,
        model_path: str | Path,
        tokenizer_dir: str | Path,
        decode: DecodeConfig | None = None,
        *,
        expected_config: ModelConfig | None = None,
        device: str | None = None,
        export_dir: str | Path | None = None,
    ) -> Translator:
        """Load ``model.pt`` (a file or the average stage's folder) and the folder's ``spm.model``
        for ``decode.engine``: torch casts the weights to ``decode.dtype``; ctranslate2 exports
        the checkpoint once (into ``export_dir``, by default next to it) and loads that."""
        from serving import tokenizer as tokenizer_lib
        from transformer_core.checkpoint import model_file

        decode = decode or DecodeConfig()
        tok = tokenizer_lib.load(Path(tokenizer_dir))
        if decode.engine == "ctranslate2":
            engine = _load_ctranslate2(model_path, tokenizer_dir, decode, export_dir, device)
            _check_config(model_file(model_path), engine.config, expected_config)
            return cls(engine, tok, decode, engine.device)
        model = _load_torch(model_path, decode, expected_config, device)
        return cls(model, tok, decode, device or default_device())

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids per text (pieces + EOS)."""
        return encode_texts(self.tokenizer, texts)

    def detokenize(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Text per id list, on one line each."""
        return [_one_line(self.tokenizer.decode(list(seq))) for seq in ids]

    def translate_batch(self, src_ids: Sequence[Sequence[int]]) -> list[list[int]]:
        """Beam search on one batch as given (no re-batching); output ids without BOS/EOS. An
        empty source (no piece before EOS) translates to an empty output, undecoded."""
        rows = self._nonempty(src_ids)
        out: list[list[int]] = [[] for _ in src_ids]
        if rows:
            found = self.engine.search([self._fit(src_ids[i]) for i in rows], self.decode)
            for i, ids in zip(rows, found, strict=True):
                out[i] = ids
        return out

    def _nonempty(self, src_ids: Sequence[Sequence[int]]) -> list[int]:
        # An empty line has nothing to translate: decoding its lone EOS would make a sentence up.
        return [i for i, seq in enumerate(src_ids) if any(t != self.eos_id for t in seq)]

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

    def translate_nbest(self, texts: Sequence[str], n_best: int) -> list[list[tuple[str, float]]]:
        """The ``n_best`` (<= beam size) best translations of each text with their scores
        (summed log-probabilities over GNMT's length penalty), best first, in input order."""
        found = self.nbest_ids(self.encode(texts), n_best)
        return [[(self.detokenize([h.tokens])[0], h.score) for h in hyps] for hyps in found]

    def nbest_ids(self, src_ids: Sequence[Sequence[int]], n_best: int) -> list[list[Hypothesis]]:
        """The ``n_best`` (<= beam size) best hypotheses of each source (ids and score), best
        first, in input order, decoded in token-budget batches sorted by length. An empty
        source gets one empty hypothesis scored 0, undecoded."""
        SearchSettings.of(self.decode, n_best=n_best)  # n_best checked against the beam
        rows = self._nonempty(src_ids)
        lengths = [len(src_ids[i]) for i in rows]
        batches = plan_decode_batches(lengths, self.decode.max_tokens_per_batch)
        results = [
            self.engine.nbest([self._fit(src_ids[rows[j]]) for j in batch], self.decode, n_best)
            for batch in batches
        ]
        found = restore_order(batches, results, len(rows))
        out = [[Hypothesis([], 0.0)] for _ in src_ids]
        for i, hyps in zip(rows, found, strict=True):
            out[i] = hyps
        return out


def _load_torch(
    model_path: str | Path,
    decode: DecodeConfig,
    expected_config: ModelConfig | None,
    device: str | None,
) -> Transformer:
    """The checkpoint's torch model in eval mode, cast to ``decode.dtype``, on ``device``."""
    import torch

    from transformer_core import checkpoint
    from transformer_core.checkpoint import model_file

    if decode.threads:
        torch.set_num_threads(decode.threads)
    model = checkpoint.load_model(model_file(model_path), expected_config, map_location="cpu")
    dtype = getattr(torch, decode.dtype)
    return model.to(device=device or default_device(), dtype=dtype).eval()


def _load_ctranslate2(
    model_path: str | Path,
    tokenizer_dir: str | Path,
    decode: DecodeConfig,
    export_dir: str | Path | None,
    device: str | None,
) -> CTranslate2Engine:
    from serving import ct2
    from transformer_core.checkpoint import model_file

    export = None if export_dir is None else Path(export_dir)
    return ct2.load_engine(
        model_file(model_path), Path(tokenizer_dir), decode, export_dir=export, device=device
    )


def _check_config(path: Path, config: ModelConfig, expected_config: ModelConfig | None) -> None:
    """CheckpointError naming the fields when the exported model's config is not the expected."""
    from transformer_core.checkpoint import CheckpointError, config_diff

    diff = config_diff(config, expected_config) if expected_config is not None else {}
    if diff:
        raise CheckpointError(
            f"{path} was written with another model config: "
            + "; ".join(f"{k}: checkpoint {a!r}, expected {b!r}" for k, (a, b) in diff.items())
        )


def encode_texts(tokenizer: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids per text (pieces + EOS), each text first joined onto one line."""
    return [list(tokenizer.encode(_one_line(t))) for t in texts]


def _one_line(text: str) -> str:
    # One segment per line in and out: a stray newline would shift every later line of a file.
    return " ".join(str(text).splitlines())
