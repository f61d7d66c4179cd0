"""The MLflow run lifetime, in one place: a flow's parent run, one run per stage (under the
flow's), the run a training logs into again on resume, a stage's result logged once, and the
registry that register needs. Nothing else opens, ends or configures a run.

Every record of a run goes to its journal (``training.tracking_journal``), never straight to
the server: the driver's records through a ``Run``, a training rank's through a relay on the
driver's node (``relay``); the process's one sender (``tasks.framework.tracking_session``)
drains the journals in order. So a server that does not answer, at any moment, blocks and fails
no stage: the console says so in one line, and once more when it answers again; what a command
could not send is sent by the next one of the work dir, or ``tfm tracking replay``. Only
register needs the server: it waits for it up to ``mlflow.registry_wait_seconds``.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corpora.redact import redact_uri, redacted
from tasks.framework import tracking_session as session
from tasks.framework.config import RunConfig, flatten
from tasks.framework.contract import MANIFEST, StageError, StageResult
from tasks.framework.workdir import open_workdir
from training.tracking import RelaySink, start_relay, stop_relay
from training.tracking_journal import (
    Journal,
    Record,
    artifact_record,
    log_record,
    new_key,
    open_record,
    status_record,
)
from training.tracking_owner import this_process
from training.tracking_sender import Sender

if TYPE_CHECKING:  # imported where they are used: a process without tracking never loads MLflow
    from mlflow import MlflowClient

log = logging.getLogger(__name__)


LOGGED_SUFFIXES = (".png", ".json", ".tsv")
"""Files of a stage folder logged as MLflow artifacts (top level only, small ones)."""
LOGGED_MAX_BYTES = 10 << 20
MLFLOW_RUN_FILE = "mlflow_run.json"
"""Where a training's storage folder remembers the run it logs into (so a resume continues it)."""
PARAMS_PER_RECORD = 100
"""Params of one record: one ``log_batch`` takes 100."""

_current: contextvars.ContextVar[Run | None] = contextvars.ContextVar("tracked_run", default=None)


class Run:
    """A run as this process writes it: its journal, which the sender drains to the server."""

    def __init__(self, journal: Journal, config: RunConfig, sender: Sender):
        self.journal, self.config, self.sender = journal, config, sender

    @property
    def key(self) -> str:
        """The journal's key: the run's name before the server gives it an id (its tag
        ``tfm.journal`` in MLflow)."""
        return self.journal.key

    @property
    def run_id(self) -> str | None:
        """The run's MLflow id, once the server has created it."""
        return self.journal.state().run_id

    def label(self) -> str:
        """The run as a person finds it: its MLflow id, or its journal before the server has it."""
        return self.run_id or f"not yet on the server (tag tfm.journal = {self.key})"

    def append(self, records: list[Record]) -> None:
        self.journal.append(records)
        self.sender.wake()

    def log_params(self, params: Mapping[str, Any]) -> None:
        items = list(params.items())
        self.append(
            [
                log_record(params=dict(items[i : i + PARAMS_PER_RECORD]))
                for i in range(0, len(items), PARAMS_PER_RECORD)
            ]
        )

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self.append([log_record(tags=tags)])

    def link(self, tag: str, other: str) -> None:
        """Tag this run with the MLflow id of journal ``other``'s run (known once it is sent)."""
        self.append([log_record(links={tag: other})])

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """``path`` as an artifact (a copy kept in the journal until the server has it)."""
        rel = self.journal.keep_file(path)
        self.append([artifact_record(rel, artifact_path)])

    def end(self, status: str = "FINISHED") -> None:
        self.append([status_record(status)])


def current() -> Run | None:
    """The run of the stage running in this context (``stage_run``), if any."""
    return _current.get()


