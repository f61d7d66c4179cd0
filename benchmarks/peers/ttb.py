"""Time to BLEU beside fairseq (``make bench-peers PEERS_FLAGS="--time-to-bleu 10"``): minutes to
a given test2016 BLEU rather than tokens a second.

1. Data: our stages (download, clean, tokenizer, shard) of the laptop recipe,
   configs/multi30k_en_de.yaml (Multi30k En-De, cased, 8,000 sentencepiece pieces), in
   ``--workdir``-ttb; fairseq reads the same pieces of the same sentences as text
   (``text/{train,valid,test}.{en,de}``, binarized by fairseq-preprocess with one dictionary).
2. Training, one toolkit after the other, each for the same wall-clock budget (``--time-to-bleu``
   minutes, from its command's start: imports, data loading and Ray's start-up count) on the same
   cores, each in its best CPU layout, two processes of one thread: ours ``tfm stage train`` of
   the recipe as committed (Ray Train's two workers, its precision and compile settings),
   fairseq-train's own data parallelism over gloo (``peers.fairseq.train_command``). Both train
   the recipe's model, optimiser and schedule (``fairseq_settings``), 2 x 1,024 tokens an
   update, a checkpoint every 100 updates and no validation (ours: one dev pass at the recipe's
   last step). A toolkit still training at the budget's end is stopped there.
3. At every ``--eval-minutes`` of the budget, each toolkit's last ``average.last`` (the
   recipe's: 1, its rate decays to zero) checkpoints written by that minute are averaged, each
   by its own tool (ours: the average stage's; fairseq: the mean of its checkpoints' ``model``
   tensors, which its scripts/average_checkpoints.py computes but its wheel does not ship),
   and decoded the same way: beam 5, fairseq's length normalisation (``--lenpen 1``) and
   limits (``--max-len-a 1 --max-len-b 50``): fairseq-generate, and our translator at
   ``peers.ours.fairseq_decoding``.
   Dev (val, 1,014 captions) and test2016 (1,000) are scored by sacreBLEU against the cased
   references.

Writes ``time_to_bleu.{json,md,png}`` under ``--out``; prints ``time to fairseq's final test2016
BLEU, ours/fairseq: T``, the first minute ours reaches fairseq's last score over the budget.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import figures

from . import fairseq
from .env import Peer, Recipe, Shape, ensure, last_line, shape_of
from .procs import free_port
from .report import cpu_model

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LAPTOP = ROOT / "configs" / "multi30k_en_de.yaml"
STAGES = ("download", "clean", "tokenizer", "shard")
SPLITS = {"train": "train", "valid": "dev", "test": "test"}
"""fairseq's split prefix -> our split name."""
EVAL_SPLITS = {"dev": "valid", "test2016": "test"}
"""Each scored set -> fairseq's split."""
CHECKPOINT_EVERY = 100
"""Updates between checkpoints, both toolkits (the recipe's ``train.checkpoint_every``)."""
RECORD_MINUTES = 10
"""The budget whose T docs/benchmarks.md gives."""
BEAM, MAX_LEN_B = 5, 50

AVERAGE_FAIRSEQ = """\
import sys, torch
paths, out = sys.argv[1:-1], sys.argv[-1]
states = [torch.load(p, map_location="cpu", weights_only=False) for p in paths]
last = states[-1]
last["model"] = {k: sum(s["model"][k].float() for s in states).div_(len(states)).to(v.dtype)
                 for k, v in last["model"].items()}
last["last_optimizer_state"] = None
torch.save(last, out)
"""
"""fairseq's checkpoint averaging as its scripts/average_checkpoints.py does it, in its venv."""


def laptop_config(workdir: Path, mirror: str | None):
    """The laptop recipe in ``workdir`` (on ``mirror`` when given)."""
    from tasks.framework.config import load_config

    overrides: dict[str, object] = {"workdir": str(workdir)}
    if mirror:
        overrides["data.mirror"] = mirror
    return load_config(LAPTOP, overrides)


