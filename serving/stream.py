"""Translating a text stream, ``tfm translate``: stdin lines in, one translation per line out,
with a registered model (a model URI) or a checkpoint and its tokenizer folder."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from serving import ServingError
from serving.mlflow_uris import pointed_at

if TYPE_CHECKING:
    from mlflow.pyfunc import PyFuncModel

    from serving.translator import DecodeConfig

__all__ = [
    "ModelNotFoundError",
    "NotUtf8Error",
    "from_checkpoint",
    "from_registry",
    "load_translator",
    "translate_stream",
]

# Any: a registered model's predict answers in JSON's types, a string or a list of dicts.
Predict = Callable[[list[str]], list[Any]]
"""Texts in, one translation per text out, in order: a string, or with n-best a list of
{"translation", "score"}, best first (a registered model's form)."""


class ModelNotFoundError(ServingError):
    """A model URI that names nothing in the registry (or no loadable model)."""


class NotUtf8Error(ServingError):
    """An input line that is not UTF-8; the message names it."""


def load_translator(model_uri: str, tracking_uri: str | None = None) -> PyFuncModel:
    """``mlflow.pyfunc.load_model(model_uri)``; a URI that names nothing is a ModelNotFoundError."""
    import mlflow
    from mlflow.exceptions import MlflowException

    where = tracking_uri or mlflow.get_tracking_uri()
    try:
        with pointed_at(tracking_uri):
            return mlflow.pyfunc.load_model(model_uri)
    except (MlflowException, OSError) as exc:
        # Imported here: a registered model carries serving/ but not corpora/.
        from corpora.redact import redact_uri

        raise ModelNotFoundError(
            f"model {model_uri} cannot be loaded from {redact_uri(where)}: {exc}"
        ) from exc


def from_registry(
    model_uri: str, tracking_uri: str | None = None, params: Mapping[str, Any] | None = None
) -> Predict:
    """A registered model's ``predict``, with per-request decoding ``params`` (beam_size, alpha,
    length_norm, max_len_offset) if given."""
    model = load_translator(model_uri, tracking_uri)
    params = dict(params or {})
    # The translator's predict answers a list; MLflow types a pyfunc's answer as any of its forms.
    return lambda texts: list(cast(Iterable[Any], model.predict(texts, params=params or None)))


def from_checkpoint(
    checkpoint: Path, tokenizer_dir: Path, decode: DecodeConfig, n_best: int = 1
) -> Predict:
    """A checkpoint (a ``model.pt`` or a folder holding one) and a tokenizer folder, no registry."""
    from serving.translator import Translator
    from transformer_core.config_checks import ConfigError
    from transformer_core.search_settings import SearchSettings

    translator = Translator.load(checkpoint, tokenizer_dir, decode)
    try:  # before any input is read
        SearchSettings.of(decode, n_best=n_best)
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
