"""The runtime stages run in: Ray, local (every port on 127.0.0.1) or a cluster. MLflow's run
lifetime is ``tasks.framework.mlflow_runs``'s."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from tasks.framework.config import RayConfig
from tasks.framework.results import StageError

log = logging.getLogger(__name__)

DASHBOARD_PORT = 8265
"""Ray's default dashboard port, which a local Ray takes when it is free."""
API_SERVER_VAR = "RAY_API_SERVER_ADDRESS"
"""Where Ray's State API clients look first for the API server (ray 2.60, before RAY_ADDRESS)."""
PREEMPTION_WATCHER_VAR = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"
"""Ray Train's switch (ray 2.60, default on) for its ``PreemptionWatcher`` actor, which polls
for draining nodes. A local Ray has none to drain; the actor, created with ``max_restarts=-1``
and worker handles as arguments, has Ray Core print an ERROR line that its restart may fail
(ray-project/ray#53727). Off for a local Ray, unless the user set it."""
AUTH_MODE_VAR = "RAY_AUTH_MODE"
"""Ray's token authentication switch (ray 2.60), read by ``ray.init`` and every process it starts:
a new local Ray turns it on by default, with a console WARNING; set to ``token`` before, Ray has
nothing to announce. It keeps or writes the token in ``~/.ray/auth_token`` (``TOKEN_FILE``)."""
TOKEN_FILE = Path("~/.ray/auth_token")
LOCAL_ONLY_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's ``ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR`` (ray 2.60), named here so that setting it
needs no import of Ray: ``0`` has a local Ray's processes bind to 127.0.0.1."""


def ray_switches(config: RayConfig, found: Mapping[str, str]) -> tuple[RayConfig, dict[str, str]]:
    """What the Ray processes of a command must find in their environment, and ``config`` with
    the dashboard port they name. For a cluster (``config.address``, or ``RAY_ADDRESS`` in
    ``found``): token authentication when a token is at hand (``token_at_hand``) and the mode
    is not set, which Ray does itself for ``address="auto"`` but not for an explicit address,
    where the connection is refused after 20 s of retries. For the local Ray a command starts:
    where its State API is, loopback, token authentication and no preemption watcher. What
    ``found`` sets stays."""
    if config.address or found.get("RAY_ADDRESS"):
        token = AUTH_MODE_VAR not in found and token_at_hand(found)
        return config, {AUTH_MODE_VAR: "token"} if token else {}
    port = dashboard_port() if config.dashboard else None
    # Every process ray.init starts (the raylet, which starts every worker) inherits where the
    # State API is: without it they search the machine for a running Ray, and with a second one
    # there (another `tfm run`) Ray Train's cleaner prints "Found multiple active Ray instances"
    # into the run's log, then a warning at every look.
    wanted = {API_SERVER_VAR: f"http://127.0.0.1:{port}"} if port else {}
    if config.loopback:
        wanted[LOCAL_ONLY_VAR] = "0"
    defaults = {AUTH_MODE_VAR: "token", PREEMPTION_WATCHER_VAR: "0"}
    wanted.update({name: value for name, value in defaults.items() if name not in found})
    return config.with_dashboard_port(port), wanted


def token_at_hand(found: Mapping[str, str]) -> bool:
    """Whether a Ray token is where Ray 2.60 looks for one: ``RAY_AUTH_TOKEN``, the file
    ``RAY_AUTH_TOKEN_PATH`` names, or ``~/.ray/auth_token``."""
    if found.get("RAY_AUTH_TOKEN"):
        return True
    named = found.get("RAY_AUTH_TOKEN_PATH")
    return Path(named).expanduser().is_file() if named else TOKEN_FILE.expanduser().is_file()


def ensure_ray(config: RayConfig | None = None) -> None:
    """Connect to ``config.address`` / ``RAY_ADDRESS``, or start a local Ray; no-op if connected.

    A local Ray takes its switches from the environment its command set at its start
    (``pipelines.environment``: token authentication, loopback, where the State API is), and its
    dashboard port from ``config.dashboard_port``; without them (a library caller) Ray's own
    defaults apply, and Ray says so."""
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
    # groups of a dead controller never freed). "local": a new one even where `ray start` left
    # its address in /tmp/ray/ray_current_cluster, which ray.init() without an address joins
    # (and refuses num_cpus for): a cluster is named by ray.address or RAY_ADDRESS only.
    ray.init(
        address="local",
        num_cpus=config.num_cpus,
        include_dashboard=config.dashboard,
        dashboard_host="127.0.0.1",
        dashboard_port=config.dashboard_port if config.dashboard else None,
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
    """Join the Ray cluster at ``address`` as a driver, which must run on one of its nodes (its
    token authentication is set at the command's start: ``ray_switches``). A machine that is
    not a node (a laptop) would attach to another node's raylet and hang in the first Ray Data
    stage (objects its workers cannot send back): it fails here, in seconds, saying what to do
    instead."""
    import ray

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


def dashboard_port() -> int:
    """A port for the next local Ray's dashboard, which serves the State API: Ray's 8265 if it
    is free, else any free one (a second run on the machine)."""
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", DASHBOARD_PORT))
        except OSError:  # held by another run's dashboard
            s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bind_ray_to_loopback() -> None:
    """Make the next local Ray bind its servers (GCS, raylet, workers, agents) to 127.0.0.1.

    Ray binds them to the node's IP, which it takes to be the machine's address on Linux and
    127.0.0.1 where local clusters only are enabled (its macOS/Windows default). Ray's processes
    read that switch from the environment (``pipelines.environment`` sets it); the driver, which
    may have imported Ray before, reads it from the constant.
    """
    import ray._private.ray_constants as ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False