def open_run(
    config: RunConfig,
    name: str,
    tags: Mapping[str, str],
    *,
    parent: str | None = None,
    key: str | None = None,
) -> Run:
    """A new run (or ``key``'s again: a resumed training), under journal ``parent``'s run."""
    uri, experiment = config.tracking_uri, config.mlflow.experiment
    found = session.sender(config)
    journal = Journal.create(config.root, key or new_key(), redact_uri(uri), experiment)
    found.watch(journal, uri, session.keeper(open_workdir(config)))
    # A local tracking store keeps artifacts beside the database, not in ./mlruns of whatever
    # directory the command ran in; a server decides for itself.
    location = (config.root / "mlartifacts").as_uri() if uri.startswith("sqlite:") else None
    run = Run(journal, config, found)
    # Its owner: the runs of a process killed outright are ended by the next command.
    owner = this_process().fields()
    opening = open_record(
        experiment, name, tags, parent=parent, artifact_location=location, owner=owner
    )
    run.append([opening])
    return run


@contextlib.contextmanager
def _lifetime(run: Run, outermost: bool) -> Iterator[Run]:
    """``run`` as the current run; ended FINISHED, or FAILED by an error; at the end of the
    ``outermost`` run of a command, the journals reach the server (``session.finish``)."""
    token = _current.set(run)
    error: BaseException | None = None
    try:
        yield run
    except BaseException as exc:
        error = exc
        run.end("FAILED")
        raise
    else:
        run.end("FINISHED")
    finally:
        _current.reset(token)
        if outermost:  # Ctrl-C: nothing waited for
            session.finish(run.config, wait=error is None or isinstance(error, Exception))


@contextlib.contextmanager
def pipeline_run(config: RunConfig, pipeline: str, tags: Mapping[str, str]) -> Iterator[Run]:
    """A flow's parent run, holding the whole config as params."""
    run = open_run(config, f"{config.name}/{pipeline}", {"pipeline": pipeline, **tags})
    run.log_params({k: str(v)[:500] for k, v in redacted(flatten(config)).items()})
    with _lifetime(run, outermost=current() is None):
        yield run


