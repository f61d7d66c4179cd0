"""The pipeline run as a team runs it, across separate hosts (network namespaces on this machine,
infra/local-cluster/localcluster.py): a Prefect server and a process worker, a Ray cluster with
token authentication, an MLflow server on PostgreSQL with proxied artifacts.

One scenario, in order: ``tfm deploy`` with a schedule, one run of the deployment through
Prefect's CLI, run by the worker on the head host; training with 2 workers spread over the two
worker hosts; one worker host dies mid-training (off the network, every process killed) and Ray
Train restarts both workers on the host left, from the last checkpoint; the flow run completes
with the final weights of an uninterrupted run on the same cluster, bit for bit; the team MLflow
holds the parent run, a run per stage and the champion, which another host loads and serves; a
second run of the deployment skips every stage; every listening socket of every host is on the
host's own address except Ray's own servers' wildcard binds.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from netns_cluster import Cluster, local_cluster, require_hosts, unexpected_listeners
from test_train_resume import assert_same_weights, final_weights

# About 5 minutes on 2 cores (docs/running.md); the default 600 s limit leaves too little room.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]

STEPS = 300
KILL_AFTER = 50  # the worker host dies once Ray Train has registered this step's checkpoint
STAGES = ["download", "clean", "tokenizer", "shard", "train", "average", "translate", "score",
          "register"]
MODEL_NAME = "cluster-translator"
EXPERIMENT = "cluster-scenario"


@pytest.fixture(scope="module")
def cluster():
    require_hosts()
    started = time.time()
    with local_cluster("tfmtest", "10.204.0.0/24") as c:
        c.timings = {"up": time.time() - started}  # type: ignore[attr-defined]
        yield c


def scenario_config(cluster: Cluster) -> dict:
    work = cluster.state / "work"
    return {
        "name": "cluster",
        "seed": 11,
        "workdir": str(work / "{name}"),
        "data": {"source": "synthetic", "synthetic_train": 600, "synthetic_dev": 30,
                 "synthetic_test": 20},
        "tokenizer": {"kind": "bpe", "vocab_size": 300, "sample_size": 1200, "threads": 1},
        "shard": {"rows_per_shard": 300, "num_actors": 1, "cpus_per_actor": 0.5},
        "model": {"preset": "debug", "n_layers": 1, "d_model": 32, "d_ff": 64, "n_heads": 2},
        "train": {
            "steps": STEPS, "tokens_per_step": 1024, "max_tokens_per_batch": 512,
            "warmup_steps": 30, "eval_every": 100, "checkpoint_every": 25,
            "checkpoint_minutes": 0, "keep_checkpoints": 12, "log_every": 50,
            "num_workers": 2, "placement_strategy": "SPREAD", "cpus_per_worker": 0.5,
            # One thread per worker before and after the restart (the host left runs both):
            # the same kernels, so the same sums.
            "torch_threads": 1, "max_failures": 2,
            "storage_path": str(work / "ray-storage"),
        },
        "average": {"last": 2},
        "decode": {"beam_size": 2, "max_len_offset": 5},
        "mlflow": {"tracking_uri": cluster.info["urls"]["mlflow"], "experiment": EXPERIMENT},
        "register": {"model_name": MODEL_NAME},
    }


def api(cluster: Cluster, path: str) -> dict:
    url = f"{cluster.info['urls']['prefect_api']}/{path}"
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - the test's own host
        return json.loads(response.read())


def run_deployment(cluster: Cluster) -> str:
    """``prefect deployment run`` from this machine; the flow run's id."""
    done = subprocess.run([sys.executable, "-m", "prefect", "deployment", "run", "pipeline/cluster"],
                          capture_output=True, text=True, env=cluster.env, timeout=120)
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
    logs = "\n".join(p.read_text()[-3000:] for p in (cluster.state / "logs").glob("head-prefect-worker.log"))
    raise AssertionError(f"flow run {run_id} did not finish in {seconds:.0f} s\n{logs}")


def training_workers(cluster: Cluster, host: str) -> int:
    pids = subprocess.run(["ip", "netns", "pids", cluster.info["netns"][host]], capture_output=True,
                          text=True).stdout.split()
    count = 0
    for pid in pids:
        try:
            count += Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::RayTrainWorker")
        except OSError:
            continue
    return count


