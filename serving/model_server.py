"""``tfm serve``'s Ray Serve deployment, ``ModelServer``: a registered version behind MLflow's
scoring protocol (``POST /invocations`` with ``{"inputs": [...], "params": {...}}``, answered
``{"predictions": [...]}``), every request checked before it decodes
(``serving.scoring_protocol``) and decoded together with the requests of other clients
(``serving.request_batcher``: up to ``serve.max_batch`` sentences or tokens, waiting
``serve.batch_wait_s`` for more once the decoder is free). Each answer names the version that
made it (``X-Model-Name``, ``X-Model-Version``) and how many sentences were decoded with it
(``X-Batch-Sentences``). Bodies are never logged.

Also served: ``GET /ping`` and ``/health`` (200 once loaded, no token asked: a gateway's
probes) and ``GET /version`` (the version serving now)."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ray.serve import metrics
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from serving.request_batcher import RequestBatcher
from serving.scoring_protocol import (
    Decoding,
    RequestError,
    check_params,
    check_pieces,
    check_texts,
    predictions,
    texts_and_params,
)
from serving.serve_config import ServeConfig
from serving.version_follower import LoadedVersion, VersionFollower

__all__ = ["Answer", "Job", "ModelServer", "decode_jobs"]

log = logging.getLogger(__name__)

NAME_HEADER = "X-Model-Name"
VERSION_HEADER = "X-Model-Version"
BATCH_HEADER = "X-Batch-Sentences"
JSON_BYTES_PER_CHAR = 6
"""The most bytes JSON spends on one character (``\\u00e9``): what bounds a body's size."""


@dataclass(frozen=True, eq=False)
class Job:
    """One request, checked and tokenized by the version that will decode it."""

    loaded: LoadedVersion
    decoding: Decoding
    src_ids: list[list[int]]
    size: int
    """What it counts toward a batch (sentences or tokens), at most ``serve.max_batch``."""


@dataclass(frozen=True)
class Answer:
    predictions: list[Any]
    """One per text: a string, or with n_best a list of {"translation", "score"}."""
    batch_sentences: int
    """The sentences decoded in the same call."""


def decode_jobs(jobs: Sequence[Job]) -> list[Answer]:
    """Decode ``jobs`` together: those of one version and one decoding in one call of its
    translator, which sorts their sentences by length into token-budget batches; the answers
    in job order."""
    groups: dict[tuple[LoadedVersion, Decoding], list[int]] = {}
    for i, job in enumerate(jobs):
        groups.setdefault((job.loaded, job.decoding), []).append(i)
    answers: list[Answer] = [Answer([], 0)] * len(jobs)
    for (loaded, decoding), members in groups.items():
        src = [ids for i in members for ids in jobs[i].src_ids]
        found = predictions(loaded.translator, src, decoding)
        start = 0
        for i in members:
            end = start + len(jobs[i].src_ids)
            answers[i] = Answer(found[start:end], len(src))
            start = end
    return answers


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """MLflow's scoring server's error shape, with our status."""
    code = {400: "BAD_REQUEST", 401: "UNAUTHENTICATED", 413: "REQUEST_TOO_LARGE"}
    body = {"error_code": code.get(status, "ERROR"), "message": message}
    return JSONResponse(body, status_code=status, headers=headers)


def bind_replica_grpc_to_loopback() -> None:
    """Have this replica's inter-deployment gRPC server, which Ray Serve 2.60 starts once the
    constructor returns, bind 127.0.0.1 instead of every interface (its address is hard-coded,
    ``[::]:0``, in ``ray.serve._private.replica``): a local Ray opens no port to the network."""
    from ray.serve._private import replica

    bind = getattr(replica, "add_port_to_grpc_server", None)
    if bind is None or getattr(bind, "loopback", False):
        return

    def on_loopback(server: object, address: str) -> int:
        return bind(server, address.replace("[::]", "127.0.0.1", 1))

    on_loopback.loopback = True  # type: ignore[attr-defined]
    replica.add_port_to_grpc_server = on_loopback


