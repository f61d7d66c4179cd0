"""A flow run's process in the cluster scenario, with a callback on training's steps:

    python -m helpers.scenario_flow WHERE stop STEP                    # a deployment's flow run
    python -m helpers.scenario_flow WHERE stop STEP --run CONFIG       # `tfm run CONFIG` instead
    python -m helpers.scenario_flow WHERE gates DOWN UP [DOWN UP ...]  # held at every gate

Prefect's process worker runs it in place of ``python -m prefect.engine`` (a deployment run's
``command``, from the tests folder), so the test decides where training is, however fast the
machine: with ``stop`` the last rank stops at STEP to die with its host (``StopAndSayWhere``);
with ``gates`` each pair of steps is an outage window, numbered from 1: rank 0 waits at window
n's DOWN step until the test writes ``WHERE/down-<n>`` and at its UP step until it writes
``WHERE/up-<n>`` (``Gates``), while the test takes a service away and brings it back."""

from __future__ import annotations

import argparse
import functools
import runpy
import sys
from pathlib import Path

from helpers.callbacks import Gates, StopAndSayWhere, by_value


def gate_files(steps: list[int]) -> dict[int, str]:
    """The file each gate step waits for: window n (from 1; a pair of ``steps``) waits at its
    DOWN step for ``down-<n>`` and at its UP step for ``up-<n>``."""
    files = {}
    for n, (down, up) in enumerate(zip(steps[::2], steps[1::2], strict=True), start=1):
        files |= {down: f"down-{n}", up: f"up-{n}"}
    return files


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="scenario_flow")
    parser.add_argument("where", type=Path, help="the folder the callback and the test share")
    modes = parser.add_subparsers(dest="mode", required=True)
    stop = modes.add_parser("stop", help="the last rank stops at STEP (StopAndSayWhere)")
    stop.add_argument("step", type=int)
    stop.add_argument("--run", metavar="CONFIG", help="`tfm run CONFIG` instead of a flow run")
    gates = modes.add_parser("gates", help="rank 0 waits at each window's DOWN and UP (Gates)")
    gates.add_argument("steps", type=int, nargs="+", metavar="DOWN UP", help="one pair a window")
    args = parser.parse_args(argv)
    if args.mode == "gates":
        if len(args.steps) % 2 or args.steps != sorted(set(args.steps)):
            parser.error("gates takes pairs of steps, DOWN UP [DOWN UP ...], in increasing order")
        callback = Gates(args.where, gate_files(args.steps))
    else:
        callback = StopAndSayWhere(args.where, args.step)

    from tasks import train

    # The runner finds train's build on its module when the flow runs the stage.
    train.build = functools.partial(train.build, callbacks=by_value(callback))
    if getattr(args, "run", None):
        from pipelines import cli

        sys.exit(cli.main(["run", args.run]))
    sys.argv = sys.argv[:1]  # the engine reads the flow run's id from its environment
    runpy.run_module("prefect.engine", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
