"""Text as the subword model sees it: optionally lowercased and Moses-tokenized (sacremoses), and
split by subword-nmt's BPE codes (``tokenizer.kind: subword-nmt``).

Published small-data recipes (Multi30k's; docs/multi30k.md) lowercase and run Moses'
``tokenizer.perl -l <lang>`` before learning BPE, and score tokenized, lowercased BLEU. This is
that step as an option of the tokenizer stage (``tokenizer.lowercase``, ``tokenizer.moses``):
the tokenizer folder records it (``pretokenize.json``) so that every reader of the folder
(shard encoding, the translator, the registered model) applies the same step to source and
target text, and detokenizes what the model writes (sacremoses' detokenizer; the case is not
restored, so a lowercased model's sacreBLEU is scored against cased references).

With BPE codes the text is then segmented as ``subword-nmt apply-bpe`` does (``@@`` ends a
piece that does not end a word), and the marks are removed from the output before
detokenizing, as ``fairseq-generate --remove-bpe``; sentencepiece only numbers the pieces.

Moses escaping (``&amp;``) is off: sentencepiece takes any character, and the escapes would
otherwise reach the output. Aggressive hyphen splitting is off (``tokenizer.perl``'s default).
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from corpora import CorpusError

__all__ = ["CODES_FILE", "FILE", "Pretokenizer", "join_pieces"]

FILE = "pretokenize.json"
"""Where a tokenizer folder records its pretokenization (absent: none)."""
CODES_FILE = "bpe.codes"
"""The subword-nmt codes a folder's record names (``subword-nmt learn-bpe``'s format)."""
BPE_MARK = "@@"
"""subword-nmt's separator: the end of a piece that continues in the next one."""


@dataclass(frozen=True)
class Pretokenizer:
    """Lowercasing and Moses tokenization of a (source, target) language pair; identity when
    both are off."""

    languages: tuple[str, str]
    """The source and target languages (Moses' rules depend on them)."""
    moses: bool = False
    """Moses-tokenize (and detokenize the model's output)."""
    lowercase: bool = False
    """Lowercase the text (not restored on output)."""
    bpe_codes: str = ""
    """subword-nmt BPE codes (the text of a codes file) applied after Moses; "": none."""
    _cache: dict[str, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    @property
    def active(self) -> bool:
        """Whether this changes any text."""
        return self.moses or self.lowercase or bool(self.bpe_codes)

    def prepare(self, texts: Sequence[str], side: int) -> list[str]:
        """``texts`` of ``side`` (0 source, 1 target) as the subword model reads them."""
        texts = [t.lower() for t in texts] if self.lowercase else list(texts)
        if self.moses:
            tokenizer = self._tools(self.languages[side])[0]
            texts = [tokenizer.tokenize(t, escape=False, return_str=True) for t in texts]
        return self.segment(texts)

    def segment(self, texts: Sequence[str]) -> list[str]:
        """Already pretokenized ``texts`` split into BPE pieces (unchanged without codes)."""
        if not self.bpe_codes:
            return list(texts)
        if "bpe" not in self._cache:
            from subword_nmt.apply_bpe import BPE

            self._cache["bpe"] = BPE(io.StringIO(self.bpe_codes), separator=BPE_MARK)
        bpe = self._cache["bpe"]
        return [bpe.segment(t) for t in texts]

    def restore(self, texts: Sequence[str], side: int = 1) -> list[str]:
        """What the subword model decoded, as running text (BPE marks removed,
        Moses-detokenized)."""
        texts = [join_pieces(t) for t in texts] if self.bpe_codes else list(texts)
        if not self.moses:
            return texts
        detokenizer = self._tools(self.languages[side])[1]
        return [detokenizer.detokenize(t.split()) for t in texts]

    def _tools(self, lang: str) -> tuple[Any, Any]:
        if lang not in self._cache:
            from sacremoses import MosesDetokenizer, MosesTokenizer

            self._cache[lang] = (MosesTokenizer(lang=lang), MosesDetokenizer(lang=lang))
        return self._cache[lang]

    def save(self, folder: Path) -> None:
        """Record this in ``folder`` (nothing is written when it is the identity)."""
        if self.active:
            record = {k: v for k, v in asdict(self).items() if k not in ("_cache", "bpe_codes")}
            if self.bpe_codes:
                (Path(folder) / CODES_FILE).write_text(self.bpe_codes, encoding="utf-8")
                record["bpe"] = CODES_FILE
            (Path(folder) / FILE).write_text(
                json.dumps(record, sort_keys=True) + "\n", encoding="utf-8"
            )

    @classmethod
    def load(cls, folder: Path) -> Pretokenizer | None:
        """What ``folder`` records; None when it records nothing (the text goes to the model as
        it is)."""
        path = Path(folder) / FILE
        if not path.is_file():
            return None
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            languages, moses, lowercase = (
                tuple(record["languages"]),
                bool(record["moses"]),
                bool(record["lowercase"]),
            )
            codes_name = record.get("bpe")
        except (ValueError, KeyError, TypeError) as exc:
            raise CorpusError(f"{path}: not a pretokenization record ({exc})") from exc
        codes = ""
        if codes_name:
            codes_path = Path(folder) / str(codes_name)
            if not codes_path.is_file():
                raise CorpusError(
                    f"{codes_path} does not exist: {path} names it as the folder's BPE codes"
                )
            codes = codes_path.read_text(encoding="utf-8")
        return cls(languages, moses, lowercase, codes)

    @property
    def description(self) -> str:
        """For logs and stage results: the steps joined by ``+`` (``moses+lowercase``), or
        ``none``."""
        steps = (
            ("moses", self.moses),
            ("lowercase", self.lowercase),
            ("subword-nmt", bool(self.bpe_codes)),
        )
        return "+".join(n for n, on in steps if on) or "none"


def join_pieces(text: str) -> str:
    """BPE-segmented ``text`` as words again (``fairseq-generate --remove-bpe``)."""
    return (text + " ").replace(BPE_MARK + " ", "").rstrip()
