"""Time to BLEU: BLEU against wall-clock minutes in one `tfm run` of a config from an empty workdir.

Runs the whole pipeline (download to register) as a user would, timing it from the start, then
reads the curve back: dev BLEU at every validation (``val_bleu`` in MLflow: greedy, the config's
``train.bleu_sentences`` dev sentences), test BLEU of every kept checkpoint (greedy, the whole
test set, sacreBLEU) at the minute it was written, and the pipeline's own final score (the
averaged checkpoints, the config's beam search: ``bleu_sacre`` and ``bleu_tok_lc``). Writes a
table, JSON and a PNG.

    python benchmarks/time_to_bleu.py --config configs/multi30k_en_de.yaml \
        --mirror file://$PWD/../shared/data/multi30k --workdir /tmp/ttb \
        --json ttb.json --png ttb.png
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import parse_overrides, report  # noqa: E402


def run_pipeline(config: str, workdir: Path, overrides: list[str]) -> tuple[float, float]:
    """``tfm run`` on an empty ``workdir``; (start, end) wall-clock times."""
    if workdir.exists() and any(workdir.iterdir()):
        raise SystemExit(f"--workdir {workdir} is not empty: time to BLEU starts from nothing")
    tfm = Path(sys.executable).with_name("tfm")
    command = [str(tfm), "run", config, "--set", f"workdir={workdir}"]
    for override in overrides:
        command += ["--set", override]
    started = time.time()
    subprocess.run(command, check=True)
    return started, time.time()


def checkpoint_test_bleu(workdir: Path, pair: str) -> list[dict]:
    """Greedy test BLEU of every checkpoint the train stage kept, with its wall time."""
    from sacrebleu.metrics import BLEU

    from corpora.text import read_lines
    from serving.translator import DecodeConfig, Translator

    src, tgt = pair.split("-")
    sources = read_lines(workdir / "download" / f"test.{src}")
    references = read_lines(workdir / "download" / f"test.{tgt}")
    listing = json.loads((workdir / "train" / "checkpoints.json").read_text())
    rows = []
    for entry in listing["checkpoints"]:
        translator = Translator.load(
            workdir / "train" / entry["path"], workdir / "tokenizer", DecodeConfig(beam_size=1)
        )
        hyps = translator.translate(sources)
        rows.append(
            {
                "step": entry["step"],
                "time": entry["time"],
                "test_bleu_greedy": BLEU().corpus_score(hyps, [references]).score,
            }
        )
    return rows


def dev_bleu(workdir: Path) -> list[dict]:
    """``val_bleu`` per validation from the train stage's MLflow run, with its wall time."""
    from mlflow.tracking import MlflowClient

    stats = json.loads((workdir / "train" / "manifest.json").read_text())["stats"]
    client = MlflowClient(stats["tracking_uri"])
    history = client.get_metric_history(stats["mlflow_run_id"], "val_bleu")
    return [
        {"step": m.step, "time": m.timestamp / 1000, "dev_bleu_greedy": m.value} for m in history
    ]


def plot(rows: list[dict], final: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label, style in (
        ("dev_bleu_greedy", "dev BLEU (greedy, subset)", "b.-"),
        ("test_bleu_greedy", "test BLEU (greedy, checkpoint)", "go-"),
    ):
        points = [(r["minutes"], r[key]) for r in rows if r.get(key) is not None]
        if points:
            ax.plot(*zip(*points, strict=True), style, label=label)
    ax.plot(
        [final["minutes"]],
        [final["bleu_sacre"]],
        "r*",
        markersize=14,
        label=f"final: averaged, beam ({final['bleu_sacre']:.1f})",
    )
    ax.set_xlabel("wall-clock minutes since `tfm run` started")
    ax.set_ylabel("sacreBLEU")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/multi30k_en_de.yaml")
    parser.add_argument("--workdir", required=True, help="an empty or new folder")
    parser.add_argument("--mirror", default=None, help="data.mirror, e.g. file://.../multi30k")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="K=V")
    parser.add_argument("--json", default=None)
    parser.add_argument("--png", default=None)
    args = parser.parse_args(argv)

    from tasks.framework.config import load_config

    overrides = args.overrides + ([f"data.mirror={args.mirror}"] if args.mirror else [])
    workdir = Path(args.workdir).resolve()
    started, ended = run_pipeline(args.config, workdir, overrides)
    config = load_config(args.config, parse_overrides(overrides))
    scores = json.loads((workdir / "score" / "scores.json").read_text())
    by_step: dict[int, dict] = {}
    for row in dev_bleu(workdir) + checkpoint_test_bleu(workdir, config.data.pair):
        entry = by_step.setdefault(row["step"], {"step": row["step"]})
        entry["minutes"] = min(entry.get("minutes", 1e9), (row["time"] - started) / 60)
        entry.update({k: v for k, v in row.items() if k not in ("step", "time")})
    rows = [
        {
            "minutes": r["minutes"],
            "step": r["step"],
            "dev_bleu_greedy": r.get("dev_bleu_greedy"),
            "test_bleu_greedy": r.get("test_bleu_greedy"),
        }
        for r in sorted(by_step.values(), key=lambda r: r["step"])
    ]
    final = {
        "minutes": (ended - started) / 60,
        "bleu_sacre": scores["bleu_sacre"],
        "bleu_tok_lc": scores["bleu_tok_lc"],
        "test_set": scores["test_set"],
    }
    rows.append(
        {
            "minutes": final["minutes"],
            "step": "final",
            "dev_bleu_greedy": None,
            "test_bleu_greedy": None,
            "test_bleu_sacre": final["bleu_sacre"],
            "test_bleu_tok_lc": final["bleu_tok_lc"],
        }
    )
    title = (
        f"{config.name} ({config.data.pair}): {final['bleu_sacre']:.2f} sacreBLEU / "
        f"{final['bleu_tok_lc']:.2f} tokenized lowercased on {final['test_set']} after "
        f"{final['minutes']:.1f} min"
    )
    report(title, [{**{k: None for k in rows[-1]}, **r} for r in rows], args.json)
    if args.png:
        plot(rows[:-1], final, Path(args.png), f"{config.name}: BLEU against wall-clock time")
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
