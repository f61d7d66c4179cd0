"""``tfm serve`` on a real Ray Serve, on the session's local Ray: requests from many clients
decoded together, each bad request refused at once while the others are served, a killed
replica replaced under load, an alias moved under load with no failed request, a bearer token,
and nothing listening beyond 127.0.0.1; and the registered pyfunc refusing the same requests
behind MLflow's own scoring server."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from email.message import Message
from pathlib import Path

import psutil
import pytest
from helpers.sockets import loopback
from helpers.teachers import TEACHER, register_teacher

from serving.closed_loop import LoadResult, run_load
from serving.scoring_protocol import RequestLimits
from serving.serve_config import ServeConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # ~90 s: Ray Serve, two replicas

URI = f"models:/{TEACHER}@champion"
TEXTS = ["the cat sees the dog", "a big red house", "dog", "the old tree walks to the new house"]
LIMITS = RequestLimits(max_sentences=8, max_chars=200, max_pieces=40, max_beam=8)
BAD_REQUESTS = [
    ({"inputs": ["a dog"], "params": {"beam_size": 10000}}, 400, "beam_size 10000 must be"),
    ({"inputs": ["a dog"] * 5000}, 413, "5000 texts in one request; the limit is 8"),
    ({"inputs": ["a dog", None]}, 400, "input 1 is null, not a string"),
    ({"inputs": [42]}, 400, "input 0 is a number, not a string"),
    ({"inputs": ["dog " * 10000]}, 413, "input 0 has 40000 characters"),
    ({"inputs": ["dog " * 45]}, 413, "subword pieces; the limit is 40"),
    ({"inputs": ["a dog"], "params": {"beam_size": 0}}, 400, "beam_size 0 must be"),
    ({"inputs": ["a dog"], "params": {"n_best": 3}}, 400, "n_best 3 must be within 1..2"),
    ({"inputs": ["a dog"], "params": {"beam": 4}}, 400, "unknown param 'beam'"),
]


def post(url: str, body: object, token: str | None = None) -> tuple[int, dict, Message]:
    """Status, JSON answer and headers (read case-insensitively) of one POST."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read()), answer.headers
    except urllib.error.HTTPError as exc:
        try:
            found = json.loads(exc.read() or b"{}")
        except ValueError:  # Ray Serve's own answers before the app is up are text
            found = {}
        return exc.code, found, exc.headers


def in_background(work: Callable[[], LoadResult]) -> tuple[threading.Thread, list[LoadResult]]:
    found: list[LoadResult] = []
    thread = threading.Thread(target=lambda: found.append(work()))
    thread.start()
    return thread, found


def replicas() -> set[str]:
    """The names of the deployment's live replica actors (Ray's named actors)."""
    import ray

    named = ray.util.list_named_actors(all_namespaces=True)
    return {a["name"] for a in named if a["name"].startswith("SERVE_REPLICA::tfm#translator")}


