"""Prefect flows: the whole pipeline (``wmt14`` or ``parsing``) and a single ``stage``.

Each stage is a thin Prefect task around ``tasks.stages.run_one``; tasks pass artifact paths.
The stage contract does the skipping (a stage whose manifest is up to date returns at once), so
Prefect's own result caching is not used: a cached path to a deleted folder cannot happen.
One MLflow parent run per flow run, one child run per stage.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from tasks import stages
from tasks.artifacts import read_manifest
from tasks.config import RunConfig, load_config, to_dict


@dataclass
class StageOutcome:
    """What happened to one stage in a flow run."""

    name: str
    path: str
    ran: bool
    seconds: float
    mlflow_run_id: str | None


def _flatten(prefix: str, data: Any, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(data, dict):
        for k, v in data.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = data
    return out


def _log_stage_outcome(path: Path) -> None:
    """Log a finished stage's stats and fingerprint into the active MLflow run."""
    import mlflow

    manifest = read_manifest(path) or {}
    mlflow.set_tag("fingerprint", manifest.get("fingerprint", ""))
    for role, info in (manifest.get("inputs") or {}).items():
        mlflow.set_tag(f"input.{role}", info.get("fingerprint", ""))
    metrics = {
        k: float(v)
        for k, v in _flatten("", manifest.get("stats") or {}, {}).items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    if metrics:
        mlflow.log_metrics({k.replace("/", "_")[:250]: v for k, v in metrics.items()})
    # The manifest and the stage's plots (length histograms, learning curves, BLEU by length).
    for artifact in [path / "manifest.json", *sorted(path.glob("*.png"))]:
        if artifact.is_file():
            mlflow.log_artifact(str(artifact), artifact_path=path.name)


@task(name="stage", retries=0, cache_policy=NO_CACHE)
def stage_task(config: RunConfig, name: str, force: bool, parent_run_id: str | None) -> StageOutcome:
    """Run one stage inside its own MLflow child run."""
    import mlflow

    from tasks.runtime import setup_mlflow

    logger = get_run_logger()
    out = stages.output_dir(config, name)
    before = (read_manifest(out) or {}).get("started")
    setup_mlflow(config)
    started = time.time()
    with mlflow.start_run(
        run_name=f"{config.name}/{name}",
        parent_run_id=parent_run_id,
        nested=parent_run_id is not None,
        tags={"stage": name, "pipeline.run": config.name, "prefect.flow_run_id": str(flow_run.id)},
    ) as run:
        logger.info("stage %s: MLflow run %s", name, run.info.run_id)
        path = stages.run_one(config, name, force=force)
        ran = (read_manifest(path) or {}).get("started") != before
        mlflow.set_tag("skipped", str(not ran).lower())
        _log_stage_outcome(path)
    seconds = time.time() - started
    logger.info("stage %s: %s in %.1fs -> %s", name, "ran" if ran else "up to date, skipped", seconds, path)
    return StageOutcome(name, str(path), ran, seconds, run.info.run_id)


def run_pipeline(
    config: RunConfig, force: tuple[str, ...] = (), only: tuple[str, ...] | None = None
) -> list[StageOutcome]:
    """Run every stage in order under one MLflow parent run (call from inside a flow).

    ``force`` names stages to rerun; they and everything downstream run again. A stage that
    actually runs also reruns everything downstream of it.
    """
    import mlflow

    from tasks.runtime import setup_mlflow

    logger = get_run_logger()
    forced = stages.downstream(config, force)
    setup_mlflow(config)
    outcomes: list[StageOutcome] = []
    with mlflow.start_run(
        run_name=f"{config.name}/{stages.pipeline_name(config)}",
        tags={"pipeline": stages.pipeline_name(config), "prefect.flow_run_id": str(flow_run.id)},
    ) as parent:
        logger.info("MLflow parent run %s (tracking %s)", parent.info.run_id, config.tracking_uri)
        mlflow.log_params({k: str(v)[:500] for k, v in _flatten("", to_dict(config), {}).items()})
        for spec in stages.pipeline(config):
            if only is not None and spec.name not in only:
                continue
            task_fn = stage_task.with_options(
                name=spec.name,
                retries=2 if spec.io_bound else 0,
                retry_delay_seconds=10,
            )
            outcome = task_fn(config, spec.name, spec.name in forced, parent.info.run_id)
            outcomes.append(outcome)
            if outcome.ran:
                forced |= stages.downstream(config, [spec.name])
        mlflow.set_tag("stages.ran", ",".join(o.name for o in outcomes if o.ran))
    return outcomes


@flow(name="wmt14")
def wmt14_flow(
    config_path: str, force: list[str] | None = None, overrides: dict[str, Any] | None = None
) -> list[StageOutcome]:
    """download -> clean -> tokenizer -> shard -> train -> average -> translate -> score -> register."""
    config = load_config(config_path, overrides)
    return run_pipeline(config, tuple(force or ()))


@flow(name="parsing")
def parsing_flow(
    config_path: str, force: list[str] | None = None, overrides: dict[str, Any] | None = None
) -> list[StageOutcome]:
    """treebank -> linearize -> tokenizer -> shard -> train -> average -> translate -> parse_score."""
    config = load_config(config_path, overrides)
    return run_pipeline(config, tuple(force or ()))


@flow(name="stage")
def stage_flow(
    config_path: str, stage: str, force: bool = False, overrides: dict[str, Any] | None = None
) -> list[StageOutcome]:
    """Run one stage by name (for deployments that rerun a single stage)."""
    config = load_config(config_path, overrides)
    stages.spec(config, stage)  # unknown names fail before anything starts
    return run_pipeline(config, (stage,) if force else (), only=(stage,))


def flow_for(config: RunConfig):
    """The flow object that runs this config's pipeline."""
    return parsing_flow if stages.pipeline_name(config) == "parsing" else wmt14_flow

