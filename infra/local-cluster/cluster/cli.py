"""The command line: ``up``, ``down``, ``status``, ``kill``, ``start-ray``, ``stop``, ``start``,
``guard`` and ``exec``."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import __doc__ as about
from . import object_store, pipeline
from .hosts import (
    alive,
    existing,
    host_pids,
    kill_host,
    network_down,
    network_up,
    set_link,
    wait_for,
)
from .layout import (
    BUCKET,
    HOSTS,
    MLFLOW_ADMIN,
    MLFLOW_USER,
    PIPELINE_USER,
    RAY_HOSTS,
    RAY_WORKERS,
    REPO,
    S3_PORT,
    SERVICES_HOST,
    ClusterError,
    Layout,
)
from .services import (
    SERVICES,
    ask_to_stop,
    postgres_bin,
    start_all,
    start_service,
    stop_service,
)
from .users import make_venv, system_user


def up(layout: Layout, health_check_ms: int = 1000) -> None:
    """Start everything, in order; on a failure, stop what was started and raise."""
    if os.geteuid() != 0:
        raise ClusterError("needs root (CAP_NET_ADMIN) to make network namespaces")
    if not shutil.which("ip"):
        raise ClusterError("iproute2's `ip` is not installed")
    postgres_bin()
    object_store.weed_binary()
    for user in (*(s.user for s in SERVICES.values()), PIPELINE_USER):
        system_user(user)
    down(layout)  # what a killed earlier run left behind
    layout.save()
    started = time.time()
    try:
        make_venv(layout, PIPELINE_USER)
        pipeline.prepare(layout)
        network_up(layout)
        start_all(layout)
        for host in RAY_HOSTS:
            pipeline.ray_up(layout, host, health_check_ms)

        def all_nodes() -> bool:
            return pipeline.ray_nodes_alive(layout) == len(RAY_HOSTS)

        wait_for(f"{len(RAY_HOSTS)} Ray nodes", all_nodes, 120, layout.logs)
        pipeline.worker_up(layout)
    except BaseException:
        down(layout)
        raise
    print(f"local cluster up in {time.time() - started:.0f} s")
    status(layout)


def down(layout: Layout) -> None:
    """Every server asked to stop, then every process of every host ended and the network
    removed."""
    if SERVICES_HOST in existing(layout):
        ask_to_stop(layout)
    network_down(layout)


def status(layout: Layout) -> None:
    found = existing(layout)
    print(f"{'host':<10} {'address':<15} {'netns':<14} processes")
    print(f"{'machine':<10} {layout.hosts['machine']:<15} {'-':<14} - (up)")
    for host in HOSTS:
        count, state = (len(host_pids(layout, host)), "up") if host in found else (0, "down")
        print(f"{host:<10} {layout.hosts[host]:<15} {layout.netns(host):<14} {count} ({state})")
    for name, url in layout.urls.items():
        print(f"{name:<14} {url}")
    secrets = layout.root / "secrets"
    print(f"Ray token      {layout.token}")
    print(
        f"MLflow login   {MLFLOW_ADMIN} / {secrets / 'mlflow-admin'} (the flows: "
        f"{MLFLOW_USER} / secrets/mlflow-pipeline)"
    )
    print(f"Prefect login  the auth string in {secrets / 'prefect-auth'}")
    print(
        f"S3 login       bucket {BUCKET}, the keys in {secrets / 's3-access-key'} and s3-secret-key"
    )
    print(f"pipeline       runs as {PIPELINE_USER}, in {layout.work}")
    print(f"client shell   source {layout.root / 'env.sh'}")


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="localcluster", description=about.split("\n\n")[0])
    parser.add_argument(
        "--state",
        default=str(REPO / "runs" / "local-cluster"),
        help="state folder (token, passwords, logs, databases)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("up", help="start the cluster (stops a previous one with the same --state)")
    p.add_argument("--prefix", default="tfm", help="names of namespaces, veths and bridge")
    p.add_argument("--subnet", default="10.203.0.0/24", help="the hosts' network")
    p.add_argument("--worker-cpus", type=int, default=2, help="CPUs each Ray worker node offers")
    p.add_argument(
        "--s3-port",
        type=int,
        default=S3_PORT,
        help="the object store's S3 port; it takes the next three too, and each one's "
        "port + 10000 (another cluster on this machine needs other ports)",
    )
    p.add_argument(
        "--health-check-ms",
        type=int,
        default=1000,
        help="Ray's node health-check period and timeout (a dead node is noticed after 5 missed)",
    )
    sub.add_parser("down", help="stop every process of every host and remove the network")
    sub.add_parser("status", help="hosts, addresses and URLs")
    p = sub.add_parser(
        "kill",
        help="take a host off the network and end every process of it at once (a machine "
        "that dies)",
    )
    p.add_argument("host", choices=HOSTS)
    p = sub.add_parser(
        "start-ray",
        help="a killed worker host back on the network, Ray started on it (a machine that "
        "came back)",
    )
    p.add_argument("host", choices=RAY_WORKERS)
    for verb, says in (
        ("stop", "stop one server of the services host (an outage, an upgrade)"),
        ("start", "start a stopped server again, as `up` did"),
    ):
        p = sub.add_parser(verb, help=says)
        p.add_argument("service", choices=tuple(SERVICES))
    p = sub.add_parser(
        "guard",
        help="stay in the background and bring the cluster down once process PID has ended "
        "(a test run that is killed)",
    )
    p.add_argument("pid", type=int)
    p = sub.add_parser(
        "exec",
        help=f"run a command on a host as {PIPELINE_USER}, with the cluster's environment",
    )
    p.add_argument("host", choices=HOSTS)
    p.add_argument("argv", nargs=argparse.REMAINDER, help="-- command ...")
    return parser


def run(args: argparse.Namespace) -> int:
    """The command ``args`` names; its exit status."""
    if args.command == "up":
        state = str(Path(args.state).resolve())
        layout = Layout(args.prefix, args.subnet, state, args.worker_cpus, args.s3_port)
        up(layout, args.health_check_ms)
        return 0
    layout = Layout.load(args.state)
    if args.command == "down":
        down(layout)
    elif args.command == "status":
        status(layout)
    elif args.command == "kill":
        # A machine that dies: first off the network (nothing it sends, a reset included,
        # reaches anyone), then every process gone at once.
        set_link(layout, args.host, "down")
        print(f"killed {len(kill_host(layout, args.host))} processes on {args.host}")
    elif args.command == "start-ray":
        set_link(layout, args.host, "up")
        pipeline.ray_up(layout, args.host)
    elif args.command == "stop":
        stop_service(layout, args.service)
        print(f"stopped {args.service}")
    elif args.command == "start":
        start_service(layout, args.service)
        print(f"started {args.service}")
    elif args.command == "guard":
        while alive(args.pid):
            time.sleep(1.0)
        down(layout)
    elif args.command == "exec":
        command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        argv = pipeline.run_as_pipeline(layout, args.host, command)
        env = pipeline.pipeline_env(layout)
        return subprocess.run(argv, cwd=Path.cwd(), env=env).returncode
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return run(args)
    except ClusterError as exc:
        print(f"localcluster: {exc}", file=sys.stderr)
        return 1
