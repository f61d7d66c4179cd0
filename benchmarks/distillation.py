"""Distillation on Multi30k, measured: the teacher, the baseline and the student side by side.

Runs, as a user would, from the repository root: the teacher's flow (the laptop recipe; every
stage skipped when its work dir is up to date), the distill flow (``tfm run`` of the distill
config: the teacher's champion translates the corpus, the student trains on it), and the
baseline (the same config with ``distill.teacher`` null: the same student, tokenizer settings,
steps and decoding, trained on the original targets), timing each. Then decodes the test set
with each of the models in each of their configs' searches (the teacher's beam 5 and the
students' greedy: every model with both, so a speed-up is read at the same search as well as at
each model's own) in one process, in two engines, each at the same threads: torch float32, and
CTranslate2 int8; passes interleaved, the median taken. Writes a table (stdout, JSON, Markdown),
a row per search and model: the test set's sacreBLEU (the pipeline's score stage at the model's
own search; of the torch and the CTranslate2 int8 outputs at each), sentences/s in each engine
and against the teacher's at that search, parameters, layers, and the minutes of each flow;
then the aims' checks, each model at its own search. The quickstart's pair (``ROWS``) records
its row in benchmarks/figures/.

    python benchmarks/distillation.py --mirror file://$HOME/multi30k \
        --json distill.json --markdown distill.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import figures  # noqa: E402
from common import parse_overrides, report  # noqa: E402

BLEU_MARGIN = 1.0
"""The student's test BLEU may be at most this far under the teacher's."""
SPEEDUP = 2.0
"""The student's sentences/s against the teacher's, in each engine, at least."""
MINUTES = 30.0
"""The distill flow's wall time, teacher translation included, at most."""
ENGINES = ("torch", "ct2_int8")
ROWS = {
    ("configs/quickstart.yaml", "configs/quickstart_distill.yaml"): (
        "distillation-quickstart",
        "the quickstart's distilled student against its teacher (`tfm run` of "
        "configs/quickstart_distill.yaml after `make demo`), the synthetic test set at 2 threads, "
        "both models at each search: the student's sentences/s against the teacher's",
    ),
}
"""The (teacher config, student config) pairs whose run records a row in benchmarks/figures/
(figures.py): its id and what it measures."""


@dataclasses.dataclass(frozen=True)
class Flow:
    """One of the three runs: its role, config path and ``--set`` overrides."""

    role: str
    config: str
    overrides: tuple[str, ...]

    def command(self) -> list[str]:
        sets = [arg for o in self.overrides for arg in ("--set", o)]
        return [sys.executable, "-m", "pipelines.cli", "run", self.config, *sets]

    def loaded(self):
        from tasks.framework.config import load_config

        return load_config(self.config, parse_overrides(list(self.overrides)))


def flows(args: argparse.Namespace) -> list[Flow]:
    """The teacher's, the student's and the baseline's runs."""
    data = [f"data.mirror={args.mirror}"] if args.mirror else []
    student = Flow("student", args.config, tuple(data + args.overrides))
    config = student.loaded()
    baseline_sets = student.overrides + (
        "distill.teacher=null",
        f"name={config.name}_baseline",
        f"register.model_name={config.register.model_name}-baseline",
    )
    found = [Flow("teacher", args.teacher_config, tuple(data)), student]
    return found if args.no_baseline else [*found, Flow("baseline", args.config, baseline_sets)]


def run(flow: Flow) -> dict:
    """``tfm run`` of ``flow``: its wall minutes, and whether its work dir started empty (else
    the minutes are a rerun's, and the stages' own seconds say what the first run took)."""
    root = flow.loaded().root
    fresh = not any(
        (root / name / "manifest.json").is_file() for name in ("download", "train", "distill")
    )
    print(f"\n== {flow.role}: {' '.join(flow.command()[3:])}", flush=True)
    started = time.time()
    subprocess.run(flow.command(), check=True)
    return {"wall_minutes": (time.time() - started) / 60, "fresh": fresh}


def stage_minutes(root: Path) -> float:
    """The seconds every stage folder of a work dir took when it was built, in minutes."""
    seconds = 0.0
    for manifest in root.glob("*/manifest.json"):
        seconds += float(json.loads(manifest.read_text()).get("seconds", 0.0))
    return seconds / 60


def describe(flow: Flow) -> dict:
    """What the flow made: its model's size and shape, its decoding and its test score."""
    from transformer_core import checkpoint, count_parameters

    config = flow.loaded()
    root = config.root
    model = checkpoint.load_model(root / "average" / "model.pt")
    scores = json.loads((root / "score" / "scores.json").read_text())
    d = config.decoding
    return {
        "config": config,
        "layers": f"{model.config.n_layers}+{model.config.n_decoder_layers}",
        "parameters": count_parameters(model),
        "decoding": "greedy" if d.beam_size == 1 else f"beam {d.beam_size}, alpha {d.alpha:g}",
        "bleu_sacre": scores["bleu_sacre"],
        "test_set": scores["test_set"],
        "stage_minutes": stage_minutes(root),
    }


