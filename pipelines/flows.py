"""Prefect flows: a config's whole pipeline (``pipeline_flow``) and a single stage (``stage_flow``).

Each stage is a thin Prefect task around ``tasks.framework.runner.run_stage``; tasks pass
artifact paths. The runner does the skipping (a stage whose manifest is up to date returns at
once), so Prefect's own result caching is not used: a cached path to a deleted folder cannot
happen. One MLflow parent run per flow run, one child run per stage, into which the runner logs
the stage's result.

A flow takes the path of its config (and ``--set`` overrides), which is what a deployment sends
and what Prefect records; ``tfm run`` hands over the config it already loaded and validated too
(``Loaded``), so one command loads its config once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from filesystem.redact import redact_uri
from pipelines import console, environment
from tasks.framework import graph, mlflow_runs, runner
from tasks.framework.config import RunConfig, load_config
from tasks.framework.graph import StageSpec
from tasks.framework.results import StageResult
from tasks.framework.workdir import WorkDir, open_workdir
from tracking.run import Run


class Loaded:
    """The config a command loaded and validated, handed to a flow in the same process.

    Prefect records a flow run's parameters on its server; it cannot encode this holder (no
    ``__dict__``, not iterable), so the record shows ``<Loaded>``, not the config's values (a
    mirror's password among them), beside the path and overrides that name the config."""

    __slots__ = ("config",)

    def __init__(self, config: RunConfig) -> None:
        self.config = config


@contextlib.contextmanager
def _config(
    config_path: str, overrides: dict[str, Any] | None, loaded: Loaded | None
) -> Iterator[RunConfig]:
    """The config the caller loaded (its command set the switches), else the file's, validated
    here, with the switches it needs for the flow run and not after it: a deployment's run,
    whose process starts here, with the team server it was started with, as ``tfm``'s."""
    if loaded is not None:
        yield loaded.config
        return
    with environment.restored():
        start = environment.found_at_start()
        config = load_config(config_path, overrides, team_tracking_uri=start.tracking_uri)
        yield environment.configured(config)


@task(name="stage", retries=0, cache_policy=NO_CACHE)
def stage_task(
    config: RunConfig, name: str, force: bool | str, parent: str | None, workdir: WorkDir
) -> StageResult:
    """Run one stage in ``workdir`` inside its own MLflow child run (under the run of journal
    ``parent``) and log its result there. The console has the runner's lines for the stage;
    these two are for Prefect's UI and the run log."""
    logger = get_run_logger()
    tags = {"prefect.flow_run_id": str(flow_run.id)}
    with mlflow_runs.stage_run(config, name, parent=parent, tags=tags) as run:
        logger.info("stage %s: MLflow run journal %s", name, run.key, extra=console.RUN_LOG_ONLY)
        # logs its result into that run
        result = runner.run_stage(config, name, force=force, workdir=workdir)
    logger.info(
        "stage %s: %s in %.1fs (%s) -> %s",
        name,
        "ran" if result.ran else "skipped",
        result.seconds,
        result.reason,
        result.path,
        extra=console.RUN_LOG_ONLY,
    )
    return result


def run_pipeline(
    config: RunConfig, force: tuple[str, ...] = (), only: tuple[str, ...] | None = None
) -> list[StageResult]:
    """Run every stage in order under one MLflow parent run (call from inside a flow).

    ``force`` names stages to rerun; they and everything downstream run again. A stage that
    actually runs also reruns everything downstream of it ("upstream <stage> ran").
    """
    logger = get_run_logger()
    workdir = open_workdir(config)  # once for the flow: every stage is handed it

    def opened(parent: Run) -> None:
        logger.info(
            "MLflow parent run journal %s (tracking %s)",
            parent.key,
            redact_uri(config.tracking_uri),
        )

    def run_one(stage: StageSpec, rerun: bool | str, parent: str) -> StageResult:
        task_fn = stage_task.with_options(
            name=stage.name,
            retries=2 if stage.io_bound else 0,
            retry_delay_seconds=10,
            retry_condition_fn=worth_retrying,
        )
        return task_fn(config, stage.name, rerun, parent, workdir)

    results, parent_label = runner.run_pipeline(
        config,
        run_one,
        force=force,
        only=only,
        tags={"prefect.flow_run_id": str(flow_run.id)},
        opened=opened,
    )
    from prefect.artifacts import create_markdown_artifact

    # The run's outcome in the Prefect UI too, beside the flow run, not only in MLflow.
    create_markdown_artifact(
        key=artifact_key(config.name),
        markdown=summary_markdown(config, results, parent_label),
        description=f"{config.name}: stages and scores",
    )
    return results


def worth_retrying(task: Any, task_run: Any, state: Any) -> bool:
    """Retry a stage only when the network stayed down through the fetcher's own retries: a bad
    checksum, an unsafe or truncated archive, a missing file or a config error fails the same
    way every time, and a retry would only download the archive again and repeat the error."""
    from corpora.fetch import NetworkError

    return isinstance(state.result(raise_on_failure=False), NetworkError)


def artifact_key(name: str) -> str:
    """Prefect's artifact keys allow lowercase letters, digits and dashes."""
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-") + "-summary"


def scores(results: list[StageResult]) -> dict[str, Any]:
    """The score (or parse_score) stage's figures: numbers and short strings."""
    stats = {r.stage: r.stats for r in results}
    found = stats.get("score") or stats.get("parse_score") or {}
    return {k: v for k, v in found.items() if isinstance(v, (int, float, str)) and k != "signature"}


def summary_markdown(config: RunConfig, results: list[StageResult], mlflow_run: str) -> str:
    """A markdown table of the stages (ran or skipped, why, seconds) and one of the scores."""
    lines = [
        f"## {config.name}",
        "",
        "| stage | result | why | seconds |",
        "|---|---|---|---|",
        *(
            f"| {r.stage} | {'ran' if r.ran else 'skipped'} | {r.reason} | {r.seconds:.1f} |"
            for r in results
        ),
    ]
    found = scores(results)
    if found:
        lines += ["", "| score | value |", "|---|---|"]
        lines += [
            f"| {k} | {v:.2f} |" if isinstance(v, float) else f"| {k} | {v} |"
            for k, v in found.items()
        ]
    lines += ["", f"MLflow parent run `{mlflow_run}` ({redact_uri(config.tracking_uri)})"]
    return "\n".join(lines) + "\n"


@flow(name="pipeline")
def pipeline_flow(
    config_path: str,
    force: list[str] | None = None,
    overrides: dict[str, Any] | None = None,
    loaded: Loaded | None = None,
) -> list[StageResult]:
    """The config's whole pipeline: download -> clean -> tokenizer -> shard -> train -> average ->
    translate -> score -> register (WMT14 and every translation source), treebank -> linearize
    -> tokenizer -> shard -> train -> average -> translate -> parse_score (parsing), or teacher
    -> download -> clean -> distill -> filter -> tokenizer -> ... -> score -> export -> register
    (a config with ``distill.teacher``: docs/distillation.md)."""
    with _config(config_path, overrides, loaded) as config:
        return run_pipeline(config, tuple(force or ()))


@flow(name="stage")
def stage_flow(
    config_path: str,
    stage: str,
    force: bool = False,
    overrides: dict[str, Any] | None = None,
    loaded: Loaded | None = None,
) -> list[StageResult]:
    """Run one stage by name (for deployments that rerun a single stage)."""
    with _config(config_path, overrides, loaded) as config:
        graph.spec(config, stage)  # unknown names fail before anything starts
        return run_pipeline(config, (stage,) if force else (), only=(stage,))
