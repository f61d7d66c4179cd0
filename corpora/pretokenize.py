"""Text as the subword model sees it: optionally lowercased and Moses-tokenized (sacremoses).

Published small-data recipes (Multi30k's; docs/multi30k.md) lowercase and run Moses'
``tokenizer.perl -l <lang>`` before learning BPE, and score tokenized, lowercased BLEU. This is
that step as an option of the tokenizer stage (``tokenizer.lowercase``, ``tokenizer.moses``):
the tokenizer folder records it (``pretokenize.json``) so that every reader of the folder
(shard encoding, the translator, the registered model) applies the same step to source and
target text, and detokenizes what the model writes (sacremoses' detokenizer; the case is not
restored, so a lowercased model's sacreBLEU is scored against cased references).

Moses escaping (``&amp;``) is off: sentencepiece takes any character, and the escapes would
otherwise reach the output. Aggressive hyphen splitting is off (``tokenizer.perl``'s default).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from corpora import CorpusError

__all__ = ["FILE", "Pretokenizer"]

FILE = "pretokenize.json"
"""Where a tokenizer folder records its pretokenization (absent: none)."""


@dataclass(frozen=True)
class Pretokenizer:
    """Lowercasing and Moses tokenization of a (source, target) language pair; identity when both are off."""

    languages: tuple[str, str]
    """The source and target languages (Moses' rules depend on them)."""
    moses: bool = False
    """Moses-tokenize (and detokenize the model's output)."""
    lowercase: bool = False
    """Lowercase the text (not restored on output)."""
    _cache: dict[str, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    @property
    def active(self) -> bool:
        """Whether this changes any text."""
        return self.moses or self.lowercase

    def prepare(self, texts: Sequence[str], side: int) -> list[str]:
        """``texts`` of ``side`` (0 source, 1 target) as the subword model reads them."""
        texts = [t.lower() for t in texts] if self.lowercase else list(texts)
        if not self.moses:
            return texts
        tokenizer = self._tools(self.languages[side])[0]
        return [tokenizer.tokenize(t, escape=False, return_str=True) for t in texts]

    def restore(self, texts: Sequence[str], side: int = 1) -> list[str]:
        """What the subword model decoded, as running text (Moses-detokenized)."""
        if not self.moses:
            return list(texts)
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
            record = {k: v for k, v in asdict(self).items() if k != "_cache"}
            (Path(folder) / FILE).write_text(json.dumps(record, sort_keys=True) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, folder: Path) -> Pretokenizer | None:
        """What ``folder`` records; None when it records nothing (the text goes to the model as it is)."""
        path = Path(folder) / FILE
        if not path.is_file():
            return None
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            return cls(tuple(record["languages"]), bool(record["moses"]), bool(record["lowercase"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise CorpusError(f"{path}: not a pretokenization record ({exc})") from exc

    @property
    def description(self) -> str:
        """For logs and stage results: ``moses+lowercase``, ``moses``, ``lowercase`` or ``none``."""
        return "+".join(n for n, on in (("moses", self.moses), ("lowercase", self.lowercase)) if on) or "none"
