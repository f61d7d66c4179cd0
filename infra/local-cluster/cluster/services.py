"""The servers of the services host, in one table (``SERVICES``): the user each runs as, how it
starts, when it is ready, and how it is asked to stop; ``stop`` and ``start`` for any of them."""

from __future__ import annotations

import base64
import json
import pwd
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import object_store
from .hosts import host_env, host_pids, in_host, send, sh, spawn, wait_for
from .layout import (
    MLFLOW_ADMIN,
    MLFLOW_PORT,
    MLFLOW_USER,
    POSTGRES_PORT,
    PREFECT_PORT,
    SERVICES_HOST,
    ClusterError,
    Layout,
)
from .users import owned_folder


@dataclass(frozen=True)
class Service:
    """One server of the services host."""

    user: str
    """The unprivileged user it runs as; its processes on the host are this user's."""
    start: Callable[[Layout], int]
    """Starts it, detached, as ``up`` does; its pid."""
    ready: Callable[[Layout, int | None], None]
    """Returns once it answers (and what needs it answering is done), or raises ClusterError."""
    stop: Callable[[Layout, list[int]], None]
    """Asks it to stop, given its processes, as an outage or an upgrade would."""
    grace: float = 10.0
    """Seconds after ``stop`` before the processes left are killed."""
    needs: tuple[str, ...] = ()
    """The services that must answer before it starts."""


def terminate(layout: Layout, pids: list[int]) -> None:
    for pid in pids:
        send(pid, signal.SIGTERM)


def http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=3) as response:  # noqa: S310 - our own addresses
        return response.status == 200


# ----------------------------------------------------------------------------- PostgreSQL


def postgres_bin() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
    if not found:
        raise ClusterError("PostgreSQL is not installed: apt-get install -y postgresql")
    return found[-1].parent


