"""``tfm tracking replay`` of a work dir on an object store (a real S3 server, SeaweedFS), from
another machine: a process that died while the MLflow server was down had kept its journal in
the bucket (what its sender does during an outage); its node folder is gone. Replay, named the
work dir's URI alone, fetches the journal into a fresh node folder and sends it to a real
MLflow store, every record once and in order; a second replay sends nothing."""

from __future__ import annotations

import secrets
import shutil

import pytest

from tracking.journal import (
    Journal,
    log_record,
    new_key,
    open_record,
    status_record,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_replay_of_an_object_store_work_dir_sends_a_dead_nodes_journal_once(
    s3_env, tmp_path, monkeypatch, capsys
):
    from mlflow.tracking import MlflowClient

    from filesystem.storage import StoreSettings, open_store
    from pipelines.cli import main
    from tasks.framework.workdir_place import node_folder_suffix
    from tracking.copies import JournalCopies

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    workdir = f"s3://tfm/replay-{secrets.token_hex(4)}/r"
    dead = tmp_path / "dead-node" / f"r-{node_folder_suffix(workdir)}"
    key = new_key()
    journal = Journal.create(dead, key, uri, "replayed")
    journal.append(
        [
            open_record(
                "replayed",
                "r/train",
                {"stage": "train"},
                artifact_location=(tmp_path / "artifacts").as_uri(),
            )
        ]
    )
    journal.append([log_record(metrics={"loss": 10.0 / step}, step=step) for step in range(1, 31)])
    journal.append([log_record(params={"steps": 30}), status_record("FINISHED")])
    JournalCopies(open_store(workdir, StoreSettings())).upload(journal)
    shutil.rmtree(dead)  # the node is gone; the bucket holds its journal

    monkeypatch.setenv("HOME", str(tmp_path / "other-node"))  # another machine's default cache
    assert main(["tracking", "replay", workdir]) == 0
    said = capsys.readouterr().out
    assert "fetched 1 journal(s)" in said and "sent 33 record(s) of 1 run(s)" in said, said

    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("replayed").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params == {"steps": "30"}
    history = sorted(
        client.get_metric_history(run.info.run_id, "loss"), key=lambda m: (m.timestamp, m.step)
    )
    assert [m.step for m in history] == list(range(1, 31))

    assert main(["tracking", "replay", workdir]) == 0
    assert "nothing to send" in capsys.readouterr().out
    assert len(client.get_metric_history(run.info.run_id, "loss")) == 30
