"""BLEU while training: greedy translations of a fixed dev subset, scored with sacreBLEU.

The first ``sentences`` rows of the dev shard, split across ranks (rank ``r`` takes rows
``r, r + W, ...``); each rank scores its share and the n-gram statistics are summed across ranks,
so the corpus BLEU is the one a single process would compute. References are the dev shard's
target ids decoded by the run's tokenizer (the shards hold ids only): sentencepiece decodes a
piece sequence back to its normalised text, so this is the score stage's sacreBLEU up to the
tokenizer's normalisation (NFKC), close enough to rank checkpoints and draw a curve.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from serving.translator import plan_decode_batches
from training.data import TokenData
from training.distributed import all_reduce_sum
from transformer_core.model import Transformer
from transformer_core.search import SearchSettings, search
from transformer_core.special_ids import EOS_ID


class DevBleu:
    """sacreBLEU of greedy translations of ``dev``'s first ``sentences`` rows; ``detokenize``
    turns piece ids (EOS removed) into text, e.g. a sentencepiece model's ``decode``."""

    def __init__(
        self,
        dev: TokenData,
        detokenize: Callable[[list[int]], str],
        sentences: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        max_tokens: int = 4096,
        max_len_offset: int = 50,
    ):
        self.detokenize = detokenize
        self.max_len_offset = max_len_offset
        rows = np.arange(min(sentences, len(dev)))[rank::world_size]
        self.sources, targets = dev.ids(rows)
        self.references = [self._text(ids) for ids in targets]
        self.batches = plan_decode_batches([len(s) for s in self.sources], max_tokens)

    def _text(self, piece_ids: np.ndarray) -> str:
        """Text of piece ids, EOS and everything after it dropped."""
        ids = [int(i) for i in piece_ids]
        return self.detokenize(ids[: ids.index(EOS_ID)] if EOS_ID in ids else ids)

    @torch.no_grad()
    def translate(self, model: Transformer) -> list[str]:
        """This rank's share of the subset, translated greedily, in row order."""
        device = next(model.parameters()).device
        out: list[str] = [""] * len(self.sources)
        pad = model.config.pad_id
        for batch in self.batches:
            longest = max(len(self.sources[i]) for i in batch)
            src = torch.full((len(batch), longest), pad, dtype=torch.long)
            for row, i in enumerate(batch):
                src[row, : len(self.sources[i])] = torch.as_tensor(self.sources[i].astype(np.int64))
            greedy = SearchSettings(beam_size=1, greedy=True, max_len_offset=self.max_len_offset)
            for i, (best,) in zip(batch, search(model, src.to(device), greedy), strict=True):
                out[i] = self._text(np.asarray(best.tokens))
        return out

    def score(self, model: Transformer, device: torch.device) -> float:
        """Corpus sacreBLEU (default 13a tokenization, case-sensitive) over every rank's share."""
        from sacrebleu.metrics import BLEU

        hyps = self.translate(model)
        stats: list[float] = [0.0] * 10  # correct[4], total[4], sys_len, ref_len
        if hyps:
            # force: with tokenizer.moses the text is Moses-tokenized on purpose (the same
            # scores; without it sacreBLEU warns "forgot to detokenize" at every validation).
            result = BLEU(force=True).corpus_score(hyps, [self.references])
            stats = [*result.counts, *result.totals, result.sys_len, result.ref_len]
        total = all_reduce_sum(stats, device)
        correct, counts = [int(x) for x in total[:4]], [int(x) for x in total[4:8]]
        if total[9] == 0:
            return 0.0
        # sacreBLEU's corpus default smoothing ("exp"); compute_bleu's own default is none.
        return BLEU.compute_bleu(
            correct, counts, int(total[8]), int(total[9]), smooth_method="exp"
        ).score
