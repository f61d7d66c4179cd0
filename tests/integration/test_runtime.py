"""What the pipeline leaves on the machine: a local Ray listening on loopback only, and nothing
running after ``tfm`` is killed (the watchdog), even by SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from helpers.sockets import loopback
from helpers.stage_folders import TINY_TRAINING

pytestmark = pytest.mark.integration


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
    exposed = [s for s in sockets if not loopback(s[1])]
    assert exposed == [], f"listening beyond loopback: {exposed}"


ANOTHER_RAY = (
    "import sys, ray\n"
    "from tasks.framework.config import RayConfig\n"
    "from tasks.framework.runtime import ensure_ray\n"
    "ensure_ray(RayConfig(num_cpus=1, dashboard=False))\n"
    "print('up', flush=True)\n"
    "sys.stdin.read()\n"
    "ray.shutdown()\n"
)


@pytest.mark.slow  # a second local Ray beside the session's and a Ray Train run on it: ~16 s
def test_ray_train_finds_its_own_state_api_beside_another_local_ray(ray_local):
    """Two runs on one machine: Ray Train's placement-group cleaner asks the State API, from an
    actor, whether its controller lives; it must ask this run's Ray, not fail on finding two."""
    import ray

    other = subprocess.Popen(
        [sys.executable, "-c", ANOTHER_RAY],
        cwd=Path(__file__).resolve().parents[2],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout.readline().strip() == "up"

        @ray.remote
        class Probe:
            def actor_id(self) -> str:
                return ray.get_runtime_context().get_actor_id()

        @ray.remote
        def state_of(actor_id: str) -> str | None:
            from ray.util.state import get_actor

            found = get_actor(actor_id, timeout=30)
            return found.state if found else None

        probe = Probe.remote()
        assert ray.get(state_of.remote(ray.get(probe.actor_id.remote()))) == "ALIVE"
    finally:
        other.stdin.close()
        other.wait(timeout=60)


OWN_LOCAL_RAY = (
    "import ray\n"
    "from tasks.framework.config import RayConfig\n"
    "from tasks.framework.runtime import ensure_ray\n"
    "ensure_ray(RayConfig(num_cpus=1, dashboard=False))\n"
    "print(ray.get_runtime_context().gcs_address, flush=True)\n"
    "ray.shutdown()\n"
)


@pytest.mark.slow  # a second local Ray in a subprocess: ~15 s
def test_a_local_ray_is_a_new_one_where_ray_start_left_an_address(ray_local):
    """`ray start` leaves its cluster's address in Ray's temp folder, and ray.init() without an
    address joins that cluster (refusing num_cpus): a command's local Ray is a new one."""
    import ray
    from ray._private.utils import get_ray_address_file

    marker = Path(get_ray_address_file(None))  # where `ray start` writes it
    saved = marker.read_text() if marker.exists() else None
    session = ray.get_runtime_context().gcs_address
    marker.write_text(session)  # as `ray start` would have left it: this session's Ray
    try:
        done = subprocess.run(
            [sys.executable, "-c", OWN_LOCAL_RAY],
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            text=True,
            timeout=180,
        )
    finally:
        if saved is None:
            marker.unlink(missing_ok=True)
        else:
            marker.write_text(saved)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] != session


LOCAL_THEN_CLUSTER = (
    "import ray\n"
    "from ray.cluster_utils import Cluster\n"
    "from tasks.framework.config import RayConfig\n"
    "from tasks.framework.runtime import ensure_ray\n"
    "ensure_ray(RayConfig(num_cpus=1))\n"
    "ray.shutdown()\n"
    "cluster = Cluster(initialize_head=True, head_node_args={'num_cpus': 1})\n"
    "try:\n"
    "    ray.init(address=cluster.address)\n"
    "    @ray.remote\n"
    "    class Echo:\n"
    "        def ping(self):\n"
    "            return 'pong'\n"
    "    print(ray.get(Echo.remote().ping.remote(), timeout=120), flush=True)\n"
    "finally:\n"
    "    ray.shutdown()\n"
    "    cluster.shutdown()\n"
)


@pytest.mark.slow  # a local Ray, then a cluster of its own in a subprocess: ~30 s
def test_a_cluster_started_after_a_local_ray_runs_this_process_s_actors(tmp_path):
    """A local Ray turns on token authentication for its process (Ray 2.60's default); the nodes
    of a cluster this process starts later (``ray.cluster_utils``, as the cluster tests do) must
    inherit it, or they send the driver requests it refuses and its first actor is dropped."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["HOME"] = str(tmp_path)  # no token yet: the local Ray makes one, as on a new machine
    done = subprocess.run(
        [sys.executable, "-c", LOCAL_THEN_CLUSTER],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.stdout.strip().splitlines()[-1:] == ["pong"], done.stderr[-3000:]


def _alive(process: psutil.Process) -> bool:
    """Running and not a zombie; one that exits between the two looks is gone, not an error."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(processes: list[psutil.Process], seconds: float) -> list[psutil.Process]:
    deadline = time.time() + seconds
    while time.time() < deadline:
        alive = [p for p in processes if _alive(p)]
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


