"""Where a work dir lives: a local folder, or a prefix in an object store (``s3://``, ``gs://``,
or any S3-compatible endpoint), as one pyarrow filesystem and a base path (``open_store``).

Object stores have no atomic rename. A folder there is complete when its manifest, written last,
lists every file with its size (``Store.publish``, ``Store.missing``); publishing first removes
the old manifest and whatever a dead run left, so nothing half-written ever looks complete.
Training workers copy such a folder once per node into a local cache, checked against the
manifest's sizes and hashes (``node_copy``): several workers on one node share one copy.
Credentials come from environment variables (the standard ones, or those a config names), never
from the config or a command line.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from filesystem.location import LocalFileSystem, Location, UriFileSystem
from transformer_core.folders import publish as publish_local
from transformer_core.folders import sha256_file, temporary_sibling

MANIFEST = "manifest.json"
REMOTE_SCHEMES = ("s3", "gs")


class StorageError(RuntimeError):
    """The store cannot be used: the message names the URI (never a secret) and what to check."""


@dataclass(frozen=True, kw_only=True)
class StoreSettings:
    """How to reach an object store; the secrets themselves stay in environment variables."""

    endpoint: str | None = None
    """An S3-compatible endpoint URL (MinIO, SeaweedFS); default ``$AWS_ENDPOINT_URL_S3`` or
    ``$AWS_ENDPOINT_URL``, else AWS itself."""
    region: str | None = None
    """Default ``$AWS_REGION`` or ``$AWS_DEFAULT_REGION``, else us-east-1."""
    access_key_env: str = "AWS_ACCESS_KEY_ID"
    """The environment variable holding the access key id."""
    secret_key_env: str = "AWS_SECRET_ACCESS_KEY"
    """The environment variable holding the secret access key."""
    timeout_seconds: float = 10.0
    """Connect and request timeout of one call: an endpoint that does not answer fails fast."""
    cache_dir: str | None = None
    """This node's folder for its copies of the store's folders, a stage's output before it is
    uploaded, and the run's local files (its log); default ``~/.cache/attention-pipeline``."""

    def cache_root(self) -> Path:
        """``cache_dir``, or the default, as an absolute path on this node."""
        return Path(self.cache_dir or "~/.cache/attention-pipeline").expanduser().resolve()


def is_remote(uri: str | Path) -> bool:
    """Whether ``uri`` names an object store rather than a local folder."""
    return urlsplit(str(uri)).scheme in REMOTE_SCHEMES


