"""A flow run's process in the cluster scenario, with a callback on training's steps:

    python -m helpers.scenario_flow WHERE stop STEP               # a deployment's flow run
    python -m helpers.scenario_flow WHERE stop STEP --run CONFIG  # `tfm run CONFIG` instead
    python -m helpers.scenario_flow WHERE gates DOWN UP           # a flow run held at two steps

Prefect's process worker runs it in place of ``python -m prefect.engine`` (a deployment run's
``command``, from the tests folder), so the test decides where training is, however fast the
machine: with ``stop`` the last rank stops at STEP to die with its host (``StopAndSayWhere``);
with ``gates`` rank 0 waits at step DOWN until the test writes ``WHERE/down`` and at UP until it
writes ``WHERE/up`` (``Gates``), while the test takes a service away and brings it back."""

from __future__ import annotations

import argparse
import functools
import runpy
import sys
from pathlib import Path

from helpers.callbacks import Gates, StopAndSayWhere, by_value


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="scenario_flow")
    parser.add_argument("where", type=Path, help="the folder the callback and the test share")
    modes = parser.add_subparsers(dest="mode", required=True)
    stop = modes.add_parser("stop", help="the last rank stops at STEP (StopAndSayWhere)")
    stop.add_argument("step", type=int)
    stop.add_argument("--run", metavar="CONFIG", help="`tfm run CONFIG` instead of a flow run")
    gates = modes.add_parser("gates", help="rank 0 waits at DOWN and at UP (Gates)")
    gates.add_argument("down", type=int)
    gates.add_argument("up", type=int)
    args = parser.parse_args(argv)
    if args.mode == "gates":
        callback = Gates(args.where, {args.down: "down", args.up: "up"})
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
