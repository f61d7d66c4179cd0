"""``make bench-serve``: ``tfm serve`` under load, beside ``mlflow models serve`` of the same
registered version and the engine's offline batched rate on the same sentences.

One registered version (the Multi30k laptop model, ``models:/multi30k-en-de@champion`` of
configs/multi30k_en_de.yaml, when its run has registered it; else the quickstart's after
``make demo``) and its run's test sources (Multi30k test2016 for the laptop model), one way after
another on the same machine:

- for each ``--engines`` (default: the version's own, then CTranslate2 int8): the version
  loaded offline (``serving.registered_version``, its registered decoding) translating every
  sentence in one call, sorted into token-budget batches, in one process of a thread per core
  and in a process of one thread per core each translating its share: the faster is the
  engine's ceiling here; then ``tfm serve`` (the real command, its config's ``serve``
  section, ``--set`` overrides), with each ``--ingresses`` (HAProxy where it is installed,
  and Ray Serve's Python proxy), under closed-loop clients sending one sentence a request
  (``serving.closed_loop``) at each ``--clients`` level: sentences/s, p50 and p99 latency,
  errors;
- ``mlflow models serve --env-manager local`` (as docs/translation.md runs it, the version's
  own engine) under the same loads;
- the requests a server must refuse (a beam of 10,000, 5,000 sentences, a null input, an
  unknown param, a 10,000-word text), sent to each while it is idle: the status and how long
  the answer took.

    python benchmarks/serve_load.py [--config CONFIG --model URI] [--clients 1 8 32 128]
        [--seconds 20] [--engines auto ctranslate2] [--ingresses haproxy proxy]
        [--set serve.replicas=1 ...] [--no-mlflow]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import figures  # noqa: E402
from common import environment, report  # noqa: E402

from serving.closed_loop import LoadResult, run_load  # noqa: E402

DEFAULTS = (
    ("configs/multi30k_en_de.yaml", "models:/multi30k-en-de@champion"),
    ("configs/quickstart.yaml", "models:/quickstart-translator@champion"),
)
"""Where to find a version when none is given: the laptop model, else the quickstart's."""
BIN = Path(sys.executable).parent


def load_config(path: str, overrides: list[str]):
    """The run config as ``tfm`` loads it, with ``--set`` overrides."""
    import yaml

    from tasks.framework.config import load_config as load

    return load(path, {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in overrides)})


def pick(args: argparse.Namespace) -> tuple[str, str, object]:
    """The config, the model URI and the loaded config of the version to measure."""
    from serving.registered_version import ModelNotFoundError, resolve

    choices = [(args.config, args.model)] if args.config else DEFAULTS
    for path, uri in choices:
        config = load_config(path, args.set)
        try:
            resolve(uri, config.tracking_uri)
            return path, uri, config
        except ModelNotFoundError as exc:
            if args.config:
                raise SystemExit(f"bench-serve: {exc}") from None
    raise SystemExit(
        "bench-serve: no registered model: run `tfm run configs/multi30k_en_de.yaml` "
        "(or `make demo`) first"
    )


def test_sources(config) -> list[str]:
    """The run's test sources, as its clean stage wrote them."""
    path = config.root / "clean" / f"test.{config.languages[0]}"
    if not path.is_file():
        raise SystemExit(f"bench-serve: {path} does not exist (the run's clean stage writes it)")
    return path.read_text(encoding="utf-8").splitlines()


def _translate_share(files, engine: str, compute_type: str, threads: int, texts, start, done):
    """One offline translator of ``threads`` threads: ``texts`` in one call once every
    process has loaded (``start``, a barrier); puts its engine's name and seconds on ``done``."""
    from serving.registered_version import load_translator

    translator = load_translator(files, engine, compute_type, threads)
    translator.translate(texts[:50])  # warm-up
    start.wait()
    began = time.perf_counter()
    translator.translate(texts)
    done.put((translator.engine.name, time.perf_counter() - began))


