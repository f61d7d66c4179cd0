"""Where a run's work dir is, from the text a config gives: a local folder or an object store's
prefix (told apart here, in ``workdir`` and in ``workdir_store`` alone), this node's folder for
the run, and the store's client. Below ``config``, which keeps the text and asks these."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from filesystem.storage import StorageError, Store, StoreSettings, is_remote, open_store, root_of
from transformer_core.config_checks import ConfigError


def workdir_of(template: str | Path, name: str) -> str:
    """``workdir`` as written (``{name}`` for the run name): the absolute folder it names, or
    the store URI it names (without a trailing '/'); a ConfigError for another scheme."""
    text = str(template).format(name=name)
    try:
        return root_of(text)
    except StorageError:
        raise ConfigError(
            "workdir", f"{text!r}: use a local path, s3://bucket/prefix or gs://bucket/prefix"
        ) from None


def node_folder_suffix(workdir: str) -> str:
    """What ends the name of this node's folder for a work dir on an object store (its URI's
    digest): how a run's local files are found from the URI alone."""
    return hashlib.sha256(workdir.encode()).hexdigest()[:8]


def run_root(workdir: str, name: str, settings: StoreSettings) -> Path:
    """This node's folder for run ``name``: the work dir itself, or with a work dir on an object
    store, the folder for the run's local files (its log, caches, staging) under
    ``settings.cache_dir``."""
    if not is_remote(workdir):
        return Path(workdir)
    return settings.cache_root() / "runs" / f"{name}-{node_folder_suffix(workdir)}"


@functools.lru_cache(maxsize=8)
def store_at(workdir: str, settings: StoreSettings) -> Store:
    """The work dir as a ``Store`` (its client, built once per process)."""
    return open_store(workdir, settings)


def holds_files(workdir: str) -> bool:
    """Whether a file that must be shared (MLflow's SQLite database) can live in the work dir:
    a folder can, an object store's prefix cannot."""
    return not is_remote(workdir)


def run_folders_at(target: str) -> tuple[Store, list[Path]]:
    """A work dir named alone, without its config (``tfm tracking replay <workdir>``): its store,
    reached with the default settings, and this node's folders for it (a local folder itself;
    for an object store's URI, each of this node's folders under the default cache, or a new
    one if it has none)."""
    workdir, settings = workdir_of(target, ""), StoreSettings()
    store = open_store(workdir, settings)
    if not is_remote(workdir):
        return store, [Path(workdir)]
    runs, where = settings.cache_root() / "runs", node_folder_suffix(workdir)
    return store, sorted(runs.glob(f"*-{where}")) or [runs / f"replay-{where}"]
