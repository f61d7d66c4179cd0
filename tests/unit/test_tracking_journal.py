"""The tracking journal and its one sender (training/tracking_journal.py, tracking_send.py,
tracking_sender.py; tasks/framework/tracking*.py at a stage's end), against a real MLflow
SQLite store in tmp_path.

An outage is a ``Switch`` in front of the real store's client: while it is off, every call
raises as a refused connection does; while it is on, the call goes to the store. The real
server killed and restarted is tests/integration/test_tracking_outage.py."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from tracking.journal import (
    KEY_TAG,
    REJECTED,
    Journal,
    journals,
    log_record,
    new_key,
    open_record,
    status_record,
)
from tracking.relay import Tracker
from tracking.run import Run
from tracking.sender import Sender, TrackingOptions
from tracking.session import Session, Target

FAST = TrackingOptions(probe_seconds=0.05, drain_seconds=20)


@pytest.fixture(scope="module")
def sqlite_uri(tmp_path_factory):
    """A real MLflow SQLite store (its migrations take seconds: one per module)."""
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    MlflowClient(uri).search_experiments()  # creates the tables
    return uri


class Switch:
    """The store's client behind an on/off switch, counting the calls that reached it."""

    def __init__(self, uri: str, up: bool = True):
        from mlflow.tracking import MlflowClient

        self.client, self.up, self.calls = MlflowClient(uri), up, []

    def __getattr__(self, name):
        method = getattr(self.client, name)

        def call(*args, **kwargs):
            if not self.up:
                raise ConnectionError("[Errno 111] Connection refused")
            self.calls.append(name)
            return method(*args, **kwargs)

        return call


class Lines(list):
    def __call__(self, line: str) -> None:
        self.append(line)

    def count(self, words: str) -> int:  # type: ignore[override]
        return sum(words in line for line in self)


def make_journal(root, uri, experiment, name="run", parent=None) -> Journal:
    journal = Journal.create(root, new_key(), uri, experiment)
    journal.append(
        [
            open_record(
                experiment,
                name,
                {"stage": name},
                parent=parent,
                artifact_location=(root / "artifacts").as_uri(),
            )
        ]
    )
    return journal


def steps(journal: Journal, uri: str, key: str = "loss") -> list[int]:
    """The steps of ``key`` in the store, in the order of their timestamps, duplicates kept."""
    from mlflow.tracking import MlflowClient

    history = MlflowClient(uri).get_metric_history(journal.state().run_id, key)
    return [m.step for m in sorted(history, key=lambda m: (m.timestamp, m.step))]


def log_steps(journal: Journal, numbers, sync: bool = False) -> None:
    for step in numbers:
        journal.append(
            [log_record(metrics={"loss": 10.0 - step / 10, "lr": step * 1e-4}, step=step)],
            sync=sync,
        )
        time.sleep(0.001)  # distinct timestamps, as steps are in training


def test_every_record_reaches_the_store_in_order_and_once(sqlite_uri, tmp_path):
    from mlflow.tracking import MlflowClient

    journal = make_journal(tmp_path, sqlite_uri, "in-order")
    log_steps(journal, range(1, 1201))  # more than one log_batch holds
    journal.append(
        [log_record(params={"d_model": 64}, tags={"phase": "a"}), status_record("FINISHED")]
    )
    lines = Lines()
    sender = Sender(FAST, say=lines)
    sender.watch(journal, sqlite_uri)
    sender.start()
    assert sender.flush([journal], 60)
    assert steps(journal, sqlite_uri) == list(range(1, 1201))
    assert steps(journal, sqlite_uri, "lr") == list(range(1, 1201))
    run = MlflowClient(sqlite_uri).get_run(journal.state().run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"d_model": "64"}
    assert run.data.tags[KEY_TAG] == journal.key and run.info.run_name == "run"
    assert journal.state().sent == journal.size() and lines == []  # nothing said: all went well