def prepare(workdir: Path, mirror: str | None) -> Path:
    """Our stages through shard (skipped when up to date), then ``workdir/text``: every split
    as the tokenizer's pieces joined by spaces; the text folder."""
    from corpora.parquet import part_files
    from corpora.text import read_lines
    from serving import tokenizer as tokenizer_lib
    from tasks.framework.runner import run_stage

    config = laptop_config(workdir, mirror)
    for stage in STAGES:
        print(f"  {stage}: {'ran' if run_stage(config, stage).ran else 'up to date'}", flush=True)
    import ray

    ray.shutdown()  # the stages' local Ray: not idling beside the trainings
    text = workdir / "text"
    stamp = json.loads((workdir / "tokenizer" / "manifest.json").read_text())["fingerprint"]
    if (text / "stamp").is_file() and (text / "stamp").read_text() == stamp:
        return text
    import pyarrow.parquet as pq

    tokenizer = tokenizer_lib.load(workdir / "tokenizer")
    text.mkdir(parents=True, exist_ok=True)
    for prefix, split in SPLITS.items():
        if split == "train":
            tables = [pq.read_table(f) for f in part_files(workdir / "clean" / "train")]
            sides = [[s for t in tables for s in t.column(c).to_pylist()] for c in ("src", "tgt")]
        else:
            sides = [read_lines(workdir / "clean" / f"{split}.{lang}") for lang in config.languages]
        for side, (lang, lines) in enumerate(zip(config.languages, sides, strict=True)):
            pieces = tokenizer.sp.encode(tokenizer.prepare(lines, side), out_type=str)
            (text / f"{prefix}.{lang}").write_text("\n".join(map(" ".join, pieces)) + "\n")
    (text / "stamp").write_text(stamp)
    return text


def fairseq_settings(config) -> tuple[Shape, Recipe]:
    """The laptop recipe's model and training as fairseq-train's settings."""
    from transformer_core.schedule import learning_rate

    model, train = config.model, config.train
    peak = learning_rate(train.warmup_steps, model.d_model, train.warmup_steps, train.lr_scale)
    shape = shape_of(model)
    recipe = Recipe(
        max_tokens=train.max_tokens_per_batch,
        update_freq=train.tokens_per_step // train.max_tokens_per_batch,
        lr=peak,
        warmup=train.warmup_steps,
        decay=train.decay,
        label_smoothing=model.label_smoothing,
        clip_norm=train.clip_norm or 0.0,
        adam_betas=train.adam_betas,
        adam_eps=train.adam_eps,
        seed=config.seed,
        threads=1,
    )
    return shape, recipe