@dataclass(frozen=True)
class Store:
    """A work dir's root: ``filesystem`` and the ``base`` path in it; ``uri`` says where (no
    secret), ``endpoint`` which server answers it (None: local, or the cloud's own)."""

    uri: str
    filesystem: pafs.FileSystem
    base: str
    endpoint: str | None = None
    settings: StoreSettings = StoreSettings()

    @property
    def remote(self) -> bool:
        return is_remote(self.uri)

    def path(self, rel: str = "") -> str:
        """The filesystem path of ``rel`` (a '/'-separated path under the root)."""
        return f"{self.base}/{rel}".rstrip("/") if rel else self.base

    def location(self, rel: str = "") -> Location:
        """``rel`` as a ``Location`` (Ray Train's storage): named by its path, as before."""
        path = self.path(rel)
        filesystem = UriFileSystem(self.filesystem) if self.remote else LocalFileSystem()
        return Location(filesystem, path, path)

    def check(self) -> None:
        """Fail in one line unless the root's bucket exists and answers with these credentials."""
        with self.errors("reach"):
            bucket = self.base.split("/", 1)[0]
            if self.remote and self.filesystem.get_file_info(bucket).type == pafs.FileType.NotFound:
                raise StorageError(
                    f"{self.uri}: bucket {bucket!r} does not exist{self._at()}: create it, or "
                    f"check the work dir"
                )
            self.filesystem.get_file_info(pafs.FileSelector(self.base, allow_not_found=True))

    def read_manifest(self, rel: str) -> dict[str, Any] | None:
        """The manifest of folder ``rel``, or None if it has none (or an unreadable one)."""
        with self.errors("read"):
            try:
                with self.filesystem.open_input_stream(self.path(f"{rel}/{MANIFEST}")) as f:
                    return json.loads(f.read())
            except FileNotFoundError:
                return None
            except ValueError:  # half a JSON document, or not JSON
                return None

    def missing(self, rel: str, manifest: Mapping[str, Any] | None = None) -> str | None:
        """What keeps folder ``rel`` from being complete, or None: no manifest, or a file the
        manifest lists that is absent or has another size (``manifest``: if already read)."""
        manifest = manifest if manifest is not None else self.read_manifest(rel)
        if manifest is None:
            return f"{self.uri}/{rel} has no manifest"
        with self.errors("list"):
            selector = pafs.FileSelector(self.path(rel), recursive=True, allow_not_found=True)
            found = {
                info.path[len(self.path(rel)) + 1 :]: info.size
                for info in self.filesystem.get_file_info(selector)
                if info.type == pafs.FileType.File
            }
        for name, info in manifest.get("files", {}).items():
            if name not in found:
                return f"{self.uri}/{rel}/{name} is missing"
            if found[name] != info["bytes"]:
                listed = info["bytes"]
                return f"{self.uri}/{rel}/{name} has {found[name]} bytes, manifest says {listed}"
        return None

    def verify(self, rel: str, manifest: Mapping[str, Any]) -> str | None:
        """``missing``, then every file's sha256 read back from the store against the
        manifest's: what differs, or None (``tfm status --verify``, ``--accept``)."""
        problem = self.missing(rel, manifest)
        if problem is not None:
            return problem
        with self.errors("read"):
            for name, info in manifest.get("files", {}).items():
                if "sha256" not in info:
                    continue
                digest = hashlib.sha256()
                with self.filesystem.open_input_stream(self.path(f"{rel}/{name}")) as f:
                    while chunk := f.read(1 << 22):
                        digest.update(chunk)
                if digest.hexdigest() != info["sha256"]:
                    return f"{self.uri}/{rel}/{name} differs from the sha256 in {MANIFEST}"
        return None

    def publish(self, local: Path, rel: str) -> None:
        """Copy the finished local folder ``local`` (manifest included) to ``rel``, replacing
        what was there: old manifest first, then the rest, the files, and the manifest last."""
        with self.errors("write"):
            target = self.path(rel)
            if self._exists(f"{target}/{MANIFEST}"):  # from here on the old output is incomplete
                self.filesystem.delete_file(f"{target}/{MANIFEST}")
            self.filesystem.delete_dir_contents(target, missing_dir_ok=True)
            files = sorted(p for p in Path(local).rglob("*") if p.is_file() and p.name != MANIFEST)
            for path in [*files, Path(local) / MANIFEST]:
                pafs.copy_files(
                    str(path),
                    f"{target}/{path.relative_to(local).as_posix()}",
                    source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=self.filesystem,
                )

    def write_manifest(self, rel: str, manifest: Mapping[str, Any]) -> None:
        """Replace folder ``rel``'s manifest (one object written whole: readers see the old or
        the new one, never half of either)."""
        with (
            self.errors("write"),
            self.filesystem.open_output_stream(self.path(f"{rel}/{MANIFEST}")) as f,
        ):
            f.write(json.dumps(manifest, indent=2, sort_keys=True).encode("utf-8"))

    def exists(self, rel: str) -> bool:
        """Whether anything is stored under ``rel`` (a folder with or without a manifest)."""
        with self.errors("list"):
            selector = pafs.FileSelector(self.path(rel), allow_not_found=True)
            return bool(self.filesystem.get_file_info(selector))

    def _exists(self, path: str) -> bool:
        return self.filesystem.get_file_info(path).type != pafs.FileType.NotFound

    def _at(self) -> str:
        return f" at {self.endpoint}" if self.endpoint else ""

    @contextlib.contextmanager
    def errors(self, doing: str) -> Iterator[None]:
        """Turn the store's errors into one line naming the URI and what to check."""
        try:
            yield
        except StorageError:
            raise
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise StorageError(f"{self.uri}: could not {doing} it: {explain(exc, self)}") from None


