"""Names, addresses and secrets: everything ``up`` makes derives from the prefix, the subnet and
the state folder, which ``cluster.json`` records for the other commands."""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import shlex
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
"""The virtual environment's scripts (ray, mlflow, prefect, tfm): the same on every host."""

SERVICES_HOST = "services"
RAY_HEAD = "head"
RAY_WORKERS = ("w1", "w2")
RAY_HOSTS = (RAY_HEAD, *RAY_WORKERS)
HOSTS = (SERVICES_HOST, *RAY_HOSTS)
ADDRESSES = {"machine": 1, SERVICES_HOST: 20, RAY_HEAD: 10, "w1": 11, "w2": 12}
"""Each host's address, as its offset in the subnet; this machine's is on the bridge."""

RAY_PORT = 6379
DASHBOARD_PORT = 8265
MLFLOW_PORT = 5000
PREFECT_PORT = 4200
POSTGRES_PORT = 5432
S3_PORT = 8333
BUCKET = "tfm"
S3_REGION = "us-east-1"
WORK_POOL = "transformer"
MLFLOW_ADMIN = "admin"
MLFLOW_USER = "pipeline"
"""MLflow's user for the flows and the training workers: not an admin; it creates its own
experiments, runs and models (and so manages them) and reads the rest."""
PIPELINE_USER = "tfm-pipeline"
"""The system user of the pipeline's side: the Ray nodes, the Prefect worker and its flow runs,
``exec``'s commands (drivers and workers share work dirs, so they are one user)."""

CREDENTIALS = {
    "mlflow": ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"),
    "prefect": ("PREFECT_API_AUTH_STRING",),
    "s3": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
}
"""The client credentials, by service: the variables MLflow's, Prefect's and S3 clients read."""
SECRET_OF = {
    "MLFLOW_TRACKING_PASSWORD": "mlflow-pipeline",
    "PREFECT_API_AUTH_STRING": "prefect-auth",
    "AWS_ACCESS_KEY_ID": "s3-access-key",
    "AWS_SECRET_ACCESS_KEY": "s3-secret-key",
}
"""The file under ``secrets/`` that holds each client credential (the MLflow user's name is
no secret: ``MLFLOW_USER``)."""


class ClusterError(Exception):
    """A step of the cluster's set-up failed; the message says which and where to look."""


def access_key() -> str:
    """An S3 access key id in AWS's shape (20 upper-case letters and digits): it is part of
    every signed request's credential scope, so it carries no ``-``, ``_`` or ``/``."""
    return "TFM" + secrets.token_hex(9).upper()[:17]


