"""A config's MLflow runs, in one place: a flow's parent run, one run per stage (under the
flow's), the run a training logs into again on resume, a stage's result logged once, and the
registry that register needs. Nothing else opens, ends or configures a run; the runs
themselves, their journals and their sender are the ``tracking`` package's (``tracking.run``).

So a server that does not answer, at any moment, blocks and fails no stage: the console says so
in one line, and once more when it answers again; what a command could not send is sent by the
next one of the work dir, or ``tfm tracking replay``. Only register needs the server: it waits
for it up to ``mlflow.registry_wait_seconds``.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from filesystem.location import Location
from filesystem.redact import redact_uri, redacted
from serving.mlflow_uris import pointed_at
from tasks.framework.config import RunConfig, flatten
from tasks.framework.manifest import MANIFEST
from tasks.framework.results import StageError, StageResult
from tasks.framework.workdir_place import run_folders_at
from tracking import session
from tracking.copies import JournalCopies
from tracking.journal import log_record
from tracking.run import Run, current, open_run, running
from tracking.sender import TrackingOptions
from tracking.session import Target

if TYPE_CHECKING:  # imported where they are used: a process without tracking never loads MLflow
    from mlflow import MlflowClient

log = logging.getLogger(__name__)


LOGGED_SUFFIXES = (".png", ".json", ".tsv")
"""Files of a stage folder logged as MLflow artifacts (top level only, small ones)."""
LOGGED_MAX_BYTES = 10 << 20
MLFLOW_RUN_FILE = "mlflow_run.json"
"""Where a training's storage folder remembers the run it logs into (so a resume continues it)."""


def options(config: RunConfig) -> TrackingOptions:
    """The run config's tracking knobs (its ``mlflow`` section)."""
    m = config.mlflow
    return TrackingOptions(
        http_retries=m.http_retries,
        http_backoff=m.http_backoff,
        http_timeout=m.http_timeout,
        drain_seconds=m.drain_seconds,
        probe_seconds=m.probe_seconds,
    )


def http_environment(config: RunConfig) -> dict[str, str]:
    """MLflow's HTTP budget of ``config`` as the environment variables MLflow's client reads
    (and reads nowhere else): what a process sets once at its start."""
    return options(config).http_environment()


def _secrets(config: RunConfig) -> dict[str, str]:
    found = {"config": config.mlflow.tracking_uri, "environment": config.team_tracking_uri}
    return {name: uri for name, uri in found.items() if uri}


def target(config: RunConfig) -> Target:
    """Where ``config``'s runs are recorded and sent."""
    return Target(
        root=config.root,
        uri=config.tracking_uri,
        experiment=config.mlflow.experiment,
        secrets=_secrets(config),
        copies=JournalCopies(config.store),
        options=options(config),
        workdir=config.workdir,
    )


def _open(config: RunConfig, name: str, tags: Mapping[str, str], **how: Any) -> Run:
    return open_run(target(config), f"{config.name}/{name}", tags, **how)


@contextlib.contextmanager
def pipeline_run(config: RunConfig, pipeline: str, tags: Mapping[str, str]) -> Iterator[Run]:
    """A flow's parent run, holding the whole config as params."""
    run = _open(config, pipeline, {"pipeline": pipeline, **tags})
    run.log_params({k: str(v)[:500] for k, v in redacted(flatten(config)).items()})
    with running(run, outermost=current() is None):
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
    run = _open(
        config, stage, {"stage": stage, "pipeline.run": config.name, **(tags or {})}, parent=parent
    )
    with running(run, outermost=parent is None):
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
def training_run(config: RunConfig, stage: str, run_dir: Location) -> Iterator[Run]:
    """The run a training logs into: the one its storage folder logged into before (a resume),
    else the current run, else a new stage run; remembered in the folder (``run_dir``), and
    ended FINISHED or FAILED with the training when it was opened again."""
    fs, root = run_dir.arrow, run_dir.path
    record_path = f"{root}/{MLFLOW_RUN_FILE}"
    stored = _read_record(fs, record_path) or {}
    if "journal" in stored:
        outer = current()
        if outer is not None and outer.key != stored["journal"]:
            outer.link("train.mlflow_run_id", stored["journal"])  # the flow's run points at it
        run = _open(config, stage, {"stage": stage}, key=stored["journal"])
        with running(run, outermost=outer is None):
            yield run
        return
    with active_or_stage_run(config, stage) as run:
        _write_record(
            fs, record_path, {"tracking_uri": redact_uri(config.tracking_uri), "journal": run.key}
        )
        yield run


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
    logged = run.logged_metrics()
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
        if not run.delivered(min(wait, 5.0)):
            log.warning(
                "%s: the MLflow server at %s does not answer; waiting up to %.0f s for it "
                "(mlflow.registry_wait_seconds): the registry needs it",
                stage,
                redact_uri(uri),
                wait,
            )
            if not run.delivered(wait) or run.run_id is None:
                raise StageError(
                    f"{stage}: the MLflow server at {redact_uri(uri)} "
                    f"did not answer in {wait:.0f} s; rerun when it answers "
                    "(the stages before it are kept, not run again)"
                )
        run_id = run.run_id
        assert run_id is not None  # delivered: the server created the run
        with pointed_at(uri), mlflow.start_run(run_id=run_id):
            yield client(config), run_id


# ----------------------------------------------------------------------------- the commands


def killed(config: RunConfig) -> list[str]:
    """What ``tfm status`` says of the config's runs that were killed, without changing them."""
    return session.killed(config.root)


def replay_config(config: RunConfig, say: Callable[[str], object]) -> int:
    """``tracking.session.replay`` of a run config's work dir (its tracking URI, its store)."""
    return session.replay(
        config.root, JournalCopies(config.store), options(config), _secrets(config), say
    )


def replay_workdir(target: str, team_tracking_uri: str | None, say: Callable[[str], object]) -> int:
    """``tracking.session.replay`` of a work dir named alone (a folder, or an object store's
    URI), the secrets of its journals' servers from ``team_tracking_uri`` (the environment's)."""
    secrets = {"environment": team_tracking_uri} if team_tracking_uri else {}
    store, roots = run_folders_at(target)
    return sum(
        session.replay(root, JournalCopies(store), TrackingOptions(), secrets, say)
        for root in roots
    )
