"""The replica's batcher (serving.request_batcher): the next batch is formed when the decoder is
free, from everything that came meanwhile, within its size; a failure is its batch's alone."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from serving.request_batcher import RequestBatcher


class Decoder:
    """Records each batch; the first one waits for ``release`` (a decoder busy for a while)."""

    def __init__(self, fail_on: str | None = None):
        self.batches: list[list[str]] = []
        self.release = threading.Event()
        self.fail_on = fail_on

    def __call__(self, items: list[str]) -> list[str]:
        self.batches.append(list(items))
        if len(self.batches) == 1:
            self.release.wait(5)
        if self.fail_on in items:
            raise RuntimeError(f"cannot decode {self.fail_on}")
        return [item.upper() for item in items]


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 10))


def test_requests_that_come_while_it_decodes_form_the_next_batch():
    decoder = Decoder()

    async def scenario():
        batcher = RequestBatcher(decoder, ThreadPoolExecutor(1), max_size=4, wait_s=0.05)
        first = asyncio.create_task(batcher.submit("a"))
        await asyncio.sleep(0.1)  # "a" is decoding alone; six more come meanwhile
        rest = [asyncio.create_task(batcher.submit(x)) for x in "bcdefg"]
        await asyncio.sleep(0.1)
        decoder.release.set()
        return await first, await asyncio.gather(*rest)

    first, rest = run(scenario())
    assert (first, rest) == ("A", ["B", "C", "D", "E", "F", "G"])
    assert decoder.batches == [["a"], ["b", "c", "d", "e"], ["f", "g"]]


def test_a_lone_request_waits_no_longer_than_wait_s_and_size_is_counted():
    decoder = Decoder()
    decoder.release.set()

    async def scenario():
        batcher = RequestBatcher(decoder, ThreadPoolExecutor(1), max_size=5, wait_s=0.02, size=len)
        alone = await batcher.submit("abc")
        # "abcdef" is over the size: decoded alone; "xy" and "z" fit together (3 <= 5).
        found = await asyncio.gather(*(batcher.submit(x) for x in ("abcdef", "xy", "z")))
        return alone, found

    alone, found = run(scenario())
    assert alone == "ABC" and found == ["ABCDEF", "XY", "Z"]
    assert decoder.batches == [["abc"], ["abcdef"], ["xy", "z"]]


def test_a_failed_batch_fails_its_requests_only_and_gone_clients_are_skipped():
    decoder = Decoder(fail_on="bad")
    decoder.release.set()

    async def scenario():
        batcher = RequestBatcher(decoder, ThreadPoolExecutor(1), max_size=2, wait_s=0.01)
        failed = await asyncio.gather(
            batcher.submit("bad"), batcher.submit("x"), return_exceptions=True
        )
        gone = asyncio.create_task(batcher.submit("gone"))
        await asyncio.sleep(0)
        gone.cancel()
        return failed, await batcher.submit("ok")

    failed, ok = run(scenario())
    assert [str(e) for e in failed] == ["cannot decode bad"] * 2
    assert ok == "OK"
    assert ["gone"] not in decoder.batches


@pytest.mark.parametrize("max_size", [1, 3])
def test_no_batch_is_over_its_size(max_size: int):
    decoder = Decoder()
    decoder.release.set()

    async def scenario():
        batcher = RequestBatcher(decoder, ThreadPoolExecutor(1), max_size=max_size, wait_s=0.01)
        return await asyncio.gather(*(batcher.submit(str(i)) for i in range(7)))

    assert run(scenario()) == [str(i) for i in range(7)]
    assert all(len(b) <= max_size for b in decoder.batches)
    assert sorted(x for b in decoder.batches for x in b) == sorted(str(i) for i in range(7))