def test_an_outage_keeps_everything_in_the_journal_then_sends_it_in_order_once(
    sqlite_uri, tmp_path
):
    journal = make_journal(tmp_path, sqlite_uri, "outage")
    switch, lines = Switch(sqlite_uri), Lines()
    sender = Sender(FAST, say=lines, client_for=lambda uri: switch)
    sender.watch(journal, sqlite_uri)
    sender.start()
    log_steps(journal, range(1, 11))
    assert sender.flush([journal], 30)
    switch.up = False
    log_steps(journal, range(11, 61))
    journal.append([log_record(tags={"phase": "down"})])
    deadline = time.monotonic() + 20
    while not sender.down(sqlite_uri):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert not sender.flush([journal], 0.5)  # a server that does not answer is not waited for
    time.sleep(0.5)  # ten probes
    assert journal.count() == 51 and steps(journal, sqlite_uri) == list(range(1, 11))
    switch.up = True
    log_steps(journal, range(61, 71))
    assert sender.flush([journal], 30)
    assert steps(journal, sqlite_uri) == list(range(1, 71))
    assert lines.count("is unreachable") == 1 and lines.count("answers again") == 1
    assert "records are kept in" in lines[0] and str(tmp_path) in lines[0]


def test_a_call_sent_again_after_a_crash_leaves_each_record_once(sqlite_uri, tmp_path):
    """The watermark is committed after the server's answer: a crash in between sends the last
    call again, which the store keeps once (metrics by key, timestamp, step and value; the run
    found by its journal tag, not created twice)."""
    from mlflow.tracking import MlflowClient

    journal = make_journal(tmp_path, sqlite_uri, "crash")
    log_steps(journal, range(1, 21))
    sender = Sender(FAST)
    sender.watch(journal, sqlite_uri)
    assert sender.deliver_now([journal]) == (0, [])
    run_id = journal.state().run_id
    journal.commit(type(journal.state())())  # as if no answer had been committed at all
    assert journal.count() == 21
    again = Sender(FAST)
    again.watch(journal, sqlite_uri)
    assert again.deliver_now([journal]) == (0, [])
    assert journal.state().run_id == run_id
    assert steps(journal, sqlite_uri) == list(range(1, 21))
    client = MlflowClient(sqlite_uri)
    found = client.search_runs([client.get_experiment_by_name("crash").experiment_id])
    assert [r.info.run_id for r in found] == [run_id]


def test_a_refused_record_is_kept_aside_and_the_records_batched_with_it_go_on(sqlite_uri, tmp_path):
    from mlflow.tracking import MlflowClient

    journal = make_journal(tmp_path, sqlite_uri, "refused")
    journal.append([log_record(params={"lr": "1"})])
    log_steps(journal, range(1, 4))
    journal.append([log_record(params={"lr": "2"})])  # a param cannot change: HTTP 400
    log_steps(journal, range(4, 7))
    lines = Lines()
    sender = Sender(FAST, say=lines)
    sender.watch(journal, sqlite_uri)
    assert sender.deliver_now([journal]) == (0, [])
    assert steps(journal, sqlite_uri) == list(range(1, 7))
    assert MlflowClient(sqlite_uri).get_run(journal.state().run_id).data.params == {"lr": "1"}
    rejected = (journal.folder / REJECTED).read_text().splitlines()
    assert [json.loads(line)["params"] for line in rejected] == [[["lr", "2"]]]
    assert lines.count("refused 1 record(s)") == 1


def test_a_child_waits_for_its_parent_run_and_is_created_under_it(sqlite_uri, tmp_path):
    from mlflow.tracking import MlflowClient

    parent = make_journal(tmp_path, sqlite_uri, "family", "flow")
    child = make_journal(tmp_path, sqlite_uri, "family", "stage", parent=parent.key)
    sender = Sender(FAST)
    sender.watch(child, sqlite_uri)
    assert sender.deliver_now([child]) == (1, [])  # its parent's run does not exist yet
    sender.watch(parent, sqlite_uri)
    assert sender.deliver_now(journals(tmp_path)) == (0, [])  # oldest first: the parent
    run = MlflowClient(sqlite_uri).get_run(child.state().run_id)
    assert run.data.tags["mlflow.parentRunId"] == parent.state().run_id