def registered_steps(storage: Path) -> list[int]:
    """Steps of the checkpoints Ray Train's controller has registered (every rank reported)."""
    from ray.train.v2._internal.constants import CHECKPOINT_MANAGER_SNAPSHOT_FILENAME

    steps = []
    for snapshot in storage.glob(f"cluster-train-*/{CHECKPOINT_MANAGER_SNAPSHOT_FILENAME}"):
        steps += [int(s) for s in re.findall(r"step-(\d{9})", snapshot.read_text())]
    return sorted(set(steps))


def test_a_deployed_flow_on_a_cluster_of_hosts_survives_a_dead_host(cluster: Cluster):
    timings: dict[str, float] = cluster.timings  # type: ignore[attr-defined]
    config_path = cluster.state / "cluster.yaml"
    config = scenario_config(cluster)
    config_path.write_text(yaml.safe_dump(config))
    storage = Path(config["train"]["storage_path"])

    # 1. Deploy with a schedule, then one run through Prefect's CLI; the head's worker runs it.
    started = time.time()
    deployed = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "deploy", str(config_path), "--cron", "0 3 * * 1"],
        capture_output=True, text=True, env=cluster.env, timeout=120,
    )
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    first = run_deployment(cluster)

    # 2-3. Two workers on the two worker hosts; once a checkpoint is registered, w2 dies.
    deadline = time.time() + 420
    while not [s for s in registered_steps(storage) if s >= KILL_AFTER]:
        state = api(cluster, f"flow_runs/{first}")["state"]["type"]
        assert state in ("SCHEDULED", "PENDING", "RUNNING"), f"flow run ended {state} before the kill"
        assert time.time() < deadline, "training did not reach its first checkpoints"
        time.sleep(0.5)
    spread = {host: training_workers(cluster, host) for host in ("head", "w1", "w2")}
    sockets = {host: unexpected_listeners(cluster, host) for host in ("services", "head", "w1", "w2")}
    store = [(a, p) for a, p, _, cmd in cluster.listening("w1") + cluster.listening("w2")
             if cmd.startswith("ray::RayTrainWorker") and a in (cluster.host("w1"), cluster.host("w2"))]
    killed_at, last_registered = time.time() - started, registered_steps(storage)[-1]
    kill_time = time.time()
    cluster.script("kill", "w2")
    assert spread == {"head": 0, "w1": 1, "w2": 1}, spread
    assert all(not bad for bad in sockets.values()), sockets
    assert store, "no training worker listened on its host's address (the torch store, gloo)"

    flow_run = wait_for_flow_run(cluster, first, 420)
    timings["first_run"] = time.time() - started
    assert flow_run["state"]["type"] == "COMPLETED", flow_run["state"]
    listing = subprocess.run([sys.executable, "-m", "prefect", "flow-run", "ls"], capture_output=True,
                             text=True, env={**cluster.env, "COLUMNS": "200"}, timeout=60)
    assert listing.returncode == 0, listing.stdout + listing.stderr
    assert flow_run["name"] in listing.stdout
    for what, shown in (("deployment", "pipeline/cluster"), ("work-pool", "transformer")):
        listing = subprocess.run([sys.executable, "-m", "prefect", what, "ls"], capture_output=True,
                                 text=True, env={**cluster.env, "COLUMNS": "200"}, timeout=60)
        assert listing.returncode == 0 and shown in listing.stdout, listing.stdout + listing.stderr

    root = cluster.state / "work" / "cluster"
    train = json.loads((root / "train" / "manifest.json").read_text())["stats"]
    assert train["step"] == STEPS
    assert last_registered <= train["resumed_from_step"] < STEPS, (last_registered, train)
    assert train["world_size"] == 2
    # How long the restart took: the first checkpoint written after the kill, less its steps.
    after = sorted((p.stat().st_mtime, p.name) for p in storage.glob("cluster-train-*/step-*")
                   if p.stat().st_mtime > kill_time)
    timings["first_checkpoint_after_kill"] = after[0][0] - kill_time if after else float("nan")

    # 4. The team MLflow: a parent run, a child run per stage, artifacts uploaded through the
    # server (they land in the server's own folder), the champion in the registry.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(cluster.info["urls"]["mlflow"])
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    parent = [r for r in runs if r.data.tags.get("prefect.flow_run_id") == first and "pipeline" in r.data.tags]
    assert len(parent) == 1
    assert parent[0].data.params["train.num_workers"] == "2"
    children = {r.data.tags["stage"]: r for r in runs
                if r.data.tags.get("mlflow.parentRunId") == parent[0].info.run_id}
    assert sorted(children) == sorted(STAGES)
    train_run = children["train"]
    assert train_run.info.artifact_uri.startswith("mlflow-artifacts:")
    uploaded = {a.path for a in client.list_artifacts(train_run.info.run_id)}
    assert {"config.json", "learning_curve.png"} <= uploaded, uploaded
    on_server = list((cluster.state / "mlartifacts").rglob("learning_curve.png"))
    assert on_server, "the server's artifact folder holds no uploaded learning curve"
    assert "loss" in client.get_run(train_run.info.run_id).data.metrics
    champion = client.get_model_version_by_alias(MODEL_NAME, "champion")
    assert champion.run_id

    # ... loaded and used from another host, and served over HTTP from it.
    uri = f"models:/{MODEL_NAME}@champion"
    translated = cluster.run("w1", sys.executable, "-m", "pipelines.cli", "translate", "--model", uri,
                             input="the small dog sees a red house\n", timeout=180)
    assert len(translated.stdout.splitlines()) == 1, translated.stdout
    served = serve_and_ask(cluster, uri, ["the small dog sees a red house"])
    assert served == translated.stdout.splitlines(), (served, translated.stdout)

    # A driver on a machine that is not a node (this one, on the bridge) fails in seconds, in one
    # line; the token file alone (no RAY_AUTH_MODE) is enough to be let in.
    env = {k: v for k, v in cluster.env.items() if k != "RAY_AUTH_MODE"}
    asked = time.time()
    outside = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "stage", "clean", "--config", str(config_path),
         "--force"], capture_output=True, text=True, env=env, timeout=120,
    )
    timings["outside_driver"] = time.time() - asked
    assert outside.returncode == 1, outside.stdout + outside.stderr
    last = outside.stderr.strip().splitlines()[-1]
    assert last.startswith("tfm: ") and "is not a node of the Ray cluster" in last, outside.stderr
    assert "ray job submit" in last

    # 5. A second run of the deployment skips every stage.
    started = time.time()
    second = run_deployment(cluster)
    flow_run = wait_for_flow_run(cluster, second, 300)
    timings["second_run"] = time.time() - started
    assert flow_run["state"]["type"] == "COMPLETED", flow_run["state"]
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    parent = [r for r in runs if r.data.tags.get("prefect.flow_run_id") == second and "pipeline" in r.data.tags]
    assert parent[0].data.tags["stages.ran"] == ""

    # 3 (cont.) The same training, uninterrupted, on the same cluster with w2 back: the
    # resumed run's final weights are its weights, bit for bit.
    started = time.time()
    cluster.script("start-ray", "w2")
    reference = cluster.state / "work" / "reference"
    for stage in ("tokenizer", "shard"):
        shutil.copytree(root / stage, reference / stage)
    cluster.run("head", sys.executable, "-m", "pipelines.cli", "stage", "train", "--config",
                str(config_path), "--set", "name=reference", timeout=400)
    timings["reference"] = time.time() - started
    reference_train = json.loads((reference / "train" / "manifest.json").read_text())["stats"]
    assert reference_train["resumed_from_step"] == 0
    assert_same_weights(final_weights(root / "train"), final_weights(reference / "train"))
    print(f"\ncluster scenario: up {timings['up']:.0f} s, first run {timings['first_run']:.0f} s "
          f"(w2 killed at {killed_at:.0f} s after step {last_registered} was registered; resumed "
          f"from step {train['resumed_from_step']}; first checkpoint after the kill "
          f"{timings['first_checkpoint_after_kill']:.0f} s later), second run {timings['second_run']:.0f} s, "
          f"reference {timings['reference']:.0f} s, driver off the cluster refused in "
          f"{timings['outside_driver']:.0f} s")


def serve_and_ask(cluster: Cluster, uri: str, texts: list[str]) -> list[str]:
    """``mlflow models serve`` of ``uri`` on w1; the predictions for ``texts`` asked from here."""
    host, port = cluster.host("w1"), 5055
    log_path = cluster.state / "logs" / "w1-serve.log"
    command = [sys.executable, str(Path(__file__).resolve().parents[2] / "infra" / "local-cluster" /
               "localcluster.py"), "--state", str(cluster.state), "exec", "w1", "--",
               sys.executable, "-m", "mlflow", "models", "serve", "-m", uri, "--env-manager", "local",
               "-h", host, "-p", str(port), "-w", "1"]
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
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
            f"http://{host}:{port}/invocations", data=json.dumps({"inputs": texts}).encode(),
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
