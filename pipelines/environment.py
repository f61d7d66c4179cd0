"""What a ``tfm`` process (or a Prefect deployment's flow run) writes into its environment, in
one place, at its start: the switches of the libraries that read them only from there (Prefect's
home and server, MLflow's progress bars and HTTP budget, Ray's worker-line prefix, its local
Ray's token authentication, loopback and State API, Ray Data's logging, Ray Serve's ingress
for ``tfm serve``), and what it found
there before any library changed it.

Every other module is handed what it needs; ``training.process_group`` sets a rank's rendezvous
in the Ray Train worker, a process of another kind.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from pipelines import console
from tasks.framework import mlflow_runs, runtime
from tasks.framework.config import RayConfig, RunConfig
from tracking.sender import TrackingOptions

PREFECT = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_LOGGING_LEVEL": "INFO",
    # Prefect waits 20 s for its ephemeral server; a fresh PREFECT_HOME's database migrations
    # alone take about that on 2 cores, so a first `tfm run` failed before any stage ran.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
}
"""Prefect's settings for a command (an ephemeral API unless the user set up a server), with
``PREFECT_HOME`` in the current directory; a value the user set stays."""
TRACKING_URI_VAR = "MLFLOW_TRACKING_URI"


@dataclass(frozen=True)
class Start:
    """What the process found at its start, for the commands it runs."""

    tracking_uri: str | None
    """``MLFLOW_TRACKING_URI`` as found, the team server for configs that name none (read here:
    ``mlflow.set_tracking_uri`` rewrites the variable, so a later read would see the store of
    the last run this process logged to)."""


def switches(verbose: bool, cwd: Path) -> dict[str, str]:
    """The variables a command sets, unless the user set them: ``-v`` leaves the libraries'
    console switches as they are."""
    found = {"PREFECT_HOME": str(cwd / ".prefect"), **PREFECT}
    if not verbose:
        found.update({**console.QUIET_MLFLOW, **console.QUIET_RAY})
    return found


COMMAND_VARIABLES = (
    console.RAY_DATA_CONFIG_VAR,
    *TrackingOptions().http_environment(),
    runtime.API_SERVER_VAR,
    runtime.PREEMPTION_WATCHER_VAR,
    runtime.LOCAL_ONLY_VAR,
)
"""What ``configured`` and ``logging_to`` may set for one command, restored after it; not
``RAY_AUTH_MODE``: a Ray that a command started with it stays up in the process (Ray's cached
config keeps token mode), and what that process starts later must inherit it, as ``ray.init``
leaves it."""


def found_at_start() -> Start:
    """What the process finds in its environment at its start."""
    return Start(tracking_uri=os.environ.get(TRACKING_URI_VAR) or None)


@contextlib.contextmanager
def started(verbose: bool) -> Iterator[Start]:
    """The process's environment for a command, set before anything imports Ray or Prefect;
    after it the environment is as it was (tests run many commands in one process)."""
    start = found_at_start()
    wanted = switches(verbose, Path.cwd())
    before = {name: os.environ.get(name) for name in wanted}
    for name, value in wanted.items():
        os.environ.setdefault(name, value)
    try:
        with restored():
            yield start
    finally:
        _restore(before)


@contextlib.contextmanager
def restored() -> Iterator[None]:
    """``COMMAND_VARIABLES`` as they were after the block: what ``configured`` set for one
    command's config (a flow run's, in a process that runs several) must not name, for the next,
    the State API of a Ray that has gone (a Ray started later inherits it: refused connections)."""
    before = {name: os.environ.get(name) for name in COMMAND_VARIABLES}
    try:
        yield
    finally:
        _restore(before)


def configured(config: RunConfig) -> RunConfig:
    """The switches ``config``'s command needs, set once it is loaded: MLflow's HTTP budget
    (its client reads it nowhere else) and, where a stage will start a local Ray, Ray's
    (``runtime.ray_switches``). Returns ``config`` with the dashboard port they name."""
    ray, wanted = runtime.ray_switches(config.ray, os.environ)
    _set({**mlflow_runs.http_environment(config), **wanted})
    return config if ray is config.ray else config.replace(ray=ray)


def serve_ingress(variables: Mapping[str, str]) -> None:
    """``tfm serve``'s ingress switches (``serving.haproxy_ingress.environment``), set before
    its local Ray starts: Ray Serve's processes read them only as they start."""
    _set(variables)


@contextlib.contextmanager
def local_ray(ray: RayConfig) -> Iterator[RayConfig]:
    """For a caller outside a command (a test, a benchmark) that starts a local Ray in the
    block (``runtime.ensure_ray``): Ray's switches as a command sets them, then as they were
    (but ``RAY_AUTH_MODE``, as after a command)."""
    ray, wanted = runtime.ray_switches(ray, os.environ)
    before = {name: os.environ.get(name) for name in wanted if name != runtime.AUTH_MODE_VAR}
    _set(wanted)
    try:
        yield ray
    finally:
        _restore(before)


def _set(wanted: Mapping[str, str]) -> None:
    os.environ.update(wanted)
    if wanted.get(runtime.AUTH_MODE_VAR) and "ray._raylet" in sys.modules:
        # Ray's core library read its config when it was imported, here before the command
        # (tests run many in one process): Ray's own switch sets the mode and refreshes it.
        from ray._private.authentication.authentication_token_setup import _enable_token_auth

        _enable_token_auth()


def _restore(before: Mapping[str, str | None]) -> None:
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def logging_to(workdir: Path, verbose: bool) -> Path:
    """Every log record to ``workdir``'s run log from now on (``console.log_to``); without
    ``-v`` Ray Data's INFO lines go there too, by the logging config it reads from the
    environment, in the driver and in every worker (call before Ray starts). Returns the log."""
    log = console.log_to(workdir, verbose)
    if not verbose and console.RAY_DATA_CONFIG_VAR not in os.environ:
        os.environ[console.RAY_DATA_CONFIG_VAR] = str(console.ray_data_config(log))
    return log