def explain(exc: OSError, store: Store) -> str:
    """What to check, for an object store's error (AWS SDK error names, as pyarrow reports them)."""
    text = str(exc)
    keys = f"${store.settings.access_key_env} and ${store.settings.secret_key_env}"
    if re.search(
        r"ACCESS_DENIED|SIGNATURE_DOES_NOT_MATCH|INVALID_ACCESS_KEY|HTTP status 403", text
    ):
        return f"the store refused the credentials in {keys}: check them"
    if re.search(r"NETWORK_CONNECTION|curlCode|Could not connect|timed out|Timeout", text):
        where = store.endpoint or "the store's endpoint"
        return (
            f"{where} does not answer: check storage.endpoint (or $AWS_ENDPOINT_URL) and that "
            "the server runs"
        )
    if "NO_SUCH_BUCKET" in text:
        return "the bucket does not exist: create it, or check the work dir"
    return text.splitlines()[0]


def root_of(where: str | Path) -> str:
    """What a work dir's text names: an object store's URI (without a trailing '/') or the
    absolute local folder (resolved from the CWD); a StorageError for another scheme."""
    text = str(where)
    if is_remote(text):
        return text.rstrip("/")
    if "://" in text:
        scheme = urlsplit(text).scheme
        raise StorageError(f"{text}: unsupported scheme {scheme!r} (use a path, s3:// or gs://)")
    return str(Path(text).resolve())


def open_store(uri: str | Path, settings: StoreSettings = StoreSettings()) -> Store:
    """The ``Store`` for a work dir: a local path (resolved from the CWD), ``s3://bucket/prefix``
    or ``gs://bucket/prefix``. Builds the client only; ``Store.check`` asks the server."""
    text = str(uri)
    parts = urlsplit(text)
    if parts.scheme not in REMOTE_SCHEMES:
        base = root_of(text)
        return Store(base, pafs.LocalFileSystem(), base, None, settings)
    if not parts.netloc:
        raise StorageError(f"{text}: no bucket (use {parts.scheme}://bucket/prefix)")
    if parts.username or parts.password or parts.query:
        raise StorageError(
            f"{parts.scheme}://{parts.hostname}{parts.path}: the URI holds credentials or options; "
            "put credentials in environment variables and the endpoint in storage.endpoint"
        )
    base = f"{parts.netloc}{parts.path}".rstrip("/")
    if parts.scheme == "gs":  # credentials: $GOOGLE_APPLICATION_CREDENTIALS, as Google's SDKs
        return Store(text.rstrip("/"), pafs.GcsFileSystem(), base, None, settings)
    return _s3_store(text.rstrip("/"), base, settings)


def _s3_store(uri: str, base: str, settings: StoreSettings) -> Store:
    env = os.environ
    key, secret = env.get(settings.access_key_env), env.get(settings.secret_key_env)
    for name, value in ((settings.access_key_env, key), (settings.secret_key_env, secret)):
        if value is None and name not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            raise StorageError(
                f"{uri}: the environment variable ${name} (storage settings) is not set"
            )
    endpoint = settings.endpoint or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    options: dict[str, Any] = {
        "region": settings.region
        or env.get("AWS_REGION")
        or env.get("AWS_DEFAULT_REGION")
        or "us-east-1",
        "connect_timeout": settings.timeout_seconds,
        "request_timeout": settings.timeout_seconds,
    }
    if key is not None and secret is not None:
        options.update(access_key=key, secret_key=secret)
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        if not host:
            raise StorageError(f"{uri}: storage.endpoint {endpoint!r} needs http:// or https://")
        options.update(endpoint_override=host.rstrip("/"), scheme=scheme)
    return Store(uri, pafs.S3FileSystem(**options), base, endpoint, settings)