class ModelServer:
    """A replica: the version loaded once (and followed, with an alias), its HTTP routes and
    the batch it decodes."""

    def __init__(
        self,
        model_uri: str,
        tracking_uri: str | None,
        settings: ServeConfig,
        token_sha256: str | None,
        loopback: bool = True,
    ):
        """``token_sha256``: the sha256 of the bearer token clients must send (None: none);
        the token itself never reaches Ray. ``loopback``: a local Ray's replica, whose every
        port is bound to 127.0.0.1."""
        if loopback:
            bind_replica_grpc_to_loopback()
        self.settings = settings
        self._token = token_sha256
        self._follower = VersionFollower(model_uri, tracking_uri, settings)
        # One thread decodes, always the same: torch's OpenMP pool belongs to the thread that
        # runs it, and a new thread a batch (asyncio.to_thread) made one sentence 2.6x slower.
        self._decoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decode")
        self._refused = metrics.Counter(
            "tfm_serve_refused_requests",
            description="Requests refused before decoding, by HTTP status.",
            tag_keys=("status",),
        )
        batches = metrics.Histogram(
            "tfm_serve_batch_sentences",
            description="Sentences decoded together, a batch.",
            boundaries=[1, 2, 4, 8, 16, 32, 64, 128, 256],
        )
        self._batcher: RequestBatcher[Job, Answer] = RequestBatcher(
            decode_jobs,
            self._decoder,
            settings.max_batch,
            settings.batch_wait_s,
            size=lambda job: job.size,
            on_batch=lambda jobs: batches.observe(sum(len(j.src_ids) for j in jobs)),
        )
        limits = settings.limits
        self._max_body = limits.max_sentences * (limits.max_chars * JSON_BYTES_PER_CHAR + 8)
        self._max_body += 1 << 16  # params, field names and whitespace

    async def __call__(self, request: Request) -> Response:
        path = request.url.path.rstrip("/")
        if path in ("/ping", "/health"):
            return Response("\n", media_type="application/json")
        if not self._authorized(request):
            self._refused.inc(tags={"status": "401"})
            return _error(401, "a bearer token is needed", {"WWW-Authenticate": "Bearer"})
        loaded = self._follower.current
        if path == "/version":
            return JSONResponse({"name": loaded.name, "version": loaded.version})
        if path != "/invocations":
            return _error(404, f"no route {path!r}: POST /invocations translates")
        if request.method != "POST":
            return _error(405, "POST /invocations translates", {"Allow": "POST"})
        try:
            job = await self._job(request, loaded)
        except RequestError as exc:
            self._refused.inc(tags={"status": str(exc.status)})
            return _error(exc.status, str(exc))
        if not job.src_ids:
            return self._answer(loaded, Answer([], 0))
        try:
            answer = await self._batcher.submit(job)
        except Exception:
            log.exception("decoding a batch failed")
            return _error(500, "decoding failed; the server's log says why")
        return self._answer(loaded, answer)

    def _authorized(self, request: Request) -> bool:
        if self._token is None:
            return True
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        digest = hashlib.sha256(given.strip().encode()).hexdigest()
        return scheme.lower() == "bearer" and hmac.compare_digest(digest, self._token)

    async def _job(self, request: Request, loaded: LoadedVersion) -> Job:
        """The request read, checked and tokenized; a RequestError for the first problem."""
        kind = request.headers.get("content-type", "").split(";")[0].strip()
        if kind != "application/json":
            raise RequestError(415, f"content type {kind!r}: send application/json")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self._max_body:
            raise RequestError(413, f"a body of {declared} bytes is over the limits' size")
        raw = await request.body()
        if len(raw) > self._max_body:
            raise RequestError(413, f"a body of {len(raw)} bytes is over the limits' size")
        try:
            body = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise RequestError(400, f"the body is not JSON ({exc.msg})") from None
        except UnicodeDecodeError:
            raise RequestError(400, "the body is not UTF-8") from None
        texts, params = texts_and_params(body)
        limits, translator = loaded.limits, loaded.translator
        checked = check_texts(texts, limits)
        decoding = check_params(params, translator.decode, limits)
        src_ids = translator.encode(checked)
        check_pieces(src_ids, loaded.pieces)
        unit = len(src_ids) if self.settings.batch_unit == "sentences" else sum(map(len, src_ids))
        return Job(loaded, decoding, src_ids, min(unit, self.settings.max_batch))

    def _answer(self, loaded: LoadedVersion, answer: Answer) -> Response:
        headers = {
            NAME_HEADER: loaded.name,
            VERSION_HEADER: str(loaded.version),
            BATCH_HEADER: str(answer.batch_sentences),
        }
        return JSONResponse({"predictions": answer.predictions}, headers=headers)

    def __del__(self) -> None:
        follower = getattr(self, "_follower", None)
        if follower is not None:
            follower.close()
        decoder = getattr(self, "_decoder", None)
        if decoder is not None:
            decoder.shutdown(wait=False)
