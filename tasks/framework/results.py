"""What running or checking a stage gives back (a ``StageResult``, a ``Status``) or raises."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


class StageError(RuntimeError):
    """A stage cannot run: a missing input, bad data, a failed download. The message says why."""


@dataclass(frozen=True)
class StageResult:
    """What running a stage did: where its output is, whether it ran and why, its stats."""

    stage: str
    """Stage name."""
    path: Path
    """The stage's output folder."""
    ran: bool
    """True if it ran now; False if its output was up to date and it was skipped."""
    reason: str
    """Why it ran (forced, missing, what changed) or why it was skipped."""
    stats: dict[str, Any]
    """The manifest's stats (also when skipped)."""
    seconds: float
    """Time spent in this call (checking only, when skipped)."""


@dataclass(frozen=True)
class Status:
    """Where a stage's output folder stands."""

    state: str
    """'up to date', 'stale' or 'missing'."""
    reason: str
    """Why, in a few words."""

    @property
    def up_to_date(self) -> bool:
        return self.state == "up to date"