def run_for(cmds: list[list[str]], env: dict[str, str], log: Path, seconds: float) -> float:
    """``cmds`` at once (each in its own session), stopped ``seconds`` after the start if still
    running (SIGINT, then SIGKILL a minute later); the start's wall-clock time."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sinks = [(log.with_suffix(f".{i}.log") if i else log).open("w") for i in range(len(cmds))]
    started = time.time()
    procs = [
        subprocess.Popen(c, env=env, stdout=s, stderr=subprocess.STDOUT, start_new_session=True)
        for c, s in zip(cmds, sinks, strict=True)
    ]
    try:
        deadline = started + seconds
        while time.time() < deadline and any(p.poll() is None for p in procs):
            time.sleep(1)
        for sig, grace in ((signal.SIGINT, 60), (signal.SIGKILL, 10)):
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, sig)
            end = time.time() + grace
            while time.time() < end and any(p.poll() is None for p in procs):
                time.sleep(0.5)
    finally:
        for s in sinks:
            s.close()
    return started


def train_fairseq(peer: Peer, text: Path, out: Path, config, seconds: float) -> dict[str, Any]:
    """fairseq-train for ``seconds``; its interval checkpoints with their minutes."""
    data_bin = out / "data-bin"
    if not (data_bin / "dict.en.txt").is_file():
        cmd = fairseq.preprocess_command(peer, text, config.languages, data_bin)
        done = subprocess.run(cmd, env=peer.env(2), capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"fairseq-preprocess: {last_line(done.stdout + done.stderr)}")
    save = out / "checkpoints"
    shutil.rmtree(save, ignore_errors=True)
    shape, recipe = fairseq_settings(config)
    port, processes = free_port(), 2
    every = ["--save-interval-updates", str(CHECKPOINT_EVERY), "--no-last-checkpoints"]
    cmds = [
        fairseq.train_command(
            peer, data_bin, save, shape, recipe, config.train.steps, 50,
            languages=config.languages, rank=(rank, processes, port),
        ) + every
        for rank in range(processes)
    ]  # fmt: skip
    started = run_for(cmds, peer.env(1), out / "train.log", seconds)
    found = [
        (int(path.stem.rsplit("_", 1)[1]), (path.stat().st_mtime - started) / 60, path)
        for path in save.glob("checkpoint_*_*.pt")
    ]
    return {"data_bin": data_bin, "checkpoints": sorted(found)}


def train_ours(workdir: Path, mirror: str | None, out: Path, seconds: float) -> dict[str, Any]:
    """``tfm stage train`` of the laptop recipe for ``seconds``, from no earlier training; its
    Ray Train checkpoints with their minutes."""
    for folder in ("train", "train_ray"):
        shutil.rmtree(workdir / folder, ignore_errors=True)
    config = laptop_config(workdir, mirror)
    sets = {
        "workdir": workdir,
        "train.checkpoint_every": CHECKPOINT_EVERY,
        "train.keep_checkpoints": config.train.steps // CHECKPOINT_EVERY,
        "train.eval_every": config.train.steps,
        "train.bleu_sentences": 0,
    } | ({"data.mirror": mirror} if mirror else {})
    cmd = [str(Path(sys.executable).with_name("tfm")), "stage", "train", "--config", str(LAPTOP)]
    cmd += [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    started = run_for([cmd], dict(os.environ), out / "train.log", seconds)
    found = []
    for path in (workdir / "train_ray").glob("*/step-*/model.pt"):
        step = int(path.parent.name.removeprefix("step-"))
        found.append((step, (path.stat().st_mtime - started) / 60, path))
    return {"checkpoints": sorted(found)}


def kept(trained: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``trained`` written to ``folder/trained.json`` (``--no-train`` decodes it again)."""
    rows = [[step, minute, str(path)] for step, minute, path in trained["checkpoints"]]
    record = {k: str(v) for k, v in trained.items() if k != "checkpoints"} | {"checkpoints": rows}
    (folder / "trained.json").write_text(json.dumps(record, indent=1) + "\n")
    return trained


def trained_before(folder: Path) -> dict[str, Any]:
    """What ``kept`` wrote in ``folder``."""
    path = folder / "trained.json"
    if not path.is_file():
        raise SystemExit(f"--no-train: {path} does not exist (train first)")
    record = json.loads(path.read_text())
    found = [(step, minute, Path(p)) for step, minute, p in record.pop("checkpoints")]
    return {k: Path(v) for k, v in record.items()} | {"checkpoints": found}


def averaged(last: int) -> str:
    """What is decoded at each minute, in words."""
    return "the last checkpoint" if last == 1 else f"the last {last} checkpoints averaged"


def chosen(checkpoints: list[tuple[int, float, Path]], minute: float, last: int) -> list[Path]:
    """The last ``last`` checkpoints written by ``minute``."""
    return [p for _, at, p in checkpoints if at <= minute][-last:]


def score(hypotheses: list[str], references: list[str]) -> float:
    from sacrebleu.metrics import BLEU

    return round(BLEU().corpus_score(hypotheses, [references]).score, 2)


def evaluate_ours(paths: list[Path], tokenizer: Path, sets: dict, out: Path) -> dict[str, float]:
    from serving.translator import Translator
    from transformer_core import checkpoint
    from transformer_core.averaging import average_checkpoints
    from transformer_core.config import ModelConfig

    from .ours import fairseq_decoding

    newest = checkpoint.load(paths[-1])
    averaged = out / "averaged" / "model.pt"
    averaged.parent.mkdir(parents=True, exist_ok=True)
    checkpoint.save(
        averaged,
        average_checkpoints(paths),
        ModelConfig.from_dict(newest["config"]),
        vocab_size=newest["vocab_size"],
        tgt_vocab_size=newest.get("tgt_vocab_size"),
    )
    translator = Translator.load(averaged, tokenizer, fairseq_decoding(BEAM, "torch", MAX_LEN_B))
    return {name: score(translator.translate(src), ref) for name, (src, ref) in sets.items()}


