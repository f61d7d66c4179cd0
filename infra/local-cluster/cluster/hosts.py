"""The hosts: network namespaces on a bridge, commands and long-running processes on a host
(as a user, in the cluster's environment), and a host's end (every process killed)."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from .layout import CREDENTIALS, HOSTS, RAY_HOSTS, REPO, ClusterError, Layout


def sh(
    *args: str,
    check: bool = True,
    quiet: bool = False,
    env: dict[str, str] | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess:
    """Run a command; a failure is a ClusterError with its stderr."""
    done = subprocess.run(args, capture_output=True, text=True, env=env, input=input)
    if check and done.returncode != 0:
        said = done.stderr.strip() or done.stdout.strip()
        raise ClusterError(f"`{shlex.join(args)}` failed: {said}")
    if not quiet and done.stdout.strip():
        print(done.stdout.strip())
    return done


def in_host(layout: Layout, host: str, argv: list[str], user: str | None = None) -> list[str]:
    """``argv`` run on ``host``, as ``user`` if given; run it with ``host_env``'s environment.

    What runs as root is only what enters the namespaces and mounts (``ip netns exec``,
    ``unshare``, ``mount``, ``setpriv``), each replaced by the next (``exec``), so no root
    process stays on the host. On a Ray host, ``layout.node_dir`` is that host's own disk: its
    folder under ``<state>/hosts/`` mounted there in a mount namespace of the process's own, so
    no other host (nor this machine) sees what it writes at that path; a work dir on an object
    store keeps its node cache there (``storage.cache_dir``), as a cloud node keeps it on its
    local disk."""
    drop = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--"] if user else []
    own: list[str] = []
    if host in RAY_HOSTS:
        own = [
            "unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount --bind "$1" "$2" && shift 2 && exec "$@"', "node-disk",
            str(layout.disk(host)), layout.node_dir,
        ]  # fmt: skip
    return ["ip", "netns", "exec", layout.netns(host), *own, *drop, *argv]


def host_env(
    layout: Layout,
    env: dict[str, str] | None = None,
    credentials: tuple[str, ...] = tuple(CREDENTIALS),
    user: str | None = None,
) -> dict[str, str]:
    """A host process's environment: the cluster's, ``user``'s name, the client credentials of
    ``credentials``, and ``env`` on top. Handed over as the environment, never as ``env K=V``
    arguments: a process's environment is readable by its user and root only, its command line
    by everyone."""
    mine = {name for service in CREDENTIALS.values() for name in service}
    inherited = {k: v for k, v in os.environ.items() if k not in mine}
    who = {"USER": user, "LOGNAME": user} if user else {}
    return {**inherited, **layout.env(), **who, **layout.credentials(credentials), **(env or {})}


def spawn(
    layout: Layout,
    host: str,
    name: str,
    argv: list[str],
    env: dict[str, str] | None = None,
    user: str | None = None,
    cwd: Path | None = None,
    credentials: tuple[str, ...] = tuple(CREDENTIALS),
) -> int:
    """Start a long-running process on ``host``, detached, its output in
    logs/<host>-<name>.log; its pid."""
    layout.logs.mkdir(parents=True, exist_ok=True)
    with open(layout.logs / f"{host}-{name}.log", "ab") as out:
        process = subprocess.Popen(
            in_host(layout, host, argv, user),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=cwd or REPO,
            env=host_env(layout, env, credentials, user),
        )
    return process.pid


def wait_for(
    what: str,
    check: Callable[[], bool],
    seconds: float,
    log: Path | None = None,
    pid: int | None = None,
) -> None:
    """Poll ``check()`` until it is true; a ClusterError naming ``what`` and the log if it is not
    within ``seconds``, or at once if process ``pid`` (the service) has ended."""
    where = f"; see {log}" if log else ""
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - a server that is still starting refuses or resets
            pass
        if pid is not None and exited(pid):
            raise ClusterError(f"{what} exited while starting{where}")
        time.sleep(0.5)
    raise ClusterError(f"{what} did not come up within {seconds:.0f} s{where}")


def alive(pid: int) -> bool:
    """Whether process ``pid`` (not ours) still runs; a zombie counts as ended."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def exited(pid: int) -> bool:
    """Whether our child ``pid`` has ended (reaped here, so a zombie counts as ended)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done == pid


def send(pid: int, sig: int) -> None:
    """Signal ``pid`` if it is still there."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def network_up(layout: Layout) -> None:
    """The bridge (with the machine's address), and per host a namespace and a veth pair."""
    sh("ip", "link", "add", layout.bridge, "type", "bridge")
    sh("ip", "addr", "add", f"{layout.hosts['machine']}/{layout.prefixlen}", "dev", layout.bridge)
    sh("ip", "link", "set", layout.bridge, "up")
    for host in HOSTS:
        ns, veth, peer = layout.netns(host), layout.veth(host), f"{layout.prefix}-p{host}"[:15]
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
        sh("ip", "link", "set", peer, "netns", ns)
        sh("ip", "-n", ns, "link", "set", peer, "name", "eth0")
        sh("ip", "-n", ns, "addr", "add", f"{layout.hosts[host]}/{layout.prefixlen}", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "link", "set", veth, "master", layout.bridge)
        sh("ip", "link", "set", veth, "up")


def existing(layout: Layout) -> set[str]:
    """The hosts of ``layout`` whose namespace exists."""
    names = set(sh("ip", "netns", "list", quiet=True).stdout.split())
    return {host for host in HOSTS if layout.netns(host) in names}


def set_link(layout: Layout, host: str, state: str) -> None:
    """``host`` on the network (``up``) or off it (``down``: nothing it sends reaches anyone)."""
    sh("ip", "link", "set", layout.veth(host), state)


def host_pids(layout: Layout, host: str) -> list[int]:
    done = sh("ip", "netns", "pids", layout.netns(host), check=False, quiet=True)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


def kill_host(layout: Layout, host: str, grace: float = 0.0) -> list[int]:
    """End every process of ``host`` (SIGTERM, then SIGKILL after ``grace`` seconds); the pids."""
    pids = host_pids(layout, host)
    if grace > 0:
        for pid in pids:
            send(pid, signal.SIGTERM)
        deadline = time.time() + grace
        while time.time() < deadline and host_pids(layout, host):
            time.sleep(0.2)
    for _ in range(20):  # processes may fork while we kill: look again until none is left
        left = host_pids(layout, host)
        if not left:
            break
        for pid in left:
            send(pid, signal.SIGKILL)
        time.sleep(0.2)
    return pids


def network_down(layout: Layout) -> None:
    """Every process of every host ended, the namespaces, veths and bridge removed, and the
    hosts' own disks and Ray's temp folders gone."""
    found = existing(layout)
    for host in HOSTS:
        if host in found:
            kill_host(layout, host, grace=5.0)
            sh("ip", "netns", "del", layout.netns(host), check=False, quiet=True)
        sh("ip", "link", "del", layout.veth(host), check=False, quiet=True)
    sh("ip", "link", "del", layout.bridge, check=False, quiet=True)
    for host in RAY_HOSTS:
        shutil.rmtree(layout.ray_temp(host), ignore_errors=True)
    shutil.rmtree(layout.root / "hosts", ignore_errors=True)
