"""The house's size limits, measured one way for every room: production code, benchmarks/ and
tests/ (tests/unit/test_architecture.py, tests/unit/test_house_sizes.py)."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

MAX_FUNCTION_LINES = 80
MAX_TEST_LINES = 100  # a test reads as one scenario on a screen or two (STYLE.md)
MAX_MODULE_LINES = 450  # as `ruff format` writes them (make lint checks the format)


def long_functions(
    source: str, limit: int, counts: Callable[[str], bool] = lambda name: True
) -> list[str]:
    """``name (n lines)`` of each function in ``source`` over ``limit`` lines whose name
    ``counts``, nested functions and methods included."""
    return [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > limit
        and counts(node.name)
    ]


def module_lines(path: Path) -> int:
    return path.read_text(encoding="utf-8").count("\n")
