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
``tokenizer`` at once. The mapping is ``weight_adapters.fairseq`` and
``weight_adapters.fairseq_vocab``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corpora.pretokenize import Pretokenizer
from tasks.framework.config import RunConfig
from tasks.framework.contract import BuildContext
from tasks.framework.results import StageError
from transformer_core.folders import file_identity

if TYPE_CHECKING:
    from weight_adapters.fairseq_vocab import Vocabulary

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
        return {
            role: {"file": path.name, "sha256": file_identity(path)} for role, path in files.items()
        }


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
    from serving import ServingError, tokenizer
    from transformer_core import checkpoint
    from transformer_core.model import Transformer
    from weight_adapters import fairseq, fairseq_vocab, weight_errors_as

    path = source.checkpoint
    with weight_errors_as(ServingError):
        data = fairseq.read(path)
        found = fairseq.languages(data)
        if found is not None and found != pretokenizer.languages:
            raise ServingError(
                f"{path} translates {'-'.join(found)}, but the run config's data.pair is "
                f"{'-'.join(pretokenizer.languages)}: give a config for its pair"
            )
        config = fairseq.model_config(data, path)
        dictionary = fairseq_vocab.dictionary_file(source.dict_dir, pretokenizer.languages)
        symbols = fairseq_vocab.read_dictionary(dictionary)
        vocab = _write_tokenizer(out, symbols, source.bpe_codes, pretokenizer)
        model = Transformer(config, len(vocab.outputs))
        fairseq.load_weights(model, data, vocab, path)
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


def _write_tokenizer(
    folder: Path, symbols: Sequence[str], codes: Path, pretokenizer: Pretokenizer
) -> Vocabulary:
    """Write the tokenizer folder of the dictionary's ``symbols`` and the subword-nmt ``codes``
    (applied after ``pretokenizer``'s lowercasing and Moses) into ``folder``, by the calls our
    ``tokenizer.kind: subword-nmt`` makes, so that every reader reads it unchanged; how our
    ids map to fairseq's."""
    from corpora import CorpusError
    from corpora.subwords import TokenizerConfig, train
    from serving import ServingError
    from serving.tokenizer import MODEL_FILE, VOCAB_FILE, Tokenizer
    from weight_adapters.fairseq_vocab import SPECIALS, vocabulary

    if not Path(codes).is_file():
        raise ServingError(f"{codes} does not exist (--bpe names subword-nmt's codes file)")
    text = Path(codes).read_text(encoding="utf-8")
    merges = sum(1 for line in text.splitlines() if line and not line.startswith("#version"))
    config = TokenizerConfig(
        kind="subword-nmt",
        merges=max(merges, 1),
        vocab_size=len(symbols) + len(SPECIALS),
        lowercase=pretokenizer.lowercase,
        moses=pretokenizer.moses,
        threads=1,
    )
    try:
        model = train(iter(symbols), config)  # a `word` model: every symbol one piece
    except CorpusError as exc:
        raise ServingError(f"{codes}: no tokenizer for this dictionary: {exc}") from exc
    (folder / MODEL_FILE).write_bytes(model.proto)
    (folder / VOCAB_FILE).write_text(model.vocab_listing(), encoding="utf-8")
    Pretokenizer(pretokenizer.languages, pretokenizer.moses, pretokenizer.lowercase, text).save(
        folder
    )
    sp = Tokenizer(folder / MODEL_FILE).sp
    return vocabulary([sp.id_to_piece(i) for i in range(sp.get_piece_size())], symbols)
