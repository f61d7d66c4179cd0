"""The one gate of the tests that need ../shared/data: skipped without it, failed in CI."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.shared_data import require_shared_data


def test_missing_shared_data_skips_outside_ci_and_fails_in_ci(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"multi30k is absent"):
        require_shared_data("multi30k", root=tmp_path)
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        require_shared_data("multi30k", root=tmp_path)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"must run in CI: .*multi30k is absent"):
        require_shared_data("multi30k", root=tmp_path)


def test_present_shared_data_is_returned_in_ci_and_out(tmp_path: Path, monkeypatch):
    (tmp_path / "ptb_sample" / "combined").mkdir(parents=True)
    for ci in ("true", ""):
        monkeypatch.setenv("CI", ci)
        assert (
            require_shared_data("ptb_sample/combined", root=tmp_path)
            == tmp_path / "ptb_sample" / "combined"
        )
