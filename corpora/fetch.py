"""Downloads that survive flaky links: resume over HTTP Range, retry with backoff, verify, pin.

``download(url, dest, expected)`` writes ``<dest>.part`` and renames it to ``dest`` only after its
size and checksums verify, so a file under its final name is always complete
(``corpora.lockfile`` pins what nobody publishes a checksum for). ``mirror_url`` maps a source's
URLs (statmt.org's unless told another base) onto a mirror. A URL's ``user:password@`` is sent
as HTTP basic auth and named nowhere: logs, errors and the ``.part`` companion see the URL
without it.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from corpora import CorpusError
from filesystem.redact import redact_uri
from transformer_core.folders import write_json_atomic

__all__ = [
    "ChecksumError",
    "DownloadError",
    "Expected",
    "Seen",
    "download",
    "file_url_path",
    "hash_file",
    "mirror_url",
    "verify",
]

log = logging.getLogger(__name__)

CHUNK = 1 << 20
MAX_BACKOFF = 60.0
USER_AGENT = "attention-pipeline-download/1"
STATMT_PREFIXES = (
    "https://www.statmt.org/",
    "http://www.statmt.org/",
    "https://statmt.org/",
    "http://statmt.org/",
)
# 4xx answers that no retry will fix.
_PERMANENT = {400, 401, 403, 404, 405, 410, 451}


class DownloadError(CorpusError):
    """A download failed for good: a permanent HTTP error, or every retry used up."""


class NetworkError(DownloadError):
    """The network failed through every retry: unlike the other download errors, a later attempt
    may succeed, so this is the one a flow retries."""


class ChecksumError(DownloadError):
    """A downloaded file's size or checksum differs from what the registry or lock file expects."""


@dataclass(frozen=True)
class Expected:
    """What a file must be; ``None`` fields are not checked."""

    bytes: int | None = None
    """Size in bytes."""
    sha256: str | None = None
    """Hex sha256."""
    md5: str | None = None
    """Hex md5."""
    origin: str = "the registry"
    """Who expects it (named in errors)."""
    remedy: str = "The download is corrupt or the file changed upstream; nothing was kept."
    """What a mismatch error tells the user to do."""


@dataclass(frozen=True)
class Seen:
    """What a downloaded file turned out to be."""

    bytes: int
    sha256: str
    md5: str


# ----------------------------------------------------------------------------- mirrors


def mirror_url(url: str, mirror: str | None, bases: Sequence[str] = STATMT_PREFIXES) -> str:
    """``url`` with its base replaced by ``mirror`` (the path after the base is kept).

    ``bases`` are the URL prefixes a mirror stands in for: statmt.org's by default; a source
    published elsewhere passes its own (Multi30k: its repository's raw-file root).
    """
    if not mirror:
        return url
    if not mirror.startswith(("file://", "http://", "https://")):
        raise CorpusError(
            f"data.mirror {redact_uri(mirror)!r} must be a file:// folder or an http(s):// base"
        )
    for prefix in bases:
        if url.startswith(prefix):
            return mirror.rstrip("/") + "/" + url[len(prefix) :]
    return url


def file_url_path(url: str) -> Path:
    """The local path of a ``file://`` URL."""
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise CorpusError(f"{url}: file:// URLs must name a local path (file:///abs/path)")
    return Path(urllib.request.url2pathname(parts.path))


# ----------------------------------------------------------------------------- verification


def hash_file(path: Path) -> Seen:
    """Size, sha256 and md5 of a file, in one streamed pass."""
    sha, md5, size = hashlib.sha256(), hashlib.md5(usedforsecurity=False), 0
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            sha.update(block)
            md5.update(block)
            size += len(block)
    return Seen(size, sha.hexdigest(), md5.hexdigest())


def verify(url: str, seen: Seen, expected: Iterable[Expected]) -> None:
    """Raise ``ChecksumError`` naming the field and who expected otherwise, on any mismatch."""
    for exp in expected:
        for name in ("bytes", "sha256", "md5"):
            want = getattr(exp, name)
            got = getattr(seen, name)
            if want is not None and (str(want).lower() != str(got).lower()):
                raise ChecksumError(
                    f"{url}: {name} is {got}, but {exp.origin} expects {want}. {exp.remedy}"
                )


