"""The delivery of one group of a journal's records as MLflow calls, with MLflow's own client:
consecutive ``log`` records batched into one ``log_batch`` within its limits, a run opened
(found by its journal tag or created, under its parent's run), an artifact logged, a run ended.
``send`` makes the calls of one group; ``verdict`` says what a failure means for the sender
(``tracking.sender``, the background thread that drains the journals)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

from tracking.journal import ARTIFACTS, KEY_TAG, Journal, Record, SendState

if TYPE_CHECKING:  # imported where it is used: a process that never sends never loads MLflow
    from mlflow import MlflowClient

MAX_METRICS, MAX_PARAMS, MAX_TAGS, MAX_ENTITIES = 1000, 100, 100, 1000
"""MLflow's limits for one ``log_batch`` call (a run's params are appended in records of
``MAX_PARAMS``, ``tracking.run``)."""

Resolve = Callable[[str], "str | None"]
"""A journal key of the same work dir -> its run's MLflow id (None: not created yet)."""


class Blocked(Exception):
    """The record names a run not created yet (its parent's journal is behind): try later."""


class NoRun(Exception):
    """A record of a journal whose opening never reached the server (it was refused)."""


def first_group(read: Sequence[tuple[Record, int]]) -> list[tuple[Record, int]]:
    """The records of the next call: consecutive ``log`` records within one ``log_batch``'s
    limits, or one record of another kind."""
    group: list[tuple[Record, int]] = []
    counts = [0, 0, 0]
    for record, end in read:
        if record["kind"] != "log":
            return group or [(record, end)]
        sizes = [
            len(record.get("metrics", ())),
            len(record.get("params", ())),
            len(record.get("tags", ())) + len(record.get("links", ())),
        ]
        total = [c + s for c, s in zip(counts, sizes, strict=True)]
        if group and (
            total[0] > MAX_METRICS
            or total[1] > MAX_PARAMS
            or total[2] > MAX_TAGS
            or sum(total) > MAX_ENTITIES
        ):
            break
        group.append((record, end))
        counts = total
    return group


def send(
    client: MlflowClient,
    journal: Journal,
    state: SendState,
    records: Sequence[Record],
    resolve: Resolve,
) -> None:
    """The MLflow calls of one group (``first_group``); ``state`` gains the run's id when the
    group opens it. Raises what MLflow raised, or ``Blocked``."""
    kind = records[0]["kind"]
    if kind == "open":
        _open(client, journal, state, records[0], resolve)
        return
    if state.run_id is None:
        raise NoRun(f"journal {journal.key} has no run to log into (its opening was refused)")
    if kind == "log":
        _log(client, state.run_id, records, resolve)
    elif kind == "artifact":
        local = journal.folder / records[0]["file"]
        if local.is_file():  # gone: sent before a crash, then removed
            client.log_artifact(state.run_id, str(local), records[0].get("path"))
    elif kind == "status":
        status = records[0]["status"]
        if status == "RUNNING":
            client.update_run(state.run_id, status="RUNNING")
        else:
            client.set_terminated(state.run_id, status, end_time=records[0]["t"])


def sent(journal: Journal, records: Sequence[Record]) -> None:
    """After a group is on the server (its watermark committed): what it leaves on disk."""
    for record in records:
        if record["kind"] == "artifact":
            folder = (journal.folder / record["file"]).parent
            if folder.parent.name == ARTIFACTS:
                for path in folder.iterdir():
                    path.unlink(missing_ok=True)
                folder.rmdir()


def _log(client: MlflowClient, run_id: str, records: Sequence[Record], resolve: Resolve) -> None:
    from mlflow.entities import Metric, Param, RunTag

    metrics = [Metric(k, v, t, s) for r in records for k, v, t, s in r.get("metrics", ())]
    params = [Param(k, v) for r in records for k, v in r.get("params", ())]
    tags = [RunTag(k, v) for r in records for k, v in r.get("tags", ())]
    for r in records:
        for k, key in r.get("links", ()):
            linked = resolve(key)
            if linked is None:
                raise Blocked(key)
            tags.append(RunTag(k, linked))
    client.log_batch(run_id, metrics=metrics, params=params, tags=tags)


def _open(
    client: MlflowClient, journal: Journal, state: SendState, record: Record, resolve: Resolve
) -> None:
    if state.experiment_id is None:
        state.experiment_id = _experiment(
            client, record["experiment"], record.get("artifact_location")
        )
    run_id = state.run_id
    if run_id is None:
        found = client.search_runs(
            [state.experiment_id], f"tags.`{KEY_TAG}` = '{journal.key}'", max_results=1
        )
        run_id = found[0].info.run_id if found else None
    if run_id is not None:
        client.update_run(run_id, status="RUNNING")  # a training resumed, or a retried open
        state.run_id = run_id
        return
    tags = {**record["tags"], KEY_TAG: journal.key}
    if record.get("parent"):
        parent = resolve(record["parent"])
        if parent is None:
            raise Blocked(record["parent"])
        tags["mlflow.parentRunId"] = parent
    run = client.create_run(
        state.experiment_id, start_time=record["t"], tags=tags, run_name=record["name"]
    )
    state.run_id = run.info.run_id


def _experiment(client: MlflowClient, name: str, artifact_location: str | None) -> str:
    """The id of experiment ``name``, created if new (with ``artifact_location``: a local
    tracking store keeps artifacts beside its database, not in the current directory)."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except MlflowException:
        experiment = client.get_experiment_by_name(name)  # created meanwhile by another process
        if experiment is None:
            raise
        return experiment.experiment_id


Verdict = Literal["refused", "gone", "outage"]


def verdict(exc: BaseException) -> Verdict:
    """What a failed call means: the server refused the records (HTTP 400: a param logged again
    with another value, an invalid key; sending them again cannot help), the run is gone (a
    tracking store that was reset: the journal is sent again from its start, into a new run),
    or anything else: the server does not answer as it should, try again later."""
    from mlflow.exceptions import MlflowException

    if isinstance(exc, NoRun):
        return "refused"
    if isinstance(exc, MlflowException):
        code = exc.get_http_status_code()
        if code == 404:
            return "gone"
        if code == 400:
            return "refused"
    return "outage"
