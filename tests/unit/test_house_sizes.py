"""benchmarks/ and tests/ under the house's size limits (STYLE.md): a benchmark is code like any
other (no file over 450 lines as formatted, no function over 80), and a test reads as one
scenario (no test function over 100 lines)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.code_size import (
    MAX_FUNCTION_LINES,
    MAX_MODULE_LINES,
    MAX_TEST_LINES,
    long_functions,
    module_lines,
)

ROOT = Path(__file__).resolve().parents[2]


def _ids(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", sorted((ROOT / "benchmarks").rglob("*.py")), ids=_ids)
def test_benchmark_functions_and_files_stay_small(path: Path):
    long = long_functions(path.read_text(encoding="utf-8"), MAX_FUNCTION_LINES)
    assert not long, f"{_ids(path)}: functions over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"
    lines = module_lines(path)
    assert lines <= MAX_MODULE_LINES, f"{_ids(path)}: {lines} lines (limit {MAX_MODULE_LINES})"


@pytest.mark.parametrize("path", sorted((ROOT / "tests").rglob("test_*.py")), ids=_ids)
def test_no_test_function_is_over_a_hundred_lines(path: Path):
    source = path.read_text(encoding="utf-8")
    long = long_functions(source, MAX_TEST_LINES, lambda name: name.startswith("test"))
    assert not long, f"{_ids(path)}: tests over {MAX_TEST_LINES} lines: {', '.join(long)}"


def test_the_size_check_sees_a_long_test_and_a_long_helper():
    body = "".join(f"    x = {i}\n" for i in range(101))
    source = f"def test_long():\n{body}\ndef helper():\n{body}\ndef test_short():\n    pass\n"
    assert long_functions(source, MAX_TEST_LINES, lambda name: name.startswith("test")) == [
        "test_long (102 lines)"
    ]
    assert len(long_functions(source, MAX_FUNCTION_LINES)) == 2