# ----------------------------------------------------------------------------- download


def progress_enabled() -> bool:
    """Byte progress bars only for a person at a terminal (not logs, not CI)."""
    return sys.stderr.isatty() and os.environ.get("CI", "").lower() != "true"


def download(
    url: str,
    dest: Path,
    expected: Iterable[Expected] = (),
    *,
    max_retries: int = 5,
    backoff: float = 1.0,
    timeout: float = 60.0,
) -> Seen:
    """Fetch ``url`` (http(s) or file) to ``dest`` unless a verified copy is already there.

    HTTP downloads resume from ``<dest>.part`` with a Range request after a dropped connection;
    failures without progress are retried ``max_retries`` times with exponential backoff.
    Credentials in ``url`` are sent as basic auth; messages name the URL without them.
    """
    dest = Path(dest)
    url, opener = _without_credentials(url)
    expected = [e for e in expected if e is not None]
    if dest.exists():
        seen = hash_file(dest)
        try:
            verify(url, seen, expected)
            log.info("%s: cached at %s", url, dest)
            return seen
        except ChecksumError as exc:
            log.warning("cached %s does not verify (%s); downloading it again", dest, exc)
            dest.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    for fresh_try in (False, True):
        if fresh_try:
            _discard(part)
        resumed = _fetch(
            url, part, opener, max_retries=max_retries, backoff=backoff, timeout=timeout
        )
        seen = hash_file(part)
        try:
            verify(url, seen, expected)
        except ChecksumError:
            _discard(part)
            if resumed and not fresh_try:
                # A resumed file can splice two versions of a changing file; try once whole.
                log.warning("%s: resumed download does not verify; downloading it whole", url)
                continue
            raise
        os.replace(part, dest)
        _meta_path(part).unlink(missing_ok=True)
        return seen
    raise AssertionError("unreachable")  # pragma: no cover


def _without_credentials(url: str) -> tuple[str, urllib.request.OpenerDirector]:
    """``url`` without its ``user:password@``, and the opener that sends them as basic auth with
    the first request (not after a 401 challenge; never to a host a redirect points at)."""
    parts = urlsplit(url)
    if parts.username is None:
        return url, urllib.request.build_opener()
    bare = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    passwords = urllib.request.HTTPPasswordMgrWithPriorAuth()
    passwords.add_password(
        None, bare, unquote(parts.username), unquote(parts.password or ""), is_authenticated=True
    )
    return bare, urllib.request.build_opener(urllib.request.HTTPBasicAuthHandler(passwords))


def _fetch(
    url: str,
    part: Path,
    opener: urllib.request.OpenerDirector,
    *,
    max_retries: int,
    backoff: float,
    timeout: float,
) -> bool:
    """Bring ``part`` to the whole file; True if it was resumed rather than fetched whole."""
    scheme = urlsplit(url).scheme
    if scheme == "file":
        _copy_file(url, part)
        return False
    if scheme not in ("http", "https"):
        raise DownloadError(f"{url}: unsupported URL scheme {scheme!r} (http, https or file)")
    failures = 0
    resumed = False
    while True:
        before = part.stat().st_size if part.exists() else 0
        try:
            if _fetch_once(url, part, opener, timeout=timeout):
                resumed = True
            return resumed
        except _Retryable as exc:
            after = part.stat().st_size if part.exists() else 0
            if after > before:
                # Progress was made: resume at once and do not count it as a failure.
                log.warning("%s: %s after %d bytes; resuming", url, exc.reason, after)
                failures = 0
                continue
            failures += 1
            if failures >= max_retries:
                raise NetworkError(
                    f"{url}: giving up after {failures} attempts without progress: {exc.reason}"
                ) from None
            delay = min(MAX_BACKOFF, backoff * 2 ** (failures - 1))
            log.warning(
                "%s: %s; retry %d/%d in %.1fs", url, exc.reason, failures, max_retries - 1, delay
            )
            time.sleep(delay)


