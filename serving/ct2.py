"""The CTranslate2 engine: beam search through a checkpoint's CTranslate2 export
(``serving.ct2_export`` makes it).

``CTranslate2Engine.search`` keeps what beam size, alpha, the length penalty's form and the
output limit mean for our own search (``transformer_core.search``); see
``CTranslate2Engine.hypotheses`` for how. ``length_rule`` fairseq: no EOS first, as ours; a
hypothesis still ends at the limit without the EOS our search forces and scores after it
(CTranslate2 cannot), so the tokens of one that reaches it are fairseq's, its rank may not be.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from serving import ServingError
from serving.ct2_export import (
    INFO_FILE,
    default_export_dir,
    export_ctranslate2,
    read_info,
    require,
)
from serving.ct2_options import ct2_exponent, min_length, suppressed
from serving.decode_config import DecodeConfig
from transformer_core.config import ModelConfig
from transformer_core.config_checks import ConfigError
from transformer_core.search_settings import (
    Hypothesis,
    LengthNorm,
    SearchSettings,
    length_penalty,
    penalty_exponent,
)

if TYPE_CHECKING:
    from ctranslate2 import TranslationResult

__all__ = ["CTranslate2Engine", "load_engine"]


class CTranslate2Engine:
    """A loaded CTranslate2 model; ``search(src_ids, decode)`` as ``Translator`` calls it."""

    name = "ctranslate2"

    def __init__(
        self,
        model_dir: Path,
        *,
        device: str = "cpu",
        compute_type: str = "default",
        threads: int = 0,
    ):
        import ctranslate2

        info = read_info(model_dir)
        if info is None:
            raise ServingError(f"{model_dir} holds no complete CTranslate2 export ({INFO_FILE})")
        self.model_dir = Path(model_dir)
        self.device = device
        self.config = ModelConfig.from_dict(info["model_config"])
        self.pieces = json.loads((self.model_dir / "shared_vocabulary.json").read_text())
        self.ids = {piece: i for i, piece in enumerate(self.pieces)}
        # An export adds EOS to every source itself (its users pass only the pieces).
        model_config = json.loads((self.model_dir / "config.json").read_text())
        self.adds_eos = bool(model_config.get("add_source_eos"))
        kind, _, index = device.partition(":")
        try:
            self.translator = ctranslate2.Translator(
                str(self.model_dir),
                device=kind,
                device_index=int(index or 0),
                compute_type=compute_type,
                inter_threads=1,
                intra_threads=threads,
            )
        except ValueError as exc:  # e.g. float16 on a CPU: CTranslate2 says why
            raise ConfigError("compute_type", f"{compute_type!r} on {device}: {exc}") from exc
        self.suppressed = suppressed(self.config, self.pieces)

    @property
    def compute_type(self) -> str:
        """The compute type CTranslate2 actually uses (``default`` resolved)."""
        return self.translator.compute_type

    def search(self, src_ids: Sequence[Sequence[int]], decode: DecodeConfig) -> list[list[int]]:
        """The best output ids (no BOS/EOS) per source, with ``decode``'s beam size, alpha,
        length penalty and output limit (source length + ``max_len_offset``)."""
        found = self.hypotheses(
            src_ids,
            decode.beam_size,
            decode.alpha,
            decode.max_len_offset,
            min_len=min_length(decode),
            length_norm=decode.length_norm,
        )
        return [hyps[0].tokens for hyps in found]

    def nbest(
        self, src_ids: Sequence[Sequence[int]], decode: DecodeConfig, n_best: int
    ) -> list[list[Hypothesis]]:
        """The ``n_best`` best hypotheses per source with ``decode``'s settings (as TorchEngine)."""
        return self.hypotheses(
            src_ids,
            decode.beam_size,
            decode.alpha,
            decode.max_len_offset,
            min_len=min_length(decode),
            n_best=n_best,
            length_norm=decode.length_norm,
        )

    def hypotheses(
        self,
        src_ids: Sequence[Sequence[int]],
        beam_size: int = 4,
        alpha: float = 0.6,
        max_len_offset: int = 50,
        *,
        max_len: int | None = None,
        min_len: int = 0,
        n_best: int = 1,
        length_norm: LengthNorm = "gnmt",
    ) -> list[list[Hypothesis]]:
        """The ``n_best`` (<= beam size) hypotheses per source, best first, scored as our search
        scores them: summed log-probabilities / ((5 + len) / 6)^alpha, len counting EOS (or
        / len^alpha with ``length_norm`` fairseq, CTranslate2's own penalty).

        CTranslate2 grows the same beams (top 2k continuations, EOS among the first k finishes,
        a sentence stops at k finished) but has one output limit per call: all sources are
        decoded under the longest limit, and those whose search ran up to their own limit
        (rare) again under it, grouped by limit; see ``_decode``. It keeps the k finished
        hypotheses best by its own raw / len^p, with the p that ranks like GNMT near the batch's
        median source length (``search_settings.penalty_exponent``), and the kept ones are
        re-ranked by GNMT's penalty exactly (fairseq's penalty is CTranslate2's own: p = alpha).
        """
        SearchSettings(  # the settings' own checks (n_best <= beam_size among them)
            beam_size=beam_size,
            alpha=alpha,
            length_norm=length_norm,
            max_len_offset=max_len_offset,
            max_len=max_len,
            n_best=n_best,
        )
        limits = [self._limit(len(seq), max_len_offset, max_len) for seq in src_ids]
        out: list[list[Hypothesis]] = [[] for _ in src_ids]

        def decode(rows: list[int], limit: int) -> list[int]:
            """Decode ``rows`` under ``limit`` into ``out``; the rows that need their own."""
            median = sorted(len(src_ids[i]) for i in rows)[len(rows) // 2]
            penalty = ct2_exponent(penalty_exponent(alpha, length_norm, median))
            sources = [self._source(src_ids[i]) for i in rows]
            found = self._decode(
                sources, beam_size, (alpha, length_norm), penalty, limit, min(min_len, limit)
            )
            redo = []
            for i, (hyps, steps) in zip(rows, found, strict=True):
                out[i] = hyps[:n_best]
                if steps >= limits[i] < limit:  # it reached its own limit: not its search
                    redo.append(i)
            return redo

        redo = decode(list(range(len(src_ids))), max(limits, default=1)) if src_ids else []
        for limit in sorted({limits[i] for i in redo}, reverse=True):
            decode([i for i in redo if limits[i] == limit], limit)
        return out

    def _source(self, ids: Sequence[int]) -> list[str]:
        """Our source ids (pieces, then EOS) as the pieces the export reads."""
        if self.adds_eos and ids and ids[-1] == self.config.eos_id:
            ids = ids[:-1]
        return [self.pieces[t] for t in ids]

    def _limit(self, src_len: int, max_len_offset: int, max_len: int | None) -> int:
        # As transformer_core.search._output_limits: the decoder input must fit max_len.
        limit = src_len + max_len_offset if max_len is None else max_len
        return max(1, min(limit, self.config.max_len))

    def _decode(
        self,
        sources: list[list[str]],
        k: int,
        lp: tuple[float, LengthNorm],
        penalty: float,
        limit: int,
        min_len: int,
    ) -> list[tuple[list[Hypothesis], int]]:
        """Per source: its re-ranked hypotheses, and the steps its search ran.

        The steps are the longest returned hypothesis (EOS counted): a search stops on the step
        its k-th hypothesis finishes, and of the k - 1 + m that have finished then, the k kept
        include at least one of the m last. A search that stopped before a shorter limit is
        exactly the search under that limit; one that did not must be run again under it.
        """
        results = self.translator.translate_batch(
            sources,
            beam_size=k,
            num_hypotheses=k,
            length_penalty=penalty,
            return_scores=True,
            max_decoding_length=limit,
            min_decoding_length=min_len,
            max_input_length=0,  # the Translator already fits sources to max_len
            suppress_sequences=self.suppressed,
        )
        found = []
        for result in results:
            lengths = [len(p) + (len(p) < limit) for p in result.hypotheses]
            found.append((self._rerank(result, lp, penalty, limit), max(lengths)))
        return found

    def _rerank(
        self, result: TranslationResult, lp: tuple[float, LengthNorm], penalty: float, limit: int
    ) -> list[Hypothesis]:
        """CTranslate2's hypotheses with their raw scores recovered, divided by our penalty
        ``lp`` = (alpha, form)."""
        hyps = []
        for pieces, score in zip(result.hypotheses, result.scores, strict=True):
            # Decoded positions, EOS included (an output that reached the limit has none): the
            # length both CTranslate2's len^penalty and ours (``length_penalty``) count.
            length = len(pieces) + (len(pieces) < limit)
            raw = score * length**penalty
            tokens = [self.ids[p] for p in pieces]
            hyps.append(Hypothesis(tokens, raw / length_penalty(length, *lp)))
        return sorted(hyps, key=lambda h: h.score, reverse=True)


def load_engine(
    checkpoint: Path,
    tokenizer_dir: Path,
    decode: DecodeConfig,
    *,
    export_dir: Path | None = None,
    device: str | None = None,
) -> CTranslate2Engine:
    """Export ``checkpoint`` in float32 (or reuse its export) into ``export_dir`` (default:
    ``default_export_dir``) and load it with ``decode.compute_type`` and ``decode.threads``;
    CTranslate2 converts the float32 weights to the compute type as it loads them."""
    require()
    out = Path(export_dir) if export_dir is not None else default_export_dir(checkpoint)
    export_ctranslate2(checkpoint, tokenizer_dir, out, decode=decode)
    return CTranslate2Engine(
        out,
        device=device or default_device(),
        compute_type=decode.compute_type,
        threads=decode.threads,
    )


def default_device() -> str:
    """``cuda`` when CTranslate2 sees a GPU, else ``cpu``."""
    import ctranslate2

    return "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
