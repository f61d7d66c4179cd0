"""The MLflow run lifetime, in one place: the tracking URI and experiment, a flow's parent run,
one run per stage (nested under the flow's), the run a training logs into again on resume, and a
stage's result logged once. Workers log through ``training.tracking.Tracker`` into a run opened
here; nothing else starts, ends or configures a run.

The end of a stage never fails for want of the server: its result, tags and the run's end are
sent on a short HTTP budget and, when the server does not answer, kept in a spill file that
``replay_spilled`` writes later (the next ``tfm run`` / ``tfm stage``, or ``tfm tracking
replay``), as are the records a training's rank 0 could not send."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from corpora.redact import redact_text, redacted
from tasks.framework.config import RunConfig, flatten
from tasks.framework.contract import MANIFEST, StageResult
from training.tracking import TrackingOptions, spill_folder
from training.tracking_spill import SPILL_FILE, Record, SpillFile, replay, send

if TYPE_CHECKING:  # imported where they are used: a process without tracking never loads MLflow
    from mlflow import ActiveRun, MlflowClient

log = logging.getLogger(__name__)

T = TypeVar("T")

LOGGED_SUFFIXES = (".png", ".json", ".tsv")
"""Files of a stage folder logged as MLflow artifacts (top level only, small ones)."""
LOGGED_MAX_BYTES = 10 << 20
MLFLOW_RUN_FILE = "mlflow_run.json"
"""Where a training's storage folder remembers the run it logs into (so a resume continues it)."""
OUTAGE_SECONDS = 60.0
"""After a call on the short budget failed, the driver spills without trying for this long."""
_last_failure: list[float] = []
_configs: dict[str, RunConfig] = {}
"""The config each open stage run was started with, by run id, and the latest flow's under
``PIPELINE_KEY`` (for calls that are given only a run)."""
PIPELINE_KEY = "pipeline"


def connect(config: RunConfig) -> str:
    """Point MLflow at the run's tracking URI and experiment; returns the experiment id."""
    import mlflow

    config.root.mkdir(parents=True, exist_ok=True)
    if redact_text(config.tracking_uri) != config.tracking_uri:
        # MLflow prints "View run ... at: <tracking URI>/..." at each run's end, password and all.
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    mlflow.set_tracking_uri(config.tracking_uri)
    mlflow.set_registry_uri(config.tracking_uri)
    client = mlflow.MlflowClient()
    experiment = client.get_experiment_by_name(config.mlflow.experiment)
    if experiment is None:
        # A local tracking store keeps artifacts beside the database, not in ./mlruns of
        # whatever directory the command ran in; a server decides for itself.
        location = None
        if config.tracking_uri.startswith("sqlite:"):
            location = (config.root / "mlartifacts").as_uri()  # root: absolute, from load
        try:
            client.create_experiment(config.mlflow.experiment, artifact_location=location)
        except mlflow.exceptions.MlflowException:
            pass  # created concurrently by another process
    return mlflow.set_experiment(config.mlflow.experiment).experiment_id


def client(config: RunConfig) -> MlflowClient:
    """An ``MlflowClient`` on the run's tracking server and registry."""
    from mlflow.tracking import MlflowClient

    connect(config)
    return MlflowClient(tracking_uri=config.tracking_uri, registry_uri=config.tracking_uri)


@contextmanager
def pipeline_run(config: RunConfig, pipeline: str, tags: Mapping[str, str]) -> Iterator[ActiveRun]:
    """A flow's parent run, holding the whole config as params."""
    import mlflow

    replay_spilled(config)
    _configs[PIPELINE_KEY] = config  # flows tag the parent run with set_tag(run, ...) alone
    connect(config)
    with mlflow.start_run(run_name=f"{config.name}/{pipeline}", tags={"pipeline": pipeline, **tags}) as run:
        mlflow.log_params({k: str(v)[:500] for k, v in redacted(flatten(config)).items()})
        yield run
        end_run(config, run)


def set_tag(run: ActiveRun, key: str, value: str, config: RunConfig | None = None) -> None:
    """Tag ``run`` (an open run, from any thread); kept in the spill file when the server does
    not answer (in ``config``'s work dir, else the current directory)."""
    import mlflow

    config = config or _configs.get(run.info.run_id) or _configs.get(PIPELINE_KEY)
    root = config.root if config is not None else Path.cwd()
    deliver(root, Record(run.info.run_id, tags=((key, value),)), mlflow.MlflowClient(),
            options(config))


