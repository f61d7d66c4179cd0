"""Where a training update's time goes, ours against fairseq's, on the same batches (issue 58
item 2): torch.profiler's per-op tables side by side.

    python benchmarks/peers profile WORKDIR DATA_BIN [--steps 8 --warmup 4 --threads 2]

WORKDIR is a ``benchmarks/peers`` work dir (its shard folder), DATA_BIN the fairseq-preprocess
folder it made (``WORKDIR/peers/fairseq/data-bin``). Both sides train the recipe's model in one
process of ``--threads`` threads, 2 x 4,096-token micro-batches an update:

1. ours: the ``Trainer`` of ``benchmarks/peers ours plain`` (our hot path, the prefetch
   thread included); the row indices of every micro-batch it took are written out;
2. fairseq: ``fairseq.trainer.Trainer.train_step`` (fairseq-train's own step: its model,
   label-smoothed criterion, Adam, clipping) in fairseq's environment under ``.peers/``, fed
   those rows, collated by fairseq's own ``collate`` (left-padded sources, EOS-first decoder
   inputs). The ids are ours folded into fairseq's dictionary: a step's cost is its shapes'.

``--warmup`` updates, then ``--steps`` under the profiler. Prints the wall ms an update of each
and the ops by self CPU ms an update, side by side; writes ``peers-profile.{json,md}`` to
``--out``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def profile(step, warmup: int, steps: int) -> dict:
    """``step()`` ``warmup`` times, then ``steps`` times under torch.profiler: wall ms an update
    and each op's self CPU ms an update."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for _ in range(warmup):
        step()
    started = time.perf_counter()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    wall = (time.perf_counter() - started) / steps
    ops = {
        e.key: {"self_ms": e.self_cpu_time_total / 1e3 / steps, "calls": e.count / steps}
        for e in prof.key_averages()
    }
    return {"wall_ms": wall * 1e3, "threads": torch.get_num_threads(), "ops": ops}


# ------------------------------------------------------------------------------ ours


def ours(workdir: Path, rows_out: Path, warmup: int, steps: int, threads: int) -> dict:
    """Our Trainer's updates profiled; the micro-batches' row indices to ``rows_out``."""
    import dataclasses

    import torch

    from training.data import TokenData
    from training.trainer import Trainer
    from training.worker import set_threads
    from transformer_core.model import Transformer

    from . import ours as ours_side

    set_threads(threads)
    updates = warmup + steps
    config = ours_side.recipe_config(workdir, updates, updates)
    train = dataclasses.replace(config.train, num_workers=1, torch_threads=threads)
    vocab = ours_side.vocab_size(workdir)
    data = TokenData.read(str(workdir / "shard" / "train"), vocab)
    torch.manual_seed(config.seed)
    module = Transformer(config.model, vocab)
    trainer = Trainer(module, train, data, data, seed=config.seed)
    taken: list[list[list[int]]] = []
    next_batches = trainer.prefetcher.next

    def recording():
        batches, host = next_batches()
        taken.append([b.tolist() for b in batches])
        return batches, host

    trainer.prefetcher.next = recording  # type: ignore[method-assign]
    try:
        result = profile(trainer.train_step, warmup, steps)
    finally:
        trainer.close()
    steps_rows = []
    for step in taken:
        micro = []
        for rows in step:
            src, tgt = data.ids(rows)
            micro.append({"src": [s.tolist() for s in src], "tgt": [t.tolist() for t in tgt]})
        steps_rows.append(micro)
    rows_out.write_text(json.dumps(steps_rows), encoding="utf-8")
    return result | {
        "target_tokens": sum(len(t) for s in steps_rows[warmup:] for m in s for t in m["tgt"])
        / steps
    }


# ------------------------------------------------------------------------------ fairseq