def translators(flow: Flow, info: dict, threads: int, cache: Path) -> dict:
    """The flow's model decoding as its config says, in torch float32 and CTranslate2 int8."""
    from serving.translator import Translator

    config = info["config"]
    root, decode = config.root, dataclasses.replace(config.decoding, threads=threads)
    weights, tokenizer = root / "average" / "model.pt", root / "tokenizer"
    torch_decode = dataclasses.replace(decode, engine="torch", compute_type="default")
    ct2_decode = dataclasses.replace(
        decode, engine="ctranslate2", compute_type="int8", dtype="float32"
    )
    return {
        "torch": Translator.load(weights, tokenizer, torch_decode, device="cpu"),
        "ct2_int8": Translator.load(
            weights, tokenizer, ct2_decode, export_dir=cache / f"{flow.role}-int8", device="cpu"
        ),
    }


def searches(infos: dict) -> dict[str, dict]:
    """Every search the models' configs name, by its label, the teacher's first: each model is
    measured in each, so two models are compared at the same search too."""
    from transformer_core.search_settings import beam_fields

    found: dict[str, dict] = {}
    for info in infos.values():
        found.setdefault(info["decoding"], beam_fields(info["config"].decoding))
    return found


def in_search(by_engine: dict, search: dict) -> dict:
    """The translators of ``by_engine`` (each engine's model, shared) decoding with ``search``."""
    from serving.translator import Translator

    return {
        engine: Translator(t.model, t.tokenizer, dataclasses.replace(t.decode, **search), t.device)
        for engine, t in by_engine.items()
    }


def measure(engines: dict[tuple[str, str], dict], sources: list[str], passes: int) -> dict:
    """Seconds per pass of each ((role, search), engine) over ``sources``, passes interleaved
    (one warm-up pass first), and the outputs of the last."""
    seconds: dict[tuple[tuple[str, str], str], list[float]] = {}
    outputs: dict[tuple[tuple[str, str], str], list[str]] = {}
    for by_engine in engines.values():
        for translator in by_engine.values():
            translator.translate(sources[:64])  # warm-up: allocations, first calls
    for _ in range(passes):
        for run_key, by_engine in engines.items():
            for engine, translator in by_engine.items():
                started = time.perf_counter()
                outputs[run_key, engine] = translator.translate(sources)
                seconds.setdefault((run_key, engine), []).append(time.perf_counter() - started)
    return {"seconds": seconds, "outputs": outputs}


def rows(flows_: list[Flow], infos: dict, runs: dict, timing: dict, refs, lang: str) -> list:
    """One row per search and model: BLEU, speed in each engine (and against the teacher's at
    that search), size, minutes; the score stage's BLEU and the minutes at its own search."""
    from evaluation.bleu import score_texts

    table = []
    for search in dict.fromkeys(search for (_, search), _ in timing["seconds"]):
        speed = {
            (role, engine): len(refs) / statistics.median(timing["seconds"][(role, search), engine])
            for role, engine in ((f.role, e) for f in flows_ for e in ENGINES)
        }
        for flow in flows_:
            info, role = infos[flow.role], flow.role
            own = info["decoding"] == search
            bleu = {
                engine: score_texts(timing["outputs"][(role, search), engine], refs, lang)
                for engine in ENGINES
            }
            ran = runs.get(role, {})
            table.append(
                {
                    "search": search,
                    "model": role,
                    "layers (enc+dec)": info["layers"],
                    "parameters": info["parameters"],
                    "test sacreBLEU": info["bleu_sacre"] if own else None,
                    "sacreBLEU, torch": bleu["torch"]["bleu_sacre"],
                    "sacreBLEU, CT2 int8": bleu["ct2_int8"]["bleu_sacre"],
                    "sent/s torch": speed[role, "torch"],
                    "x teacher torch": speed[role, "torch"] / speed["teacher", "torch"],
                    "sent/s CT2 int8": speed[role, "ct2_int8"],
                    "x teacher CT2 int8": speed[role, "ct2_int8"] / speed["teacher", "ct2_int8"],
                    "flow minutes": ran["wall_minutes"] if own and ran.get("fresh") else None,
                    "stage minutes": info["stage_minutes"] if own else None,
                }
            )
    return table


def own_rows(table: list[dict]) -> dict[str, dict]:
    """Each model's row at its own search (the one with the score stage's BLEU), by role."""
    return {row["model"]: row for row in table if row["test sacreBLEU"] is not None}