def training_run(tmp_path, name: str):
    """A tiny config whose training takes long enough to be stopped, the ``tfm run`` command,
    its environment, and the Ray Train folder to watch."""
    config = {
        "name": name,
        "seed": 3,
        "workdir": str(tmp_path / "{name}"),
        "data": {
            "source": "synthetic",
            "synthetic_train": 400,
            "synthetic_dev": 30,
            "synthetic_test": 30,
        },
        "tokenizer": {"kind": "bpe", "vocab_size": 300, "sample_size": 1000, "threads": 1},
        "shard": {"rows_per_shard": 200, "num_actors": 1, "cpus_per_actor": 0.5},
        **TINY_TRAINING,
        "decode": {"beam_size": 2, "max_len_offset": 5},
        "ray": {"num_cpus": 2},
    }
    # Long enough to be stopped three times, each after a checkpoint of its own (every 50 of 300
    # steps, polled 5 times a second); no validation or metrics at every step (the tiny
    # config's), which the reruns would otherwise spend their time on.
    config["train"] = {
        **config["train"],
        "steps": 300,
        "checkpoint_every": 50,
        "eval_every": 150,
        "log_every": 10,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    tfm = [sys.executable, "-m", "pipelines.cli", "run", str(path)]
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    return tfm, env, tmp_path / name / "train_ray"


def newest_checkpoint(run_dir) -> int:
    """The step of the newest checkpoint in the Ray Train folder (0: none); older ones may be
    gone (``train.keep_checkpoints``), so the step is what says a new one came."""
    return max((int(p.name.removeprefix("step-")) for p in run_dir.rglob("step-*")), default=0)


def start_and_wait_for_training(tfm, env, run_dir, log_path):
    """``tfm run`` in a session of its own, once training has written a checkpoint."""
    log = open(log_path, "w")  # noqa: SIM115 - the caller's process owns it until it ends
    command = subprocess.Popen(
        tfm, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    seen = newest_checkpoint(run_dir)
    deadline = time.time() + 240
    while newest_checkpoint(run_dir) <= seen:  # a checkpoint of this run
        assert command.poll() is None, log_path.read_text()[-3000:]
        assert time.time() < deadline, "training did not start"
        time.sleep(0.2)
    return command, psutil.Process(command.pid).children(recursive=True)


@pytest.mark.slow  # one tfm run killed, interrupted and stopped in training, then finished
def test_a_tfm_run_killed_interrupted_or_stopped_ends_cleanly_and_the_rerun_finishes(tmp_path):
    """One run's training ended three ways, each by a rerun of the same command: SIGKILL (the
    command gone at once: nothing it started, Ray's raylet included, is left running); Ctrl-C
    (SIGINT to the whole process group, as a terminal sends it) and SIGTERM (to the command, as
    `timeout` or a scheduler sends it): exit 130 / 143 within seconds with one line and nothing
    the run started left running 5 s after it exits. Then the same command finishes the run and
    the killed run's temporary folders are gone. One run for the three (CI time): each rerun
    resumes the one before, as a user's would."""
    tfm, env, run_dir = training_run(tmp_path, "stopped")
    first, started = start_and_wait_for_training(tfm, env, run_dir, tmp_path / "SIGKILL.log")
    assert any("raylet" in p.name() for p in started)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    survivors = _wait_gone(started, 30)
    assert survivors == [], [(p.pid, p.name()) for p in survivors]

    for sent, code, line in (
        (signal.SIGINT, 130, "tfm: interrupted; rerun the same command to continue"),
        (signal.SIGTERM, 143, "tfm: stopped by SIGTERM; rerun the same command to continue"),
    ):
        log_path = tmp_path / f"{sent.name}.log"
        command, _ = start_and_wait_for_training(tfm, env, run_dir, log_path)
        started = psutil.Process(command.pid).children(recursive=True)  # the training workers too
        stopped_at = time.time()
        if sent == signal.SIGINT:
            os.killpg(command.pid, sent)
        else:
            command.send_signal(sent)
        assert command.wait(timeout=60) == code, log_path.read_text()[-3000:]
        took = time.time() - stopped_at
        assert took < 30, f"{sent.name}: exited after {took:.0f} s"
        output = log_path.read_text().rstrip().splitlines()
        assert output[-1] == line, output[-20:]
        assert "Traceback" not in "\n".join(output[-20:])
        survivors = _wait_gone(started, 5)
        assert survivors == [], [(p.pid, p.name()) for p in survivors]

    rerun = subprocess.run(tfm, capture_output=True, text=True, env=env, timeout=400)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert "score" in rerun.stdout
    leftovers = [p.name for p in (tmp_path / "stopped").iterdir() if p.name.startswith(".")]
    assert leftovers == []  # the killed run's temporary folders are gone
