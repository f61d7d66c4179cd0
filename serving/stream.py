"""Translating a text stream, ``tfm translate``: stdin lines in, one translation per line out,
with a registered model (a model URI) or a checkpoint and its tokenizer folder."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from serving import ServingError
from serving.registered_version import ModelNotFoundError

if TYPE_CHECKING:
    from serving.translator import DecodeConfig, Translator

__all__ = [
    "ModelNotFoundError",
    "NotUtf8Error",
    "from_checkpoint",
    "from_registry",
    "translate_stream",
]

# Any: an n-best answer is a list of dicts, as a registered model's.
Predict = Callable[[list[str]], list[Any]]
"""Texts in, one translation per text out, in order: a string, or with n-best a list of
{"translation", "score"}, best first (a registered model's form)."""


class NotUtf8Error(ServingError):
    """An input line that is not UTF-8; the message names it."""


def from_registry(
    model_uri: str, tracking_uri: str | None = None, params: Mapping[str, Any] | None = None
) -> Predict:
    """A registered version, downloaded and decoded by this process's code as it was
    registered, with ``params`` (beam_size, alpha, length_norm, max_len_offset, n_best)
    changing its decoding."""
    import dataclasses
    import tempfile

    from serving.registered_version import download, load_translator
    from transformer_core.config_checks import ConfigError

    folder = tempfile.TemporaryDirectory(prefix="tfm-translate-")
    files = download(model_uri, Path(folder.name), tracking_uri)
    changes = dict(params or {})
    n_best = int(changes.pop("n_best", 1))
    try:
        decode = dataclasses.replace(files.decode, **changes)
    except ConfigError as exc:
        raise ServingError(f"--{exc.key.replace('_', '-')} {exc.message}") from None
    translator = load_translator(dataclasses.replace(files, decode=decode))
    predict = _predict(translator, n_best)
    # The folder lives as long as the function that translates with the files in it.
    return lambda texts, _folder=folder: predict(texts)


def from_checkpoint(
    checkpoint: Path, tokenizer_dir: Path, decode: DecodeConfig, n_best: int = 1
) -> Predict:
    """A checkpoint (a ``model.pt`` or a folder holding one) and a tokenizer folder, no registry."""
    from serving.translator import Translator

    return _predict(Translator.load(checkpoint, tokenizer_dir, decode), n_best)


def _predict(translator: Translator, n_best: int) -> Predict:
    from transformer_core.config_checks import ConfigError
    from transformer_core.search_settings import SearchSettings

    try:  # before any input is read
        SearchSettings.of(translator.decode, n_best=n_best)
    except ConfigError as exc:
        raise ServingError(f"--n-best {exc.message}") from None
    if n_best > 1:  # the registered model's form, so the stream writes one kind
        return lambda texts: [
            [{"translation": text, "score": score} for text, score in hyps]
            for hyps in translator.translate_nbest(texts, n_best)
        ]
    return translator.translate


def translate_stream(
    predict: Predict, stdin: IO[bytes], stdout: IO[str], batch_lines: int = 256
) -> int:
    """Translate the lines of ``stdin`` to ``stdout``; returns the count. Lines are read in
    chunks of ``batch_lines``, so a long stream starts producing output early; a line that is
    not UTF-8 stops the stream with an error naming it (the lines before it are written).
    With n-best, each input line gets its hypotheses as ``LINE ||| TRANSLATION ||| SCORE``
    lines (Moses' n-best format; LINE counts from 0), best first."""
    count = 0
    chunk: list[str] = []
    try:
        for line in _lines(stdin):
            chunk.append(line)
            if len(chunk) >= batch_lines:
                count += _write(predict, chunk, stdout, count)
                chunk = []
    except NotUtf8Error:  # what was read before the bad line is still translated
        if chunk:
            _write(predict, chunk, stdout, count)
        raise
    if chunk:
        count += _write(predict, chunk, stdout, count)
    return count


def _lines(stdin: IO[bytes]) -> Iterable[str]:
    for number, raw in enumerate(stdin, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise NotUtf8Error(
                f"input line {number} is not UTF-8 (byte {exc.start + 1} of the line is "
                f"{raw[exc.start : exc.start + 1]!r}); the lines before it were translated, "
                "none after"
            ) from None
        yield text.rstrip("\n").rstrip("\r")


def _write(predict: Predict, lines: list[str], stdout: IO[str], first: int) -> int:
    for i, out in enumerate(predict(lines), start=first):
        if isinstance(out, str):
            stdout.write(out + "\n")
            continue
        for hyp in out:
            stdout.write(f"{i} ||| {hyp['translation']} ||| {hyp['score']:.6f}\n")
    stdout.flush()
    return len(lines)
