"""The best validation so far by ``val_bleu`` (whose weights a run keeps as its best checkpoint)
and patience: how many validations since it, and whether that is enough to stop."""

from __future__ import annotations

from typing import Any


class BestCheckpoint:
    """``record`` (step and ``val_bleu`` of the best validation, ``{}`` before one),
    ``since_best`` (validations since) and ``improved`` (the last one set a new best); out of
    patience after ``patience`` validations without a better score (None: never)."""

    def __init__(self, patience: int | None):
        self.patience = patience
        self.record: dict[str, Any] = {}
        self.since_best = 0
        self.improved = False

    def update(self, step: int, val_bleu: float) -> bool:
        """Count a validation; whether it is the best so far (the first of equals stays best)."""
        self.improved = val_bleu > self.record.get("val_bleu", -1.0)
        if self.improved:
            self.record, self.since_best = {"step": step, "val_bleu": val_bleu}, 0
        else:
            self.since_best += 1
        return self.improved

    @property
    def out_of_patience(self) -> bool:
        """``patience`` validations in a row without a better score."""
        return self.patience is not None and self.since_best >= self.patience

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint carries (``best`` and ``since_best``)."""
        return {"best": dict(self.record), "since_best": self.since_best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's state (one without these keys: no validation yet)."""
        self.record = dict(state.get("best") or {})
        self.since_best = int(state.get("since_best", 0))
