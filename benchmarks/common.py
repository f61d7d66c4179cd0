"""Shared by the benchmark scripts: print a table of results and optionally save it as JSON."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import torch

# Vocabulary per model size: the quickstart's 1,000 pieces for debug (with 37k its output layer
# would be all there is to measure), the paper's 37k shared En-De BPE for the real sizes.
VOCAB_SIZES = {"debug": 1_000}


def vocab_for(size: str) -> int:
    """The vocabulary size the benchmarks use for a model preset."""
    return VOCAB_SIZES.get(size, 37_000)


def report(title: str, rows: list[dict], json_path: str | Path | None = None) -> None:
    """Print ``rows`` (dicts with the same keys) as an aligned table; with ``json_path``, also
    write {"title", "environment", "rows"} there."""
    env = environment()
    print(f"\n{title}\n({', '.join(f'{k}={v}' for k, v in env.items())})")
    if rows:
        columns = list(rows[0])
        cells = [[_format(row.get(c)) for c in columns] for row in rows]
        widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
        print("  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True)))
        for r in cells:
            print("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)))
    if json_path is not None:
        payload = {"title": title, "environment": env, "rows": rows}
        Path(json_path).write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {json_path}")


def environment() -> dict:
    """Where the figures were measured: they mean little without it."""
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        # Other jobs on the machine skew CPU figures; the load average says how much.
        "load_avg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def _format(value: object) -> str:
    if isinstance(value, float):
        # 4 significant digits: a BLEU of 39.35 must not print as 39.4.
        return f"{value:,.4g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def parse_overrides(items: list[str]) -> dict[str, object]:
    """``--set key.path=value`` pairs, values read as YAML (``3`` an int, ``true`` a bool), as
    ``tfm --set``."""
    import yaml

    pairs = [item.partition("=") for item in items]
    bad = [item for item, (_, sep, _) in zip(items, pairs, strict=True) if not sep]
    if bad:
        raise SystemExit(f"--set {bad[0]!r}: expected key.path=value")
    return {key: yaml.safe_load(value) for key, _, value in pairs}


def best_tokens(model, src, **settings) -> list[list[int]]:
    """Our search's best output ids per source row, with these ``SearchSettings`` (greedy loop:
    ``greedy=True, beam_size=1``)."""
    from transformer_core.search import SearchSettings, search

    return [hyps[0].tokens for hyps in search(model, src, SearchSettings(**settings))]
