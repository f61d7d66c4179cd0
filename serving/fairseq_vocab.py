"""A fairseq dictionary and its subword-nmt BPE codes as our tokenizer folder.

fairseq numbers a joined dictionary (``dict.<lang>.txt``: ``symbol count`` lines) after four
specials: ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3, then the file's symbols in file order
(``madeupwordNNNN`` padding included: ``fairseq-preprocess`` writes it into the file). Ours:
``<pad>`` 0, ``<unk>`` 1, ``<s>`` 2, ``</s>`` 3, then the pieces (``docs/contracts.md``).

``write_tokenizer`` makes the folder our ``tokenizer.kind: subword-nmt`` makes (``spm.model``,
``spm.vocab``, ``pretokenize.json``, ``bpe.codes``), by the same calls
(``corpora.subwords.train`` numbering the dictionary's symbols as pieces,
``corpora.pretokenize.Pretokenizer.save``), so that every reader of a tokenizer folder reads it
unchanged: text is lowercased and Moses-tokenized as the run config says, split by the codes
as ``subword-nmt apply-bpe`` does, and each piece gets the id of its symbol; a piece the
dictionary lacks is ``<unk>``, as in fairseq's ``Dictionary.encode_line``.

``Vocabulary`` says where each of our ids was in fairseq's: ``outputs`` is a bijection (the
pre-softmax projection's rows, so every logit is fairseq's, column for column), ``inputs`` the
same but for ``<s>``: fairseq's decoder starts from ``</s>``, ours from ``<s>``, so our ``<s>``
embedding is fairseq's ``</s>`` row.

Hand-written: reading ``dict.txt`` (a ``symbol count`` line each) is all of fairseq's
``Dictionary`` this needs, and fairseq is no dependency of ours.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from corpora import CorpusError
from corpora.pretokenize import Pretokenizer
from serving import ServingError
from transformer_core.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID

__all__ = ["SPECIALS", "Vocabulary", "dictionary_file", "read_dictionary", "write_tokenizer"]

SPECIALS = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
"""fairseq's ``Dictionary``: its special symbols and their ids, before the file's symbols."""
_OURS = {PAD_ID: "<pad>", UNK_ID: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>"}
_MARK = "\u2581"
"""sentencepiece's word-boundary mark: a ``word`` model's piece is the mark and the word."""


@dataclass(frozen=True)
class Vocabulary:
    """Our ids in fairseq's: ``outputs[i]`` is the fairseq id of our id i (a bijection);
    ``inputs`` is the same but our ``<s>`` takes fairseq's ``</s>`` (its decoder's start)."""

    outputs: list[int]
    inputs: list[int]


def dictionary_file(folder: Path, languages: tuple[str, str]) -> Path:
    """``folder``'s one joined dictionary: ``dict.<src>.txt``, the same symbols as
    ``dict.<tgt>.txt`` (our tokenizer folder holds one vocabulary for both sides)."""
    files = [Path(folder) / f"dict.{lang}.txt" for lang in languages]
    for path in files:
        if not path.is_file():
            raise ServingError(f"{path} does not exist (--dict names the folder that holds it)")
    if read_dictionary(files[0]) != read_dictionary(files[1]):
        raise ServingError(
            f"{files[0]} and {files[1]} differ: only a joined dictionary "
            "(fairseq-preprocess --joined-dictionary) maps onto one tokenizer folder"
        )
    return files[0]


def read_dictionary(path: Path) -> list[str]:
    """The symbols of fairseq's ``dict.txt`` in file order (their ids are 4, 5, ...)."""
    symbols: list[str] = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        symbol, _, count = line.rstrip().rpartition(" ")
        if count == "#fairseq:overwrite":
            raise ServingError(f"{path}:{n}: #fairseq:overwrite entries cannot be imported")
        if not symbol or not count.isdigit():
            raise ServingError(f"{path}:{n}: not a fairseq dictionary line ('<symbol> <count>')")
        symbols.append(symbol)
    seen = set(SPECIALS)
    for n, symbol in enumerate(symbols, 1):
        if symbol in seen:
            raise ServingError(f"{path}:{n}: symbol {symbol!r} appears twice")
        seen.add(symbol)
    return symbols


def write_tokenizer(
    folder: Path,
    symbols: Sequence[str],
    codes: Path,
    pretokenizer: Pretokenizer,
) -> Vocabulary:
    """Write the tokenizer folder of the dictionary's ``symbols`` and the subword-nmt ``codes``
    (applied after ``pretokenizer``'s lowercasing and Moses) into ``folder``; how our ids map
    to fairseq's."""
    from corpora.subwords import TokenizerConfig, train
    from serving.tokenizer import MODEL_FILE, VOCAB_FILE, Tokenizer

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
    return _vocabulary([sp.id_to_piece(i) for i in range(sp.get_piece_size())], symbols)


def _vocabulary(pieces: Sequence[str], symbols: Sequence[str]) -> Vocabulary:
    """Where each of our ``pieces`` (sentencepiece's, in id order) is in fairseq's dictionary."""
    fairseq = {symbol: i for i, symbol in enumerate(symbols, len(SPECIALS))}
    words = [piece.removeprefix(_MARK) for piece in pieces[len(_OURS) :]]
    if sorted(words) != sorted(symbols):  # a symbol holding a space or the mark cannot be a piece
        lost = sorted(set(symbols) ^ set(words))
        raise ServingError(
            f"the dictionary's symbols are not one sentencepiece piece each: {len(lost)} "
            f"differ, e.g. {lost[:3]}"
        )
    outputs = [SPECIALS[_OURS[i]] for i in range(len(_OURS))] + [fairseq[w] for w in words]
    inputs = list(outputs)
    inputs[BOS_ID] = SPECIALS["</s>"]
    return Vocabulary(outputs, inputs)
