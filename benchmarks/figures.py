"""The figures' one home: benchmarks/figures/*.json, written by the benchmarks that make targets
run (``record``) and rendered into docs/benchmarks.md's results table and README.md's recipe
table, which ``make lint`` holds to them.

A row: ``id`` (its anchor, ``docs/benchmarks.md#<id>``, where other pages link instead of
repeating the figure), ``what`` was measured, the ``figure``, the ``command`` that measured it,
its ``date``, the ``machine`` (CPU or GPU model) and the ``commit`` it ran at (null for figures
measured before the files existed); a recipe row also says how long the recipe takes (``time``).

    .venv/bin/python benchmarks/figures.py           # check: exit 1, a line per stale table
    .venv/bin/python benchmarks/figures.py --write   # write both tables from the files
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURES = Path("benchmarks/figures")
RECIPES = "recipes"
"""The file whose rows are README.md's recipe table (and rows of the results table too)."""
ORDER = ("train", "data", "peers", "store", "decode", "serve", RECIPES, "gpu", "gpu_recipe")
"""The files, in the order of their rows in the results table."""
PAGES = {Path("docs/benchmarks.md"): "results", Path("README.md"): "recipes"}
"""Each page that holds a generated table, and which."""
WRITE = ".venv/bin/python benchmarks/figures.py --write"
BEGIN = "<!-- {} table: written by benchmarks/figures.py from benchmarks/figures/*.json -->"
END = "<!-- end of the {} table -->"


def load(root: Path = ROOT) -> dict[str, list[dict]]:
    """Every file's rows, by file name (no ``.json``), in ``ORDER``; an unknown file is an error."""
    found = {p.stem: p for p in sorted((root / FIGURES).glob("*.json"))}
    unknown = sorted(set(found) - set(ORDER))
    if unknown:
        raise ValueError(f"{FIGURES}: files not in figures.ORDER: {', '.join(unknown)}")
    return {
        name: json.loads(found[name].read_text(encoding="utf-8"))["rows"]
        for name in ORDER
        if name in found
    }


def cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def results_table(files: dict[str, list[dict]]) -> list[str]:
    """Every row of every file: what, figure, command, date, machine."""
    lines = ["| what | figure | command | date | machine |", "|---|---|---|---|---|"]
    for rows in files.values():
        for r in rows:
            what = f'<a id="{r["id"]}"></a>{cell(r["what"])}'
            lines.append(
                f"| {what} | {cell(r['figure'])} | `{cell(r['command'])}` | {r['date']} "
                f"| {cell(r['machine'])} |"
            )
    return lines


def recipes_table(files: dict[str, list[dict]]) -> list[str]:
    """The recipes file's rows: the recipe, its command, what it gives and how long it takes."""
    lines = ["| recipe | command | what you get | time |", "|---|---|---|---|"]
    for r in files.get(RECIPES, []):
        measured = ", ".join(cell(r[k]) for k in ("date", "machine") if r[k] not in ("", "—"))
        link = f"[{measured if r['date'] != '—' else 'its row'}](docs/benchmarks.md#{r['id']})"
        lines.append(
            f"| {cell(r['what'])} | `{cell(r['command'])}` | {cell(r['figure'])} "
            f"| {cell(r['time'])} ({link}) |"
        )
    return lines


TABLES = {"results": results_table, "recipes": recipes_table}


def render(page: str, name: str, files: dict[str, list[dict]]) -> str:
    """``page`` with the text between its ``name`` table's markers written anew."""
    begin, end = BEGIN.format(name), END.format(name)
    head, found, rest = page.partition(begin + "\n")
    if not found or end not in rest:
        raise ValueError(f"no {begin!r} ... {end!r} markers")
    tail = rest[rest.index(end) :]
    return head + begin + "\n" + "\n".join(TABLES[name](files)) + "\n" + tail


