"""Sentences translated so far, as the corpus translator's driver reports them
(``serving.corpus_translation``): a bar at a terminal, else a line at every tenth."""

from __future__ import annotations

import os
import sys
import time
from typing import IO

__all__ = ["Progress"]


class Progress:
    """Sentences translated so far: a tqdm bar for a person at a terminal, else (logs, CI) a
    plain line at every tenth of the total, with the rate, elapsed time and ETA."""

    def __init__(
        self,
        total: int,
        out: IO[str] | None = None,
        bar: bool | None = None,
        label: str = "translate",
    ):
        from tqdm import tqdm

        self.total, self.done, self.out, self.label = total, 0, out or sys.stderr, label
        if bar is None:
            bar = self.out.isatty() and os.environ.get("CI", "").lower() != "true"
        self.bar = tqdm(total=total, unit="sent", desc=label, file=self.out) if bar else None
        self.started, self.next_line = time.time(), 0.1

    def update(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            return
        if self.done / self.total + 1e-9 < self.next_line and self.done < self.total:
            return
        from tqdm import tqdm

        elapsed = time.time() - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        self.out.write(
            f"{self.label} {self.done}/{self.total} sentences "
            f"({100 * self.done / self.total:.0f}%)"
            f" | {rate:,.1f} sent/s | {tqdm.format_interval(elapsed)} elapsed, ETA "
            f"{tqdm.format_interval(eta)}\n"
        )
        self.out.flush()
        while self.next_line <= self.done / self.total + 1e-9:
            self.next_line += 0.1

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
