"""Each service of the services host goes away mid-training and comes back; the flow run still
ends Completed with every step's metrics in MLflow and its champion in the registry. Training
waits at step OUTAGE_FROM until the service is down and at OUTAGE_TO until it is back, so the
steps between run during the outage on any machine."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers.cluster_scenario import api, run_deployment, scenario_config, wait_for_flow_run
from helpers.flow_configs import WMT14_STAGES
from helpers.netns_cluster import TESTS, Cluster

# The scenario's limit (test_dead_host.py), should the cluster come up for this file alone.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1800)]

OUTAGE_STEPS, OUTAGE_FROM, OUTAGE_TO = 60, 15, 45
"""Training waits at OUTAGE_FROM and OUTAGE_TO, so the 30 steps between run with the service down
however long it stays down (the MLflow test keeps it down past the retry budget)."""
OUTAGE_HTTP = {"http_retries": 1, "http_backoff": 1, "http_timeout": 3}
"""The logging thread's MLflow budget in these runs: 1 retry, 3 s an answer (MLflow's default,
7 retries with backoff 2, waits 254 s)."""


def outage_config(cluster: Cluster, service: str) -> dict:
    config = scenario_config(cluster)
    config["name"] = f"outage-{service}"
    # Every step logged, so that every step's metrics can be counted and timed.
    config["train"] |= {
        "steps": OUTAGE_STEPS,
        "log_every": 1,
        "eval_every": OUTAGE_STEPS,
        "checkpoint_every": 50,
        "keep_checkpoints": 3,
    }
    config["mlflow"] |= {"experiment": "cluster-outages", **OUTAGE_HTTP}
    config["register"] = {"model_name": f"outage-{service}"}
    return config


def wait_for_file(
    path: Path, seconds: float, cluster: Cluster | None = None, flow_run: str | None = None
) -> None:
    """Until ``path`` exists; failing at once if the flow run (asked while Prefect is up) ended."""
    deadline = time.time() + seconds
    while not path.exists():
        if flow_run is not None:
            state = api(cluster, f"flow_runs/{flow_run}")["state"]["type"]
            assert state in ("SCHEDULED", "PENDING", "RUNNING"), (
                f"flow run ended {state} before {path.name}"
            )
        assert time.time() < deadline, f"training did not reach {path.name} in {seconds:.0f} s"
        time.sleep(0.5)


def step_seconds(history) -> dict[int, float]:
    """Seconds between one step's metrics and the step before's (rank 0 stamps each when it logs
    it, at the end of the step), for every step after the first."""
    at = {m.step: m.timestamp / 1000 for m in history}
    return {s: at[s] - at[s - 1] for s in sorted(at) if s - 1 in at}


def stall(history, checkpoint_every: int) -> dict[str, float]:
    """The slowest step while the service was down against the median step outside the outage,
    leaving out the two steps that waited at a gate and each step after a checkpoint."""
    took = {
        s: t
        for s, t in step_seconds(history).items()
        if s not in (OUTAGE_FROM, OUTAGE_TO) and (s - 1) % checkpoint_every
    }
    during = [t for s, t in took.items() if OUTAGE_FROM < s < OUTAGE_TO]
    outside = sorted(t for s, t in took.items() if not OUTAGE_FROM <= s <= OUTAGE_TO)
    median = outside[len(outside) // 2]
    return {
        "median_ms": 1000 * median,
        "slowest_during_ms": 1000 * max(during),
        "slowest_outside_ms": 1000 * outside[-1],
        "ratio": max(during) / median,
        "over_twice_during": sum(t > 2 * median for t in during) / len(during),
        "over_twice_outside": sum(t > 2 * median for t in outside) / len(outside),
    }


def run_through_outage(cluster: Cluster, service: str, monkeypatch) -> dict[str, float]:
    """A deployed flow run whose ``service`` is stopped at step OUTAGE_FROM and started again
    at OUTAGE_TO; asserts it completed with everything tracked; the stall figures."""
    config = outage_config(cluster, service)
    config_path = cluster.state / f"outage-{service}.yaml"
    config_path.write_text(yaml.safe_dump(config))
    where = cluster.give(cluster.state / "work" / f"where-{service}")
    for name, value in cluster.credentials.items():
        monkeypatch.setenv(name, value)
    deployed = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "deploy", str(config_path)],
        capture_output=True,
        text=True,
        env=cluster.env,
        timeout=120,
    )
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    worker_log = cluster.state / "logs" / "head-prefect-worker.log"
    said_before = worker_log.read_text(errors="replace")
    started = time.time()
    flow = f"command=python -m helpers.scenario_flow {where} gates {OUTAGE_FROM} {OUTAGE_TO}"
    flow_id = run_deployment(cluster, flow, f"working_dir={TESTS}", name=config["name"])

    wait_for_file(where / f"at-{OUTAGE_FROM}", 600, cluster, flow_id)
    cluster.script("stop", service)
    down = time.time()
    (where / "down").write_text("")
    wait_for_file(where / f"at-{OUTAGE_TO}", 600)  # OUTAGE_TO - OUTAGE_FROM steps, service down
    if service == "mlflow":  # down past the logging thread's whole budget, whatever the speed
        budget = OUTAGE_HTTP["http_retries"] * (
            OUTAGE_HTTP["http_timeout"] + 2 * OUTAGE_HTTP["http_backoff"]
        )
        time.sleep(max(0.0, 3 * budget - (time.time() - down)))
    cluster.script("start", service)
    outage = time.time() - down
    (where / "up").write_text("")
    flow_run = wait_for_flow_run(cluster, flow_id, 600)
    assert flow_run["state"]["type"] == "COMPLETED", flow_run["state"]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(cluster.info["urls"]["mlflow"])
    experiment = client.get_experiment_by_name("cluster-outages")
    runs = client.search_runs(
        [experiment.experiment_id], f"tags.`prefect.flow_run_id` = '{flow_id}'", max_results=100
    )
    (parent,) = [r for r in runs if "pipeline" in r.data.tags]
    children = {
        r.data.tags["stage"]: r
        for r in client.search_runs(
            [experiment.experiment_id],
            f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
            max_results=100,
        )
    }
    assert sorted(children) == sorted(WMT14_STAGES)
    assert all(r.info.status == "FINISHED" for r in [parent, *children.values()])
    train_id = children["train"].info.run_id
    for key in ("loss", "lr", "target_tokens_per_s"):  # every step's metrics, once each, in order
        history = sorted(
            client.get_metric_history(train_id, key), key=lambda m: (m.timestamp, m.step)
        )
        assert [m.step for m in history] == list(range(1, OUTAGE_STEPS + 1)), (
            key,
            [m.step for m in history],
        )
    champion = client.get_model_version_by_alias(config["register"]["model_name"], "champion")
    assert champion.run_id in {r.info.run_id for r in [parent, *children.values()]}
    storage = Path(config["train"]["storage_path"])
    left = [p for p in storage.glob("outage-*/tracking_*.jsonl") if config["name"] in p.parent.name]
    assert left == [], left  # nothing left to replay, nothing refused
    said = worker_log.read_text(errors="replace")[len(said_before) :]
    figures = {
        **stall(client.get_metric_history(train_id, "loss"), config["train"]["checkpoint_every"]),
        "outage_s": outage,
        "flow_s": time.time() - started,
        "tracking_lines": [
            line
            for line in said.splitlines()
            if "the MLflow server is unreachable" in line
            or "the MLflow server answers again" in line
        ],
    }
    print(
        f"\noutage of {service}: down {outage:.0f} s over steps {OUTAGE_FROM}-{OUTAGE_TO}; "
        f"median step {figures['median_ms']:.0f} ms outside, "
        f"slowest {figures['slowest_during_ms']:.0f} ms during "
        f"({figures['ratio']:.1f}x; {figures['slowest_outside_ms']:.0f} ms outside); "
        f"steps over twice the median: {figures['over_twice_during']:.0%} during, "
        f"{figures['over_twice_outside']:.0%} outside; flow run {figures['flow_s']:.0f} s"
    )
    return figures


def test_tracking_outage_past_the_retry_budget_loses_no_metric_and_the_flow_completes(
    cluster: Cluster, monkeypatch
):
    figures = run_through_outage(cluster, "mlflow", monkeypatch)
    said = ["back" if "answers again" in line else "down" for line in figures["tracking_lines"]]
    # Training said that tracking was unreachable and that it was back, once each, not at every
    # probe (one each 2 s of the outage). A server that takes over the 3-s timeout to answer one
    # request on a loaded 2-core machine (CI's stop 53) is one more outage, with its own pair.
    assert said in (["down", "back"], ["down", "back"] * 2), figures["tracking_lines"]


def test_prefect_server_restarted_mid_flow(cluster: Cluster, monkeypatch):
    figures = run_through_outage(cluster, "prefect", monkeypatch)
    assert figures["tracking_lines"] == [], figures


def test_postgres_restarted_mid_run(cluster: Cluster, monkeypatch):
    run_through_outage(cluster, "postgres", monkeypatch)