def stale(root: Path = ROOT) -> list[str]:
    """The pages whose table differs from what the files say (one line each)."""
    files = load(root)
    found = []
    for path, name in PAGES.items():
        text = (root / path).read_text(encoding="utf-8")
        if render(text, name, files) != text:
            found.append(f"{path}: the {name} table differs from {FIGURES}: run {WRITE}")
    return found


def write(root: Path = ROOT) -> None:
    files = load(root)
    for path, name in PAGES.items():
        page = root / path
        page.write_text(render(page.read_text(encoding="utf-8"), name, files), encoding="utf-8")


# ----------------------------------------------------------------------------- recording


ISA = (
    ("avx2", "AVX2"),
    ("avx512f", "AVX-512"),
    ("avx512_bf16", "AVX512-BF16"),
    ("amx_bf16", "AMX"),
)
"""The CPU flags that change which float kernels run (and so speeds, and scores in their last
digits), as the docs name them."""


def machine(cpuinfo: str | None = None) -> str:
    """The GPU's model where torch sees one, else the CPU's cores, model and instruction sets
    (``ISA``) from ``cpuinfo`` (``/proc/cpuinfo``'s text; read here when None)."""
    torch = sys.modules.get("torch")
    if cpuinfo is None and torch is not None and torch.cuda.is_available():
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields = dict(
        (key.strip(), value.strip())
        for key, _, value in (line.partition(":") for line in cpuinfo.splitlines())
        if key.strip() in ("model name", "flags", "cpu family", "model")
    )  # the first processor's: later ones overwrite with the same
    model = fields.get("model name") or platform.processor() or platform.machine()
    if not any(c.isdigit() for c in model) and fields.get("cpu family", "").isdigit():
        # A VM's name without a number ("AMD EPYC") hides the generation: family and model say it.
        model += f", family {fields['cpu family']} model {fields.get('model', '?')}"
    flags = set(fields.get("flags", "").split())
    sets = [name for flag, name in ISA if flag in flags]
    return f"{os.cpu_count()}-core {model}" + (f" ({', '.join(sets)})" if sets else "")


def commit(root: Path = ROOT) -> str | None:
    """The checkout's commit, ``+dirty`` when files differ from it; None outside git."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def command_line(argv: Iterable[str] | None = None) -> str:
    """The command as a user types it: ``.venv/bin/python benchmarks/x.py ...``."""
    args = list(sys.argv if argv is None else argv)
    script = Path(args[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else Path(args[0])
    return shlex.join([".venv/bin/python", shown.as_posix(), *args[1:]])


def record(file: str, row_id: str, figure: str, *, root: Path | None = None, **fields: str) -> Path:
    """Write ``figure`` as row ``row_id`` of benchmarks/figures/``file``.json with this run's
    command, date, machine and commit (``fields`` replaces any of them, or ``what``); a new id
    needs ``what``; then both tables are written again."""
    root = ROOT if root is None else root  # looked up now: the tests plant another
    if file not in ORDER:
        raise ValueError(f"{file}: not a figures file (figures.ORDER)")
    path = root / FIGURES / f"{file}.json"
    rows = json.loads(path.read_text(encoding="utf-8"))["rows"] if path.is_file() else []
    row = next((r for r in rows if r["id"] == row_id), None)
    if row is None:
        if "what" not in fields:
            raise ValueError(f"{file}.json has no row {row_id!r}: a new row needs what=")
        row = {"id": row_id}
        rows.append(row)
    row.update(
        figure=figure,
        command=command_line(),
        date=datetime.datetime.now(datetime.UTC).date().isoformat(),
        machine=machine(),
        commit=commit(root),
    )
    row.update(fields)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rows": rows}, indent=2, ensure_ascii=False) + "\n", "utf-8")
    write(root)
    print(f"recorded {row_id} in {path.relative_to(root)} and the tables: {figure}")
    return path


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the tables")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.write:
        write(args.root)
        return 0
    problems = stale(args.root)
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
