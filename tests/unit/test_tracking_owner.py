"""Who owns a run's journal and whether it still lives (training/tracking_owner.py): a real child
process, alive, SIGKILLed (a zombie, then reaped), a pid whose start time is not the owner's;
the runs of a dead owner ended as KILLED at its last record, and every other run left alone."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tracking.journal import Journal, Record, log_record, new_key, open_record
from tracking.journal import status_record as status
from tracking.owner import Owner, end_abandoned, gone, killed_runs, this_process


@pytest.fixture
def child():
    """A real process that waits to be killed."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


def owner_of(proc: subprocess.Popen) -> Owner:
    here = this_process()
    return Owner(here.host, proc.pid, psutil.Process(proc.pid).create_time(), here.pid_ns)


def test_this_process_lives_and_another_hosts_process_cannot_be_judged():
    here = this_process()
    assert here.pid == os.getpid() and here.host == socket.gethostname()
    assert gone(here) is False
    assert gone(Owner("another-host", os.getpid(), here.started, here.pid_ns)) is None
    assert gone(Owner(here.host, os.getpid(), here.started, "pid:[1]")) is None  # a container
    assert Owner.of(here.fields()) == here
    assert Owner.of(None) is None  # an older version's record names no owner


def test_a_child_lives_until_it_is_killed(child):
    owner = owner_of(child)
    assert gone(owner) is False
    os.kill(child.pid, signal.SIGKILL)
    _wait_zombie(child.pid)
    assert gone(owner) is True  # a zombie: dead, not yet reaped
    child.wait()
    assert gone(owner) is True  # its pid gone


def test_a_pid_that_started_at_another_time_is_another_process():
    here = this_process()
    assert gone(Owner(here.host, here.pid, here.started - 60, here.pid_ns)) is True


def _wait_zombie(pid: int) -> None:
    for _ in range(200):
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return
        time.sleep(0.01)
    raise AssertionError("the child did not die")


def journal(root: Path, name: str, owner: Owner | None, *, parent: str | None = None) -> Journal:
    j = Journal.create(root, new_key(), "http://127.0.0.1:1", "e")
    tags = {"pipeline": "p"} if parent is None else {"stage": name}
    fields = owner.fields() if owner else None
    j.append([open_record("e", f"r/{name}", tags, parent=parent, owner=fields)])
    return j


def at(record: Record, t: int) -> Record:
    return {**record, "t": t}


def test_the_runs_of_a_dead_owner_end_as_killed_at_its_last_record(tmp_path, child):
    dead = owner_of(child)
    flow = journal(tmp_path, "pipeline", dead)
    train = journal(tmp_path, "train", dead, parent=flow.key)
    train.append([at(log_record(metrics={"loss": 2.0}, step=5), 1_900_000_000_000)])
    done = journal(tmp_path, "clean", dead, parent=flow.key)
    done.append([status("FINISHED")])
    left_alone = [
        done,
        journal(tmp_path, "pipeline", this_process()),  # a live owner's run
        journal(tmp_path, "pipeline", Owner("another-host", dead.pid, dead.started)),
        journal(tmp_path, "pipeline", None),  # an older version's run: no owner to judge
    ]
    sizes = [j.size() for j in left_alone]
    os.kill(child.pid, signal.SIGKILL)
    child.wait()

    before = killed_runs(tmp_path)  # what `tfm status` says: nothing changes
    assert [k.run.journal.key for k in before] == [flow.key]
    assert "the next `tfm run`" in before[0].line()
    assert not list(flow.records("status")) and not list(train.records("status"))

    (ended,) = end_abandoned(tmp_path)
    line = ended.line()
    assert f"flow run r/pipeline (tag tfm.journal = {flow.key}) was killed" in line
    assert f"process {dead.pid} on {dead.host} died after" in line
    assert "2030-03-17 17:46:40 UTC" in line and "were ended as KILLED" in line
    for j in (flow, train):
        (end,) = j.records("status")
        assert end["status"] == "KILLED" and end["t"] == 1_900_000_000_000  # its last sign of life
        assert Owner.of(end["owner"]) == dead
    assert [j.size() for j in left_alone] == sizes
    assert end_abandoned(tmp_path) == []  # ended once
    (after,) = killed_runs(tmp_path)
    assert after.line() == line


def test_status_forgets_a_kill_once_the_same_command_ended_again(tmp_path, child):
    dead = owner_of(child)
    journal(tmp_path, "pipeline", dead)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    end_abandoned(tmp_path)
    rerun = journal(tmp_path, "pipeline", this_process())
    assert len(killed_runs(tmp_path)) == 1  # the rerun runs: the kill is still news
    rerun.append([status("FINISHED")])
    assert killed_runs(tmp_path) == []


def test_a_resumed_run_of_a_live_process_is_not_ended(tmp_path, child):
    """A training journal opened again by a later (live) process: its last opening decides."""
    dead = owner_of(child)
    train = journal(tmp_path, "train", dead, parent="someone")
    train.append([open_record("e", "r/train", {"stage": "train"}, owner=this_process().fields())])
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert end_abandoned(tmp_path) == [] and killed_runs(tmp_path) == []
    assert not list(train.records("status"))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to run a step as another user")
def test_a_lock_another_user_made_does_not_stop_the_next_command(tmp_path):
    """A work dir shared by two users (a cluster's pipeline user; an operator's `tfm status` as
    root, which made the lock): the other user still takes the lock and finds nothing to end."""
    shared = Path(tempfile.mkdtemp(prefix="tfm-shared-"))
    try:
        shared.chmod(0o755)
        folder = shared / "tracking"
        folder.mkdir(mode=0o755)
        assert end_abandoned(shared) == []  # root's command makes the lock, 0644
        assert (folder / "end.lock").stat().st_uid == 0
        nobody = pwd.getpwnam("nobody")
        pid = os.fork()
        if pid == 0:  # the other user: a forked child that drops root, then ends nothing
            try:
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)
                os._exit(0 if end_abandoned(shared) == [] else 2)
            except BaseException:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        shutil.rmtree(shared)
