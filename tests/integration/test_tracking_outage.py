"""A training rank's MLflow logging through a real MLflow server's outage: the server (SQLite in
tmp_path, on 127.0.0.1) is killed mid-run for longer than the lowered retry budget and
restarted with the same command; the logging loop never waits on it (it only appends to the
run's journal) and every step's metrics end in MLflow once, in step order, sent by the one
sender."""

from __future__ import annotations

import time

import pytest

from tracking.journal import Journal, new_key, open_record
from tracking.relay import Tracker
from tracking.sender import Sender, TrackingOptions

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# One try, no backoff, a 3-s answer: the sender sees the outage in seconds.
BUDGET = TrackingOptions(
    http_retries=1, http_backoff=0, http_timeout=3, drain_seconds=60, probe_seconds=0.5
)


@pytest.fixture
def server(mlflow_server):
    return mlflow_server


def wait_for(condition, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.1)


@pytest.mark.timeout(600)
def test_tracking_outage_loses_nothing_and_never_stops_the_loop(server, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    for key, value in BUDGET.http_environment().items():  # what a tfm command sets for its sender
        monkeypatch.setenv(key, value)
    journal = Journal.create(tmp_path, new_key(), server.uri, "outage")
    journal.append([open_record("outage", "train", {"stage": "train"})])
    lines: list[str] = []
    sender = Sender(BUDGET, say=lines.append)
    sender.watch(journal, server.uri)
    sender.start()
    tracker = Tracker(journal)
    slowest = 0.0

    def log(steps) -> None:
        nonlocal slowest
        for step in steps:
            started = time.monotonic()
            tracker.metrics({"loss": 5.0 / step, "tokens_per_s": 1000.0 + step}, step)
            slowest = max(slowest, time.monotonic() - started)
            time.sleep(0.02)

    log(range(1, 21))
    assert sender.flush([journal], 60)
    server.kill()
    log(range(21, 41))
    # Down for longer than one call's budget: the sender has seen it and keeps the records.
    wait_for(lambda: sender.down(server.uri), 60)
    log(range(41, 141))
    assert not server.running  # the loop went through 120 steps while it was down
    on_disk = [r["metrics"][0][3] for r, _ in journal.read(journal.state().sent)]
    assert on_disk == list(range(21, 141))
    server.start()
    log(range(141, 161))
    assert sender.flush([journal], 120, while_down=True)
    run_id = journal.state().run_id
    history = MlflowClient(server.uri).get_metric_history(run_id, "loss")
    by_time = [m.step for m in sorted(history, key=lambda m: (m.timestamp, m.step))]
    assert by_time == list(range(1, 161))  # each step once, in step order
    assert len(MlflowClient(server.uri).get_metric_history(run_id, "tokens_per_s")) == 160
    assert len([line for line in lines if "is unreachable" in line]) == 1
    assert len([line for line in lines if "answers again" in line]) == 1
    print(f"\nslowest logging call: {1000 * slowest:.1f} ms")