@pytest.fixture(scope="module")
def served(ray_local, tmp_path_factory):
    """Ray Serve with two replicas of the registry's champion (version 1), following its alias
    every half second; the invocations URL and the registry's root."""
    import socket

    from ray import serve

    from serving import serve_launch

    root = tmp_path_factory.mktemp("serve")
    tracking = register_teacher(root, seed=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = ServeConfig(
        port=port, replicas=2, cpus_per_replica=0.5, max_batch=16, batch_wait_s=0.05,
        poll_seconds=0.5, limits=LIMITS,
    )  # fmt: skip
    url = serve_launch.deploy(URI, tracking, settings, token=None)
    yield url, root, tracking, settings
    serve.shutdown()


def test_requests_are_batched_and_bad_ones_refused_at_once(served):
    url = served[0]
    status, answer, headers = post(url, {"inputs": TEXTS, "params": {"n_best": 2}})
    assert status == 200 and len(answer["predictions"]) == len(TEXTS), answer
    assert all(
        len(hyps) == 2 and {"translation", "score"} <= set(hyps[0])
        for hyps in answer["predictions"]
    )
    assert headers["X-Model-Name"] == TEACHER and headers["X-Model-Version"] == "1"

    thread, found = in_background(lambda: run_load(url, TEXTS, clients=12, seconds=6, warmup=1))
    time.sleep(2)
    for body, status, words in BAD_REQUESTS:
        start = time.monotonic()
        got, answer, _ = post(url, body)
        took = time.monotonic() - start
        assert (got, words in answer.get("message", "")) == (status, True), (body, answer)
        assert took < 1.0, f"{words}: answered in {took:.2f} s while the load ran"
    thread.join()
    load = found[0]
    assert load.errors == 0 and load.sentences > 0, load.statuses
    assert max(load.batches) > 1, f"no two requests decoded together: {load.batches}"


def test_a_killed_replica_is_replaced_and_the_load_goes_on(served):
    import ray

    url = served[0]
    before = replicas()
    assert len(before) == 2, before
    thread, found = in_background(lambda: run_load(url, TEXTS, clients=8, seconds=20, warmup=1))
    time.sleep(4)
    victim = sorted(before)[0]
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (victim in replicas() or len(replicas()) < 2):
        time.sleep(0.5)
    now = replicas()
    assert victim not in now and len(now) == 2, f"not replaced: {before} -> {now}"
    thread.join()
    load = found[0]
    # The requests the killed replica held may fail; the load goes on without it.
    assert load.sentences > 0 and load.errors <= 8, load.statuses
    assert post(url, {"inputs": TEXTS})[0] == 200


def test_an_alias_moved_under_load_serves_the_new_version_with_no_failed_request(served):
    url, root, tracking, _ = served
    thread, found = in_background(lambda: run_load(url, TEXTS, clients=8, seconds=12, warmup=1))
    time.sleep(2)
    assert register_teacher(root, seed=2) == tracking  # version 2 takes the champion alias
    thread.join()
    load = found[0]
    assert load.errors == 0, load.statuses
    assert set(load.versions) == {"1", "2"}, load.versions
    assert post(url, {"inputs": TEXTS})[2]["X-Model-Version"] == "2"


def test_a_token_is_asked_when_configured(served):
    import dataclasses

    from serving import serve_launch

    url, _, tracking, settings = served
    with_token = dataclasses.replace(settings, token_env="SERVE_TEST_TOKEN")
    token = serve_launch.token_sha256(with_token, {"SERVE_TEST_TOKEN": "s3cret"})
    assert token is not None and "s3cret" not in token
    serve_launch.deploy(URI, tracking, with_token, token)
    assert post(url, {"inputs": TEXTS})[0] == 401
    assert post(url, {"inputs": TEXTS}, token="wrong")[0] == 401
    assert post(url, {"inputs": TEXTS}, token="s3cret")[0] == 200
    with urllib.request.urlopen(url.replace("/invocations", "/ping"), timeout=10) as ping:
        assert ping.status == 200  # a gateway's probe needs no token


def listening(pid: int) -> list[tuple[str, str, int]]:
    """Name, address and port of each listening socket of process ``pid`` and its
    descendants (Ray's processes, Ray Serve's proxy or HAProxy, the replicas)."""
    root = psutil.Process(pid)
    sockets = []
    for process in [root, *root.children(recursive=True)]:
        try:
            sockets += [
                (process.name(), c.laddr.ip, c.laddr.port)
                for c in process.net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN
            ]
        except psutil.NoSuchProcess:
            continue
    return sockets


def test_nothing_listens_beyond_loopback(served):
    sockets = listening(psutil.Process().pid)
    port = int(served[0].rsplit(":", 1)[1].split("/")[0])
    assert port in {p for _, _, p in sockets}, sockets  # the proxy was seen
    exposed = [s for s in sockets if not loopback(s[1])]
    assert exposed == [], f"listening beyond loopback: {exposed}"


def test_the_registered_pyfunc_refuses_the_same_requests_under_mlflow_serve(served):
    """The champion behind MLflow's scoring server (what `mlflow models serve` runs), in-process:
    each bad request a 400 naming the problem (MLflow drops unknown params before the model)."""
    import mlflow
    from fastapi.testclient import TestClient
    from mlflow.pyfunc import scoring_server

    from serving.mlflow_uris import pointed_at

    tracking = served[2]
    with pointed_at(tracking):
        model = mlflow.pyfunc.load_model(f"models:/{TEACHER}/1")
    client = TestClient(scoring_server.init(model))
    answer = client.post("/invocations", json={"inputs": TEXTS})
    assert answer.status_code == 200 and len(answer.json()["predictions"]) == len(TEXTS)
    defaults = RequestLimits()  # the version was registered with the default limits
    cases = [
        ({"inputs": ["a dog"], "params": {"beam_size": 10000}}, "beam_size 10000 must be within"),
        ({"inputs": ["a dog"] * (defaults.max_sentences + 1)}, "257 texts in one request"),
        ({"inputs": ["a dog", None]}, "input 1 is null, not a string"),
        ({"inputs": [42]}, "input 0 is a number, not a string"),
        ({"inputs": ["dog " * 10000]}, "input 0 has 40000 characters"),
        ({"inputs": ["dog " * 300]}, "subword pieces"),
        ({"inputs": ["a dog"], "params": {"n_best": 3}}, "n_best 3 must be within 1..2"),
    ]
    for body, words in cases:
        answer = client.post("/invocations", json=body)
        assert answer.status_code == 400 and words in answer.json()["message"], (body, answer.text)


def test_the_served_files_are_the_versions(served, tmp_path: Path):
    """What the server loads is the version's own files (its limits included)."""
    from serving.registered_version import download

    files = download(f"models:/{TEACHER}/1", tmp_path, served[2])
    assert files.limits == RequestLimits() and files.weights.is_file()
    assert files.ctranslate2 is None and files.decode.beam_size == 2


def test_the_command_serves_with_a_token_from_the_environment_and_stops_on_ctrl_c(
    served, tmp_path: Path
):
    """`tfm serve` as a user runs it: a port in use is one config error before Ray starts; then
    served with the token a variable holds, through HAProxy where it is installed (CI installs
    it): requests batched, every socket of the command's processes on loopback; Ctrl-C ends it
    with the port free again."""
    import os
    import shutil
    import signal
    import socket
    import subprocess
    import sys

    import yaml

    haproxy = shutil.which("haproxy") is not None
    assert haproxy or os.environ.get("CI") != "true", "CI installs haproxy (.ci/run)"

    tracking = served[2]
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        config = tmp_path / "serve.yaml"
        settings = {"port": port, "token_env": "TFM_TEST_TOKEN", "cpus_per_replica": 0.5}
        config.write_text(
            yaml.safe_dump(
                {
                    "name": "servecmd",
                    "workdir": str(tmp_path / "run"),
                    "mlflow": {"tracking_uri": tracking},
                    "ray": {"num_cpus": 1},
                    "serve": settings,
                }
            )
        )
        command = [sys.executable, "-m", "pipelines.cli", "serve", "--model", URI]
        command += ["--config", str(config)]
        env = {**os.environ, "TFM_TEST_TOKEN": "s3cret"}
        busy = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert busy.returncode == 2, busy.stderr
        assert f"serve.port: 127.0.0.1:{port}: Address already in use" in busy.stderr
    server = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        url = f"http://127.0.0.1:{port}/invocations"
        deadline = time.monotonic() + 180
        while post_or_none(url, token="s3cret") is None:
            assert server.poll() is None and time.monotonic() < deadline, server.stdout.read()
            time.sleep(1)
        assert post(url, {"inputs": TEXTS})[0] == 401
        status, answer, headers = post(url, {"inputs": TEXTS}, token="s3cret")
        assert status == 200 and len(answer["predictions"]) == len(TEXTS), answer
        assert headers["X-Model-Name"] == TEACHER and headers["X-Model-Version"] in {"1", "2"}
        load = run_load(url, TEXTS, clients=8, seconds=3, warmup=1, token="s3cret")
        assert load.errors == 0 and max(load.batches) > 1, (load.statuses, load.batches)
        found = listening(server.pid)  # HAProxy's stats and metrics frontends among them
        assert port in {p for _, _, p in found}, found
        exposed = [s for s in found if not loopback(s[1])]
        assert exposed == [], f"listening beyond loopback: {exposed}"
    finally:
        server.send_signal(signal.SIGINT)
        output, _ = server.communicate(timeout=120)
    assert server.returncode == 130, output
    assert f"serving {TEACHER} version" in output and "s3cret" not in output
    assert f"{'haproxy' if haproxy else 'proxy'} ingress" in output, output
    deadline = time.monotonic() + 15  # the watchdog ends the command's Ray within seconds
    while True:
        with socket.socket() as again:
            # As a rerun's check and the proxy bind it: the closed connections' TIME_WAIT
            # entries (a minute) are no listener, and held a plain bind in a CI replica.
            again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                again.bind(("127.0.0.1", port))  # nothing listens on the port any more
                break
            except OSError:
                assert time.monotonic() < deadline, f"port {port} still held"
        time.sleep(0.5)


def post_or_none(url: str, token: str) -> int | None:
    """The status of a translation request, or None until the application answers it."""
    try:
        status = post(url, {"inputs": TEXTS}, token=token)[0]
    except OSError:
        return None
    return status if status in (200, 401) else None
