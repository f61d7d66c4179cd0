"""What the cluster scenario's tests share (tests/integration/cluster_scenario/): the scenario's
config, Prefect's API and CLI as a team's client uses them, and the model served from a host."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from helpers.netns_cluster import SCRIPT, Cluster

STEPS = 100  # 50 after the resume: enough for the bit-for-bit comparison, and the flow goes on
KILL_AFTER = 50  # the worker host dies once Ray Train has registered this step's checkpoint ...
KILL_AT = 60  # ... with its last rank stopped after this step, waiting for it (the next is 75)
HOSTS = ("services", "head", "w1", "w2")
SERVICE_PORTS = {5000: "tfm-mlflow", 4200: "tfm-prefect", 5432: "postgres"}
MODEL_NAME = "cluster-translator"
EXPERIMENT = "cluster-scenario"


def scenario_config(cluster: Cluster) -> dict:
    work = cluster.state / "work"
    return {
        "name": "cluster",
        "seed": 11,
        "workdir": str(work / "{name}"),
        "data": {
            "source": "synthetic",
            "synthetic_train": 600,
            "synthetic_dev": 30,
            "synthetic_test": 20,
        },
        "tokenizer": {"kind": "bpe", "vocab_size": 300, "sample_size": 1200, "threads": 1},
        "shard": {"rows_per_shard": 300, "num_actors": 1, "cpus_per_actor": 0.5},
        "model": {"preset": "debug", "n_layers": 1, "d_model": 32, "d_ff": 64, "n_heads": 2},
        "train": {
            "steps": STEPS,
            "tokens_per_step": 1024,
            "max_tokens_per_batch": 512,
            "warmup_steps": 30,
            "eval_every": 100,
            "checkpoint_every": 25,
            "checkpoint_minutes": 0,
            "keep_checkpoints": 12,
            "log_every": 50,
            "num_workers": 2,
            "placement_strategy": "SPREAD",
            "cpus_per_worker": 0.5,
            # One thread per worker before and after the restart (the host left runs both):
            # the same kernels, so the same sums.
            "torch_threads": 1,
            "max_failures": 2,
            "storage_path": str(work / "ray-storage"),
        },
        "average": {"last": 2},
        "decode": {"beam_size": 2, "max_len_offset": 5},
        "mlflow": {"tracking_uri": cluster.info["urls"]["mlflow"], "experiment": EXPERIMENT},
        "register": {"model_name": MODEL_NAME},
    }


def basic(user: str, password: str) -> str:
    """An ``Authorization`` header's value; Prefect's clients send the auth string as ``user``."""
    token = f"{user}:{password}" if password else user
    return "Basic " + base64.b64encode(token.encode()).decode()


def prefect_auth(cluster: Cluster) -> dict[str, str]:
    return {"Authorization": basic(cluster.credentials["PREFECT_API_AUTH_STRING"], "")}


def ask(
    url: str, headers: dict[str, str] | None = None, body: dict | None = None
) -> tuple[int, dict]:
    """The HTTP status of a GET (or, with ``body``, a POST) and the JSON answer, if it is one."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - the test's hosts
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, {}


def api(cluster: Cluster, path: str) -> dict:
    status, answer = ask(f"{cluster.info['urls']['prefect_api']}/{path}", prefect_auth(cluster))
    assert status == 200, (path, status)
    return answer


def host_of(cluster: Cluster, pid: int) -> str:
    """The host whose network namespace process ``pid`` is in."""
    done = subprocess.run(
        ["ip", "netns", "identify", str(pid)], capture_output=True, text=True, check=True
    )
    (host,) = [h for h, ns in cluster.info["netns"].items() if ns == done.stdout.strip()]
    return host


def run_deployment(cluster: Cluster, *job_variables: str, name: str = "cluster") -> str:
    """``prefect deployment run`` of ``pipeline/<name>`` from this machine; the flow run's id."""
    options = [a for jv in job_variables for a in ("--job-variable", jv)]
    done = subprocess.run(
        [sys.executable, "-m", "prefect", "deployment", "run", f"pipeline/{name}", *options],
        capture_output=True,
        text=True,
        env=cluster.env,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    found = re.search(r"UUID:\s*([0-9a-f-]{36})", done.stdout)
    assert found, done.stdout
    return found.group(1)


def wait_for_flow_run(cluster: Cluster, run_id: str, seconds: float) -> dict:
    deadline = time.time() + seconds
    while time.time() < deadline:
        flow_run = api(cluster, f"flow_runs/{run_id}")
        if flow_run["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return flow_run
        time.sleep(2)
    raise AssertionError(
        f"flow run {run_id} did not finish in {seconds:.0f} s\n{worker_log(cluster)}"
    )


def worker_log(cluster: Cluster) -> str:
    """The end of the head's Prefect worker log: what a failed assertion about a flow run shows."""
    return "\n".join(
        p.read_text()[-3000:] for p in (cluster.state / "logs").glob("head-prefect-worker.log")
    )


def registered_steps(storage: Path) -> list[int]:
    """Steps of the checkpoints Ray Train's controller has registered (every rank reported)."""
    from ray.train.v2._internal.constants import CHECKPOINT_MANAGER_SNAPSHOT_FILENAME

    steps = []
    for snapshot in storage.glob(f"cluster-train-*/{CHECKPOINT_MANAGER_SNAPSHOT_FILENAME}"):
        steps += [int(s) for s in re.findall(r"step-(\d{9})", snapshot.read_text())]
    return sorted(set(steps))


def serve_and_ask(cluster: Cluster, on: str, uri: str, texts: list[str]) -> list[str]:
    """``mlflow models serve`` of ``uri`` on host ``on``; the predictions for ``texts`` asked
    from here."""
    host, port = cluster.host(on), 5055
    log_path = cluster.state / "logs" / f"{on}-serve.log"
    command = [
        sys.executable,
        str(SCRIPT),
        "--state",
        str(cluster.state),
        "exec",
        on,
        "--",
        "python",
        "-m",
        "mlflow",
        "models",
        "serve",
        "-m",
        uri,
        "--env-manager",
        "local",
        "-h",
        host,
        "-p",
        str(port),
        "-w",
        "1",
    ]
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.time() + 180
        while True:
            assert server.poll() is None, log_path.read_text()[-3000:]
            try:
                urllib.request.urlopen(f"http://{host}:{port}/ping", timeout=2)  # noqa: S310
                break
            except OSError:
                assert time.time() < deadline, log_path.read_text()[-3000:]
                time.sleep(1)
        request = urllib.request.Request(
            f"http://{host}:{port}/invocations",
            data=json.dumps({"inputs": texts}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310
            return json.loads(response.read())["predictions"]
    finally:
        import os
        import signal

        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
