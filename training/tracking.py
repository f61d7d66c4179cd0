"""MLflow for training: rank 0's ``Tracker`` inside the workers (queued, never waiting on the
server: ``training.tracking_queue``), and on the driver the run's params and learning curve.
The run itself is opened by ``tasks.framework.tracking.training_run``."""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from training.tracking_queue import TrackingQueue
from training.tracking_spill import SPILL_FILE, Record, SpillFile, metrics_record

if TYPE_CHECKING:  # imported where it is used: rank 0 alone loads MLflow
    from mlflow import MlflowClient


@dataclass(frozen=True, kw_only=True)
class TrackingOptions:
    """How rank 0 logs without waiting on the server (the run config's ``mlflow`` section)."""

    queue_size: int = 1000
    """Logging calls held in memory before they spill to the spill file."""
    spill_dir: str | None = None
    """A local folder for the spill file (``<spill_dir>/<run name>/tracking_spill.jsonl``);
    None: the Ray Train run folder when it is local, else the system's temporary folder."""
    http_retries: int = 2
    """MLflow's HTTP retries per call of the logging thread (MLflow's default 7 takes 254 s)."""
    http_backoff: int = 1
    """MLflow's HTTP backoff factor for the logging thread (MLflow's default: 2)."""
    http_timeout: int = 10
    """Seconds the logging thread waits for one HTTP answer (MLflow's default: 120)."""
    drain_seconds: float = 60.0
    """At the end of training, how long rank 0 waits for queued records to reach the server
    before it leaves them in the spill file."""
    probe_seconds: float = 2.0
    """While the server is unreachable, seconds between two tries of the next record."""

    def http_env(self) -> dict[str, str]:
        """MLflow's HTTP budget as its environment variables, which it reads on every call."""
        return {
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(self.http_retries),
            "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": str(self.http_backoff),
            "MLFLOW_HTTP_REQUEST_TIMEOUT": str(self.http_timeout),
        }


def spill_folder(configured: str | None, storage_path: str | None, run_name: str) -> str:
    """Where a training's spill file goes: ``configured/<run name>``, else its Ray Train run
    folder when the storage is local, else (a URI, or None: an object store) the system's
    temporary folder (an append-only file needs a file system, not an object store)."""
    if configured:
        return f"{configured.rstrip('/')}/{run_name}"
    if storage_path is not None and "://" not in storage_path:
        return f"{storage_path.rstrip('/')}/{run_name}"
    return f"{tempfile.gettempdir()}/tfm-tracking/{run_name}"


LOCK_WAIT_SECONDS = 60.0
"""How long a Tracker waits for another process's lock on its spill file."""


class Tracker:
    """Rank 0's MLflow logging through a ``TrackingQueue`` (a background thread, a spill file in
    ``spill_dir``): a call never waits on the server. A no-op on other ranks or without a run."""

    def __init__(
        self,
        tracking_uri: str | None,
        run_id: str | None,
        enabled: bool,
        *,
        spill_dir: str | Path | None = None,
        options: TrackingOptions | None = None,
        out: IO[str] | None = None,
    ):
        self.run_id = run_id if enabled and tracking_uri else None
        self.options = options or TrackingOptions()
        self.out = out or sys.stderr
        self.queue: TrackingQueue | None = None
        self._lock = contextlib.ExitStack()
        if self.run_id and tracking_uri:
            from mlflow.tracking import MlflowClient

            if spill_dir is None:
                raise ValueError("Tracker: a run to log into needs a spill_dir")
            spill = SpillFile(Path(spill_dir) / SPILL_FILE)
            # A `tfm tracking replay` of the file finishes first; a process that still holds
            # it after a minute (a worker Ray failed to end) must not stop training.
            if not self._lock.enter_context(spill.locked(wait=LOCK_WAIT_SECONDS)):
                self.out.write(f"tracking: {spill.path} is locked by another process; "
                               "logging to it anyway\n")
            self.queue = TrackingQueue(
                MlflowClient(tracking_uri),
                spill,
                capacity=self.options.queue_size,
                probe_seconds=self.options.probe_seconds,
                out=self.out,
            )

    def metrics(self, values: dict[str, float], step: int) -> None:
        if self.queue is not None and self.run_id and values:
            self.queue.put(metrics_record(self.run_id, values, step))

    def param(self, key: str, value: Any) -> None:
        if self.queue is not None and self.run_id:
            self.queue.put(Record(self.run_id, params=((key, str(value)[:6000]),)))

    def tag(self, key: str, value: str) -> None:
        if self.queue is not None and self.run_id:
            self.queue.put(Record(self.run_id, tags=((key, str(value)[:5000]),)))

    def close(self, timeout: float | None = None) -> int:
        """Wait (``drain_seconds`` at most) for the queue to reach the server; else leave the rest
        in the spill file and say so in one line. Returns the records left there."""
        if self.queue is None:
            return 0
        queue, self.queue = self.queue, None
        left = queue.close(self.options.drain_seconds if timeout is None else timeout)
        self._lock.close()
        if left:
            self.out.write(
                f"tracking: {left} record(s) did not reach the MLflow server; they are kept in "
                f"{queue.spill.path} and written in order by `tfm tracking replay <config>` or "
                "the next `tfm run` / `tfm stage train` of this work dir\n"
            )
            self.out.flush()
        return left


def log_params(client: MlflowClient, run_id: str, params: Mapping[str, Any]) -> None:
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


def learning_curve(client: MlflowClient, run_id: str, path: Path) -> Path | None:
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