def postgres_start(layout: Layout) -> int:
    """A PostgreSQL server on the services host, its own data folder made on the first start."""
    pg = postgres_bin()
    data = layout.root / "pgdata"
    if not (data / "PG_VERSION").is_file():
        data.mkdir(parents=True, exist_ok=True)
        shutil.chown(data, "postgres", "postgres")
        data.chmod(0o700)
        # initdb reads the superuser's password from a file the postgres user can read, which
        # the secrets folder (root's, 0700) is not: a copy beside the data folder, removed after.
        pwfile = data.parent / ".pgpw"
        pwfile.write_text(layout.secret("postgres"))
        shutil.chown(pwfile, "postgres", "postgres")
        pwfile.chmod(0o600)
        try:
            sh(
                "runuser", "-u", "postgres", "--", str(pg / "initdb"), "-D", str(data),
                "-U", "postgres", f"--pwfile={pwfile}", "--auth-local=scram-sha-256",
                "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C", quiet=True,
            )  # fmt: skip
        finally:
            pwfile.unlink(missing_ok=True)
        with open(data / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {layout.subnet} scram-sha-256\n")
    argv = [
        str(pg / "postgres"), "-D", str(data),
        "-c", f"listen_addresses={layout.hosts[SERVICES_HOST]}", "-c", f"port={POSTGRES_PORT}",
        "-c", "unix_socket_directories=", "-c", "fsync=off",
    ]  # fmt: skip
    return spawn(layout, SERVICES_HOST, "postgres", argv, user="postgres", credentials=())


def postgres_ready(layout: Layout, pid: int | None) -> None:
    """Once it answers, a role and a database each for MLflow and Prefect (made once)."""
    pg, ip = postgres_bin(), layout.hosts[SERVICES_HOST]
    env = host_env(layout, {"PGPASSWORD": layout.secret("postgres")}, (), "postgres")
    where = ["-h", ip, "-p", str(POSTGRES_PORT)]
    isready = in_host(layout, SERVICES_HOST, [str(pg / "pg_isready"), *where], "postgres")
    wait_for(
        "PostgreSQL",
        lambda: subprocess.run(isready, capture_output=True, env=env).returncode == 0,
        60,
        layout.logs / "services-postgres.log",
        pid,
    )
    psql = [str(pg / "psql"), *where, "-U", "postgres", "-v", "ON_ERROR_STOP=1", "-q"]
    psql = in_host(layout, SERVICES_HOST, psql, "postgres")
    for name in ("mlflow", "prefect"):
        password = layout.secret(name)
        sql = (
            f"DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{name}') THEN "
            f"CREATE ROLE {name} LOGIN PASSWORD '{password}'; END IF; END$$;"
        )
        sh(*psql, "-f", "-", env=env, input=sql, quiet=True)  # on stdin: it holds a password
        query = f"SELECT 1 FROM pg_database WHERE datname = '{name}'"
        exists = sh(*psql, "-tAc", query, env=env, quiet=True)
        if exists.stdout.strip() != "1":
            sh(*psql, "-c", f"CREATE DATABASE {name} OWNER {name}", env=env, quiet=True)


def postgres_stop(layout: Layout, pids: list[int]) -> None:
    """A fast shutdown (the data folder stays consistent for the next start)."""
    pid_file = layout.root / "pgdata" / "postmaster.pid"
    if pid_file.is_file():
        try:
            send(int(pid_file.read_text().split()[0]), signal.SIGINT)
        except (ValueError, IndexError):
            pass


def pg_url(layout: Layout, name: str, driver: str, password: bool = True) -> str:
    """The database ``name``'s URL as its role ``name``; without the password, libpq takes it
    from ``PGPASSWORD``."""
    secret = f":{layout.secret(name)}" if password else ""
    return f"{driver}://{name}{secret}@{layout.hosts[SERVICES_HOST]}:{POSTGRES_PORT}/{name}"


# ----------------------------------------------------------------------------- MLflow


def mlflow_start(layout: Layout) -> int:
    """MLflow's tracking server with its basic-auth app, as ``tfm-mlflow``, on PostgreSQL,
    proxying artifact uploads to a folder of its own."""
    user, ip = SERVICES["mlflow"].user, layout.hosts[SERVICES_HOST]
    home = owned_folder(layout.root / "mlflow", user)
    artifacts = owned_folder(layout.root / "mlartifacts", user)
    # The auth app's own database and the admin it creates on first start (mlflow/server/auth).
    config = home / "basic_auth.ini"
    config.write_text(
        "[mlflow]\ndefault_permission = READ\n"
        f"database_uri = sqlite:///{home / 'basic_auth.db'}\n"
        f"admin_username = {MLFLOW_ADMIN}\nadmin_password = {layout.secret('mlflow-admin')}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        # A password check hashes (scrypt) on every request; one worker, so a cached check
        # cannot be stale on another worker (see MLflow's basic_auth.ini).
        "auth_cache_ttl_seconds = 60\n"
    )
    owned_folder(home, user)
    config.chmod(0o600)
    env = {
        "HOME": str(home),
        "MLFLOW_AUTH_CONFIG_PATH": str(config),
        "MLFLOW_BACKEND_STORE_URI": pg_url(layout, "mlflow", "postgresql+psycopg", password=False),
        "PGPASSWORD": layout.secret("mlflow"),
        "MLFLOW_FLASK_SERVER_SECRET_KEY": layout.secret("mlflow-flask"),
    }
    argv = [
        str(layout.python), "-m", "mlflow", "server", "--app-name", "basic-auth",
        "--serve-artifacts", "--artifacts-destination", artifacts.as_uri(),
        "--host", ip, "--port", str(MLFLOW_PORT), "--workers", "1",
        "--allowed-hosts", f"{ip},{ip}:{MLFLOW_PORT}",
    ]  # fmt: skip
    return spawn(layout, SERVICES_HOST, "mlflow", argv, env, user=user, credentials=())


def mlflow_ready(layout: Layout, pid: int | None) -> None:
    """Once it answers, MLflow's user ``pipeline`` with the password in secrets/, made (or its
    password reset) through the auth app's REST API as the admin.

    Hand-written (urllib): MLflow's AuthServiceClient takes the admin's credentials only from
    this process's environment."""
    url = layout.urls["mlflow"]
    log = layout.logs / "services-mlflow.log"
    wait_for("MLflow server", lambda: http_ok(f"{url}/health"), 180, log, pid)
    login = f"{MLFLOW_ADMIN}:{layout.secret('mlflow-admin')}"
    admin = "Basic " + base64.b64encode(login.encode()).decode()
    user = {"username": MLFLOW_USER, "password": layout.secret("mlflow-pipeline")}

    def call(path: str, method: str) -> None:
        request = urllib.request.Request(
            f"{url}/api/2.0/mlflow/users/{path}",
            data=json.dumps(user).encode(),
            method=method,
            headers={"Authorization": admin, "Content-Type": "application/json"},
        )
        urllib.request.urlopen(request, timeout=30).close()  # noqa: S310 - our own address

    try:
        call("create", "POST")
    except urllib.error.HTTPError as exc:
        if exc.code != 400:  # 400: the user exists (an earlier `up`)
            raise ClusterError(
                f"MLflow refused to create user {MLFLOW_USER}: HTTP {exc.code}"
            ) from exc
        call("update-password", "PATCH")


# ----------------------------------------------------------------------------- Prefect


def prefect_start(layout: Layout) -> int:
    """Prefect's server (API and UI), as ``tfm-prefect``, on PostgreSQL, asking every client for
    the auth string."""
    user, ip = SERVICES["prefect"].user, layout.hosts[SERVICES_HOST]
    home = owned_folder(layout.root / "prefect" / "services", user)
    auth = layout.secret("prefect-auth")
    env = {
        "HOME": str(home),
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_DATABASE_CONNECTION_URL": pg_url(layout, "prefect", "postgresql+asyncpg"),
        "PREFECT_SERVER_API_AUTH_STRING": auth,
        "PREFECT_API_AUTH_STRING": auth,  # the server's own client calls, if any
        "PREFECT_UI_API_URL": layout.urls["prefect_api"],
        "PREFECT_SERVER_API_HOST": ip,
    }
    argv = [
        str(layout.python), "-m", "prefect", "server", "start", "--host", ip,
        "--port", str(PREFECT_PORT),
    ]  # fmt: skip
    return spawn(layout, SERVICES_HOST, "prefect", argv, env, user=user, credentials=())


def prefect_ready(layout: Layout, pid: int | None) -> None:
    # /api/health answers without the auth string (Prefect lets health probes through).
    url = f"{layout.urls['prefect_api']}/health"
    log = layout.logs / "services-prefect.log"
    wait_for("Prefect server", lambda: http_ok(url), 180, log, pid)


# ----------------------------------------------------------------------------- the table

WEED_STOP_SECONDS = 3.0
"""SIGKILL after this: a graceful stop of ``weed server`` drains for ~25 s, and its volumes and
filer store (LevelDB, with its log) reopen after a kill."""

SERVICES = {
    "s3": Service(
        object_store.USER, object_store.start, object_store.ready, terminate, WEED_STOP_SECONDS
    ),
    "postgres": Service("postgres", postgres_start, postgres_ready, postgres_stop),
    "mlflow": Service("tfm-mlflow", mlflow_start, mlflow_ready, terminate, needs=("postgres",)),
    "prefect": Service("tfm-prefect", prefect_start, prefect_ready, terminate, needs=("postgres",)),
}
"""The services host's servers, in the order ``up`` starts them."""


def service_pids(layout: Layout, name: str) -> list[int]:
    """The processes of service ``name`` on the services host: those of its user there."""
    uid = pwd.getpwnam(SERVICES[name].user).pw_uid
    found = []
    for pid in host_pids(layout, SERVICES_HOST):
        try:
            if Path(f"/proc/{pid}").stat().st_uid == uid:
                found.append(pid)
        except OSError:  # ended meanwhile
            continue
    return found


def start_all(layout: Layout) -> None:
    """Every server, each started once those it needs answer; returns once all answer."""
    started: dict[str, int] = {}
    answered: set[str] = set()

    def answers(name: str) -> None:
        if name not in answered:
            SERVICES[name].ready(layout, started[name])
            answered.add(name)

    for name, service in SERVICES.items():
        for need in service.needs:
            answers(need)
        started[name] = service.start(layout)
    for name in SERVICES:
        answers(name)


def start_service(layout: Layout, name: str) -> None:
    """Start one server with the command ``up`` starts it with; returns once it answers."""
    service = SERVICES[name]
    service.ready(layout, service.start(layout))


def stop_service(layout: Layout, name: str) -> None:
    """Stop one server as an outage or an upgrade would: its stop request, SIGKILL after its
    grace; returns once none of its processes is left."""
    service = SERVICES[name]
    service.stop(layout, service_pids(layout, name))
    deadline = time.time() + service.grace
    while (left := service_pids(layout, name)) and time.time() < deadline:
        time.sleep(0.2)
    for pid in left:
        send(pid, signal.SIGKILL)
    while service_pids(layout, name):
        time.sleep(0.2)


def ask_to_stop(layout: Layout) -> None:
    """Every server's stop request, without waiting (``down`` then ends the host)."""
    for name, service in SERVICES.items():
        service.stop(layout, service_pids(layout, name))
