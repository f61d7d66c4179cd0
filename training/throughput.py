"""Training throughput: tokens, target tokens and model FLOPs per second over the steps between
two logging steps, timing training only (validation and checkpoints start a new interval)."""

from __future__ import annotations


class ThroughputMeter:
    """The tokens and model FLOPs of the steps since the last reading and when the first of them
    began; ``timed_tokens``, ``timed_targets`` and ``timed_seconds`` sum the intervals read with
    ``timed``."""

    def __init__(self, world_size: int, peak_flops: float | None):
        self.world_size, self.peak_flops = world_size, peak_flops
        self.timed_tokens, self.timed_targets, self.timed_seconds = 0, 0, 0.0
        self.reset()

    def reset(self) -> None:
        """Drop the open interval: the next step starts a new one (after other work)."""
        self.start: float | None = None
        self.tokens = self.targets = 0
        self.flops = 0.0

    def add(self, started: float, tokens: int, targets: int, flops: float) -> None:
        """Count a step begun at ``started``: its tokens (both sides), target tokens, FLOPs."""
        if self.start is None:
            self.start = started
        self.tokens += tokens
        self.targets += targets
        self.flops += flops

    def read(self, now: float, timed: bool) -> dict[str, float | None]:
        """The rates over the interval, ended at ``now`` (after a host sync); ``timed`` adds it
        to the totals (the first interval after a start is warm-up). A new interval starts."""
        assert self.start is not None, "read() before a step was counted"
        seconds, tokens, targets, flops = now - self.start, self.tokens, self.targets, self.flops
        if timed:
            self.timed_tokens += tokens
            self.timed_targets += targets
            self.timed_seconds += seconds
        self.reset()
        tokens_per_s = tokens / seconds if seconds > 0 else 0.0
        flops_per_s = flops / seconds / self.world_size if seconds > 0 else 0.0  # per worker
        return {
            "tokens_per_s": tokens_per_s,
            "tokens_per_s_per_worker": tokens_per_s / self.world_size,
            "target_tokens_per_s": targets / seconds if seconds > 0 else 0.0,
            "tflops_per_worker": flops_per_s / 1e12,
            "mfu": flops_per_s / self.peak_flops if self.peak_flops else None,
        }

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens per second over the timed intervals; None before one."""
        return self.timed_tokens / self.timed_seconds if self.timed_seconds > 0 else None
