"""Prefect deployments: the whole flow and the single-stage flow, on a work pool, with a schedule.

This is the one place deployments are defined (``tfm deploy``): configs and schedules come from
the command line, so no deployment file can drift from the flows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.framework import graph
from tasks.framework.config import RunConfig

REPO = Path(__file__).resolve().parents[1]


def deploy(
    config_path: Path,
    config: RunConfig,
    *,
    cron: str | None,
    work_pool: str,
    stage: str | None = None,
    overrides: dict[str, Any] | None = None,
) -> str:
    """Register a deployment on the Prefect server named by PREFECT_API_URL; returns its id.
    ``overrides`` (the command's ``--set``) travel in its parameters: each run applies them.

    The flow code is read from this checkout (``from_source``), so a process worker on the
    same machine or a shared filesystem runs it.
    """
    from prefect import Flow
    from prefect import flow as prefect_flow

    parameters: dict[str, Any]
    if stage is not None:
        graph.spec(config, stage)
        entrypoint = "pipelines/flows.py:stage_flow"
        parameters = {"config_path": str(config_path), "stage": stage, "force": True}
        name = f"{config.name}-{stage}"
    else:
        entrypoint = "pipelines/flows.py:pipeline_flow"
        parameters = {"config_path": str(config_path)}
        name = config.name
    if overrides:
        parameters["overrides"] = overrides
    remote = prefect_flow.from_source(source=str(REPO), entrypoint=entrypoint)
    assert isinstance(remote, Flow)  # a caller outside an event loop gets it; typed as either
    deployment_id = remote.deploy(
        name=name,
        work_pool_name=work_pool,
        cron=cron,
        parameters=parameters,
        tags=["transformer", graph.pipeline_name(config)],
        print_next_steps=False,
        ignore_warnings=True,  # the advice to use .serve() for a process pool: we want a worker
    )
    print(
        f"deployment {name} ({deployment_id}) on work pool {work_pool!r}"
        + (f", schedule {cron!r}" if cron else "")
    )
    print(f"start a worker: prefect worker start --pool {work_pool}")
    return str(deployment_id)
