"""The real data samples in ``../shared/data`` beside the checkout, for the tests that need them.

A test marked ``@pytest.mark.shared_data("multi30k/data/task1/raw")`` (or a module with that
``pytestmark``) runs only where that path is; elsewhere it is skipped with one line, except in CI
(``CI=true``), where it fails: a CI run without the data must not pass by skipping them, as the
network-namespace tests' ``require_hosts`` does for their hosts.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
"""``../shared/data`` next to the project checkout."""


def require_shared_data(relative: str, root: Path = SHARED_DATA) -> Path:
    """``root / relative`` if it exists; else skip the test with one line why, or fail it in CI."""
    path = root / relative
    if path.exists():
        return path
    required_in_ci(
        "tests that need shared data",
        f"{path} is absent (the real data samples, see ../shared/data/README.md)",
    )


def required_in_ci(what: str, reason: str) -> NoReturn:
    """Skip the test with one line why; in CI (``CI=true``) fail it instead: ``what`` must run
    there."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} must run in CI: {reason}", pytrace=False)
    pytest.skip(reason)
