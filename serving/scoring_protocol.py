"""MLflow's scoring protocol for a translator: what a request may hold and ask, checked before
anything decodes (its shape, its texts, its decoding params and the limits a server sets,
``RequestLimits``), and the answer it gets (``predictions``). ``tfm serve`` and the registered
pyfunc (``mlflow models serve``) share it; each refusal is one ``RequestError``: an HTTP status
and a message that names the limit, the param or the input's index."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from serving import ServingError
from serving.decode_config import DecodeConfig
from serving.translator import Translator
from transformer_core.config_checks import ConfigError

__all__ = [
    "INPUT_KEYS",
    "PARAMS",
    "Decoding",
    "RequestError",
    "RequestLimits",
    "check_params",
    "check_pieces",
    "check_texts",
    "piece_limit",
    "predictions",
    "texts_and_params",
]

INPUT_KEYS = ("inputs", "instances", "dataframe_split", "dataframe_records")
"""The fields of MLflow's scoring protocol that carry the texts (one per request)."""
PARAMS: dict[str, type] = {
    "beam_size": int,
    "alpha": float,
    "length_norm": str,
    "max_len_offset": int,
    "n_best": int,
}
"""What a request's ``params`` may set, and the JSON type of each."""


class RequestError(ServingError):
    """A request refused before decoding: ``status`` (400 malformed or out of range, 413 over a
    size limit) and a message for the client."""

    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(message)


@dataclass(frozen=True, kw_only=True)
class RequestLimits:
    """What one request may ask of a served model (the ``serve.limits`` section; a registered
    version carries the limits of the config that registered it)."""

    max_sentences: int = 256
    """Texts in one request."""
    max_chars: int = 2000
    """Characters in one text."""
    max_pieces: int | None = None
    """Subword pieces in one text once prepared (EOS not counted); null: as many as the model's
    positions hold (model.max_len - 1). A text over it is refused, never cut."""
    max_beam: int = 16
    """The largest beam_size a request may ask (n_best is at most its beam)."""

    def __post_init__(self) -> None:
        for name in ("max_sentences", "max_chars", "max_beam", "max_pieces"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value < 1):
                raise ConfigError(name, f"{value!r} must be an integer >= 1")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestLimits:
        """From stored JSON (a registered version's limits.json), ignoring unknown fields."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


class Decoding(NamedTuple):
    """How one request is decoded: the settings (the version's, changed by its params) and how
    many hypotheses each text gets. Requests with equal ``Decoding`` decode together."""

    decode: DecodeConfig
    n_best: int = 1


def texts_and_params(body: object) -> tuple[list[object], dict[str, object]]:
    """The texts and params of a request body in MLflow's shapes: ``{"inputs": [...]}`` or
    ``{"instances": [...]}``, a one-column ``dataframe_split`` or ``dataframe_records``, each
    with an optional ``params`` object."""
    shape = 'a JSON object such as {"inputs": ["a sentence"], "params": {"beam_size": 4}}'
    if not isinstance(body, dict):
        raise RequestError(400, f"the body must be {shape}")
    unknown = sorted(set(body) - {*INPUT_KEYS, "params"})
    if unknown:
        raise RequestError(
            400, f"unknown field {', '.join(map(repr, unknown))}: the body must be {shape}"
        )
    given = [key for key in INPUT_KEYS if key in body]
    if len(given) != 1:
        raise RequestError(400, f"the body must hold one of {', '.join(INPUT_KEYS)}")
    params = body.get("params")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise RequestError(400, "params must be a JSON object")
    return _texts(given[0], body[given[0]]), params


def _texts(key: str, value: object) -> list[object]:
    if key in ("inputs", "instances"):
        if not isinstance(value, list):
            raise RequestError(400, f"{key} must be a list of strings")
        return value
    if key == "dataframe_split":
        rows = value.get("data") if isinstance(value, dict) else None
        columns = value.get("columns", [None]) if isinstance(value, dict) else None
        if not isinstance(rows, list) or not isinstance(columns, list) or len(columns) != 1:
            raise RequestError(400, "dataframe_split must hold one column and its data rows")
        if not all(isinstance(row, list) and len(row) == 1 for row in rows):
            raise RequestError(400, "each row of dataframe_split must hold one value")
        return [row[0] for row in rows]
    if not isinstance(value, list) or not all(isinstance(r, dict) and len(r) == 1 for r in value):
        raise RequestError(400, "dataframe_records must be a list of objects of one field each")
    return [next(iter(record.values())) for record in value]


def check_texts(texts: Sequence[object], limits: RequestLimits) -> list[str]:
    """``texts`` as strings, within ``limits``' count and length; the first bad one named."""
    if len(texts) > limits.max_sentences:
        raise RequestError(
            413,
            f"{len(texts)} texts in one request; the limit is {limits.max_sentences} "
            "(serve.limits.max_sentences)",
        )
    checked: list[str] = []
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise RequestError(400, f"input {i} is {_json_type(text)}, not a string")
        if len(text) > limits.max_chars:
            raise RequestError(
                413,
                f"input {i} has {len(text)} characters; the limit is {limits.max_chars} "
                "(serve.limits.max_chars)",
            )
        checked.append(text)
    return checked


def _json_type(value: object) -> str:
    # A one-column DataFrame (the pyfunc's input) holds a null among strings as NaN.
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, numbers.Number):
        return "a number"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def check_params(
    params: Mapping[str, object], decode: DecodeConfig, limits: RequestLimits
) -> Decoding:
    """The decoding a request's ``params`` ask of a version decoding as ``decode``: only known
    params, each of its type, a beam other than the version's within ``limits.max_beam``,
    n_best within the beam, and the settings' own rules (``BeamSettings``). A null param keeps
    the version's value."""
    unknown = sorted(set(params) - set(PARAMS))
    if unknown:
        raise RequestError(
            400,
            f"unknown param {', '.join(map(repr, unknown))}; a request may set {', '.join(PARAMS)}",
        )
    values = {name: _typed(name, value) for name, value in params.items() if value is not None}
    n_best = values.pop("n_best", 1)
    beam = values.get("beam_size", decode.beam_size)
    # The version's own beam is never refused (MLflow fills in every param's default).
    if beam != decode.beam_size and not 1 <= beam <= limits.max_beam:
        raise RequestError(
            400, f"beam_size {beam} must be within 1..{limits.max_beam} (serve.limits.max_beam)"
        )
    if not 1 <= n_best <= beam:
        raise RequestError(400, f"n_best {n_best} must be within 1..{beam} (the beam size)")
    try:
        return Decoding(dataclasses.replace(decode, **values), n_best)
    except ConfigError as exc:
        raise RequestError(400, f"{exc.key} {exc.message}") from None