@contextmanager
def stage_run(
    config: RunConfig,
    stage: str,
    *,
    parent_run_id: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> Iterator[ActiveRun]:
    """A run for one stage, nested under ``parent_run_id`` or else under the active run, if any.

    ``parent_run_id`` is for a stage run in another thread than its flow's (MLflow's active run
    is per thread)."""
    import mlflow

    if parent_run_id is None and mlflow.active_run() is None:
        replay_spilled(config)  # `tfm stage`: what an earlier outage left, before anything new
    connect(config)
    if parent_run_id is None and (active := mlflow.active_run()) is not None:
        parent_run_id = active.info.run_id
    with mlflow.start_run(
        run_name=f"{config.name}/{stage}",
        parent_run_id=parent_run_id,
        nested=parent_run_id is not None,
        tags={"stage": stage, "pipeline.run": config.name, **(tags or {})},
    ) as run:
        _configs[run.info.run_id] = config
        yield run
        end_run(config, run)


@contextmanager
def active_or_stage_run(config: RunConfig, stage: str) -> Iterator[ActiveRun]:
    """The active run (the CLI and the flows open one per stage), or a new stage run."""
    import mlflow

    active = mlflow.active_run()
    if active is None:
        with stage_run(config, stage) as run:
            yield run
        return
    connect(config)
    yield active


@contextmanager
def training_run(
    config: RunConfig, stage: str, run_dir: tuple[Any, str]
) -> Iterator[tuple[str, str]]:
    """``(tracking_uri, run_id)`` a training logs into: the run its storage folder logged into
    before (a resume), else the active run, else a new stage run; remembered in the folder
    (``run_dir``: a filesystem and the path in it), and ended FINISHED or FAILED with the
    training when it was reopened."""
    import mlflow

    fs, root = run_dir
    record_path = f"{root}/{MLFLOW_RUN_FILE}"
    stored = _read_record(fs, record_path)
    if stored is not None and not _run_exists(stored["tracking_uri"], stored["run_id"]):
        stored = None  # the tracking store was reset: start a new run
    if stored is not None:
        with _reopened(stored["tracking_uri"], stored["run_id"], config.root, options(config)):
            yield stored["tracking_uri"], stored["run_id"]
        return
    with active_or_stage_run(config, stage) as run:
        uri = mlflow.get_tracking_uri()
        _write_record(fs, record_path, {"tracking_uri": uri, "run_id": run.info.run_id})
        yield uri, run.info.run_id


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


def _run_exists(tracking_uri: str, run_id: str) -> bool:
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient(tracking_uri).get_run(run_id)
    except Exception:  # any failure to read it back: the store no longer holds that run
        return False
    return True


@contextmanager
def _reopened(tracking_uri: str, run_id: str, root: Path, opts: TrackingOptions) -> Iterator[None]:
    import mlflow
    from mlflow.tracking import MlflowClient

    active = mlflow.active_run()
    if active is not None and active.info.run_id != run_id:
        mlflow.set_tag("train.mlflow_run_id", run_id)  # the flow's run points at the training
    run_client = MlflowClient(tracking_uri)
    run_client.update_run(run_id, status="RUNNING")
    try:
        yield
    except BaseException:
        deliver(root, Record(run_id, status="FAILED", end_time=_now()), run_client, opts)
        raise
    deliver(root, Record(run_id, status="FINISHED", end_time=_now()), run_client, opts)


def log_stage_result(result: StageResult, config: RunConfig | None = None) -> None:
    """Log a stage's result into the active MLflow run, once: whether it ran and why, the
    fingerprints, the numeric stats as metrics (except those the stage logged itself, such as
    training curves), the other scalars as tags, and the folder's manifest, plots and tables.
    When the server does not answer, the tags and metrics go to the spill file (the work dir's,
    ``result.path``'s parent) and the files stay in the stage folder only."""
    import mlflow

    run = mlflow.active_run()
    if run is None:
        return
    config = config or _configs.get(run.info.run_id)
    root = config.root if config is not None else result.path.parent
    opts, client = options(config), mlflow.MlflowClient()
    manifest = json.loads((result.path / MANIFEST).read_text(encoding="utf-8"))
    tags = {"skipped": str(not result.ran).lower(), "reason": result.reason[:5000],
            "fingerprint": manifest["fingerprint"]}
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
    now = _now()
    # The metrics the run has (the training's curves) are dropped as the record is sent.
    record = Record(run.info.run_id, tags=tuple(tags.items()), new_metrics_only=True,
                    metrics=tuple((k, v, now, 0) for k, v in metrics.items()))
    if deliver(root, record, client, opts):
        attempt(opts, f"the {result.stage} folder's files as artifacts", _log_files, result)


def _log_files(result: StageResult) -> None:
    import mlflow

    for path in sorted(result.path.iterdir()):
        if path.is_file() and path.suffix in LOGGED_SUFFIXES and path.stat().st_size <= LOGGED_MAX_BYTES:
            mlflow.log_artifact(str(path), artifact_path=result.stage)


# ----------------------------------------------------------------------------- outages


def options(config: RunConfig | None) -> TrackingOptions:
    """The run config's tracking knobs (``mlflow`` section) for ``training``'s ``Tracker``."""
    m = config.mlflow if config is not None else None
    if m is None:
        return TrackingOptions()
    return TrackingOptions(
        queue_size=m.queue_size,
        spill_dir=str(Path(m.spill_dir).resolve()) if m.spill_dir else None,
        http_retries=m.http_retries,
        http_backoff=m.http_backoff,
        http_timeout=m.http_timeout,
        drain_seconds=m.drain_seconds,
    )


def _now() -> int:
    return int(time.time() * 1000)


def _recently_down() -> bool:
    return bool(_last_failure) and time.monotonic() - _last_failure[-1] < OUTAGE_SECONDS


@contextmanager
def short_budget(opts: TrackingOptions) -> Iterator[None]:
    """MLflow's HTTP calls in this block retry on ``opts``' budget (seconds, not 254 s): MLflow
    reads these variables on every call; the driver's other threads make no MLflow call here."""
    saved = {k: os.environ.get(k) for k in opts.http_env()}
    os.environ.update(opts.http_env())
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def attempt(
    opts: TrackingOptions, what: str, call: Callable[..., T], *args: Any
) -> tuple[bool, T | None]:
    """``call(*args)`` on the short budget: ``(True, its value)``, or ``(False, None)`` after one
    warning naming ``what`` (not the stage's failure), at once while the server is known down."""
    if _recently_down():
        return False, None
    try:
        with short_budget(opts):
            return True, call(*args)
    except Exception as exc:  # noqa: BLE001 - the server's absence must not fail the stage
        _note_failure(exc, f"{what}: not logged")
        return False, None


def _note_failure(exc: BaseException, what: str) -> None:
    first = not _recently_down()
    _last_failure[:] = [time.monotonic()]
    if first:
        reason = redact_text(str(exc).splitlines()[0] if str(exc) else "")[:200]
        log.warning("tracking: the MLflow server does not answer (%s: %s); %s",
                    type(exc).__name__, reason, what)


def deliver(root: Path, record: Record, client: MlflowClient, opts: TrackingOptions) -> bool:
    """Send ``record`` now on the short budget (after what ``root``'s spill file holds), else
    append it to that file, to be replayed in order. Returns whether it reached the server."""
    spill = SpillFile(Path(root) / SPILL_FILE)
    if not _recently_down():
        try:
            with short_budget(opts):
                if spill.pending() and _replay_quietly(client, spill):
                    raise ConnectionError(f"{spill.path} could not be written to the server")
                send(client, [record])
            return True
        except Exception as exc:  # noqa: BLE001 - any failure: keep the record for later
            _note_failure(exc, f"kept in {spill.path} for `tfm tracking replay`")
    with spill.locked():
        spill.append([record])
    return False


def _replay_quietly(client: MlflowClient, spill: SpillFile) -> int:
    with spill.locked(wait=False) as mine:
        return replay(client, spill, say=log.warning) if mine else spill.count()


def end_run(config: RunConfig, run: ActiveRun, status: str = "FINISHED") -> None:
    """End the active ``run`` now, on the short budget; its end is spilled if the server does
    not answer (the ``with mlflow.start_run()`` around it then finds it ended)."""
    import mlflow

    active = mlflow.active_run()
    if active is None or active.info.run_id != run.info.run_id:
        return
    _configs.pop(run.info.run_id, None)
    try:
        with short_budget(options(config)):
            mlflow.end_run(status)  # takes the run off MLflow's stack, then tells the server
    except Exception as exc:  # noqa: BLE001 - the run stays RUNNING on the server until a replay
        _note_failure(exc, "the run's end is kept for `tfm tracking replay`")
        record = Record(run.info.run_id, status=status, end_time=_now())
        deliver(config.root, record, mlflow.MlflowClient(), options(config))


def spill_files(config: RunConfig) -> list[SpillFile]:
    """Every spill file of ``config``'s work dir: its trainings' (in Ray Train run folders or
    ``mlflow.spill_dir``), then the stages' own (the work dir's), in the order to replay them."""
    storage = config.train.storage_path or str(config.root / "train_ray")
    folders = [Path(spill_folder(None, storage, "x")).parent] if "://" not in storage else []
    if config.mlflow.spill_dir:
        folders.append(Path(config.mlflow.spill_dir))
    found = [SpillFile(p) for folder in folders for p in sorted(folder.glob(f"*/{SPILL_FILE}"))]
    return [*found, SpillFile(config.root / SPILL_FILE)]


def replay_spilled(config: RunConfig, say: Callable[[str], object] | None = None) -> int:
    """Write every spill file of ``config``'s work dir to its tracking server, in order, each
    file's records once; a file in use (a training logging into it) is left to that training.
    Returns the records still left; says one line per file."""
    from mlflow.tracking import MlflowClient

    say = say or (lambda line: log.warning("tracking: %s", line))
    left = 0
    for spill in spill_files(config):
        if not spill.pending():
            continue
        with spill.locked(wait=False) as mine:
            if not mine:
                say(f"{spill.path} is in use by a running training, which writes it itself")
                continue
            n = spill.count()
            with short_budget(options(config)):
                rest = replay(MlflowClient(config.tracking_uri), spill, say)
            left += rest
            if rest:
                say(f"{rest} of {n} record(s) left in {spill.path}; run `tfm tracking replay "
                    "<config>` when the MLflow server answers")
            else:
                say(f"wrote {n} record(s) left by an earlier outage from {spill.path}")
    return left
