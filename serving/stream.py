"""Translating a text stream with a registered model: ``tfm translate``."""

from __future__ import annotations

from typing import IO, Any

from serving import ServingError

__all__ = ["ModelNotFoundError", "load_translator", "translate_stream"]


class ModelNotFoundError(ServingError):
    """A model URI that names nothing in the registry (or no loadable model)."""


def load_translator(model_uri: str, tracking_uri: str | None = None) -> Any:
    """``mlflow.pyfunc.load_model(model_uri)``; a URI that names nothing is a ModelNotFoundError."""
    import mlflow
    from mlflow.exceptions import MlflowException

    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
        mlflow.set_registry_uri(tracking_uri)
    where = tracking_uri or mlflow.get_tracking_uri()
    try:
        return mlflow.pyfunc.load_model(model_uri)
    except (MlflowException, OSError) as exc:
        raise ModelNotFoundError(f"model {model_uri} cannot be loaded from {where}: {exc}") from exc


def translate_stream(
    model_uri: str,
    stdin: IO[str],
    stdout: IO[str],
    tracking_uri: str | None = None,
    batch_lines: int = 256,
) -> int:
    """Translate the lines of ``stdin`` to ``stdout`` (one line out per line in); returns the count.

    Lines are read in chunks of ``batch_lines`` so a long stream starts producing output early.
    """
    model = load_translator(model_uri, tracking_uri)
    count = 0
    chunk: list[str] = []
    for line in stdin:
        chunk.append(line.rstrip("\n").rstrip("\r"))
        if len(chunk) >= batch_lines:
            count += _write(model, chunk, stdout)
            chunk = []
    if chunk:
        count += _write(model, chunk, stdout)
    return count


def _write(model: Any, lines: list[str], stdout: IO[str]) -> int:
    for hyp in model.predict(lines):
        stdout.write(hyp + "\n")
    stdout.flush()
    return len(lines)
