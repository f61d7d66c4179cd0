"""Stage fairseq_import: a fairseq ``transformer`` checkpoint as a folder the pipeline reads as a
trained model and its tokenizer (the fairseq pipeline: this, then register; ``tfm import
fairseq``).

In: the files ``fairseq`` names (``checkpoint``; ``dict_dir``, the folder of its joined
dictionary ``dict.<src>.txt``; ``bpe_codes``, its subword-nmt codes), the language pair, and how
the text was prepared before the codes (``tokenizer.lowercase``, ``tokenizer.moses``: fairseq's
data was made by whatever ran before ``fairseq-preprocess``, so the config says what that was).
Out: ``model.pt`` (our checkpoint; ``imported_from`` names the file and its sha256) beside the
files of the tokenizer folder our ``tokenizer.kind: subword-nmt`` makes (``spm.model``,
``spm.vocab``, ``pretokenize.json``, ``bpe.codes``), so the folder is register's ``average`` and
``tokenizer`` at once. The mapping is ``serving.fairseq_weights`` and ``serving.fairseq_vocab``.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corpora.pretokenize import Pretokenizer
from tasks.framework.config import RunConfig
from tasks.framework.contract import BuildContext
from tasks.framework.results import StageError

log = logging.getLogger(__name__)

STAGE = "fairseq_import"
MOSES_ESCAPES = ("&amp;", "&apos;", "&quot;", "&lt;", "&gt;", "&#124;", "&#91;", "&#93;")
"""What Moses' ``tokenizer.perl`` writes for & ' " < > | [ ] unless told ``-no-escape``."""


@dataclass(frozen=True)
class Source:
    """The files of a fairseq model."""

    checkpoint: Path
    """The checkpoint (``checkpoint_best.pt``, an average of several)."""
    dict_dir: Path
    """The folder holding ``dict.<src>.txt`` and ``dict.<tgt>.txt`` (fairseq-preprocess's)."""
    bpe_codes: Path
    """subword-nmt's BPE codes, as ``learn-bpe`` wrote them."""

    def origin(self, languages: tuple[str, str]) -> dict[str, dict[str, str]]:
        """Each file's name and sha256 (of the dictionaries, the source language's)."""
        dictionary = self.dict_dir / f"dict.{languages[0]}.txt"
        files = {"checkpoint": self.checkpoint, "dict": dictionary, "bpe": self.bpe_codes}
        return {role: {"file": path.name, "sha256": _sha256(path)} for role, path in files.items()}


def _sha256(path: Path) -> str:
    """The file's sha256, once per process while it is unchanged ("" for no file)."""
    if not path.is_file():
        return ""
    stat = path.stat()
    return _hashed(path.resolve(), stat.st_size, stat.st_mtime_ns)


@functools.cache
def _hashed(path: Path, size: int, mtime_ns: int) -> str:
    from transformer_core.folders import sha256_file

    return sha256_file(path)


def _source(config: RunConfig) -> Source:
    fairseq = config.fairseq
    if fairseq.checkpoint is None or fairseq.dict_dir is None or fairseq.bpe_codes is None:
        raise StageError("fairseq_import: the config names no fairseq.checkpoint to import")
    return Source(Path(fairseq.checkpoint), Path(fairseq.dict_dir), Path(fairseq.bpe_codes))


def stage_config(config: RunConfig) -> dict[str, Any]:
    """The source files by name and content (sha256), and the text's preparation."""
    return {
        "source": _source(config).origin(config.languages),
        "languages": list(config.languages),
        "lowercase": config.tokenizer.lowercase,
        "moses": config.tokenizer.moses,
    }


def build(ctx: BuildContext) -> dict[str, Any]:
    """Import the config's fairseq checkpoint into ``ctx.tmp``."""
    config = ctx.config
    pretokenizer = Pretokenizer(
        config.languages, moses=config.tokenizer.moses, lowercase=config.tokenizer.lowercase
    )
    return write(ctx.tmp, _source(config), pretokenizer)


def write(out: Path, source: Source, pretokenizer: Pretokenizer) -> dict[str, Any]:
    """Write ``model.pt`` and the tokenizer's files for ``source`` into the folder ``out``, the
    text prepared by ``pretokenizer`` before the codes; the stats."""
    from serving import ServingError, fairseq_vocab, fairseq_weights, tokenizer
    from transformer_core import checkpoint
    from transformer_core.model import Transformer

    path = source.checkpoint
    data = fairseq_weights.read(path)
    found = fairseq_weights.languages(data)
    if found is not None and found != pretokenizer.languages:
        raise ServingError(
            f"{path} translates {'-'.join(found)}, but the run config's data.pair is "
            f"{'-'.join(pretokenizer.languages)}: give a config for its pair"
        )
    config = fairseq_weights.model_config(data, path)
    dictionary = fairseq_vocab.dictionary_file(source.dict_dir, pretokenizer.languages)
    symbols = fairseq_vocab.read_dictionary(dictionary)
    vocab = fairseq_vocab.write_tokenizer(out, symbols, source.bpe_codes, pretokenizer)
    model = Transformer(config, len(vocab.outputs))
    fairseq_weights.load_weights(model, data, vocab, path)
    origin = {"toolkit": "fairseq", **source.origin(pretokenizer.languages)["checkpoint"]}
    checkpoint.save(
        out / checkpoint.MODEL_FILE,
        model,
        config,
        vocab_size=len(vocab.outputs),
        imported_from=origin,
    )
    tok = tokenizer.load(out)  # the folder reads back as every consumer reads it
    stats: dict[str, Any] = {
        "imported_from": origin,
        "layers": config.n_layers,
        "d_model": config.d_model,
        "vocab_size": tok.vocab_size,
        "pretokenize": tok.pretokenizer.description if tok.pretokenizer else "none",
    }
    escaped = sorted({e for e in MOSES_ESCAPES for s in symbols if s.startswith(e)})
    if escaped and pretokenizer.moses:
        stats["warning"] = (
            f"{dictionary} holds Moses escapes ({', '.join(escaped)}): its text was escaped "
            "before BPE, and tokenizer.moses never escapes"
        )
        log.warning("fairseq_import: %s", stats["warning"])
    return stats
