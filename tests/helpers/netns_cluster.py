"""The local cluster of network-namespace hosts (infra/local-cluster) as the cluster scenario
drives it: started and stopped through its command line, commands on its hosts (as the
pipeline's user), every listening socket and every process of every host with its user, and the
secrets it made."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from helpers.shared_data import required_in_ci

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "infra" / "local-cluster" / "localcluster.py"
RAY_WORKER_PORTS = range(10002, 20000)
"""Ray's default worker port range (``--min-worker-port``/``--max-worker-port``): the gRPC
servers of drivers, workers and actors."""
TESTS = ROOT / "tests"
"""The folder a flow run's script runs from (``python -m helpers.scenario_flow``)."""
SETUP = ("ip netns exec ", "unshare ", "sh -c mount --bind ", "mount ", "setpriv ")
"""The command lines of what enters a host as root (namespaces, the node disk's mount, the user
it drops to), each replaced by the next: the only root processes a host may have."""
RAY_DAEMONS = (
    "gcs_server",
    "raylet",
    "ray::DashboardAgent",
    "ray/dashboard/dashboard.py",
    "ray/autoscaler/_private/monitor.py",
)
"""Ray's own servers, matched in the command line."""


def cannot_make_hosts() -> str | None:
    """Why network-namespace hosts cannot be made here, or None if they can."""
    if sys.platform != "linux" or os.geteuid() != 0:
        return "needs root (CAP_NET_ADMIN) on Linux to make network-namespace hosts"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip`"
    if not list(Path("/usr/lib/postgresql").glob("*/bin/postgres")):
        return "needs Debian's postgresql (apt-get install -y postgresql; .ci/run installs it)"
    probe = f"tfmprobe{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def require_hosts() -> None:
    """Skip with one line why, except in CI, where the scenario must run."""
    reason = cannot_make_hosts()
    if reason is not None:
        required_in_ci("the cluster scenario", reason)


@dataclass
class Cluster:
    """A started local cluster: its state folder and what ``cluster.json`` says."""

    state: Path
    info: dict

    def host(self, name: str) -> str:
        return self.info["hosts"][name]

    @property
    def user(self) -> str:
        """The user the pipeline's side runs as (Ray, the Prefect worker, ``exec``)."""
        return self.info["pipeline_user"]

    @property
    def python(self) -> str:
        """The cluster's Python (its venv, which every user of the cluster can run)."""
        return self.info["python"]

    def give(self, path: Path) -> Path:
        """``path`` (made if missing) and all in it handed to the pipeline's user, as a person
        hands a folder to the cluster: its flow runs and Ray workers write there."""
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["chown", "-R", f"{self.user}:{self.user}", str(path)], check=True)
        return path

    @property
    def credentials(self) -> dict[str, str]:
        """The pipeline's MLflow user, Prefect's auth string and the object store's keys, as
        env.sh gives a shell."""
        secrets = self.state / "secrets"
        return {
            "MLFLOW_TRACKING_USERNAME": "pipeline",
            "MLFLOW_TRACKING_PASSWORD": (secrets / "mlflow-pipeline").read_text().strip(),
            "PREFECT_API_AUTH_STRING": (secrets / "prefect-auth").read_text().strip(),
            "AWS_ACCESS_KEY_ID": (secrets / "s3-access-key").read_text().strip(),
            "AWS_SECRET_ACCESS_KEY": (secrets / "s3-secret-key").read_text().strip(),
        }

    @property
    def env(self) -> dict[str, str]:
        """This machine (on the bridge) as a client of the cluster."""
        return {**os.environ, **self.info["env"], **self.credentials}

    def secrets(self) -> dict[str, str]:
        """Every secret the cluster made (passwords, auth strings, Ray's token), by file name."""
        files = [*(self.state / "secrets").iterdir(), self.state / "auth_token"]
        return {p.name: p.read_text().strip() for p in files}

    def pids(self, host: str) -> list[int]:
        """Every process of ``host`` (its network namespace)."""
        out = subprocess.run(
            ["ip", "netns", "pids", self.info["netns"][host]],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return [int(p) for p in out.split()]

    def script(
        self, *args: str, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [sys.executable, str(SCRIPT), "--state", str(self.state), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"localcluster {' '.join(args)}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
            )
        return done

    def run(
        self,
        host: str,
        *argv: str,
        timeout: float = 300,
        input: str | None = None,
        check: bool = True,
        cwd: Path = ROOT,
    ) -> subprocess.CompletedProcess:
        """``argv`` on ``host`` as the pipeline's user, with the cluster's environment."""
        done = subprocess.run(
            [sys.executable, str(SCRIPT), "--state", str(self.state), "exec", host, "--", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            cwd=cwd,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"on {host}: {' '.join(argv)}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
            )
        return done

    def listening(self, host: str) -> list[tuple[str, int, int, str]]:
        """``(address, port, pid, command line)`` of every listening TCP socket on ``host``."""
        ns = self.info["netns"][host]
        out = subprocess.run(
            ["ip", "netns", "exec", ns, "ss", "-ltnpH"], capture_output=True, text=True, check=True
        ).stdout
        found = []
        for line in out.splitlines():
            fields = line.split()
            address, _, port = fields[3].rpartition(":")
            for pid in _pids(fields[-1]):
                try:
                    cmdline = (
                        Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                    )
                except OSError:
                    cmdline = ""
                found.append((address.strip("[]"), int(port), pid, cmdline.strip()))
        return found


def user_of(pid: int) -> str | None:
    """The user ``pid`` runs as, as ``ps`` names it; None once it has ended (a listing is a
    snapshot: a short-lived process, such as a database backend, can end before it is looked
    at)."""
    done = subprocess.run(["ps", "-o", "user=", "-p", str(pid)], capture_output=True, text=True)
    return done.stdout.strip() or None if done.returncode == 0 else None


def cmdline(pid: int) -> str:
    """``pid``'s command line, spaces for NULs; empty once it has ended."""
    try:
        return (
            Path(f"/proc/{pid}/cmdline")
            .read_bytes()
            .replace(b"\0", b" ")
            .decode(errors="replace")
            .strip()
        )
    except OSError:
        return ""


def command_lines_with(pids: list[int], secrets: dict[str, str]) -> list[tuple[int, str]]:
    """``(pid, secret's name)`` for each process whose command line holds one of ``secrets``."""
    found = []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:  # ended meanwhile
            continue
        found += [(pid, name) for name, value in secrets.items() if value in cmdline]
    return found


def root_processes(pids: dict[str, list[int]]) -> list[tuple[str, int, str]]:
    """``(host, pid, command line)`` of each process of ``pids`` (by host) that runs as root and
    is not one that enters a host (``SETUP``)."""
    found = []
    for host, listed in pids.items():
        for pid in listed:
            line = cmdline(pid)
            if line and user_of(pid) == "root" and not line.startswith(SETUP):
                found.append((host, pid, line[:120]))
    return found


def users_of(pids: list[int]) -> set[str]:
    """The users ``pids`` run as, leaving out those that ended before they were looked at."""
    return {user for pid in pids if (user := user_of(pid)) is not None}


def _pids(users: str) -> list[int]:
    """The pids in ss's ``users:(("name",pid=1,fd=3),...)`` column."""
    return [
        int(part.split("=")[1].split(",")[0].rstrip(")"))
        for part in users.split(",")
        if part.startswith("pid=")
    ]


def unexpected_listeners(cluster: Cluster, host: str) -> list[tuple[str, int, str]]:
    """Listening sockets on ``host`` that are neither on the host's own address nor loopback,
    except the wildcard binds of Ray 2.60's own servers (its daemons, and the gRPC server of
    every driver, worker and actor, in Ray's worker port range), which have no bind setting."""
    own = {
        cluster.host(host),
        "127.0.0.1",
        "::1",
        f"::ffff:{cluster.host(host)}",
        "::ffff:127.0.0.1",
    }
    bad = []
    for address, port, _pid, cmdline in cluster.listening(host):
        if address in own:
            continue
        if any(d in cmdline for d in RAY_DAEMONS) or port in RAY_WORKER_PORTS:
            continue
        bad.append((address, port, cmdline[:80]))
    return bad


@contextmanager
def local_cluster(prefix: str, subnet: str, s3_port: int = 8433) -> Iterator[Cluster]:
    """The cluster up in a fresh state folder; down, and the folder gone, however this ends.
    ``s3_port``: not the default cluster's 8333, so that one may run beside it (weed's gRPC
    sockets under /tmp are named by port, on every host)."""
    # PostgreSQL runs as its own user, which must reach its data folder: not under pytest's
    # tmp_path (0700, root's).
    state = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir="/tmp"))
    state.chmod(0o755)
    up = [
        sys.executable,
        str(SCRIPT),
        "--state",
        str(state),
        "up",
        "--prefix",
        prefix,
        "--subnet",
        subnet,
        "--s3-port",
        str(s3_port),
    ]
    try:
        done = subprocess.run(up, capture_output=True, text=True, timeout=400)
        if done.returncode != 0:
            raise AssertionError(
                f"localcluster up failed: {done.stdout[-3000:]}{done.stderr[-3000:]}"
            )
        # If this process is killed (a CI timeout), the guard brings the cluster down.
        subprocess.Popen(
            [sys.executable, str(SCRIPT), "--state", str(state), "guard", str(os.getpid())],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        yield Cluster(state, json.loads((state / "cluster.json").read_text()))
    finally:
        subprocess.run(
            [sys.executable, str(SCRIPT), "--state", str(state), "down"],
            capture_output=True,
            timeout=120,
        )
        shutil.rmtree(state, ignore_errors=True)
