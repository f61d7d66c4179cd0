"""What rank 0 prints while it trains: where it starts, one line per logging step (step / total,
loss, lr, target tokens/s, the last validation's perplexity and BLEU, elapsed and ETA), and a
warning when the encoder collapses. The line of a step that validates waits for its validation,
so that it shows that validation's figures, not the one before (the last line, the last ones).

Plain lines rather than a bar: they reach the driver's console through Ray's worker-log
forwarding, which passes lines, and read the same in a terminal, CI and a log file. Written,
not printed: Ray Train patches a worker's ``print`` to log each line besides printing it, which
would show every line twice.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any


def duration(seconds: float) -> str:
    """``1h02m``, ``4m05s``, ``12s``."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class Progress:
    """Lines for the steps ``start_step + 1 .. total``; silent unless ``enabled`` (rank 0)."""

    def __init__(
        self,
        total: int,
        start_step: int,
        *,
        enabled: bool = True,
        spread_floor: float = 0.0,
        eval_every: int = 0,
        out: IO[str] | None = None,
    ):
        self.total, self.start_step, self.enabled = total, start_step, enabled
        self.spread_floor, self.eval_every = spread_floor, eval_every
        self.out = out or sys.stderr
        self.started = time.time()
        self.validation: dict[str, float] = {}
        self.held: tuple[int, dict[str, Any]] | None = None

    def begun(self, world_size: int) -> str:
        """The one line that says where training starts: step 1, or a checkpoint."""
        if self.start_step == 0:
            return self._print(f"train starting: {self.total} steps, {world_size} worker(s)")
        return self._print(
            f"train resuming from step {self.start_step}/{self.total} (its checkpoint: the "
            f"weights, optimizer, data position and RNG states), {world_size} worker(s)"
        )

    def validates(self, step: int) -> bool:
        """Whether ``step`` ends with a validation (``Trainer.maybe_evaluate``'s rule)."""
        return step == self.total or bool(self.eval_every and step % self.eval_every == 0)

    def step(self, step: int, metrics: dict[str, Any]) -> str | None:
        """The line for a logging step's ``metrics`` (nothing for other steps); held until its
        validation when the step validates."""
        if not metrics:
            return None
        self.release()
        if self.validates(step):
            self.held = (step, dict(metrics))
            return None
        return self._print(self.line(step, metrics))

    def release(self) -> str | None:
        """The held line, printed with the figures of the latest validation."""
        if self.held is None:
            return None
        step, metrics = self.held
        self.held = None
        return self._print(self.line(step, metrics))

    def line(self, step: int, metrics: dict[str, Any]) -> str:
        elapsed = time.time() - self.started
        done = step - self.start_step
        eta = elapsed / done * (self.total - step) if done > 0 else 0.0
        parts = [
            f"train step {step}/{self.total} ({100 * step / self.total:.0f}%)",
            f"loss {metrics['loss']:.3f}",
            f"lr {metrics['lr']:.2e}",
            f"{metrics.get('target_tokens_per_s', 0.0):,.0f} tgt tok/s",
        ]
        if "val_ppl" in self.validation:
            parts.append(f"dev ppl {self.validation['val_ppl']:.2f}")
        if "val_bleu" in self.validation:
            parts.append(f"dev BLEU {self.validation['val_bleu']:.1f}")
        parts.append(f"{duration(elapsed)} elapsed, ETA {duration(eta)}")
        return " | ".join(parts)

    def validated(self, step: int, metrics: dict[str, float]) -> str | None:
        """Remember a validation's metrics and print the step's held line with them; returns a
        warning line if the encoder has collapsed."""
        if not metrics:
            return None
        self.validation = dict(metrics)
        self.release()
        spread = metrics.get("val_encoder_spread")
        if spread is not None and spread < self.spread_floor:
            return self._print(self.collapse_warning(step, spread))
        return None

    def collapse_warning(self, step: int, spread: float) -> str:
        return (
            f"WARNING step {step}: val_encoder_spread {spread:.3f} < {self.spread_floor:g} "
            "(train.warn_encoder_spread): the encoder's output barely differs between source "
            "positions, so the decoder is translating without its source (a collapsed "
            "encoder; docs/training.md says what to try)"
        )

    def _print(self, line: str) -> str:
        if self.enabled:
            self.out.write(line + "\n")
            self.out.flush()
        return line