def test_a_reset_store_gets_the_whole_journal_again(sqlite_uri, tmp_path):
    """The run is gone from the store (a new database): the journal is sent again from its
    start, into a new run, with the records that came since."""
    journal = make_journal(tmp_path, sqlite_uri, "reset")
    log_steps(journal, range(1, 6))
    sender = Sender(FAST)
    sender.watch(journal, sqlite_uri)
    sender.deliver_now([journal])
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    log_steps(journal, range(6, 9))
    sender.watch(journal, fresh)
    assert sender.deliver_now([journal]) == (0, [])
    assert steps(journal, fresh) == list(range(1, 9))


def test_one_process_sends_a_journal_at_a_time(sqlite_uri, tmp_path):
    journal = make_journal(tmp_path, sqlite_uri, "locked")
    sender = Sender(FAST)
    sender.watch(journal, sqlite_uri)
    with journal.sending() as mine:  # another sender holds it
        assert mine
        assert sender.deliver_now([journal]) == (1, [journal])
    assert sender.deliver_now([journal]) == (0, [])


def test_a_line_cut_by_a_crash_is_skipped_and_the_next_record_starts_a_line(tmp_path):
    journal = Journal.create(tmp_path, new_key(), "sqlite://", "x")
    journal.append([log_record(metrics={"loss": 1.0}, step=1)])
    with open(journal.path, "a") as f:
        f.write('{"kind": "log", "metrics": [["loss", 2')  # a writer died mid-line
    assert [r["metrics"][0][3] for r in journal.records()] == [1]  # not a record until its newline
    journal.append([log_record(metrics={"loss": 3.0}, step=3)])
    assert [r["metrics"][0][3] for r in journal.records()] == [1, 3]


