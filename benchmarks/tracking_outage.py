"""What rank 0's MLflow logging costs a training step while the tracking server is up, refuses
connections (stopped) or hangs (accepts, never answers), against no tracking at all.

Each mode runs the same steps: a fixed torch workload on one thread (a stand-in for a step of
the cluster tests' tiny model), then ``Tracker.metrics`` with one step's metrics, as the worker
logs them: appended to the run's journal, which a sender thread of the same process drains to
the server (in training, the driver's sender: another process). The modes are interleaved in
rounds, so a busy machine skews them alike. The server: ``up`` is ``mlflow server`` on loopback
(SQLite, in a temporary folder; on this machine, so it takes CPU a remote server would not);
``refused`` a loopback port nothing listens on; ``hung`` a loopback socket that listens and never
accepts, so every call waits out its timeout. MLflow's HTTP budget is the pipeline's default
(``TrackingOptions``).

    python benchmarks/tracking_outage.py [--steps 200] [--rounds 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from tracking.journal import Journal, new_key, open_record
from tracking.relay import JournalRelay, Tracker
from tracking.sender import Sender, TrackingOptions

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The MLflow server is started by the tests' own launcher (one launcher, not two): tests/helpers.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from common import report  # noqa: E402
from helpers.mlflow_server import MlflowServer, free_port  # noqa: E402

METRICS = (
    "loss",
    "nll",
    "ppl",
    "lr",
    "tokens_per_s",
    "target_tokens_per_s",
    "grad_norm",
    "memory_gb",
    "epoch",
    "batch_index",
)


def step_work(size: int) -> None:
    a = torch.randn(size, size)
    for _ in range(4):
        a = torch.tanh(a @ a) / size


def tracker_for(
    mode: str, folder: Path, hung_port: int, server_uri: str
) -> tuple[Tracker, Sender] | None:
    """The Tracker of ``mode`` and the sender that drains its journal to the mode's server."""
    if mode == "none":
        return None
    uri = (
        server_uri
        if mode == "up"
        else f"http://127.0.0.1:{free_port() if mode == 'refused' else hung_port}"
    )
    journal = Journal.create(folder, new_key(), uri, "bench")
    journal.append([open_record("bench", mode, {})])
    sender = Sender(TrackingOptions(drain_seconds=0.0), say=lambda line: None)
    sender.watch(journal, uri)
    sender.start()
    # As a rank's records reach the journal: through the relay's unsynced appends.
    return Tracker(JournalRelay(str(journal.folder))), sender


def run_mode(
    mode: str, steps: int, size: int, folder: Path, hung_port: int, server_uri: str
) -> list[float]:
    tracked = tracker_for(mode, folder, hung_port, server_uri)
    took = []
    for step in range(1, steps + 1):
        started = time.perf_counter()
        step_work(size)
        if tracked is not None:
            tracked[0].metrics({k: float(step) for k in METRICS}, step)
        took.append(time.perf_counter() - started)
    if tracked is not None:
        tracked[0].close()
        tracked[1].stop()
    return took


@contextlib.contextmanager
def mlflow_server(folder: Path) -> Iterator[str]:
    """``mlflow server`` on a free loopback port; its URI once it answers."""
    server = MlflowServer(folder)
    server.start()
    try:
        yield server.uri
    finally:
        server.kill()


def summary(mode: str, took: list[float], reference: float) -> dict:
    ordered = sorted(took)
    return {
        "server": mode,
        "steps": len(took),
        "median_ms": 1000 * ordered[len(ordered) // 2],
        "p99_ms": 1000 * ordered[int(0.99 * (len(ordered) - 1))],
        "max_ms": 1000 * ordered[-1],
        "median_vs_none": ordered[len(ordered) // 2] / reference,
        "over_2x_none_median": sum(t > 2 * reference for t in took) / len(took),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="steps per mode and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--size", type=int, default=640, help="the step's matrix size")
    parser.add_argument("--json", help="also write the table here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("MLFLOW_TRACKING_URI", "")  # no ambient server
    os.environ.update(
        TrackingOptions().http_environment()
    )  # as a tfm command sets it for its sender
    modes = ("none", "up", "refused", "hung")
    took: dict[str, list[float]] = {m: [] for m in modes}
    with (
        tempfile.TemporaryDirectory() as tmp,
        socket.socket() as hung,
        mlflow_server(Path(tmp)) as server_uri,
    ):
        hung.bind(("127.0.0.1", 0))
        hung.listen(0)  # connections queue in the backlog; none is ever accepted
        for _ in range(args.rounds):
            for mode in modes:
                took[mode] += run_mode(
                    mode, args.steps, args.size, Path(tmp), hung.getsockname()[1], server_uri
                )
    reference = sorted(took["none"])[len(took["none"]) // 2]
    report(
        "Rank 0's tracking, per training step, by the server's state",
        [summary(m, took[m], reference) for m in modes],
        args.json,
    )


if __name__ == "__main__":
    main()