def offline(uri: str, config, texts: list[str], engine: str) -> list[dict]:
    """The version's offline batched rate on ``engine`` (as ``serve.engine`` says it), every
    sentence translated in one call, in two layouts of the machine's cores: one process of
    as many threads, and one process of one thread per core, each translating its share at
    the same time (what the replicas do). The faster is the ceiling (first)."""
    import multiprocessing

    from serving.registered_version import download

    cores = os.cpu_count() or 1
    layouts = [(1, cores)] + ([(cores, 1)] if cores > 1 else [])
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        files = download(uri, Path(tmp), config.tracking_uri)
        context = multiprocessing.get_context("spawn")
        for processes, threads in layouts:
            start, done = context.Barrier(processes), context.Queue()
            workers = [
                context.Process(
                    target=_translate_share,
                    args=(files, engine, config.serve.compute_type, threads, texts[i::processes]),
                    kwargs={"start": start, "done": done},
                )
                for i in range(processes)
            ]
            for worker in workers:
                worker.start()
            found = [done.get(timeout=1800) for _ in workers]
            for worker in workers:
                worker.join()
            name = found[0][0]
            rows.append(
                {
                    "server": f"offline batched, {name}, {processes} x {threads} thread(s)",
                    "engine": name,
                    "clients": "-",
                    "sentences_per_s": round(len(texts) / max(s for _, s in found), 1),
                    "p50_ms": None,
                    "p99_ms": None,
                    "errors": 0,
                }
            )
    return sorted(rows, key=lambda row: -row["sentences_per_s"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(command: list[str], env: dict, url: str, log: Path) -> subprocess.Popen:
    """Start a server in a session of its own and wait until it answers ``url`` (its ping)."""
    out = log.open("w")
    proc = subprocess.Popen(
        command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"bench-serve: {command[0]} ended ({proc.returncode}); see {log}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return proc
        except (urllib.error.URLError, OSError):
            time.sleep(1)
    stop_server(proc)
    raise SystemExit(f"bench-serve: {' '.join(command[:3])} did not answer in 300 s; see {log}")


def stop_server(proc: subprocess.Popen) -> None:
    """Ctrl-C to its process group, as a terminal stops it; killed if it lingers."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(60)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


BAD_REQUESTS = (
    ("beam 10000", {"inputs": ["A dog runs ."], "params": {"beam_size": 10000}}),
    ("5,000 sentences", {"inputs": ["A dog runs ."] * 5000}),
    ("a null input", {"inputs": [None]}),
    ("an unknown param", {"inputs": ["A dog runs ."], "params": {"beam": 4}}),
    ("a 10,000-word input", {"inputs": ["dog " * 10000]}),
)


def refusals(url: str, name: str) -> list[dict]:
    """Each bad request sent once: the status and how long the answer took."""
    rows = []
    for what, body in BAD_REQUESTS:
        data = json.dumps(body).encode()
        request = urllib.request.Request(
            url, data=data, headers={"Content-Type": "application/json"}
        )
        start = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=120) as answer:
                status = answer.status
        except urllib.error.HTTPError as exc:
            status = exc.code
        rows.append(
            {
                "server": name,
                "request": what,
                "status": status,
                "ms": round((time.perf_counter() - start) * 1000, 1),
            }
        )
    return rows


def under_load(name: str, url: str, texts: list[str], args) -> list[LoadResult]:
    """The closed-loop levels against one server, one after another."""
    results = []
    for clients in args.clients:
        result = run_load(url, texts, clients, args.seconds, warmup=args.warmup)
        print(f"{name}: {result.row()}", flush=True)
        results.append(result)
    return results


def measure_server(name: str, command: list[str], env: dict, port: int, texts, args) -> dict:
    """Start a server, load it, send it the bad requests, stop it."""
    log = Path(tempfile.gettempdir()) / f"bench-serve-{name.replace(' ', '-').replace(',', '')}.log"
    proc = start_server(command, env, f"http://127.0.0.1:{port}/ping", log)
    url = f"http://127.0.0.1:{port}/invocations"
    try:
        loads = under_load(name, url, texts, args)
        refused = refusals(url, name)
    finally:
        stop_server(proc)
    return {"loads": loads, "refusals": refused}


def tfm_serve(
    config_path: str, uri: str, port: int, engine: str, ingress: str, args
) -> tuple[list[str], dict]:
    command = [str(BIN / "tfm"), "serve", "--model", uri, "--config", config_path]
    overrides = [f"serve.engine={engine}", f"serve.ingress={ingress}", f"serve.port={port}"]
    for override in [*args.set, *overrides]:
        command += ["--set", override]
    return command, dict(os.environ)


def mlflow_serve(uri: str, tracking_uri: str, port: int) -> tuple[list[str], dict]:
    command = [str(BIN / "mlflow"), "models", "serve", "-m", uri, "--env-manager", "local"]
    command += ["-h", "127.0.0.1", "-p", str(port)]
    # It starts uvicorn through the shell: the venv's bin must be on PATH.
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return command, env


def level(results: list[LoadResult], clients: int) -> LoadResult | None:
    found = [r for r in results if r.clients == clients]
    return found[0] if found else None


def summary(measured: dict, ceilings: dict[str, dict], at: int) -> list[str]:
    """The done-when lines at ``at`` clients, one per engine: tfm serve against the engine's
    offline rate and against mlflow models serve, and the p99 latencies."""
    theirs = level(measured.get("mlflow models serve", {}).get("loads", []), at)
    lines = []
    for name, ceiling in ceilings.items():
        ours = level(measured[name]["loads"], at)
        if ours is None:
            continue
        name = name.removeprefix("tfm serve, ")
        line = (
            f"serve sentences/s at {at} clients ({name}), tfm serve / offline "
            f"batched: {ours.rate / ceiling['sentences_per_s']:.2f}"
        )
        if theirs is not None:
            line += f"; tfm serve / mlflow models serve: {ours.rate / theirs.rate:.2f}"
        p99 = f"p99 {ours.row()['p99_ms']} ms"
        lines.append(f"{line} ({p99})")
    if theirs is not None:
        lines.append(f"mlflow models serve at {at} clients: p99 {theirs.row()['p99_ms']} ms")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="run config of the version (default: see above)")
    parser.add_argument("--model", help="with --config: the model URI to serve")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--seconds", type=float, default=20.0, help="measured per level")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before each level")
    parser.add_argument("--set", action="append", default=[], help="tfm serve's --set")
    parser.add_argument(
        "--engines",
        nargs="+",
        default=["auto", "ctranslate2"],
        choices=["auto", "torch", "ctranslate2"],
        help="serve.engine of each tfm serve run (auto: the version's own)",
    )
    parser.add_argument(
        "--ingresses",
        nargs="+",
        default=["haproxy", "proxy"] if shutil.which("haproxy") else ["proxy"],
        choices=["haproxy", "proxy"],
        help="serve.ingress of each tfm serve run (default: both where haproxy is installed)",
    )
    parser.add_argument("--no-mlflow", action="store_true", help="skip mlflow models serve")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a bar a download
    if args.config and not args.model:
        parser.error("--config needs --model")
    config_path, uri, config = pick(args)
    texts = test_sources(config)
    print(f"bench-serve: {uri} ({config_path}), {len(texts)} test sentences", flush=True)
    measured, ceilings, offline_rows = {}, {}, []
    for engine in args.engines:
        layouts = offline(uri, config, texts, engine)
        for row in layouts:
            print(f"offline: {row}", flush=True)
        offline_rows += layouts
        ceiling = layouts[0]
        for ingress in args.ingresses:
            name = f"tfm serve, {ceiling['engine']}, {ingress}"
            ceilings[name] = ceiling
            port = free_port()
            command, env = tfm_serve(config_path, uri, port, engine, ingress, args)
            measured[name] = measure_server(name, command, env, port, texts, args)
    if not args.no_mlflow:
        port = free_port()
        command, env = mlflow_serve(uri, config.tracking_uri, port)
        measured["mlflow models serve"] = measure_server(
            "mlflow models serve", command, env, port, texts, args
        )
    rows = [{k: v for k, v in c.items() if k != "engine"} for c in offline_rows] + [
        {"server": name, **result.row()} for name, m in measured.items() for result in m["loads"]
    ]
    refused = [row for m in measured.values() for row in m["refusals"]]
    report(f"bench-serve: {uri}, one sentence a request", rows)
    report("requests to refuse, each sent once to an idle server", refused)
    at = 32 if 32 in args.clients else args.clients[-1]
    lines = summary(measured, ceilings, at)
    print("\n".join(lines))
    if config_path == DEFAULTS[0][0] and not (args.set or args.no_mlflow) and at == 32:
        figures.record("serve", "serve-under-load", "; ".join(lines))  # the row's measurement
    if args.json:
        payload = {"model": uri, "config": config_path, "serve_overrides": args.set}
        payload.update(environment=environment(), rows=rows, refusals=refused, summary=lines)
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
