"""weight_adapters: other toolkits' weights to and from our ``Transformer``'s state dict, one
``StateDictAdapter`` (``weight_adapters.protocol``) per layout: fairseq checkpoints
(``fairseq``, imported), Hugging Face's ``MarianMTModel`` (``marian``) and CTranslate2's
``TransformerSpec`` (``ctranslate2``). The adapters map tensors and names only: the files
around them (a tokenizer folder, ``export.json``, generation settings) are written by their
callers in ``serving`` and ``tasks``. Imports ``transformer_core`` and torch (ctranslate2 when
a spec is built), nothing above."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class WeightsError(RuntimeError):
    """Weights or settings another layout cannot hold, or that ours cannot; the message says
    which and why, in one line."""


@contextmanager
def weight_errors_as(error: type[Exception]) -> Iterator[None]:
    """A ``WeightsError`` raised inside, raised again as ``error`` with the same message (the
    caller's own error type, as its users catch it)."""
    try:
        yield
    except WeightsError as exc:
        raise error(str(exc)) from None
