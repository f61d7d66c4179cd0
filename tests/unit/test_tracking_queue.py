"""Training's MLflow logging off the loop (training/tracking_queue.py, tracking_spill.py,
tracking.py; tasks/framework/tracking.py at a stage's end): the bounded queue, the spill file and its
replay, against a real MLflow SQLite store in tmp_path.

An outage is a ``Switch`` in front of the real store: while it is off, a call raises as a
refused connection does; while it is on, the call goes to the store. The real server killed
and restarted is tests/integration/test_tracking_outage.py."""

from __future__ import annotations

import io
import socket
import threading
import time

import pytest

from training.tracking import Tracker, TrackingOptions
from training.tracking_queue import TrackingQueue
from training.tracking_spill import (
    REJECTED_FILE,
    SPILL_FILE,
    Record,
    SpillFile,
    metrics_record,
    replay,
)


@pytest.fixture(scope="module")
def sqlite_store(tmp_path_factory):
    """A real MLflow SQLite store (its migrations take seconds: one per module) and an
    experiment in it."""
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("mlflow")
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    return client, client.create_experiment("t", artifact_location=str(root / "artifacts"))


@pytest.fixture
def store(sqlite_store):
    """The store's client and a new open run's id."""
    client, experiment = sqlite_store
    return client, client.create_run(experiment).info.run_id


class Switch:
    """The store behind an on/off switch, remembering the steps of what reached it in order."""

    def __init__(self, client, up: bool = True):
        self.client, self.up = client, up
        self.arrived: list[int] = []
        self.gate = threading.Event()
        self.gate.set()

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        self.gate.wait()
        if not self.up:
            raise ConnectionError("[Errno 111] Connection refused")
        self.client.log_batch(run_id, metrics=list(metrics), params=list(params), tags=list(tags))
        self.arrived += [m.step for m in metrics]

    def set_terminated(self, run_id, status=None, end_time=None):
        if not self.up:
            raise ConnectionError("[Errno 111] Connection refused")
        self.client.set_terminated(run_id, status, end_time)

    def get_run(self, run_id):
        if not self.up:
            raise ConnectionError("[Errno 111] Connection refused")
        return self.client.get_run(run_id)


def steps_in_store(client, run_id, key="loss") -> list[int]:
    """The steps of ``key`` in the store, in the order of their timestamps, duplicates kept."""
    history = client.get_metric_history(run_id, key)
    return [m.step for m in sorted(history, key=lambda m: (m.timestamp, m.step))]