def _typed(name: str, value: object) -> Any:
    want = PARAMS[name]
    if want is int and isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if want is float and isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    if want is str and isinstance(value, str):
        return value
    kind = {int: "an integer", float: "a number", str: "a string"}[want]
    raise RequestError(400, f"param {name} must be {kind}, not {_json_type(value)} ({value!r})")


def piece_limit(limits: RequestLimits, max_len: int) -> int:
    """The pieces a text may have for a model of ``max_len`` positions (its EOS takes one):
    ``limits.max_pieces``, or all the positions hold; a limit above that is a ConfigError."""
    held = max_len - 1
    if limits.max_pieces is None:
        return held
    if limits.max_pieces > held:
        raise ConfigError(
            "max_pieces",
            f"{limits.max_pieces} is more than the model's {max_len} positions hold "
            f"({held} pieces and EOS)",
        )
    return limits.max_pieces


def check_pieces(src_ids: Sequence[Sequence[int]], limit: int) -> None:
    """Refuse the first text whose pieces (its ids less the EOS) are over ``limit``."""
    for i, ids in enumerate(src_ids):
        if len(ids) - 1 > limit:
            raise RequestError(
                413,
                f"input {i} is {len(ids) - 1} subword pieces; the limit is {limit} "
                "(serve.limits.max_pieces, at most the model's max_len - 1)",
            )


def predictions(
    translator: Translator, src_ids: Sequence[Sequence[int]], decoding: Decoding
) -> list[Any]:
    """The answer to texts encoded as ``src_ids``, decoded as ``decoding`` asks (the translator's
    model and tokenizer shared): one string per text, or with n_best > 1 a list of
    ``{"translation", "score"}`` per text, best first."""
    if decoding.decode != translator.decode:
        translator = Translator(
            translator.model, translator.tokenizer, decoding.decode, translator.device
        )
    if decoding.n_best == 1:
        return translator.detokenize(translator.translate_ids(src_ids))
    return [
        [{"translation": translator.detokenize([h.tokens])[0], "score": h.score} for h in hyps]
        for hyps in translator.nbest_ids(src_ids, decoding.n_best)
    ]
