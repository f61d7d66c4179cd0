"""The pipeline's side: the Ray nodes and the Prefect worker, run as ``tfm-pipeline`` (as
KubeRay's images run Ray as the unprivileged ``ray``), with the folders it writes. The flow
runs the worker starts, their Ray workers and ``exec``'s commands are that user too: drivers and
workers read and write the same work dirs and Ray storage."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from pathlib import Path

from .hosts import host_env, in_host, spawn
from .layout import (
    CREDENTIALS,
    DASHBOARD_PORT,
    PIPELINE_USER,
    RAY_HEAD,
    RAY_HOSTS,
    RAY_PORT,
    REPO,
    WORK_POOL,
    ClusterError,
    Layout,
)
from .users import owned_folder


def user_env(layout: Layout) -> dict[str, str]:
    """The pipeline user's own variables: a home in the state folder (MLflow's and matplotlib's
    caches), Prefect's home in it (else ``tfm`` takes ``.prefect`` of the folder it runs in,
    which may be root's), the cluster's venv first on ``PATH``, and the temporary folder of
    the host's own disk (``node_tmp``)."""
    path = os.environ.get("PATH", "/usr/bin:/bin")
    home = layout.root / "home"
    return {
        "HOME": str(home),
        "PREFECT_HOME": str(home / ".prefect"),
        "PATH": f"{layout.venv / 'bin'}:{path}",
        **node_tmp(layout),
    }


def run_as_pipeline(layout: Layout, host: str, argv: list[str]) -> list[str]:
    """``argv`` on ``host`` as the pipeline user (``hosts.in_host``)."""
    return in_host(layout, host, argv, PIPELINE_USER)


def pipeline_env(
    layout: Layout,
    env: dict[str, str] | None = None,
    credentials: tuple[str, ...] = tuple(CREDENTIALS),
) -> dict[str, str]:
    """``hosts.host_env`` for the pipeline user: its own variables, then ``env``."""
    return host_env(layout, {**user_env(layout), **(env or {})}, credentials, PIPELINE_USER)


def prepare(layout: Layout) -> None:
    """What the pipeline user writes, made its own: the work folder (the shared filesystem's
    part for runs), its home, each Ray host's own disk, the Prefect worker's home, and Ray's
    token (which the nodes and every driver read; mode 0600)."""
    owned_folder(layout.work, PIPELINE_USER, 0o755)
    owned_folder(layout.root / "home", PIPELINE_USER)
    for host in RAY_HOSTS:
        owned_folder(layout.disk(host), PIPELINE_USER, 0o755)
        owned_folder(layout.disk(host) / NODE_TMP, PIPELINE_USER, 0o755)
    Path(layout.node_dir).mkdir(parents=True, exist_ok=True)
    owned_folder(layout.root / "prefect" / RAY_HEAD, PIPELINE_USER)
    if not layout.token.is_file():
        layout.token.write_text(secrets.token_hex(32))
    shutil.chown(layout.token, PIPELINE_USER, PIPELINE_USER)
    layout.token.chmod(0o600)


def ray_up(layout: Layout, host: str, health_check_ms: int = 1000) -> None:
    """``ray start`` on ``host``: the head (no CPUs for tasks) or a worker node joining it."""
    ip = layout.hosts[host]
    ray = str(layout.venv / "bin" / "ray")
    common = [
        "--node-ip-address", ip, "--temp-dir", layout.ray_temp(host), "--disable-usage-stats",
    ]  # fmt: skip
    if host == RAY_HEAD:
        # A dead host answers nothing: each check waits out its timeout (Ray's default: 10 s,
        # so 5 misses took 55 s), so the timeout is the period too.
        system = {
            "health_check_period_ms": health_check_ms,
            "health_check_timeout_ms": health_check_ms,
            "health_check_failure_threshold": 5,
        }
        argv = [
            ray, "start", "--head", "--port", str(RAY_PORT), "--num-cpus", "0",
            "--dashboard-host", ip, "--dashboard-port", str(DASHBOARD_PORT),
            "--ray-client-server-port", "10001", "--system-config", json.dumps(system), *common,
        ]  # fmt: skip
    else:
        argv = [
            ray, "start", "--address", layout.urls["ray"],
            "--num-cpus", str(layout.worker_cpus), *common,
        ]  # fmt: skip
    log = layout.logs / f"{host}-ray-start.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    # The node's environment reaches every Ray worker it starts: rank 0 of training logs to
    # MLflow with the pipeline's credentials from here, and every worker opens the object store
    # with its keys from here. (A job's runtime_env would carry them too, but the raylet starts
    # each worker with it on a command line, --serialized-runtime-env-context.)
    with open(log, "ab") as out:
        done = subprocess.run(
            run_as_pipeline(layout, host, argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=REPO,
            timeout=180,
            env=pipeline_env(layout, credentials=("mlflow", "s3")),
        )
    if done.returncode != 0:
        raise ClusterError(f"`ray start` on {host} failed; see {log}")


NODE_TMP = "tmp"
"""The folder of a Ray host's own disk that stands for its /tmp."""


def node_tmp(layout: Layout) -> dict[str, str]:
    """A Ray host's temporary folder on its own disk, for its nodes, their workers and the
    drivers run there: the hosts of one machine share /tmp, where Ray keeps its checkpoint locks
    (``/tmp/_ray_lockfiles``), and a lock folder an earlier Ray made as another user there
    refuses the pipeline user's."""
    return {"RAY_TMPDIR": f"{layout.node_dir}/{NODE_TMP}"}


def ray_nodes_alive(layout: Layout) -> int:
    """Alive Ray nodes, asked from the head host as a driver would."""
    script = (
        "import ray; ray.init(logging_level='ERROR'); print(sum(n['Alive'] for n in ray.nodes()))"
    )
    done = subprocess.run(
        run_as_pipeline(layout, RAY_HEAD, [str(layout.python), "-c", script]),
        capture_output=True,
        text=True,
        timeout=120,
        env=pipeline_env(layout, credentials=()),
    )
    return int(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else 0


def worker_up(layout: Layout) -> None:
    """A Prefect process worker on the head host: it runs flows there, as Ray drivers."""
    prefect = str(layout.venv / "bin" / "prefect")
    env = {"PREFECT_HOME": str(layout.root / "prefect" / RAY_HEAD)}
    create = [prefect, "work-pool", "create", WORK_POOL, "--type", "process", "--overwrite"]
    done = subprocess.run(
        run_as_pipeline(layout, RAY_HEAD, create),
        capture_output=True,
        text=True,
        timeout=120,
        env=pipeline_env(layout, env),
    )
    if done.returncode != 0:
        said = f"{done.stdout[-500:]}{done.stderr[-500:]}"
        raise ClusterError(f"prefect work-pool create failed: {said}")
    start = [prefect, "worker", "start", "--pool", WORK_POOL, "--type", "process"]
    spawn(
        layout,
        RAY_HEAD,
        "prefect-worker",
        start,
        {**user_env(layout), **env},
        user=PIPELINE_USER,
    )
