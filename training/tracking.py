"""MLflow for training: rank 0's ``Tracker`` inside the workers, and on the driver the run's
params and learning curve. The run itself is opened by ``tasks.tracking.training_run``."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class Tracker:
    """Rank 0's MLflow client; a no-op on other ranks or without a run id."""

    def __init__(self, tracking_uri: str | None, run_id: str | None, enabled: bool):
        self.run_id = run_id if enabled else None
        self.client = None
        if self.run_id and tracking_uri:
            from mlflow.tracking import MlflowClient

            self.client = MlflowClient(tracking_uri)

    def metrics(self, values: dict[str, float], step: int) -> None:
        if self.client is None or not values:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in values.items() if v is not None]
        self.client.log_batch(self.run_id, metrics=batch)

    def param(self, key: str, value: Any) -> None:
        if self.client is not None:
            self.client.log_param(self.run_id, key, value)

    def tag(self, key: str, value: str) -> None:
        if self.client is not None:
            self.client.set_tag(self.run_id, key, value)


def log_params(client: Any, run_id: str, params: Mapping[str, Any]) -> None:
    """Log params a run does not have yet; a changed value (e.g. more steps on resume) is a tag."""
    from mlflow.entities import Param, RunTag

    existing = client.get_run(run_id).data.params
    new, changed = [], []
    for key, value in params.items():
        text = str(value)[:6000]
        if key not in existing:
            new.append(Param(key, text))
        elif existing[key] != text:
            changed.append(RunTag(f"param_changed.{key}", text))
    for i in range(0, len(new), 100):
        client.log_batch(run_id, params=new[i : i + 100])
    if changed:
        client.log_batch(run_id, tags=changed)


def learning_curve(client: Any, run_id: str, path: Path) -> Path | None:
    """Train and validation loss, and dev BLEU when measured (right axis), against step (left
    panel) and wall-clock minutes since the run's first metric (right panel); matplotlib, Agg."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {}
    for key in ("loss", "val_loss", "val_bleu"):
        history = {m.step: m for m in client.get_metric_history(run_id, key)}
        if history:
            series[key] = [history[s] for s in sorted(history)]
    if not ("loss" in series or "val_loss" in series):
        return None
    t0 = min(m.timestamp for ms in series.values() for m in ms)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for ax, x_label, x_of in (
        (axes[0], "step", lambda m: m.step),
        (axes[1], "wall-clock minutes", lambda m: (m.timestamp - t0) / 60_000),
    ):
        lines = []
        for key, label in (("loss", "train loss"), ("val_loss", "validation loss")):
            if key in series:
                ms = series[key]
                marker = "." if len(ms) < 50 else None
                lines += ax.plot([x_of(m) for m in ms], [m.value for m in ms], label=label, marker=marker)
        ax.set_xlabel(x_label)
        ax.set_ylabel("label-smoothed loss per token")
        ax.grid(alpha=0.3)
        if "val_bleu" in series:
            bleu_ax = ax.twinx()
            ms = series["val_bleu"]
            lines += bleu_ax.plot(
                [x_of(m) for m in ms], [m.value for m in ms], "g.-", label="dev BLEU (greedy)"
            )
            bleu_ax.set_ylabel("sacreBLEU")
        ax.legend(lines, [line.get_label() for line in lines], loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