MAKERS: dict[str, Callable[[], str]] = {"s3-access-key": access_key}
"""How a secret is made where a random URL-safe string will not do."""


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
            raise ClusterError(
                f"--prefix {self.prefix!r}: at most 8 letters or digits (interface names)"
            )
        base = net.network_address
        self.hosts = {host: str(base + offset) for host, offset in ADDRESSES.items()}

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
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def work(self) -> Path:
        """The pipeline's folder on the shared filesystem: work dirs and Ray storage go here."""
        return self.root / "work"

    @property
    def venv(self) -> Path:
        """The virtual environment the cluster's unprivileged users run (``users.make_venv``)."""
        return self.root / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def token(self) -> Path:
        """Ray's authentication token."""
        return self.root / "auth_token"

    @property
    def node_dir(self) -> str:
        """The path each Ray host sees as its own local disk (``hosts.in_host``)."""
        return f"/var/tmp/{self.prefix}-node"

    def disk(self, host: str) -> Path:
        """The folder mounted at ``node_dir`` for the processes of Ray host ``host``."""
        return self.root / "hosts" / host

    def ray_temp(self, host: str) -> str:
        # Ray's unix sockets live under its temp dir; their paths must stay under 108 bytes.
        return f"/tmp/ray-{self.prefix}-{host}"

    @property
    def urls(self) -> dict[str, str]:
        return {
            "ray": f"{self.hosts[RAY_HEAD]}:{RAY_PORT}",
            "ray_dashboard": f"http://{self.hosts[RAY_HEAD]}:{DASHBOARD_PORT}",
            "mlflow": f"http://{self.hosts[SERVICES_HOST]}:{MLFLOW_PORT}",
            "prefect_api": f"http://{self.hosts[SERVICES_HOST]}:{PREFECT_PORT}/api",
            "prefect_ui": f"http://{self.hosts[SERVICES_HOST]}:{PREFECT_PORT}",
            "s3": f"http://{self.hosts[SERVICES_HOST]}:{self.s3_port}",
        }

    @property
    def weed_ports(self) -> dict[str, int]:
        """SeaweedFS's HTTP port per server; each one's gRPC twin is 10000 above it."""
        return {
            "s3": self.s3_port,
            "master": self.s3_port + 1,
            "volume": self.s3_port + 2,
            "filer": self.s3_port + 3,
        }

    def env(self) -> dict[str, str]:
        """What a process on any host needs to be a client of the cluster."""
        urls = self.urls
        return {
            "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "RAY_ADDRESS": urls["ray"],
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.token),
            "RAY_USAGE_STATS_ENABLED": "0",
            "MLFLOW_TRACKING_URI": urls["mlflow"],
            "PREFECT_API_URL": urls["prefect_api"],
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "AWS_ENDPOINT_URL": urls["s3"],
            "AWS_REGION": S3_REGION,
        }

    def secret(self, name: str) -> str:
        """A password or key kept in ``secrets/`` (mode 0600), made on first use."""
        path = self.root / "secrets" / name
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            path.write_text(MAKERS.get(name, lambda: secrets.token_urlsafe(24))())
            path.chmod(0o600)
        return path.read_text().strip()

    def credentials(self, services: tuple[str, ...] = tuple(CREDENTIALS)) -> dict[str, str]:
        """The client credentials for ``services``, read from ``secrets/``: never written to
        cluster.json or env.sh, never put on a command line."""
        names = [name for service in services for name in CREDENTIALS[service]]
        return {
            name: MLFLOW_USER
            if name == "MLFLOW_TRACKING_USERNAME"
            else self.secret(SECRET_OF[name])
            for name in names
        }

    def save(self) -> None:
        """``cluster.json`` (the layout and what derives from it) and ``env.sh``."""
        self.root.mkdir(parents=True, exist_ok=True)
        info = {
            **asdict(self),
            "netns": {h: self.netns(h) for h in HOSTS},
            "urls": self.urls,
            "node_dir": self.node_dir,
            "work": str(self.work),
            "python": str(self.python),
            "env": self.env(),
            "work_pool": WORK_POOL,
            "pipeline_user": PIPELINE_USER,
        }
        (self.root / "cluster.json").write_text(json.dumps(info, indent=2) + "\n")
        lines = [f"export {k}={shlex.quote(v)}" for k, v in self.env().items()]
        lines.append(f"export MLFLOW_TRACKING_USERNAME={MLFLOW_USER}")
        for name, file in SECRET_OF.items():
            # Read when sourced (as root): the passwords stay in secrets/ only.
            path = shlex.quote(str(self.root / "secrets" / file))
            lines.append(f'export {name}="$(cat {path})"')
        header = "# source me: a shell as a client of the local cluster\n"
        (self.root / "env.sh").write_text(header + "\n".join(lines) + "\n")

    @classmethod
    def load(cls, state: str) -> Layout:
        path = Path(state) / "cluster.json"
        if not path.is_file():
            raise ClusterError(
                f"{path} does not exist: no cluster was started with --state {state}"
            )
        info = json.loads(path.read_text())
        return cls(
            prefix=info["prefix"],
            subnet=info["subnet"],
            state=info["state"],
            worker_cpus=info["worker_cpus"],
            s3_port=info.get("s3_port", S3_PORT),
        )
