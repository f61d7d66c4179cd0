"""What a search is asked for and what it returns: ``SearchSettings``, the ``StepProcessor``
protocol a constraint implements, and ``Hypothesis`` (``transformer_core.search`` runs it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, overload

from torch import Tensor


@dataclass(frozen=True)
class Hypothesis:
    """One finished output: token ids (no BOS/EOS) and its length-penalised log-probability."""

    tokens: list[int]
    score: float


LENGTH_NORMS = ("gnmt", "fairseq")
"""How a finished hypothesis's summed log-probability is normalised by its length."""


@overload
def length_penalty(length: int, alpha: float, norm: str = "gnmt") -> float: ...
@overload
def length_penalty(length: Tensor, alpha: float, norm: str = "gnmt") -> Tensor: ...


def length_penalty(length: int | Tensor, alpha: float, norm: str = "gnmt") -> float | Tensor:
    """What a hypothesis's summed log-probability is divided by.

    ``gnmt``: lp(Y) = ((5 + |Y|) / 6)^alpha (Wu et al. 2016), used by the paper with alpha=0.6.
    ``fairseq``: |Y|^alpha, fairseq's ``--lenpen`` (its default 1 is the mean log-probability).
    |Y| counts decoded positions, the final EOS included (as tensor2tensor and fairseq)."""
    if norm == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    if norm == "fairseq":
        return length**alpha
    raise ValueError(f"length_norm must be one of {', '.join(LENGTH_NORMS)}, got {norm!r}")


@dataclass(frozen=True, kw_only=True)
class SearchSettings:
    """How ``search`` decodes; the defaults are the paper's beam search (section 6.1)."""

    beam_size: int = 4
    """Beams per sentence."""
    alpha: float = 0.6
    """Length penalty exponent: of ((5 + |Y|) / 6)^alpha, or of |Y|^alpha (``length_norm``)."""
    length_norm: str = "gnmt"
    """gnmt or fairseq: the penalty's form (``length_penalty``)."""
    max_len_offset: int = 50
    """Output length limit: the source's length (non-pad tokens) plus this..."""
    max_len: int | None = None
    """...or this one limit for every sentence, when given."""
    n_best: int = 1
    """Hypotheses returned per sentence, best first (at most ``beam_size``)."""
    use_cache: bool = True
    """False runs the uncached reference that recomputes the prefix (tests and benchmarks)."""
    greedy: bool = False
    """The greedy loop instead of the beam loop at beam 1 (dev BLEU): the same tokens for less
    work a step, but finished rows stay in the batch, so scores differ in the 7th digit."""

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {self.beam_size}")
        if not 1 <= self.n_best <= self.beam_size:
            raise ValueError(
                f"n_best must be in [1, beam_size {self.beam_size}], got {self.n_best}"
            )
        if self.greedy and self.beam_size != 1:
            raise ValueError(f"greedy search has one beam, got beam_size {self.beam_size}")
        if self.length_norm not in LENGTH_NORMS:
            raise ValueError(
                f"length_norm must be one of {', '.join(LENGTH_NORMS)}, got {self.length_norm!r}"
            )
        if self.alpha < 0:
            raise ValueError(f"alpha must be >= 0 (the early stop relies on it), got {self.alpha}")


class StepProcessor(Protocol):
    """Plugged into every beam-search step: forbids tokens (log-prob -inf) and follows the
    beams. It holds one search's state; ``begin`` starts it afresh."""

    def begin(self, src: Tensor, limits: Tensor, beam_size: int) -> None:
        """Set up the state of every beam (B*k rows) of the sources (B, S); ``limits`` (B,)."""

    def mask(self, log_probs: Tensor, first: bool) -> None:
        """Set the forbidden tokens of ``log_probs`` (N, V) to -inf, in place. ``first``: one
        row per sentence, for its first beam (they are still identical)."""

    def advance(self, rows: Tensor, tokens: Tensor) -> None:
        """Keep beams ``rows`` (N',) in that order, then take one token (N',) per beam."""