def node_copy(store: Store, rel: str, cache_root: Path) -> Path:
    """A local copy of the complete store folder ``rel``, made once per node under
    ``cache_root`` and checked against its manifest (sizes and sha256); later calls, from any
    process on this node, reuse it. A local store's folder is returned as it is."""
    if not store.remote:
        return Path(store.path(rel))
    manifest = store.read_manifest(rel)
    problem = store.missing(rel, manifest)
    if manifest is None or problem:
        raise StorageError(f"{problem}: run the stage that writes it first")
    folder = Path(cache_root) / manifest.get("fingerprint", "unversioned") / rel.replace("/", "_")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process fills; the others wait, then reuse it
        if _matches(folder, manifest):
            return folder
        tmp = temporary_sibling(folder)
        try:
            _download(store, rel, manifest, tmp)
            publish_local(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _matches(folder: Path, manifest: Mapping[str, Any]) -> bool:
    """A cached copy is reused when its manifest lists the same files and its files have their
    sizes (the hashes were checked when it was filled); a manifest that only gained an
    acceptance is copied over the cached one."""
    try:
        cached = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    same = cached.get("files") == manifest.get("files") and cached.get(
        "fingerprint"
    ) == manifest.get("fingerprint")
    if same and cached != manifest:
        (folder / MANIFEST).write_text(
            json.dumps(manifest, indent=2, sort_keys=True), encoding="utf-8"
        )
    return same and all(
        (folder / name).is_file() and (folder / name).stat().st_size == info["bytes"]
        for name, info in manifest.get("files", {}).items()
    )


def _download(store: Store, rel: str, manifest: Mapping[str, Any], tmp: Path) -> None:
    with store.errors("read"):
        for name, info in manifest.get("files", {}).items():
            local = tmp / name
            local.parent.mkdir(parents=True, exist_ok=True)
            pafs.copy_files(
                store.path(f"{rel}/{name}"),
                str(local),
                source_filesystem=store.filesystem,
                destination_filesystem=pafs.LocalFileSystem(),
            )
            if "sha256" in info and sha256_file(local) != info["sha256"]:
                raise StorageError(
                    f"{store.uri}/{rel}/{name} does not match its manifest's sha256: rerun the "
                    "stage that writes it"
                )
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True), encoding="utf-8")


@dataclass(frozen=True)
class StoredFolder:
    """A complete folder of a store, as a Ray worker is handed it: each node copies it once into
    its cache (``node_copy``) and reads the copy, at the same path as every other node (the
    driver's ``cache_root``); a local store's folder is read where it is."""

    store: Store
    rel: str
    cache_root: str
    fingerprint: str | None = None
    """The manifest's fingerprint the reader expects: a copy of it already on this node is
    used without asking the store (a Ray worker calls ``local`` once per batch)."""

    def open_input_file(self, name: str) -> Any:  # a pyarrow NativeFile: pyarrow ships no types
        """File ``name`` of the folder, read straight from the store (seekable: a Parquet reader
        fetches only the footer and the row groups it reads)."""
        with self.store.errors("read"):
            return self.store.filesystem.open_input_file(self.store.path(f"{self.rel}/{name}"))

    def local(self) -> Path:
        """This node's copy (made now if this node has none)."""
        if self.fingerprint is not None and self.store.remote:
            have = Path(self.cache_root) / self.fingerprint / self.rel.replace("/", "_")
            mine = _read_json(have / MANIFEST)
            if (
                mine is not None
                and mine.get("fingerprint") == self.fingerprint
                and _matches(have, mine)
            ):
                return have
        return node_copy(self.store, self.rel, Path(self.cache_root))

    def __truediv__(self, rel: str) -> StoredPath:
        return StoredPath(self, rel)


@dataclass(frozen=True)
class StoredPath:
    """A file or folder inside a ``StoredFolder`` (``folder / "name"``; ``rel`` empty: the folder
    itself), as a Ray worker is handed it: ``local`` is this node's copy."""

    folder: StoredFolder
    rel: str = ""

    def local(self) -> Path:
        """This node's copy (the whole folder copied first, once per node)."""
        root = self.folder.local()
        return root / self.rel if self.rel else root


def on_this_node(path: str | Path | StoredPath) -> Path:
    """``path`` on the node that asks: a local path as it is, a stored one as this node's copy.
    Libraries that hand paths to Ray workers take either and call this on the worker's side."""
    return path.local() if isinstance(path, StoredPath) else Path(path)


def folder_at(path: str | Path) -> StoredFolder:
    """A local folder as a worker is handed one: read where it is (a local work dir's input)."""
    folder = Path(path).resolve()
    return StoredFolder(open_store(folder.parent), folder.name, "")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