def fairseq(data_bin: Path, rows_file: Path, warmup: int, steps: int, threads: int) -> dict:
    """fairseq-train's ``Trainer.train_step`` profiled on the rows of ``rows_file``."""
    import torch
    from fairseq import options, tasks
    from fairseq.data.language_pair_dataset import collate
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    from .env import Peer, Recipe, Shape
    from .fairseq import train_command

    torch.set_num_threads(threads)
    cmd = train_command(
        Peer("fairseq", Path(sys.prefix)), data_bin, Path(tempfile.gettempdir()), Shape(),
        Recipe(threads=threads), warmup + steps, 1,
    )  # fmt: skip
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, input_args=cmd[3:])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model, criterion = task.build_model(cfg.model), task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)
    dictionary = task.source_dictionary
    pad, eos, size = dictionary.pad(), dictionary.eos(), len(dictionary)
    special = dictionary.nspecial

    def fold(row: list[int]) -> torch.Tensor:
        ids = [special + i % (size - special) for i in row[:-1]]
        return torch.tensor(ids + [eos], dtype=torch.long)

    updates = []
    for step in json.loads(rows_file.read_text(encoding="utf-8")):
        micro = []
        for m in step:
            samples = [
                {"id": i, "source": fold(s), "target": fold(t)}
                for i, (s, t) in enumerate(zip(m["src"], m["tgt"], strict=True))
            ]
            micro.append(collate(samples, pad, eos, left_pad_source=True, left_pad_target=False))
        updates.append(micro)
    trainer.begin_epoch(1)
    position = iter(updates)
    return profile(lambda: trainer.train_step(next(position)), warmup, steps) | {
        "target_tokens": sum(m["ntokens"] for s in updates[warmup:] for m in s) / steps
    }


# ------------------------------------------------------------------------------ report


def side_by_side(results: dict, top: int = 25) -> str:
    """The wall ms an update and the ``top`` ops by self CPU ms an update, ours beside fairseq's."""
    a, b = results["ours"], results["fairseq"]
    lines = [
        "| | ours | fairseq |",
        "|---|---:|---:|",
        f"| wall ms an update | {a['wall_ms']:,.0f} | {b['wall_ms']:,.0f} |",
        f"| target tokens an update | {a['target_tokens']:,.0f} | {b['target_tokens']:,.0f} |",
        f"| target tokens/s | {1e3 * a['target_tokens'] / a['wall_ms']:,.0f} | "
        f"{1e3 * b['target_tokens'] / b['wall_ms']:,.0f} |",
        "",
        "| op (self CPU ms an update) | ours | calls | fairseq | calls |",
        "|---|---:|---:|---:|---:|",
    ]
    names = sorted(
        set(a["ops"]) | set(b["ops"]),
        key=lambda n: (
            -max(a["ops"].get(n, {}).get("self_ms", 0), b["ops"].get(n, {}).get("self_ms", 0))
        ),
    )
    for name in names[:top]:
        x, y = a["ops"].get(name, {}), b["ops"].get(name, {})
        cells = [f"{d['self_ms']:,.1f} | {d['calls']:.0f}" if d else "- | -" for d in (x, y)]
        lines.append(f"| `{name}` | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workdir", type=Path, nargs="?")
    parser.add_argument("data_bin", type=Path, nargs="?")
    parser.add_argument("--side", choices=["ours", "fairseq"], help="(internal) one side only")
    parser.add_argument("--rows", type=Path, help="(internal) the micro-batches' rows")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    if args.side == "fairseq":
        result = fairseq(args.data_bin, args.rows, args.warmup, args.steps, args.threads)
        print("PROFILE " + json.dumps(result))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    rows = args.out / "peers-profile-rows.json"
    results = {"ours": ours(args.workdir.resolve(), rows, args.warmup, args.steps, args.threads)}
    python = ROOT / ".peers" / "fairseq" / "bin" / "python"
    env = {"OMP_NUM_THREADS": str(args.threads), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [str(python), str(HERE), "profile", "--side", "fairseq", "--rows", str(rows), "--steps",
         str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads),
         "x", str(args.data_bin.resolve())],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    line = next((x for x in done.stdout.splitlines() if x.startswith("PROFILE ")), None)
    if line is None:
        print(done.stdout[-2000:], done.stderr[-3000:], file=sys.stderr)
        return 1
    results["fairseq"] = json.loads(line.removeprefix("PROFILE "))
    text = side_by_side(results)
    (args.out / "peers-profile.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "peers-profile.md").write_text(text)
    rows.unlink()
    print(text)
    return 0
