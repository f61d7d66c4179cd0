"""The runtimes stages run in: Ray (local or a cluster) and MLflow tracking, and logging a
stage's result to MLflow once."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tasks.config import RayConfig, RunConfig, flatten
from tasks.contract import MANIFEST, StageError, StageResult

log = logging.getLogger(__name__)


def ensure_ray(config: RayConfig | None = None) -> None:
    """Connect to ``config.address`` / ``RAY_ADDRESS``, or start a local Ray; no-op if connected."""
    import ray

    if ray.is_initialized():
        return
    config = config or RayConfig()
    address = config.address or os.environ.get("RAY_ADDRESS")
    if address:
        connect_to_cluster(address)
        return
    if config.loopback:
        bind_ray_to_loopback()
    # A local Ray with quiet logs. The dashboard process also serves the State API, which Ray
    # Train's placement-group cleaner polls (without it: a warning every second and placement
    # groups of a dead controller never freed).
    ray.init(
        num_cpus=config.num_cpus,
        include_dashboard=config.dashboard,
        dashboard_host="127.0.0.1",
        log_to_driver=True,
        logging_level=logging.WARNING,
        configure_logging=True,
    )
    try:
        from ray.data import DataContext

        # Progress bars are for people at a terminal, not for logs and tests.
        DataContext.get_current().enable_progress_bars = os.environ.get("CI") != "true"
    except ImportError:  # pragma: no cover - ray[data] is a dependency
        pass


TOKEN_HINT = (
    "a cluster with token authentication (Ray 2.60's default for `ray start --head`) needs "
    "RAY_AUTH_MODE=token here and its token in RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or "
    "~/.ray/auth_token (docs/running.md)"
)


def connect_to_cluster(address: str) -> None:
    """Join the Ray cluster at ``address`` as a driver, which must run on one of its nodes.

    With a token at hand (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``)
    and ``RAY_AUTH_MODE`` unset, token authentication is turned on: Ray does so itself for
    ``address="auto"`` but not for an explicit address, where the connection is refused after
    20 s of retries. A machine that is not a node (a laptop) would attach to another node's
    raylet and hang in the first Ray Data stage (objects its workers cannot send back): it
    fails here, in seconds, saying what to do instead."""
    import ray

    if "RAY_AUTH_MODE" not in os.environ:
        # Ray's own switch (ray 2.60): sets the variable and refreshes the config its core
        # library read at import; the variable alone comes too late in a process that has
        # imported Ray.
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )

        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    log.info("connecting to Ray at %s", address)
    try:
        ray.init(address=address, log_to_driver=True)
    except ConnectionError as exc:
        hint = f"; {TOKEN_HINT}" if os.environ.get("RAY_AUTH_MODE") != "token" else ""
        raise StageError(f"cannot connect to Ray at {address}: {exc}{hint}") from None
    node = ray.util.get_node_ip_address()
    here = local_addresses()
    if node not in here:
        ray.shutdown()
        shown = sorted(a for a in here if ":" not in a and not a.startswith("127."))
        raise StageError(
            f"this machine ({', '.join(shown) or 'no IPv4 address'}) is not a node of the Ray "
            f"cluster at {address} (its driver would attach to {node}'s raylet and hang): run tfm "
            "on a node, e.g. the head, or submit it as a Ray job: "
            f"`ray job submit --address http://<head>:8265 --working-dir . -- tfm run <config>`"
        )


def local_addresses() -> set[str]:
    """Every IP address of this machine's network interfaces."""
    import socket

    import psutil

    return {
        entry.address.split("%")[0]
        for entries in psutil.net_if_addrs().values()
        for entry in entries
        if entry.family in (socket.AF_INET, socket.AF_INET6)
    }


def bind_ray_to_loopback() -> None:
    """Make the next local Ray bind its servers (GCS, raylet, workers, agents) to 127.0.0.1.

    Ray binds them to the node's IP, which it takes to be the machine's address on Linux and
    127.0.0.1 where local clusters only are enabled (its macOS/Windows default). That switch is
    read from the environment, which Ray's processes inherit; the driver, which has imported
    Ray already, reads it from the constant.
    """
    import ray._private.ray_constants as ray_constants

    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def setup_mlflow(config: RunConfig) -> str:
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


@contextmanager
def stage_run(config: RunConfig, stage: str, tags: dict[str, Any] | None = None) -> Iterator[Any]:
    """An MLflow run for one stage: nested under the active run (a flow) if there is one."""
    import mlflow

    setup_mlflow(config)
    parent = mlflow.active_run()
    with mlflow.start_run(
        run_name=f"{config.name}/{stage}",
        nested=parent is not None,
        tags={"stage": stage, "pipeline.run": config.name, **(tags or {})},
    ) as run:
        yield run


LOGGED_SUFFIXES = (".png", ".json", ".tsv")
"""Files of a stage folder logged as MLflow artifacts (top level only, small ones)."""
LOGGED_MAX_BYTES = 10 << 20


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