def checks(table: list[dict]) -> list[tuple[str, bool]]:
    """The aims, each model at its own search: each figure against its bound."""
    by = own_rows(table)
    teacher, student, baseline = by["teacher"], by["student"], by.get("baseline")
    minutes = student["flow minutes"] or student["stage minutes"]
    found = [
        (
            f"student BLEU {student['test sacreBLEU']:.2f} >= teacher's "
            f"{teacher['test sacreBLEU']:.2f} - {BLEU_MARGIN}",
            student["test sacreBLEU"] >= teacher["test sacreBLEU"] - BLEU_MARGIN,
        ),
        *(
            (
                f"student {engine} {student[engine]:.1f} >= {SPEEDUP}x teacher's "
                f"{teacher[engine]:.1f}",
                student[engine] >= SPEEDUP * teacher[engine],
            )
            for engine in ("sent/s torch", "sent/s CT2 int8")
        ),
        (f"distill flow {minutes:.1f} min <= {MINUTES:g}", minutes <= MINUTES),
    ]
    if baseline is not None:
        found.append(
            (
                f"student BLEU {student['test sacreBLEU']:.2f} > baseline's "
                f"{baseline['test sacreBLEU']:.2f}",
                student["test sacreBLEU"] > baseline["test sacreBLEU"],
            )
        )
    return found


def markdown(table: list[dict], found: list[tuple[str, bool]]) -> str:
    """The table and the checks as Markdown, for docs/distillation.md."""
    columns = list(table[0])

    def cell(value: object) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):  # a BLEU or a ratio to 2 decimals, sentences/s whole
            return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}"
        return f"{value:,}" if isinstance(value, int) else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row[c]) for c in columns) + " |" for row in table]
    lines += [""] + [f"- {'met' if ok else 'NOT met'}: {what}" for what, ok in found]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher-config", default="configs/multi30k_en_de.yaml")
    parser.add_argument("--config", default="configs/multi30k_en_de_distill.yaml")
    parser.add_argument("--mirror", default=None, help="data.mirror, e.g. file://.../multi30k")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="K=V")
    parser.add_argument("--no-run", action="store_true", help="measure the work dirs as they are")
    parser.add_argument(
        "--no-baseline", action="store_true", help="the teacher and the student alone"
    )
    parser.add_argument("--passes", type=int, default=3, help="timed decoding passes per model")
    parser.add_argument("--threads", type=int, default=2, help="decoding threads, every engine")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args(argv)

    from corpora.text import read_lines

    plan = flows(args)
    runs = {} if args.no_run else {flow.role: run(flow) for flow in plan}
    infos = {flow.role: describe(flow) for flow in plan}
    config = infos["teacher"]["config"]
    src, tgt = config.languages
    sources = read_lines(config.root / "download" / f"test.{src}")
    refs = read_lines(config.root / "download" / f"test.{tgt}")
    cache = config.root.parent / "distillation-bench"
    engines = {}
    for flow in plan:
        own = translators(flow, infos[flow.role], args.threads, cache)
        for label, search in searches(infos).items():
            engines[flow.role, label] = in_search(own, search)
    timing = measure(engines, sources, args.passes)
    table = rows(plan, infos, runs, timing, refs, tgt)
    found = checks(table)
    report(f"Distillation on {infos['teacher']['test_set']}", table, args.json)
    for what, ok in found:
        print(f"{'met' if ok else 'NOT met'}: {what}")
    if args.markdown:
        Path(args.markdown).write_text(markdown(table, found), encoding="utf-8")
        print(f"wrote {args.markdown}")
    record_row(args, table)
    return 0 if all(ok for _, ok in found) else 1


def record_row(args: argparse.Namespace, table: list[dict]) -> None:
    """The pair's row in benchmarks/figures/decode.json, when the run is its measurement (a pair
    of ``ROWS``, as shipped, at 2 threads): the student against the teacher at each search."""
    pair = tuple(repo_path(c) for c in (args.teacher_config, args.config))
    if pair not in ROWS or args.overrides or args.mirror or args.threads != 2:
        return
    row_id, what = ROWS[pair]
    by = {(row["search"], row["model"]): row for row in table}
    first = table[0]["search"]
    student, teacher = by[first, "student"], by[first, "teacher"]
    parts = [
        f"student {student['parameters']:,} parameters ({student['layers (enc+dec)']} layers), "
        f"teacher {teacher['parameters']:,} ({teacher['layers (enc+dec)']})"
    ]
    for search in dict.fromkeys(row["search"] for row in table):
        student, teacher = by[search, "student"], by[search, "teacher"]
        parts.append(
            f"{search}: **{student['x teacher torch']:.2f}x** torch, "
            f"**{student['x teacher CT2 int8']:.2f}x** CTranslate2 int8 the teacher's "
            f"sentences/s ({student['sent/s torch']:,.0f} and {student['sent/s CT2 int8']:,.0f}), "
            f"sacreBLEU {student['sacreBLEU, torch']:.2f} against {teacher['sacreBLEU, torch']:.2f}"
        )
    figures.record("decode", row_id, "; ".join(parts), what=what)


def repo_path(path: str) -> str:
    """``path`` relative to the repository, as ``ROWS`` names configs (else as given)."""
    found = Path(path).resolve()
    return (
        found.relative_to(figures.ROOT).as_posix() if found.is_relative_to(figures.ROOT) else path
    )


if __name__ == "__main__":
    sys.exit(main())