def evaluate_fairseq(
    peer: Peer, paths: list[Path], data_bin: Path, sets: dict, out: Path, languages
) -> dict[str, float]:
    averaged = out / "averaged.pt"
    averaged.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(peer.bin / "python"), "-c", AVERAGE_FAIRSEQ, *map(str, paths), str(averaged)]
    done = subprocess.run(cmd, env=peer.env(2), capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"fairseq averaging: {last_line(done.stderr)}")
    scores = {}
    for name, (_, references) in sets.items():
        cmd = fairseq.generate_command(
            peer, data_bin, averaged, BEAM, 4096, MAX_LEN_B, languages=languages,
            remove_bpe="sentencepiece", subset=EVAL_SPLITS[name],
        ) + ["--required-batch-size-multiple", "1"]  # fmt: skip
        # fairseq 0.12's batches in multiples of 8 sentences (its default) left 6 of the
        # 1,014 dev sentences out of them all: not translated, no output line.
        done = subprocess.run(cmd, env=peer.env(2), capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"fairseq-generate: {last_line(done.stdout + done.stderr)}")
        scores[name] = score(fairseq.hypotheses(done.stdout), references)
    return scores


def curves(trained: dict[str, dict], grid: list[float], evaluate: dict, last: int) -> list[dict]:
    """Each toolkit's scores at every minute of ``grid`` (an evaluation per new set of
    checkpoints)."""
    rows, seen = [], {}
    for minute in grid:
        row: dict[str, Any] = {"minute": minute}
        for name, result in trained.items():
            paths = chosen(result["checkpoints"], minute, last)
            updates = max((u for u, at, _ in result["checkpoints"] if at <= minute), default=0)
            row[f"{name}_updates"] = updates
            if not paths:
                continue
            key = (name, tuple(paths))
            if key not in seen:
                print(f"  {minute:g} min: {name}, the last {len(paths)} to {updates}", flush=True)
                seen[key] = evaluate[name](paths)
            row |= {f"{name}_{s}": v for s, v in seen[key].items()}
        rows.append(row)
    return rows


def time_to(rows: list[dict], budget: float) -> dict[str, Any]:
    """fairseq's final test2016 BLEU, the first minute ours reaches it, and T."""
    target = next((r.get("fairseq_test2016") for r in reversed(rows)), None)
    reached = next(
        (r["minute"] for r in rows if target is not None and r.get("ours_test2016", -1) >= target),
        None,
    )
    return {
        "fairseq_final_test2016": target,
        "ours_minutes_to_it": reached,
        "T": None if reached is None else round(reached / budget, 2),
    }


