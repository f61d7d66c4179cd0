"""What a search is asked for and what it returns: ``BeamSettings`` (the decoding settings every
beam search here shares), ``SearchSettings`` (a call of ``transformer_core.search``), the
``StepProcessor`` protocol a constraint implements, and ``Hypothesis``."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args, overload

from torch import Tensor

from transformer_core.config_checks import ConfigError, check_choices


@dataclass(frozen=True)
class Hypothesis:
    """One finished output: token ids (no BOS/EOS) and its length-penalised log-probability."""

    tokens: list[int]
    score: float


LengthNorm = Literal["gnmt", "fairseq"]
"""How a finished hypothesis's summed log-probability is normalised by its length
(``length_penalty``)."""


@overload
def length_penalty(length: int, alpha: float, norm: LengthNorm = "gnmt") -> float: ...
@overload
def length_penalty(length: Tensor, alpha: float, norm: LengthNorm = "gnmt") -> Tensor: ...


def length_penalty(length: int | Tensor, alpha: float, norm: LengthNorm = "gnmt") -> float | Tensor:
    """What a hypothesis's summed log-probability is divided by.

    ``gnmt``: lp(Y) = ((5 + |Y|) / 6)^alpha (Wu et al. 2016), used by the paper with alpha=0.6.
    ``fairseq``: |Y|^alpha, fairseq's ``--lenpen`` (its default 1 is the mean log-probability).
    |Y| counts decoded positions, the final EOS included (as tensor2tensor and fairseq)."""
    if norm == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    if norm == "fairseq":
        return length**alpha
    raise ValueError(f"length_norm must be one of {', '.join(get_args(LengthNorm))}, got {norm!r}")


LengthRule = Literal["ours", "fairseq"]
"""Where a hypothesis may end (``BeamSettings.length_rule``): at the output length limit, and
whether at the first step."""


PENALTY_FIT_LENGTHS = range(1, 101)
"""Output lengths over which ``fitted_penalty_exponent`` fits |Y|^p to GNMT's penalty."""


def penalty_exponent(alpha: float, norm: LengthNorm, length: int) -> float:
    """The p of a penalty |Y|^p (CTranslate2's, Hugging Face's) that ranks hypotheses near
    ``length`` as ``length_penalty`` does: alpha for fairseq's form (exactly), and for GNMT's
    the slope of its logarithm against log |Y| there, alpha * length / (5 + length)."""
    return alpha if norm == "fairseq" else alpha * length / (5.0 + length)


def fitted_penalty_exponent(alpha: float, norm: LengthNorm = "gnmt") -> float:
    """The p of a penalty |Y|^p for ``length_penalty`` at any length: alpha for fairseq's form;
    for GNMT's, the least-squares slope of alpha * log((5 + L) / 6) against log L over the
    lengths 1..100 (0.4509 for the paper's alpha = 0.6). Only ratios between lengths change
    which hypothesis wins, so the slope is what matters."""
    if norm == "fairseq":
        return alpha
    xs = [math.log(n) for n in PENALTY_FIT_LENGTHS]
    ys = [alpha * math.log((5.0 + n) / 6.0) for n in PENALTY_FIT_LENGTHS]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    covariance = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    return round(covariance / sum((x - mx) ** 2 for x in xs), 4)


@dataclass(frozen=True, kw_only=True)
class BeamSettings:
    """The decoding settings of every beam search here, checked once: the search's own
    (``SearchSettings``), a translator's (``serving.decode_config.DecodeConfig``, the run
    config's ``decode`` section) and the parsing pipeline's (its ``parsing`` section). The
    defaults are the paper's translation settings (section 6.1).

    Every check is ``__post_init__``'s, so settings made in code, read from JSON or sent with a
    request are checked as a config file's: a ``Literal`` field against its own values
    (``check_choices``, in the words pydantic's loader uses), then the ranges and the rules
    between fields (a subclass's after these)."""

    beam_size: int = 4
    """Beam width."""
    alpha: float = 0.6
    """Length penalty exponent: of ((5 + |Y|) / 6)^alpha, or of |Y|^alpha with ``length_norm``
    fairseq."""
    length_norm: LengthNorm = "gnmt"
    """gnmt (the paper's penalty) or fairseq (the summed log-probability / |Y|^alpha, as
    fairseq-generate's --lenpen: a fairseq recipe's decoding)."""
    max_len_offset: int = 50
    """Output length limit: the source's length (non-pad tokens) plus this."""
    length_rule: LengthRule = "ours"
    """ours: the output length limit counts decoded positions, EOS included (a hypothesis that
    reaches it ends there, without EOS), and EOS may come first (an empty output). fairseq:
    fairseq-generate's: the limit counts the tokens before the EOS, which is forced after them
    (scored, and counted in |Y|), and EOS never comes first (its min_len 1); with length_norm
    fairseq, alpha 1 and max_len_offset 50: fairseq-generate --lenpen 1 --max-len-a 1
    --max-len-b 50."""

    def __post_init__(self) -> None:
        check_choices(self)
        if self.beam_size < 1:
            raise ConfigError("beam_size", f"{self.beam_size} must be >= 1")
        if self.alpha < 0:
            raise ConfigError("alpha", f"{self.alpha} must be >= 0 (the early stop relies on it)")
        if self.max_len_offset < 0:
            raise ConfigError("max_len_offset", f"{self.max_len_offset} must be >= 0")


def beam_fields(settings: BeamSettings) -> dict[str, Any]:
    """The shared settings of ``settings`` (of any kind) by name, to make another kind with."""
    return {f.name: getattr(settings, f.name) for f in dataclasses.fields(BeamSettings)}


@dataclass(frozen=True, kw_only=True)
class SearchSettings(BeamSettings):
    """How ``search`` decodes: the shared settings, and what only a call of the search chooses."""

    max_len: int | None = None
    """One output length limit for every sentence, instead of source length + max_len_offset."""
    n_best: int = 1
    """Hypotheses returned per sentence, best first (at most ``beam_size``)."""
    use_cache: bool = True
    """False runs the uncached reference that recomputes the prefix (tests and benchmarks)."""
    greedy: bool = False
    """The greedy loop instead of the beam loop at beam 1 (dev BLEU): the same tokens for less
    work a step, but finished rows stay in the batch, so scores differ in the 7th digit."""

    @classmethod
    def of(cls, settings: BeamSettings, **call: Any) -> SearchSettings:
        """The search of ``settings`` (of any kind: a ``DecodeConfig``, the parsing section)
        with this call's own choices (``n_best``, ``max_len``, ...), checked."""
        return cls(**beam_fields(settings), **call)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.n_best <= self.beam_size:
            raise ConfigError("n_best", f"{self.n_best} must be in [1, beam_size {self.beam_size}]")
        if self.greedy and self.beam_size != 1:
            raise ConfigError(
                "greedy", f"greedy search has one beam, got beam_size {self.beam_size}"
            )


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
