"""Constituency parsing on the NLTK WSJ sample within a CPU time budget (paper section 6.3).

Runs the real parsing stages (``tasks.framework.runner.run_stage``: treebank -> linearize ->
tokenizer -> shard -> train -> average -> translate -> parse_score) with ``configs/ptb_sample.yaml``
plus overrides: 3,501 training trees (wsj_0001-0169), 176 dev, 237 test (wsj_0181-0199). Training is
bounded by ``--steps`` and by ``--minutes``: a short first run (``train.stop_after``) measures the
step time, then the same run resumes up to the number of steps that fit in the budget. The rest of
the budget is spent in ``--legs`` resumed legs, each timed again (a shared machine that slows down
stops near the budget, at a checkpoint, rather than running on for the steps the first timing
promised; one that runs faster than the first timing trains for more steps). Decoding is the
config's (``parsing.beam_size``, ``alpha``, ``max_len_offset``, ``constrained``) unless ``--beam``
says otherwise.

The paper's 91.3 F1 comes from 40k trees, a 4-layer d_model 1024 model and hours on GPUs;
minutes of CPU on 9% of the data give far less, and this benchmark says how much.

    python benchmarks/parsing_f1.py                           # 15 minutes of training
    python benchmarks/parsing_f1.py --minutes 5 --json benchmarks/results/parsing.json
    python benchmarks/parsing_f1.py --steps 200 --beam 4 --set model.n_layers=2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
from common import parse_overrides, report  # noqa: E402

DATA_STAGES = ("treebank", "linearize", "tokenizer", "shard")
MODEL_STAGES = ("train", "average", "translate", "parse_score")


def stats(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())["stats"]


def timed(config, name: str) -> tuple[Path, float]:
    from tasks.framework import runner

    started = time.perf_counter()
    path = runner.run_stage(config, name).path
    return path, time.perf_counter() - started


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "ptb_sample.yaml"))
    parser.add_argument("--minutes", type=float, default=15.0, help="training time budget")
    parser.add_argument(
        "--steps", type=int, default=None, help="most training steps (default: the config's)"
    )
    parser.add_argument("--calibrate", type=int, default=100, help="steps of the timing run")
    parser.add_argument(
        "--legs", type=int, default=3, help="training legs, each re-timed against the budget"
    )
    parser.add_argument(
        "--beam", type=int, default=None, help="beam width (default: the config's, 21)"
    )
    parser.add_argument("--workdir", default=str(ROOT / "runs" / "bench_parsing"))
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any config override, e.g. model.d_model=256 (repeatable)",
    )
    parser.add_argument("--json", default=None)
    return parser.parse_args(argv)


def bench_config(args: argparse.Namespace) -> Any:
    """The config with the overrides, its model stages removed (training is a timing: it always
    starts afresh; the data stages are reused when up to date)."""
    import torch

    from tasks.framework.config import load_config

    torch.set_num_threads(1)  # the driver only plans; the Ray workers do the work
    overrides = {"workdir": args.workdir, **parse_overrides(args.set)}
    if args.steps is not None:
        overrides["train.steps"] = args.steps
    if args.beam is not None:
        overrides["parsing.beam_size"] = args.beam
    config = load_config(args.config, overrides)
    for name in (*MODEL_STAGES, "train_ray"):
        shutil.rmtree(config.root / name, ignore_errors=True)
    return config


@dataclasses.dataclass
class Pace:
    """What the timing run measured and the plan it gives: ``steps`` in the budget."""

    calib: int
    per_step: float
    startup: float  # Ray Train start-up, paid again on resume
    steps: int
    budget: float
    train_dir: Path  # the timing run's folder


def time_a_step(config: Any, args: argparse.Namespace, seconds: dict[str, float]) -> Pace:
    """A short run to time a step (Ray start-up and the first evaluation included: a safe side)."""
    tc = config.train
    calib = min(args.calibrate, tc.steps)
    budget = 60 * args.minutes
    train_dir, seconds["train_timing_run"] = timed(
        config.replace(train=dataclasses.replace(tc, stop_after=calib)), "train"
    )
    loop = stats(train_dir)["loop_seconds"]
    per_step = loop / calib
    startup = seconds["train_timing_run"] - loop
    fit = calib + int((budget - seconds["train_timing_run"] - startup) / per_step)
    steps = max(calib, min(tc.steps, fit))
    print(
        f"{per_step:.2f} s/step over {calib} steps: training {steps} steps "
        f"(budget {args.minutes:g} min, cap {tc.steps})"
    )
    return Pace(calib, per_step, startup, steps, budget, train_dir)


def train_in_legs(
    config: Any, pace: Pace, legs: int, seconds: dict[str, float]
) -> tuple[Any, Path]:
    """The timing run resumed towards ``pace.steps`` in ``legs`` legs, each timed again, so that
    a machine that slows down (shared cores) still stops near the budget, at a checkpoint;
    checkpoints in the last tenth are averaged. The final config and the train folder."""
    tc, calib, steps = config.train, pace.calib, pace.steps
    per_step, startup, train_dir = pace.per_step, pace.startup, pace.train_dir
    last = config.average.last
    every = max(1, math.ceil(steps / (10 * last)))
    final = config.replace(
        train=dataclasses.replace(
            tc,
            steps=steps,
            checkpoint_every=every,
            keep_checkpoints=max(tc.keep_checkpoints, last),
        )
    )
    leg = max(1, math.ceil((steps - calib) / max(1, legs) / every)) * every
    spent, done, seconds["train"] = seconds["train_timing_run"], calib, 0.0
    while done < steps:
        fit = int((pace.budget - spent - startup) / per_step)  # steps the rest of the budget holds
        if done > calib and fit < every:
            print(f"stopping at step {done}: the budget is spent ({spent / 60:.1f} min)")
            break
        # Steps ran faster than the first timing (start-up and the first evaluation weigh on
        # it): the budget holds more of them. `train.steps` is not part of the resume key.
        grown = min(tc.steps, done + fit // every * every)
        if grown > steps:
            print(f"the budget holds {grown} steps at {per_step:.2f} s/step (planned {steps})")
            steps = grown
            final = final.replace(train=dataclasses.replace(final.train, steps=steps))
        stop = min(steps, (done // every) * every + max(every, min(leg, fit) // every * every))
        leg_config = final.replace(train=dataclasses.replace(final.train, stop_after=stop))
        train_dir, took = timed(leg_config, "train")
        loop = stats(train_dir)["loop_seconds"]
        per_step, startup = loop / (stop - done), took - loop
        spent, done, seconds["train"] = spent + took, stop, seconds["train"] + took
        print(f"step {done}: {per_step:.2f} s/step in the last leg, {spent / 60:.1f} min spent")
    return final.replace(train=dataclasses.replace(final.train, stop_after=done)), train_dir


def result_row(config: Any, tb: dict, train_dir: Path, seconds: dict[str, float]) -> dict:
    """The table's one row: data, training, decoding and EVALB's scores."""
    # POS slots in the outputs before repair, per word (the issue: within 2% of 1).
    from parsing.linearize import POS_TAGS, VINYALS_LEAF, structure_tokens

    root = config.root
    tr = stats(train_dir)
    tl = stats(root / "translate")
    hyps = (root / "translate" / "hyp.tree").read_text(encoding="utf-8").splitlines()
    words = (root / "linearize" / "test.words").read_text(encoding="utf-8").splitlines()
    form = config.parsing.form
    slots = sum(t in POS_TAGS or t == VINYALS_LEAF for h in hyps for t in structure_tokens(h, form))
    sc = json.loads((root / "parse_score" / "scores.json").read_text())
    train_wall = seconds["train_timing_run"] + seconds["train"]
    return {
        "train_trees": tb["train_trees"],
        "test_trees": tb["test_trees"],
        "params": tr.get("n_parameters"),
        "steps": tr["step"],
        "train_min": round(train_wall / 60, 2),
        "tokens_per_s": tr.get("tokens_per_s"),
        "val_loss": tr.get("val_loss"),
        "beam": tl["decode"]["beam_size"],
        "decode_s": tl["decode_seconds"],
        "f1": sc["f1"],
        "precision": sc["precision"],
        "recall": sc["recall"],
        "exact_match": sc["exact_match"],
        "tagging_acc": sc["tagging_accuracy"],
        "f1_le40": sc["f1_le40"],
        "slots_per_word": round(slots / sum(len(w.split()) for w in words), 4),
        "length_errors": sc["length_errors"],
        "repaired": sc["repaired_sentences"],
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    config = bench_config(args)
    seconds: dict[str, float] = {}
    for name in DATA_STAGES:
        _, seconds[name] = timed(config, name)
    tb = stats(config.root / "treebank")
    print(f"trees: train {tb['train_trees']}, dev {tb['dev_trees']}, test {tb['test_trees']}")
    pace = time_a_step(config, args, seconds)
    final, train_dir = train_in_legs(config, pace, args.legs, seconds)
    for name in ("average", "translate", "parse_score"):
        _, seconds[name] = timed(final, name)
    rows = [result_row(config, tb, train_dir, seconds)]
    report(
        f"Parsing on the NLTK WSJ sample (EVALB COLLINS.prm; paper, WSJ 02-21 -> 23: 91.3 F1); "
        f"form {config.parsing.form}, model d_model={config.model.d_model} "
        f"n_layers={config.model.n_layers}, vocab {config.tokenizer.vocab_size}; stage seconds "
        + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items()),
        rows,
        args.json,
    )


if __name__ == "__main__":
    main()