def plot(rows: list[dict], found: dict[str, Any], path: Path, title: str, last: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, colour in (("ours", "tab:blue"), ("fairseq", "tab:orange")):
        for split, style in (("test2016", "o-"), ("dev", "x--")):
            points = [(r["minute"], r[f"{name}_{split}"]) for r in rows if f"{name}_{split}" in r]
            if points:
                ax.plot(*zip(*points, strict=True), style, color=colour, label=f"{name}, {split}")
    if found["fairseq_final_test2016"] is not None:
        ax.axhline(found["fairseq_final_test2016"], color="grey", lw=0.8, ls=":")
    ax.set_xlabel("wall-clock minutes of training (2 cores)")
    ax.set_ylabel(f"sacreBLEU ({averaged(last)}, beam 5)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table(rows: list[dict]) -> str:
    lines = [
        "| minute | ours: updates | dev | test2016 | fairseq: updates | dev | test2016 |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        cells = [f"{r['minute']:g}"]
        for name in ("ours", "fairseq"):
            cells += [f"{r.get(f'{name}_updates', 0):,}"]
            cells += [f"{r[k]:.2f}" if (k := f"{name}_{s}") in r else "" for s in EVAL_SPLITS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(args) -> int:
    """``--time-to-bleu MINUTES``: the comparison above; 0 when it ran."""
    from corpora.text import read_lines

    budget, every = args.time_to_bleu, args.eval_minutes
    workdir = args.workdir.with_name(args.workdir.name + "-ttb").resolve()
    work = workdir / "peers"
    started = time.time()
    print("data: the laptop recipe's stages through shard, then its pieces as text", flush=True)
    text = prepare(workdir, args.mirror)
    config = laptop_config(workdir, args.mirror)
    peer = ensure("fairseq", install=not args.no_install)
    if peer.problem:
        raise SystemExit(f"time to BLEU needs fairseq: {peer.problem}")
    src, tgt = config.languages
    sets = {
        name: (read_lines(workdir / "clean" / f"{split}.{src}"),
               read_lines(workdir / "clean" / f"{split}.{tgt}"))
        for name, split in (("dev", "dev"), ("test2016", "test"))
    }  # fmt: skip
    if args.no_train:
        print("training: the checkpoints an earlier run left (--no-train)", flush=True)
        ours, theirs = (trained_before(work / name) for name in ("ours", "fairseq"))
    else:
        print(f"training: ours, {budget:g} min", flush=True)
        ours = kept(train_ours(workdir, args.mirror, work / "ours", budget * 60), work / "ours")
        print(f"training: fairseq, {budget:g} min", flush=True)
        theirs = train_fairseq(peer, text, work / "fairseq", config, budget * 60)
        theirs = kept(theirs, work / "fairseq")
    grid = [round(every * i, 4) for i in range(1, int(budget / every + 1e-9) + 1)]
    last = config.average.last
    evaluate = {
        "ours": lambda p: evaluate_ours(p, workdir / "tokenizer", sets, work / "ours"),
        "fairseq": lambda p: evaluate_fairseq(
            peer, p, theirs["data_bin"], sets, work / "fairseq", config.languages
        ),
    }
    print(f"decoding: beam 5, each toolkit's {averaged(last)} at every minute", flush=True)
    rows = curves({"ours": ours, "fairseq": theirs}, grid, evaluate, last)
    found = time_to(rows, budget)
    line = "time to fairseq's final test2016 BLEU, ours/fairseq: " + (
        f"{found['T']:.2f}" if found["T"] is not None else f"not reached in {budget:g} min"
    )
    results = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cores, {cpu_model()}",
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
        "budget_minutes": budget,
        "eval_minutes": every,
        "config": str(LAPTOP.relative_to(ROOT)),
        "rows": rows,
        **found,
        "wall_s": round(time.time() - started),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "time_to_bleu.json").write_text(json.dumps(results, indent=2) + "\n")
    md = table(rows) + f"\n{line}\n"
    (args.out / "time_to_bleu.md").write_text(md)
    title = f"Multi30k En-De laptop recipe, {budget:g} min each on {os.cpu_count()} cores"
    plot(rows, found, args.out / "time_to_bleu.png", title, last)
    print("\n" + md + f"\n{args.out / 'time_to_bleu.md'} ({results['wall_s']} s)", flush=True)
    if budget == RECORD_MINUTES and found["T"] is not None:
        shutil.copy(args.out / "time_to_bleu.png", ROOT / "docs" / "img" / "peers_time_to_bleu.png")
        end, target = rows[-1], found["fairseq_final_test2016"]
        figures.record(
            "peers",
            "peers-time-to-bleu",
            f"**{found['T']:.2f}** (ours reached fairseq's final {target:.2f} in "
            f"{found['ours_minutes_to_it']:g} min; at {budget:g} min ours "
            f"{end.get('ours_test2016', 0):.2f} after {end['ours_updates']:,} updates, fairseq "
            f"{end.get('fairseq_test2016', 0):.2f} after {end['fairseq_updates']:,})",
            what="time to fairseq's final test2016 BLEU, ours/fairseq: the laptop recipe trained "
            f"by each toolkit for {budget:g} minutes on the same 2 cores, {averaged(last)}, "
            "decoded alike (beam 5, fairseq's length penalty) every minute",
        )
    return 0
