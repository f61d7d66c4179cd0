"""The process's one tracking sender (``training.tracking_sender``) for the runs of a config:
where their journals live (``<work dir>/tracking/``, this node's copy for an object store, which
keeps them there too while the server does not answer), the MLflow HTTP budget of the process,
what a command's end says about records left, and ``tfm tracking replay``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from corpora.redact import redact_uri
from tasks.framework.config import TRACKING_URI_AT_START, RunConfig
from tasks.framework.workdir import WorkDir, open_workdir, workdirs_at
from training.tracking_journal import JOURNALS, Journal, journals
from training.tracking_owner import end_abandoned, killed_runs
from training.tracking_sender import Keep, Sender, TrackingOptions

log = logging.getLogger(__name__)

_SENDER: list[Sender] = []
"""The process's sender, made on first use (one thread for every journal the process sends)."""
_WATCHED_ROOTS: set[Path] = set()


def options(config: RunConfig) -> TrackingOptions:
    """The run config's tracking knobs (its ``mlflow`` section)."""
    m = config.mlflow
    return TrackingOptions(
        http_retries=m.http_retries,
        http_backoff=m.http_backoff,
        http_timeout=m.http_timeout,
        drain_seconds=m.drain_seconds,
        probe_seconds=m.probe_seconds,
    )


def budget(config: RunConfig) -> None:
    """MLflow's HTTP calls of this process on the config's budget (seconds, not MLflow's 254):
    MLflow reads these variables at every call."""
    os.environ.update(options(config).http_env())


def sender(config: RunConfig) -> Sender:
    """The process's sender, running, and watching every journal of ``config``'s work dir
    (what earlier processes left too: it is sent first, being older)."""
    budget(config)
    if not _SENDER:
        _SENDER.append(Sender(options(config)))
    found = _SENDER[0]
    found.options = options(config)
    root = Path(config.root)
    if root not in _WATCHED_ROOTS:
        _WATCHED_ROOTS.add(root)
        end_killed(root, say=lambda line: log.warning("tracking: %s", line))
        keep = keeper(open_workdir(config))
        for journal in journals(root):
            found.watch(journal, uri_of(journal, config), keep)
    found.start()
    return found


def end_killed(root: Path, say: Callable[[str], object]) -> None:
    """End as KILLED the runs of ``root``'s journals whose process on this host died without
    ending them (``training.tracking_owner``); one line per such process. Housekeeping, never a
    reason for a command to stop: a journal this user may not write (another user's, in a shared
    work dir) stays as it is, and the run log says why."""
    try:
        ended = end_abandoned(root)
    except OSError as exc:
        log.info("tracking: the runs of killed processes in %s stay as they are: %s", root, exc)
        return
    for one in ended:
        say(one.line())


def killed(config: RunConfig) -> list[str]:
    """What ``tfm status`` says of the config's runs that were killed, without changing them."""
    return [k.line() for k in killed_runs(config.root)]


def keeper(wd: WorkDir) -> Keep:
    """How a journal is kept in the work dir (an object store's; a local one holds it already)."""
    return lambda journal: wd.keep(journal.folder, f"{JOURNALS}/{journal.key}")


def uri_of(journal: Journal, config: RunConfig | None) -> str:
    """The tracking URI a journal goes to: the one its meta names, which is ``config``'s (or
    ``$MLFLOW_TRACKING_URI``'s) with its password, when that is the one it names masked."""
    named = journal.meta().get("tracking_uri") or ""
    for candidate in (config.tracking_uri if config else None, TRACKING_URI_AT_START):
        if candidate and redact_uri(candidate) == named:
            return candidate
    return named


def finish(config: RunConfig, wait: bool = True) -> int:
    """The end of a flow or a command: wait (``mlflow.drain_seconds``, unless ``wait`` is
    false or the server does not answer) for the work dir's journals to reach the server; say
    in one line what is left, kept for later. Returns the records left."""
    found = sender(config)
    ours = journals(config.root)
    if wait and found.flush(ours, found.options.drain_seconds):
        return 0
    left = found.keep_pending()
    if left:
        log.warning(
            "tracking: %d record(s) for the MLflow server at %s are kept in %s; the next `tfm run` "
            "or `tfm stage` of this work dir sends them, or `tfm tracking replay %s` now",
            left,
            redact_uri(config.tracking_uri),
            config.root / JOURNALS,
            config.workdir,
        )
    return left


def replay_config(config: RunConfig, say: Callable[[str], object]) -> int:
    """``replay`` of a run config's work dir (its tracking URI, its store's settings)."""
    return replay(config.root, open_workdir(config), config, say)


def replay_workdir(target: str, say: Callable[[str], object]) -> int:
    """``replay`` of a work dir named alone (a folder, or an object store's URI)."""
    return sum(replay(wd.root, wd, None, say) for wd in workdirs_at(target))


def replay(root: Path, wd: WorkDir, config: RunConfig | None, say: Callable[[str], object]) -> int:
    """Send what the journals of a work dir hold (``root``: this node's folder for it; those an
    object store keeps that this node lacks are fetched first), now, in order; one line per
    server. Returns the records left (the server does not answer)."""
    fetched = wd.kept(JOURNALS, root / JOURNALS)
    if fetched:
        say(f"fetched {len(fetched)} journal(s) from {wd.uri}/{JOURNALS}")
    end_killed(root, say)
    pending = [j for j in journals(root) if j.pending()]
    if not pending:
        say(f"nothing to send in {root / JOURNALS}")
        return 0
    if config is not None:
        budget(config)
    replayer = Sender(options(config) if config else TrackingOptions(), say=say)
    keep = keeper(wd)
    by_uri: dict[str, list[Journal]] = {}
    for journal in pending:
        replayer.watch(journal, uri_of(journal, config), keep)
        by_uri.setdefault(uri_of(journal, config), []).append(journal)
    left = 0
    for uri, group in by_uri.items():
        n = sum(j.count() for j in group)
        rest, busy = replayer.deliver_now(group)
        left += rest
        for journal in busy:
            say(f"{journal.folder} is being sent by another process; left to it")
        if rest:
            replayer.keep_pending()
            say(
                f"{rest} of {n} record(s) left in {root / JOURNALS}; "
                "run `tfm tracking replay` again "
                f"when the MLflow server at {redact_uri(uri)} answers"
            )
        else:
            say(f"sent {n} record(s) of {len(group)} run(s) to {redact_uri(uri)}")
    return left
