"""What the pipeline leaves on the machine: a local Ray listening on loopback only, and nothing
running after ``tfm`` is killed (the watchdog), even by SIGKILL."""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import yaml
from stage_folders import TINY_TRAINING

pytestmark = pytest.mark.integration


def _loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def listening(processes: list[psutil.Process]) -> list[tuple[str, str, int]]:
    """(process name, address, port) of every listening TCP socket of ``processes``."""
    found = []
    for process in processes:
        try:
            for conn in process.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.append((process.name(), conn.laddr.ip, conn.laddr.port))
        except psutil.NoSuchProcess:
            continue
    return found


def test_a_local_ray_listens_on_loopback_only(ray_local):
    import ray
    import ray.data

    # Workers, an actor pool and Ray Data's own actors: every kind of process Ray starts.
    @ray.remote
    class Echo:
        def ping(self) -> int:
            return 1

    assert ray.get(Echo.remote().ping.remote()) == 1
    assert ray.data.range(64).map_batches(lambda b: b).count() == 64
    me = psutil.Process()
    sockets = listening([me, *me.children(recursive=True)])
    names = {name for name, _, _ in sockets}
    assert {"gcs_server", "raylet"} <= names, sockets  # Ray's servers were seen at all
    exposed = [s for s in sockets if not _loopback(s[1])]
    assert exposed == [], f"listening beyond loopback: {exposed}"


def _wait_gone(processes: list[psutil.Process], seconds: float) -> list[psutil.Process]:
    deadline = time.time() + seconds
    while time.time() < deadline:
        alive = [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return []
        time.sleep(0.5)
    return alive


def test_the_watchdog_ends_what_a_killed_command_started(tmp_path):
    script = (
        "import subprocess, sys, time\n"
        "from pipelines import watchdog\n"
        "watchdog.start()\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    command = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child = psutil.Process(int(command.stdout.readline()))
    time.sleep(2.5)  # the watchdog looks every second
    command.send_signal(signal.SIGKILL)
    command.wait()
    assert _wait_gone([child], 20) == [], "the command's child outlived it"


@pytest.mark.slow  # a whole tfm run, killed during training, then run again: ~1.5 min
def test_a_killed_tfm_run_leaves_nothing_running_and_the_rerun_finishes(tmp_path):
    config = {
        "name": "killed",
        "seed": 3,
        "workdir": str(tmp_path / "{name}"),
        "data": {"source": "synthetic", "synthetic_train": 400, "synthetic_dev": 30, "synthetic_test": 30},
        "tokenizer": {"kind": "bpe", "vocab_size": 300, "sample_size": 1000, "threads": 1},
        "shard": {"rows_per_shard": 200, "num_actors": 1, "cpus_per_actor": 0.5},
        **TINY_TRAINING,
        "decode": {"beam_size": 2, "max_len_offset": 5},
        "ray": {"num_cpus": 2},
    }
    config["train"] = {**config["train"], "steps": 400, "checkpoint_every": 50}
    path = tmp_path / "killed.yaml"
    path.write_text(yaml.safe_dump(config))
    tfm = [sys.executable, "-m", "pipelines.cli", "run", str(path)]
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    log = open(tmp_path / "first.log", "w")  # noqa: SIM115 - closed below
    first = subprocess.Popen(tfm, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    run_dir = tmp_path / "killed" / "train_ray"
    deadline = time.time() + 240
    while not any(run_dir.rglob("step-*")):  # training has written a checkpoint
        assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        assert time.time() < deadline, "training did not start"
        time.sleep(1)
    started = psutil.Process(first.pid).children(recursive=True)
    assert any("raylet" in p.name() for p in started)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    log.close()
    survivors = _wait_gone(started, 30)
    assert survivors == [], [(p.pid, p.name()) for p in survivors]

    rerun = subprocess.run(tfm, capture_output=True, text=True, env=env, timeout=400)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert "score" in rerun.stdout
    leftovers = [p.name for p in (tmp_path / "killed").iterdir() if p.name.startswith(".")]
    assert leftovers == []  # the killed run's temporary folders are gone
