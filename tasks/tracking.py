"""The MLflow run lifetime, in one place: the tracking URI and experiment, a flow's parent run,
one run per stage (nested under the flow's), the run a training logs into again on resume, and a
stage's result logged once. Workers log through ``training.tracking.Tracker`` into a run opened
here; nothing else starts, ends or configures a run."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from corpora.redact import redacted
from tasks.config import RunConfig, flatten
from tasks.contract import MANIFEST, StageResult

LOGGED_SUFFIXES = (".png", ".json", ".tsv")
"""Files of a stage folder logged as MLflow artifacts (top level only, small ones)."""
LOGGED_MAX_BYTES = 10 << 20
MLFLOW_RUN_FILE = "mlflow_run.json"
"""Where a training's storage folder remembers the run it logs into (so a resume continues it)."""


def connect(config: RunConfig) -> str:
    """Point MLflow at the run's tracking URI and experiment; returns the experiment id."""
    import mlflow

    config.root.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(config.tracking_uri)
    mlflow.set_registry_uri(config.tracking_uri)
    client = mlflow.MlflowClient()
    experiment = client.get_experiment_by_name(config.mlflow.experiment)
    if experiment is None:
        # A local tracking store keeps artifacts beside the database, not in ./mlruns of
        # whatever directory the command ran in; a server decides for itself.
        location = None
        if config.tracking_uri.startswith("sqlite:"):
            location = (config.root / "mlartifacts").resolve().as_uri()
        try:
            client.create_experiment(config.mlflow.experiment, artifact_location=location)
        except mlflow.exceptions.MlflowException:
            pass  # created concurrently by another process
    return mlflow.set_experiment(config.mlflow.experiment).experiment_id


def client(config: RunConfig) -> Any:
    """An ``MlflowClient`` on the run's tracking server and registry."""
    from mlflow.tracking import MlflowClient

    connect(config)
    return MlflowClient(tracking_uri=config.tracking_uri, registry_uri=config.tracking_uri)


@contextmanager
def pipeline_run(config: RunConfig, pipeline: str, tags: Mapping[str, str]) -> Iterator[Any]:
    """A flow's parent run, holding the whole config as params."""
    import mlflow

    connect(config)
    with mlflow.start_run(run_name=f"{config.name}/{pipeline}", tags={"pipeline": pipeline, **tags}) as run:
        mlflow.log_params({k: str(v)[:500] for k, v in redacted(flatten(config)).items()})
        yield run


def set_tag(run: Any, key: str, value: str) -> None:
    """Tag ``run`` (an open run, from any thread)."""
    import mlflow

    mlflow.MlflowClient().set_tag(run.info.run_id, key, value)


@contextmanager
def stage_run(
    config: RunConfig,
    stage: str,
    *,
    parent_run_id: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> Iterator[Any]:
    """A run for one stage, nested under ``parent_run_id`` or else under the active run, if any.

    ``parent_run_id`` is for a stage run in another thread than its flow's (MLflow's active run
    is per thread)."""
    import mlflow

    connect(config)
    if parent_run_id is None and (active := mlflow.active_run()) is not None:
        parent_run_id = active.info.run_id
    with mlflow.start_run(
        run_name=f"{config.name}/{stage}",
        parent_run_id=parent_run_id,
        nested=parent_run_id is not None,
        tags={"stage": stage, "pipeline.run": config.name, **(tags or {})},
    ) as run:
        yield run


@contextmanager
def active_or_stage_run(config: RunConfig, stage: str) -> Iterator[Any]:
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
def training_run(config: RunConfig, stage: str, run_dir: str) -> Iterator[tuple[str, str]]:
    """``(tracking_uri, run_id)`` a training logs into: the run its storage folder logged into
    before (a resume), else the active run, else a new stage run; remembered in the folder, and
    ended FINISHED or FAILED with the training when it was reopened."""
    import mlflow

    from training.data import open_fs

    fs, root = open_fs(run_dir)
    record_path = f"{root}/{MLFLOW_RUN_FILE}"
    stored = _read_record(fs, record_path)
    if stored is not None and not _run_exists(stored["tracking_uri"], stored["run_id"]):
        stored = None  # the tracking store was reset: start a new run
    if stored is not None:
        with _reopened(stored["tracking_uri"], stored["run_id"]):
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
def _reopened(tracking_uri: str, run_id: str) -> Iterator[None]:
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
        run_client.set_terminated(run_id, "FAILED")
        raise
    run_client.set_terminated(run_id, "FINISHED")


def log_stage_result(result: StageResult) -> None:
    """Log a stage's result into the active MLflow run, once: whether it ran and why, the
    fingerprints, the numeric stats as metrics (except those the stage logged itself, such as
    training curves), the other scalars as tags, and the folder's manifest, plots and tables."""
    import mlflow

    run = mlflow.active_run()
    if run is None:
        return
    manifest = json.loads((result.path / MANIFEST).read_text(encoding="utf-8"))
    tags = {"skipped": str(not result.ran).lower(), "reason": result.reason[:5000],
            "fingerprint": manifest["fingerprint"]}
    tags.update({f"input.{role}": info["fingerprint"] for role, info in manifest["inputs"].items()})
    logged = set(mlflow.MlflowClient().get_run(run.info.run_id).data.metrics)
    metrics: dict[str, float] = {}
    for key, value in flatten(result.stats).items():
        key = key.replace("/", "_")[:250]
        if isinstance(value, bool) or value is None:
            tags[f"stats.{key}"] = str(value)
        elif isinstance(value, (int, float)):
            if key not in logged:
                metrics[key] = float(value)
        elif isinstance(value, str):
            tags[f"stats.{key}"] = value[:5000]
    mlflow.set_tags(tags)
    if metrics:
        mlflow.log_metrics(metrics)
    for path in sorted(result.path.iterdir()):
        if path.is_file() and path.suffix in LOGGED_SUFFIXES and path.stat().st_size <= LOGGED_MAX_BYTES:
            mlflow.log_artifact(str(path), artifact_path=result.stage)
