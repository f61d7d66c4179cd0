"""Credentials out of URIs before they leave the process: ``redact_uri`` masks the password of a
``scheme://user:password@host`` URI (a mirror, a tracking server) and ``redacted`` every such
string in a config or stats, wherever they are logged, written to a manifest or an artifact, or
logged to MLflow. Here in ``filesystem``, below every layer that handles URLs (the fetcher's
mirrors, the tracking server, the store), so that they all share one function.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = ["MASK", "redact_text", "redact_uri", "redacted", "without_credentials"]

MASK = "***"
_IN_TEXT = re.compile(r"\b([a-zA-Z][\w+.-]*://)([^/@\s]+)@")


def redact_uri(value: str) -> str:
    """``value`` with a URI's password masked (``user:***@``); a user name without a password is
    masked whole (``***@``: it is often a token); any other string comes back unchanged."""
    if "@" not in value or "://" not in value:
        return value
    try:
        parts = urlsplit(value)
        user, password = parts.username, parts.password
    except ValueError:  # unparseable (a stray "["): mask all before the last "@"
        scheme, _, rest = value.partition("://")
        return f"{scheme}://{MASK}@{rest.rpartition('@')[2]}"
    if user is None:
        return value
    masked = f"{user}:{MASK}" if password is not None else MASK
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{masked}@{host}"))


def without_credentials(value: str) -> str:
    """``value`` with a URI's ``user:password@`` removed (what names a server, as a tracking
    journal records it); any other string comes back unchanged."""
    if "@" not in value or "://" not in value:
        return value
    parts = urlsplit(value)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def redact_text(text: str) -> str:
    """Free text (an error message, a log line) with every URI's credentials in it masked as
    ``redact_uri`` masks them."""

    def mask(match: re.Match[str]) -> str:
        user, colon, _ = match.group(2).partition(":")
        return f"{match.group(1)}{f'{user}:{MASK}' if colon else MASK}@"

    return _IN_TEXT.sub(mask, text)


def redacted(data: Any) -> Any:  # Any: JSON values in, the same shape out
    """``data`` (JSON-ready: dicts, lists, scalars) with ``redact_uri`` applied to every string;
    data without credentials comes back equal, so fingerprints of it do not change."""
    if isinstance(data, str):
        return redact_uri(data)
    if isinstance(data, Mapping):
        return {key: redacted(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        items = [redacted(value) for value in data]
        return items if isinstance(data, list) else tuple(items)
    return data