class _Retryable(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


def _fetch_once(
    url: str, part: Path, opener: urllib.request.OpenerDirector, *, timeout: float
) -> bool:
    """One request; appends to ``part`` on 206, rewrites it on 200. True if it resumed."""
    have = part.stat().st_size if part.exists() else 0
    meta = _read_meta(part)
    if have and meta.get("url") != url:
        _discard(part)
        have, meta = 0, {}
    response = _request(opener, url, part, have, meta.get("validator"), timeout)
    if response is None:
        return True  # the part file was already whole
    with response:
        resumed, have, total = _accept_response(url, part, response, have)
        written = have
        try:
            with open(part, "ab" if resumed else "wb") as f, _progress(part, total, have) as bar:
                while block := response.read(CHUNK):
                    f.write(block)
                    written += len(block)
                    bar.update(len(block))
        except (http.client.HTTPException, OSError) as exc:
            raise _Retryable(f"connection lost ({type(exc).__name__})") from None
        if total is not None and written != total:
            raise _Retryable(f"connection closed at byte {written} of {total}")
    return resumed


def _request(
    opener: urllib.request.OpenerDirector,
    url: str,
    part: Path,
    have: int,
    validator: str | None,
    timeout: float,
) -> Any:
    """The response for the bytes from ``have`` on, or None when the part file is already whole."""
    headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
        if validator:
            headers["If-Range"] = validator
    try:
        return opener.open(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 416 and have:
            if _total_from_range(exc.headers.get("Content-Range")) == have:
                return None
            _discard(part)
            raise _Retryable(f"HTTP 416 for a range from byte {have}; starting over") from None
        if exc.code in _PERMANENT:
            raise DownloadError(f"{url}: HTTP {exc.code} {exc.reason}") from None
        raise _Retryable(f"HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        raise _Retryable(f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}") from None


def _accept_response(
    url: str, part: Path, response: Any, have: int
) -> tuple[bool, int, int | None]:
    """``(resumed, bytes kept, total or None)`` for a response: a 206 continuing at ``have``, or
    a 200 that starts the file over."""
    if response.status == 206:
        match = _CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
        if not match or int(match.group(1)) != have:
            _discard(part)
            raise _Retryable(
                f"bad Content-Range {response.headers.get('Content-Range')!r} for byte {have}"
            )
        return True, have, None if match.group(3) == "*" else int(match.group(3))
    # 200: a first request, or the server ignored Range / the file changed (If-Range).
    if have:
        log.info("%s: server sent the whole file; starting over", url)
    length = response.headers.get("Content-Length")
    _write_meta(part, url, response.headers)
    return False, 0, int(length) if length and length.isdigit() else None


def _copy_file(url: str, part: Path) -> None:
    source = file_url_path(url)
    if not source.is_file():
        raise DownloadError(f"{url}: no such file {source} (is the mirror folder complete?)")
    total = source.stat().st_size
    with open(source, "rb") as src, open(part, "wb") as dst, _progress(part, total, 0) as bar:
        while block := src.read(CHUNK):
            dst.write(block)
            bar.update(len(block))


def _progress(part: Path, total: int | None, initial: int) -> Any:
    from tqdm import tqdm

    name = part.name.removesuffix(".part")
    return tqdm(
        total=total,
        initial=initial,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=name,
        disable=not progress_enabled(),
        leave=False,
    )


def _total_from_range(value: str | None) -> int | None:
    match = re.match(r"bytes\s+(?:\*|\d+-\d+)/(\d+)", value or "")
    return int(match.group(1)) if match else None


# The .part file's companion records which URL it came from and the server's validator, so a
# resume never splices bytes of another file (If-Range makes a changed file come back whole).


def _meta_path(part: Path) -> Path:
    return part.with_name(part.name + ".json")


def _read_meta(part: Path) -> dict[str, Any]:
    try:
        return json.loads(_meta_path(part).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _write_meta(part: Path, url: str, headers: Any) -> None:
    etag = headers.get("ETag")
    validator = etag if etag and not etag.startswith("W/") else headers.get("Last-Modified")
    write_json_atomic(_meta_path(part), {"url": url, "validator": validator})


def _discard(part: Path) -> None:
    part.unlink(missing_ok=True)
    _meta_path(part).unlink(missing_ok=True)
