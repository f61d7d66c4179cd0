"""A load generator for a translation server (``tfm serve``, ``mlflow models serve``): closed-loop
clients, each sending one request, waiting for its answer, then sending the next, for a while;
what came back is counted (sentences a second, latency percentiles, errors by status).
``make bench-serve`` and the serving tests drive servers with it; a team can point it at its
own deployment:

    python -m serving.closed_loop --url http://127.0.0.1:8000/invocations --texts test.en \\
        --clients 32 --seconds 20

Hand-written on aiohttp (which Ray brings) rather than a load tool: each request carries a line
of a test set, and the answers are checked as MLflow's scoring protocol writes them.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["LoadResult", "percentile", "run_load"]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values`` by the nearest rank; NaN for none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass
class LoadResult:
    """What ``clients`` closed-loop clients got in ``seconds`` of measurement."""

    clients: int
    seconds: float
    sentences: int = 0
    """Sentences translated (200 answers) that ended inside the measured window."""
    latencies: list[float] = field(default_factory=list)
    """Seconds per answered request (200), inside the window."""
    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    """Answers by HTTP status (0: no answer, a connection error or a timeout)."""
    versions: collections.Counter[str] = field(default_factory=collections.Counter)
    """Answers (200) by the X-Model-Version header."""
    batches: collections.Counter[int] = field(default_factory=collections.Counter)
    """Answers (200) by the X-Batch-Sentences header."""

    @property
    def rate(self) -> float:
        """Sentences a second."""
        return self.sentences / self.seconds

    @property
    def errors(self) -> int:
        """Requests not answered 200."""
        return sum(n for status, n in self.statuses.items() if status != 200)

    def row(self) -> dict[str, object]:
        """A table row: clients, sentences/s, p50 and p99 latency (ms), errors."""
        return {
            "clients": self.clients,
            "sentences_per_s": round(self.rate, 1),
            "p50_ms": round(percentile(self.latencies, 50) * 1000, 1),
            "p99_ms": round(percentile(self.latencies, 99) * 1000, 1),
            "errors": self.errors,
        }


async def _client(
    session: object,
    url: str,
    texts: Sequence[str],
    first: int,
    window: tuple[float, float],
    headers: Mapping[str, str],
    result: LoadResult,
) -> None:
    import aiohttp

    start, stop = window
    i = first
    while (sent := time.monotonic()) < stop:
        text = texts[i % len(texts)]
        i += 1
        status, version, batch = 0, "", 0
        try:
            async with session.post(url, json={"inputs": [text]}, headers=headers) as answer:  # type: ignore[attr-defined]
                await answer.read()
                status = answer.status
                version = answer.headers.get("X-Model-Version", "")
                batch = int(answer.headers.get("X-Batch-Sentences", "0") or 0)
        except (TimeoutError, aiohttp.ClientError):
            pass
        done = time.monotonic()
        if sent < start or done > stop:
            continue
        result.statuses[status] += 1
        if status == 200:
            result.sentences += 1
            result.latencies.append(done - sent)
            result.versions[version] += 1
            result.batches[batch] += 1


async def _load(
    url: str,
    texts: Sequence[str],
    clients: int,
    seconds: float,
    warmup: float,
    headers: Mapping[str, str],
    timeout: float,
) -> LoadResult:
    import aiohttp

    result = LoadResult(clients, seconds)
    start = time.monotonic() + warmup
    window = (start, start + seconds)
    connector = aiohttp.TCPConnector(limit=0)  # one connection a client, however many
    limits = aiohttp.ClientTimeout(total=timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=limits) as session:
        spread = max(1, len(texts) // clients)
        await asyncio.gather(
            *(
                _client(session, url, texts, c * spread, window, headers, result)
                for c in range(clients)
            )
        )
    return result


def run_load(
    url: str,
    texts: Sequence[str],
    clients: int,
    seconds: float,
    *,
    warmup: float = 2.0,
    token: str | None = None,
    timeout: float = 60.0,
) -> LoadResult:
    """``clients`` closed-loop clients, each sending one text a request (client c from text
    c * len(texts) / clients on), for ``warmup`` + ``seconds``; what the last ``seconds``
    answered. ``token``: sent as a bearer token."""
    if not texts:
        raise ValueError("no texts to send")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return asyncio.run(_load(url, texts, clients, seconds, warmup, headers, timeout))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the server's /invocations URL")
    parser.add_argument("--texts", required=True, help="a file of texts, one a line")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--token-env", help="environment variable holding a bearer token")
    args = parser.parse_args(argv)
    import os

    token = os.environ.get(args.token_env, "") if args.token_env else None
    texts = [
        line.rstrip("\n") for line in Path(args.texts).read_text(encoding="utf-8").splitlines()
    ]
    for clients in args.clients:
        print(run_load(args.url, texts, clients, args.seconds, token=token).row(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