def test_a_rank_appends_from_many_threads_and_never_waits_on_the_server(tmp_path):
    """Nothing a rank does calls the server: its Tracker appends to the journal (a port nothing
    listens on is never asked)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    journal = Journal.create(tmp_path, new_key(), f"http://127.0.0.1:{port}", "x")
    tracker = Tracker(journal)
    started = time.monotonic()
    tracker.param("n_parameters", 123)
    threads = [
        threading.Thread(
            target=lambda k=k: [tracker.metrics({f"m{k}": 1.0}, s) for s in range(200)]
        )
        for k in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tracker.tag("warning.encoder_collapse", "step 50")
    tracker.close()
    assert time.monotonic() - started < 30
    records = list(journal.records())
    assert len(records) == 802 and records[0]["params"] == [["n_parameters", "123"]]
    for k in range(4):
        assert [
            r["metrics"][0][3] for r in records if r.get("metrics", [[""]])[0][0] == f"m{k}"
        ] == list(range(200))


def test_other_ranks_log_nothing(tmp_path):
    journal = Journal.create(tmp_path, new_key(), "sqlite://", "x")
    tracker = Tracker(journal, enabled=False)
    tracker.metrics({"loss": 1.0}, 1)
    tracker.close()
    assert journal.size() == 0


def test_new_params_logs_what_is_new_and_tags_what_changed(tmp_path):
    journal = Journal.create(tmp_path, new_key(), "sqlite://", "x")
    run = Run(journal, Target(tmp_path, "sqlite://", "x"), Session(FAST), owns_session=False)
    run.log_new_params({"steps": 100, "d_model": 64})
    run.log_new_params({"steps": 100, "d_model": 64})  # nothing new: no record
    run.log_new_params({"steps": 200, "d_model": 64, "seed": 1})
    first, record = run.journal.records("log")
    assert first["params"] == [["steps", "100"], ["d_model", "64"]]
    assert record["params"] == [["seed", "1"]] and record["tags"] == [
        ["param_changed.steps", "200"]
    ]


def dead_uri() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # free once closed: connections refused


def test_tfm_tracking_replay_sends_what_a_dead_process_left_once(sqlite_uri, tmp_path, capsys):
    from pipelines.cli import main

    workdir = tmp_path / "work"
    journal = make_journal(workdir, sqlite_uri, "replay")
    log_steps(journal, range(1, 13))
    sender = Sender(FAST)
    sender.watch(journal, sqlite_uri)
    sender.deliver_now([journal])
    log_steps(journal, range(13, 25))  # then the process died
    journal.append([status_record("FAILED")])
    assert main(["tracking", "replay", str(workdir)]) == 0
    assert "sent 13 record(s) of 1 run(s)" in capsys.readouterr().out
    assert steps(journal, sqlite_uri) == list(range(1, 25))
    assert main(["tracking", "replay", str(workdir)]) == 0
    assert "nothing to send" in capsys.readouterr().out


def test_tfm_tracking_replay_keeps_the_journal_while_the_server_is_down(tmp_path, capsys):
    from pipelines.cli import main

    journal = make_journal(tmp_path / "work", dead_uri(), "down")
    journal.append([log_record(tags={"skipped": "false"})])
    path = tmp_path / "run.yaml"
    path.write_text(
        json.dumps(
            {
                "name": "r",
                "workdir": str(tmp_path / "work"),
                "mlflow": {"http_retries": 0, "http_timeout": 2},
            }
        )
    )
    assert main(["tracking", "replay", str(path)]) == 1
    out = capsys.readouterr().out
    assert "is unreachable" in out and "2 of 2 record(s) left" in out
    assert journal.count() == 2


def test_a_stage_that_ends_while_the_server_is_down_succeeds_and_keeps_its_records(
    tmp_path, caplog, monkeypatch
):
    """A stage run (as `tfm stage` opens it) against a server that does not answer: the stage
    and its end take no longer than one try, the console says so once, and the journal holds
    the run's opening, the stage's result, its files and its end, in that order."""
    from tasks.framework import mlflow_runs
    from tasks.framework.config import config_from_dict
    from tasks.framework.runner import build_folder

    config = config_from_dict(
        {
            "name": "r",
            "workdir": str(tmp_path / "work"),
            "mlflow": {
                "tracking_uri": dead_uri(),
                "http_retries": 0,
                "http_timeout": 2,
                "drain_seconds": 30,
            },
        }
    )
    for key, value in mlflow_runs.http_environment(config).items():  # as a command sets them
        monkeypatch.setenv(key, value)
    caplog.set_level("WARNING")
    started = time.monotonic()
    with mlflow_runs.stage_run(config, "clean") as run:
        result = build_folder(
            "clean", config.root / "clean", {"k": 1}, {}, lambda tmp: {"kept": 5, "note": "x"}
        )
        mlflow_runs.log_stage_result(result)
    assert time.monotonic() - started < 20  # not drain_seconds: the server is known down
    kinds = [r["kind"] for r in run.journal.records()]
    assert kinds == ["open", "log", "artifact", "status"]
    logged = list(run.journal.records("log"))[0]
    assert ["kept", 5.0] == logged["metrics"][0][:2] and ["stats.note", "x"] in logged["tags"]
    said = [r.getMessage() for r in caplog.records if "tracking:" in r.getMessage()]
    assert sum("is unreachable" in line for line in said) == 1
    assert any("record(s) for the MLflow server" in line and "kept in" in line for line in said)


def test_the_mlflow_section_refuses_bad_tracking_knobs():
    from tasks.framework.config import ConfigError, config_from_dict

    with pytest.raises(ConfigError, match="registry_wait_seconds"):
        config_from_dict({"name": "r", "mlflow": {"registry_wait_seconds": -1}})
    with pytest.raises(ConfigError, match="probe_seconds"):
        config_from_dict({"name": "r", "mlflow": {"probe_seconds": 0}})