@contextlib.contextmanager
def stage_run(
    config: RunConfig,
    stage: str,
    *,
    parent: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> Iterator[Run]:
    """A run for one stage, under journal ``parent``'s run or else the current run, if any
    (``parent`` is for a stage run in another thread than its flow's)."""
    outer = current()
    parent = parent or (outer.key if outer else None)
    run = open_run(
        config,
        f"{config.name}/{stage}",
        {"stage": stage, "pipeline.run": config.name, **(tags or {})},
        parent=parent,
    )
    with _lifetime(run, outermost=parent is None):
        yield run


@contextlib.contextmanager
def active_or_stage_run(config: RunConfig, stage: str) -> Iterator[Run]:
    """The current run (the CLI and the flows open one per stage), or a new stage run."""
    run = current()
    if run is not None:
        yield run
        return
    with stage_run(config, stage) as run:
        yield run


@contextlib.contextmanager
def training_run(config: RunConfig, stage: str, run_dir: tuple[Any, str]) -> Iterator[Run]:
    """The run a training logs into: the one its storage folder logged into before (a resume),
    else the current run, else a new stage run; remembered in the folder (``run_dir``: a
    filesystem and the path in it), and ended FINISHED or FAILED with the training when it was
    opened again."""
    fs, root = run_dir
    record_path = f"{root}/{MLFLOW_RUN_FILE}"
    stored = _read_record(fs, record_path) or {}
    if "journal" in stored:
        outer = current()
        if outer is not None and outer.key != stored["journal"]:
            outer.link("train.mlflow_run_id", stored["journal"])  # the flow's run points at it
        run = open_run(config, f"{config.name}/{stage}", {"stage": stage}, key=stored["journal"])
        with _lifetime(run, outermost=outer is None):
            yield run
        return
    with active_or_stage_run(config, stage) as run:
        _write_record(
            fs, record_path, {"tracking_uri": redact_uri(config.tracking_uri), "journal": run.key}
        )
        yield run


@contextlib.contextmanager
def relay(run: Run) -> Iterator[RelaySink]:
    """Where a training's ranks log into ``run``: a relay on this (the driver's) Ray node that
    appends to its journal; ended, its records written, with the block."""
    sink = start_relay(run.journal.folder)
    try:
        yield sink
    finally:
        stop_relay(sink)
        run.sender.wake()


def drain(run: Run) -> bool:
    """Wait (``mlflow.drain_seconds`` at most, not while the server does not answer) for the
    server to have ``run``'s records so far; whether it has."""
    return run.sender.flush([run.journal], run.sender.options.drain_seconds)


def _read_record(fs: Any, path: str) -> dict[str, Any] | None:
    import pyarrow.fs as pafs

    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return None
    with fs.open_input_stream(path) as f:
        return json.loads(f.read().decode())


def _write_record(fs: Any, path: str, data: dict[str, str]) -> None:
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(path) as f:
        f.write(json.dumps(data).encode())


def log_stage_result(result: StageResult) -> None:
    """Log a stage's result into the current run, once: whether it ran and why, the
    fingerprints, the numeric stats as metrics (except those the run has already, such as
    training's curves), the other scalars as tags, and the folder's manifest, plots and tables."""
    run = current()
    if run is None:
        return
    manifest = json.loads((result.path / MANIFEST).read_text(encoding="utf-8"))
    tags = {
        "skipped": str(not result.ran).lower(),
        "reason": result.reason[:5000],
        "fingerprint": manifest["fingerprint"],
    }
    tags.update({f"input.{role}": info["fingerprint"] for role, info in manifest["inputs"].items()})
    metrics: dict[str, float] = {}
    for key, value in flatten(result.stats).items():
        key = key.replace("/", "_")[:250]
        if isinstance(value, bool) or value is None:
            tags[f"stats.{key}"] = str(value)
        elif isinstance(value, (int, float)):
            metrics[key] = float(value)
        elif isinstance(value, str):
            tags[f"stats.{key}"] = value[:5000]
    logged = run.journal.metric_keys()
    run.append(
        [log_record(metrics={k: v for k, v in metrics.items() if k not in logged}, tags=tags)]
    )
    for path in sorted(result.path.iterdir()):
        if (
            path.is_file()
            and path.suffix in LOGGED_SUFFIXES
            and path.stat().st_size <= LOGGED_MAX_BYTES
        ):
            run.log_artifact(path, artifact_path=result.stage)


# ----------------------------------------------------------------------------- the registry


def client(config: RunConfig) -> MlflowClient:
    """An ``MlflowClient`` on the run's tracking server and registry, on the config's budget."""
    from mlflow.tracking import MlflowClient

    session.budget(config)
    return MlflowClient(tracking_uri=config.tracking_uri, registry_uri=config.tracking_uri)


@contextlib.contextmanager
def registry(config: RunConfig, stage: str) -> Iterator[tuple[MlflowClient, str]]:
    """``(client, MLflow run id)`` for a stage that needs the server (register): once the
    server has its run's records so far, waiting up to ``mlflow.registry_wait_seconds`` with
    one line; else a one-line error naming the server. The run is MLflow's active run in the
    block (a model logged there is logged into it)."""
    import mlflow

    with active_or_stage_run(config, stage) as run:
        wait, uri = config.mlflow.registry_wait_seconds, config.tracking_uri
        if not run.sender.flush([run.journal], min(wait, 5.0), while_down=True):
            log.warning(
                "%s: the MLflow server at %s does not answer; waiting up to %.0f s for it "
                "(mlflow.registry_wait_seconds): the registry needs it",
                stage,
                redact_uri(uri),
                wait,
            )
            if not run.sender.flush([run.journal], wait, while_down=True) or run.run_id is None:
                raise StageError(
                    f"{stage}: the MLflow server at {redact_uri(uri)} "
                    f"did not answer in {wait:.0f} s; rerun when it answers "
                    "(the stages before it are kept, not run again)"
                )
        run_id = run.run_id
        assert run_id is not None  # delivered: the server created the run
        mlflow.set_tracking_uri(uri)
        mlflow.set_registry_uri(uri)
        with mlflow.start_run(run_id=run_id):
            yield client(config), run_id