def wait_for(condition, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def put_steps(queue: TrackingQueue, run_id: str, steps, capacity: int | None = None) -> None:
    for step in steps:
        queue.put(metrics_record(run_id, {"loss": 10.0 - step / 10, "lr": step * 1e-4}, step))
        if capacity is not None:
            assert len(queue._state.memory) <= capacity  # bounded memory, whatever happens
        time.sleep(0.001)  # distinct timestamps, as steps are in training


def test_records_reach_the_store_in_order_and_once(store, tmp_path):
    client, run_id = store
    sink = Switch(client)
    queue = TrackingQueue(sink, SpillFile(tmp_path / SPILL_FILE), capacity=5)
    put_steps(queue, run_id, range(40), capacity=5)
    assert queue.close(timeout=30) == 0
    assert sink.arrived == sorted(sink.arrived)
    assert steps_in_store(client, run_id) == list(range(40))
    assert steps_in_store(client, run_id, "lr") == list(range(40))
    assert not (tmp_path / SPILL_FILE).exists()


def test_an_outage_spills_to_the_file_then_everything_is_written_in_order_once(store, tmp_path):
    client, run_id = store
    out = io.StringIO()
    sink = Switch(client)
    spill = SpillFile(tmp_path / SPILL_FILE)
    queue = TrackingQueue(sink, spill, capacity=4, probe_seconds=0.05, out=out)
    put_steps(queue, run_id, range(10), capacity=4)
    wait_for(lambda: len(sink.arrived) == 20)  # two metrics per step
    sink.up = False
    queue.put(Record(run_id, tags=(("phase", "a"),)))
    put_steps(queue, run_id, range(10, 60), capacity=4)
    queue.put(Record(run_id, tags=(("phase", "b"),)))
    wait_for(lambda: spill.count() == 52)  # the server is down: every record is on disk
    assert steps_in_store(client, run_id) == list(range(10))
    sink.up = True
    put_steps(queue, run_id, range(60, 70), capacity=4)
    assert queue.close(timeout=30) == 0
    assert steps_in_store(client, run_id) == list(range(70))
    assert sink.arrived == sorted(sink.arrived)
    assert client.get_run(run_id).data.tags["phase"] == "b"  # the later tag won
    lines = out.getvalue().splitlines()
    assert len([line for line in lines if "unreachable" in line]) == 1
    assert len([line for line in lines if "answers again" in line]) == 1
    assert not spill.path.exists()


def test_a_full_queue_spills_while_the_server_is_slow(store, tmp_path):
    client, run_id = store
    sink = Switch(client)
    sink.gate.clear()  # every call waits: the queue fills
    spill = SpillFile(tmp_path / SPILL_FILE)
    queue = TrackingQueue(sink, spill, capacity=3)
    put_steps(queue, run_id, range(30), capacity=3)
    assert spill.count() >= 30 - 3 - 3  # beyond memory and the call in flight: on disk
    sink.gate.set()
    assert queue.close(timeout=30) == 0
    assert sink.arrived == sorted(sink.arrived)
    assert steps_in_store(client, run_id) == list(range(30))


def test_close_leaves_the_rest_in_the_file_and_a_replay_writes_it_once(store, tmp_path):
    client, run_id = store
    sink = Switch(client, up=False)
    spill = SpillFile(tmp_path / SPILL_FILE)
    queue = TrackingQueue(sink, spill, capacity=8, probe_seconds=0.05, out=io.StringIO())
    put_steps(queue, run_id, range(25), capacity=8)
    queue.put(Record(run_id, status="FINISHED", end_time=int(time.time() * 1000)))
    assert queue.close(timeout=0.3) == 26
    assert steps_in_store(client, run_id) == []
    assert client.get_run(run_id).info.status == "RUNNING"
    # A replay that dies after writing some records, before it notes how far it got.
    records = [r for r, _ in spill.read(0)]
    for record in records[:7]:
        client.log_batch(run_id, metrics=[_metric(m) for m in record.metrics])
    assert replay(client, spill, say=lambda line: None) == 0
    assert steps_in_store(client, run_id) == list(range(25))  # the store kept each once
    assert client.get_run(run_id).info.status == "FINISHED"  # the run's end came last
    assert not spill.path.exists()
    assert replay(client, spill) == 0


def test_a_spill_file_left_by_an_earlier_run_goes_first(store, tmp_path):
    client, run_id = store
    spill = SpillFile(tmp_path / SPILL_FILE)
    spill.append(metrics_record(run_id, {"loss": 1.0}, step) for step in range(10))
    with open(spill.path, "a") as f:
        f.write('{"run_id": "cut mid-line by a crash"')  # not a record until its newline
    sink = Switch(client)
    queue = TrackingQueue(sink, spill, capacity=4)
    put_steps(queue, run_id, range(10, 20))
    assert queue.close(timeout=30) == 0  # the half line is skipped, the next record kept
    assert sink.arrived == list(range(10)) + [s for s in range(10, 20) for _ in (0, 1)]
    assert steps_in_store(client, run_id) == list(range(20))


def test_a_refused_record_is_kept_aside_and_the_rest_goes_on(store, tmp_path):
    client, run_id = store
    client.log_param(run_id, "lr", "1")
    out = io.StringIO()
    queue = TrackingQueue(Switch(client), SpillFile(tmp_path / SPILL_FILE), out=out)
    put_steps(queue, run_id, range(3))
    queue.put(Record(run_id, params=(("lr", "2"),)))  # a param cannot change: HTTP 400
    put_steps(queue, run_id, range(3, 6))
    assert queue.close(timeout=30) == 0
    assert steps_in_store(client, run_id) == list(range(6))
    rejected = (tmp_path / REJECTED_FILE).read_text().splitlines()
    assert [Record.from_json(line).params for line in rejected] == [(("lr", "2"),)]
    assert "refused 1 record" in out.getvalue()


def test_the_tracker_returns_at_once_when_the_server_is_gone(tmp_path, monkeypatch, caplog):
    """A real HTTP client against a port nothing listens on: every call returns, the console
    says once that the server is unreachable (and urllib3 not once per retried call), and
    closing leaves the records in the file."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed: connections are refused
    caplog.set_level("WARNING", logger="urllib3.connectionpool")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    out = io.StringIO()
    options = TrackingOptions(queue_size=4, drain_seconds=0.5, probe_seconds=0.05)
    tracker = Tracker(f"http://127.0.0.1:{port}", "0" * 32, True, spill_dir=tmp_path,
                      options=options, out=out)
    tracker.param("n_parameters", 123)
    for step in range(1, 101):
        tracker.metrics({"loss": 1.0 / step}, step)
    tracker.tag("warning.encoder_collapse", "step 50")
    left = tracker.close()
    assert left == 102
    records = [r for r, _ in SpillFile(tmp_path / SPILL_FILE).read(0)]
    assert [r.metrics[0][3] for r in records if r.metrics] == list(range(1, 101))
    assert records[0].params == (("n_parameters", "123"),)
    lines = out.getvalue().splitlines()
    assert len([line for line in lines if "unreachable" in line]) == 1
    assert "102 record(s) did not reach" in lines[-1] and str(tmp_path) in lines[-1]
    assert [r.getMessage() for r in caplog.records if r.name.startswith("urllib3")] == []


def test_other_ranks_and_runs_without_an_id_log_nothing(tmp_path):
    tracker = Tracker("http://127.0.0.1:1", "run", enabled=False, spill_dir=tmp_path)
    tracker.metrics({"loss": 1.0}, 1)
    assert tracker.close() == 0
    assert not any(tmp_path.iterdir())


def test_the_mlflow_section_refuses_bad_tracking_knobs():
    from tasks.framework.config import ConfigError, config_from_dict

    with pytest.raises(ConfigError, match="queue_size"):
        config_from_dict({"name": "r", "mlflow": {"queue_size": 0}})
    with pytest.raises(ConfigError, match="drain_seconds"):
        config_from_dict({"name": "r", "mlflow": {"drain_seconds": -1}})


def _metric(m):
    from mlflow.entities import Metric

    return Metric(*m)


def _config_file(tmp_path, uri: str):
    import yaml

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"name": "r", "workdir": str(tmp_path / "work"),
                                    "mlflow": {"tracking_uri": uri, "http_retries": 0,
                                               "http_timeout": 2}}))
    return path


def test_tfm_tracking_replay_writes_a_left_spill_file_once(store, tmp_path, capsys):
    from pipelines.cli import main

    client, run_id = store
    uri = client._tracking_client.tracking_uri
    spill = SpillFile(tmp_path / "work" / "train_ray" / "train-abc" / SPILL_FILE)
    spill.append(metrics_record(run_id, {"loss": 1.0 / (s + 1)}, s) for s in range(12))
    read = list(spill.read(0))
    for record, _ in read[:6]:  # the first half reached the server before the outage's end
        client.log_batch(run_id, metrics=[_metric(m) for m in record.metrics])
    spill.commit(read[5][1])
    assert main(["tracking", "replay", str(_config_file(tmp_path, uri))]) == 0
    assert "wrote 6 record(s)" in capsys.readouterr().out
    assert steps_in_store(client, run_id) == list(range(12))
    assert not spill.path.exists()
    assert main(["tracking", "replay", str(_config_file(tmp_path, uri))]) == 0
    assert "nothing to replay" in capsys.readouterr().out


def test_tfm_tracking_replay_keeps_the_file_while_the_server_is_down(tmp_path, capsys):
    from pipelines.cli import main

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spill = SpillFile(tmp_path / "work" / SPILL_FILE)
    spill.append([Record("0" * 32, tags=(("skipped", "false"),))])
    assert main(["tracking", "replay", str(_config_file(tmp_path, f"http://127.0.0.1:{port}"))]) == 1
    out = capsys.readouterr().out
    assert "unreachable" in out and "1 of 1 record(s) left" in out
    assert spill.count() == 1


def test_a_stage_that_ends_while_the_server_is_down_succeeds_and_spills(store, tmp_path):
    """A stage run (as `tfm stage` opens it) whose server goes away before its end: the result's
    tags and the run's end are kept in the work dir's spill file, the stage does not fail, and
    the replay ends the run on the server with its tags."""
    from tasks.framework import tracking
    from tasks.framework.config import config_from_dict
    from tasks.framework.runner import build_folder

    client, _ = store
    good_uri = client._tracking_client.tracking_uri
    config = config_from_dict({"name": "r", "workdir": str(tmp_path / "work"),
                               "mlflow": {"tracking_uri": good_uri, "http_retries": 0}})
    result = build_folder("clean", config.root / "clean", {"k": 1}, {},
                          lambda tmp: {"kept": 5, "note": "x", "loss": 0.5})
    with tracking.stage_run(config, "clean") as run:
        run_id = run.info.run_id
        client.log_metric(run_id, "loss", 2.0, step=3)  # logged by the stage itself, as training does
        # The server goes away: from here MLflow's calls go to a port nothing listens on.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        import mlflow

        mlflow.set_tracking_uri(f"http://127.0.0.1:{port}")
        tracking.log_stage_result(result)
    assert mlflow.active_run() is None
    spilled = [r for r, _ in SpillFile(config.root / SPILL_FILE).read(0)]
    assert dict(spilled[0].tags)["stats.note"] == "x"
    assert [m[0] for m in spilled[0].metrics] == ["kept", "loss"]
    assert spilled[-1].status == "FINISHED"
    assert client.get_run(run_id).info.status == "RUNNING"
    mlflow.set_tracking_uri(good_uri)
    tracking._last_failure.clear()  # the next test's stages must not see this outage
    assert tracking.replay_spilled(config) == 0
    finished = client.get_run(run_id)
    assert finished.info.status == "FINISHED" and finished.data.tags["stats.note"] == "x"
    assert finished.data.metrics["kept"] == 5  # the stage's stat, replayed
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [3]  # not the stat


def test_a_replay_leaves_a_file_that_a_training_holds(store, tmp_path):
    from tasks.framework import tracking
    from tasks.framework.config import config_from_dict

    client, run_id = store
    config = config_from_dict({"name": "r", "workdir": str(tmp_path / "work"),
                               "mlflow": {"tracking_uri": client._tracking_client.tracking_uri}})
    spill = SpillFile(tmp_path / "work" / "train_ray" / "train-abc" / SPILL_FILE)
    spill.append([metrics_record(run_id, {"loss": 1.0}, 1)])
    said: list[str] = []
    with spill.locked():  # as a training's Tracker holds it while it trains
        assert tracking.replay_spilled(config, say=said.append) == 0
    assert "in use by a running training" in said[0]
    assert spill.count() == 1 and steps_in_store(client, run_id) == []
