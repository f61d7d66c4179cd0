"""``python benchmarks/peers [ours] ...``: the comparison, or our side of it alone."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIDES = ("ours",)

# Run as a folder, the package's own folder is first on the path, where its modules would hide
# the libraries of the same names (fairseq, eole): the checkout and benchmarks/ go there
# instead, so `peers.*` is this package and `common` the benchmarks' shared helpers.
if sys.path and Path(sys.path[0]).resolve() == HERE:
    sys.path[0:1] = [str(HERE.parents[1]), str(HERE.parent)]


def main(argv: list[str]) -> int:
    name = argv.pop(0) if argv and argv[0] in SIDES else "run"
    if name != "run":
        sys.argv[0] = f"peers {name}"  # argparse's usage line names the side
    return importlib.import_module(f"peers.{name}").main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
