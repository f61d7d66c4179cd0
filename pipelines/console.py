"""The console a person reads: our progress lines, the stage table, the scores, and errors.

Without ``-v``, what the libraries say goes to the run's log, ``<workdir>/logs/tfm.log``:
Ray Data's INFO lines (its logging config, which Ray's local workers inherit through the
environment), other libraries' log records that reach the root logger, and Python warnings
(``logging.captureWarnings``). MLflow's loggers keep their own console handler (INFO).
MLflow's artifact download bars and its "View run ... at" links are switched off with MLflow's
own variables (a progress bar is not a log line), Ray's ``(RayTrainWorker pid=...)`` prefix with
Ray's, and Prefect's bookkeeping lines ("Finished in state Completed()") go to the log. ``-v``
leaves every library as it is and logs at DEBUG. Our own records, warnings included, and
anyone's errors stay on the console, but for Prefect's copies of a failed stage's error, which
``tfm:``'s last line says once.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path

OURS = (
    "pipelines", "tasks", "corpora", "parsing", "training", "evaluation", "serving",
    "transformer_core", "__main__", "prefect.flow_runs", "prefect.task_runs",
)  # fmt: skip
"""Loggers whose records are ours: the packages, and the Prefect run loggers our stages log to."""
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_FILE = Path("logs") / "tfm.log"
"""The run's log, under its work dir: everything logged, the libraries' records included."""
RAY_DATA_CONFIG_VAR = "RAY_DATA_LOGGING_CONFIG"
"""Ray Data's logging config file (ray 2.60, ``ray.data._internal.logging``), read when
``ray.data`` is imported, in the driver and in every worker."""
QUIET_MLFLOW = {
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}
"""Not ``MLFLOW_CONFIGURE_LOGGING=false``: Ray's workers inherit it, and there it unleashed
alembic's INFO lines (9 per training run) that MLflow's own setup keeps at WARNING."""
QUIET_RAY = {"RAY_DISABLE_WORKER_LOG_PREFIX": "1", "RAY_SERVE_LOG_TO_STDERR": "0"}
"""Ray prints every line a worker writes behind a coloured ``(RayTrainWorker pid=...)``; without
it the progress lines read as the command's own. The lines themselves, worker errors included,
still reach the console (Ray's forwarding and its deduplication stay on). Ray Serve's components
(``tfm serve``'s proxy and replicas) log to their files under Ray's session folder only, not
through the console line by line. Ray reads both when it is first imported, so they are set
before (``pipelines.environment``)."""
RUN_LOG_ONLY = {"console": False}
"""``extra`` of a record that goes to the run log (and Prefect's UI) but not the console: a
line that repeats, for those readers, what the console already says."""
PREFECT_RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")
PREFECT_BOOKKEEPING = ("Beginning flow run", "Created task run", "Finished in state Completed")
"""Prefect's engine's INFO lines on its run loggers that repeat ours (a stage ran, the flow began
and ended): the run log keeps them; its other lines (a retry) stay on the console."""
PREFECT_RESTATED = (
    "Finished in state", "Task run failed with", "Encountered exception during execution",
    "Crash detected",
)  # fmt: skip
"""Prefect's engine's ERROR lines on its run loggers when a stage or the flow fails or crashes,
and the flow's closing "Finished in state Failed(...)" (INFO): copies of the error that
``tfm:``'s one line ends the output with (or of the stop its signal line reports). The run log
keeps them; a retry's line ("Task run failed with ... - Retry 1/2 will start", INFO) stays."""


def is_ours(name: str) -> bool:
    """Whether logger ``name`` belongs to this project (or is a Prefect run logger we log to)."""
    return any(name == ours or name.startswith(ours + ".") for ours in OURS)


def for_console(record: logging.LogRecord) -> bool:
    """Without ``-v``: our records, and anyone's errors but Prefect's copies of the command's
    own; not what is for the run log only."""
    if _restates_the_error(record):
        return False
    if record.levelno >= logging.ERROR:
        return True
    if not is_ours(record.name) or not getattr(record, "console", True):
        return False
    return not (
        record.name in PREFECT_RUN_LOGGERS
        and record.levelno < logging.WARNING
        and record.getMessage().startswith(PREFECT_BOOKKEEPING)
    )


def _restates_the_error(record: logging.LogRecord) -> bool:
    if record.name not in PREFECT_RUN_LOGGERS:
        return False
    message = record.getMessage()
    return message.startswith(PREFECT_RESTATED) and (
        record.levelno >= logging.ERROR or message.startswith("Finished in state")
    )


def _without_traceback(record: logging.LogRecord) -> bool:
    record.exc_info, record.exc_text = None, None
    return True


@contextlib.contextmanager
def routed(verbose: bool) -> Iterator[None]:
    """``setup`` for one command; after it the root logger is as it was (tests run many
    commands in one process). The libraries' switches are ``pipelines.environment``'s."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    # Prefect's console handler, which its logging setup puts on the root logger, gives way to
    # the command's: it would print each line twice, or write to the stream it was made with
    # (an earlier test's, closed by now).
    prefects = [h for h in handlers if type(h).__module__.startswith("prefect.")]
    for handler in prefects:
        root.removeHandler(handler)
    setup(verbose)
    try:
        yield
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
            handler.close()
        for handler in prefects:
            root.addHandler(handler)
        root.setLevel(level)
        logging.captureWarnings(False)


def setup(verbose: bool) -> None:
    """First thing a command does: the console handler, and where the libraries' records go."""
    root = logging.getLogger()
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(FORMAT))
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    if verbose:
        return
    handler.addFilter(for_console)
    logging.captureWarnings(True)  # to the "py.warnings" logger: the log, not the console
    # One line per HTTP call to the Prefect API buries the stage log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # A failed task or flow is logged with its traceback; the error's one line ends the output
    # anyway, and -v keeps the tracebacks.
    for name in ("prefect.task_runs", "prefect.flow_runs"):
        logging.getLogger(name).addFilter(_without_traceback)


def log_to(workdir: Path, verbose: bool) -> Path:
    """Write every log record to ``workdir``'s run log from now on; returns the log. Ray Data's
    records follow with ``pipelines.environment.logging_to``."""
    path = workdir / LOG_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    if not any(getattr(h, "baseFilename", None) == str(path.resolve()) for h in root.handlers):
        handler = logging.FileHandler(path, encoding="utf-8")
        handler.setFormatter(logging.Formatter(FORMAT))
        root.addHandler(handler)
    return path


def ray_data_config(log: Path) -> Path:
    """Ray Data's logging config for the run log ``log``, written beside it; returns its path,
    for ``RAY_DATA_LOGGING_CONFIG``."""
    config = log.with_name("ray-data-logging.json")  # JSON is YAML, which Ray Data reads
    config.write_text(json.dumps(ray_data_logging(log.resolve()), indent=1), encoding="utf-8")
    return config.resolve()


def ray_data_logging(log: Path) -> dict:
    """Ray Data's default logging config (ray 2.60) with its console at WARNING and its records
    appended to ``log`` too (by the driver and the local workers: one machine, one file)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"ray": {"format": FORMAT}},
        "filters": {"console_filter": {"()": "ray.data._internal.logging.HiddenRecordFilter"}},
        "handlers": {
            "file": {
                "class": "ray.data._internal.logging.SessionFileHandler",
                "formatter": "ray",
                "filename": "ray-data.log",
            },
            "run_log": {
                "class": "logging.FileHandler",
                "formatter": "ray",
                "level": "INFO",
                "filename": str(log),
                "delay": True,
            },
            "console": {
                "class": "ray._private.log.PlainRayHandler",
                "formatter": "ray",
                "level": "WARNING",
                "filters": ["console_filter"],
            },
        },
        "loggers": {
            "ray.data": {
                "level": "DEBUG",
                "handlers": ["file", "run_log", "console"],
                "propagate": False,
            }
        },
    }
