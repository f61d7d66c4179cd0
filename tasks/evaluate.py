"""Stage evaluate: the averaged model judged on every test set of ``eval.test_sets``.

In: ``average`` (``model.pt``), ``tokenizer``, ``score`` (the primary set's figures, which
translate and score made) and ``clean`` (its training split, for each set's overlap with it).
Out: ``sets/<name>/`` per extra set (``test.<src>``, ``test.<tgt>`` as read, ``hyp.<tgt>``,
``scores.json``, ``sentences.tsv``), and ``scores.json`` and ``scores.tsv`` of every set, the
primary first; the table on the console, each set's figures as MLflow metrics
(``bleu_sacre/<name>``...).

Each extra set is read (a built-in split fetched as the download stage fetches, or a prefix's
files), its source normalised as clean normalises the test set, translated by the corpus
translator (``serving.corpus_translation.translate_shards``) and scored against its text as
read, as score does. Its translation is kept under a key (the set's bytes, the model's and
the tokenizer's fingerprints, the decoding), and the next run of the stage takes it from the
stage's previous folder when the key is the same: a set added to the list is the only one
translated. A set not held out (``holdout: false``: the holdout stage did not remove it from the
training data) is reported with the share of its sources and of its targets that training saw.
"""

from __future__ import annotations

import json
import logging
import shutil
from importlib import metadata
from pathlib import Path
from typing import Any

from tasks.framework.config import RunConfig, fingerprint, to_dict
from tasks.framework.config_eval import EvalSet
from tasks.framework.contract import BuildContext
from tasks.framework.results import StageError

log = logging.getLogger(__name__)

STAGE = "evaluate"
SETS = "sets"
SCORES_FILE = "scores.json"
TABLE_FILE = "scores.tsv"
SENTENCES_FILE = "sentences.tsv"
COLUMNS = ("bleu_sacre", "bleu_tok_compound", "bleu_tok_lc", "chrf")
"""The metrics of the table and of MLflow, per set (``evaluation.bleu.METRICS``)."""
ROWS_PER_SHARD = 2000
"""Sentences per translated shard of a set (the unit a killed run resumes by)."""


def primary_name(config: RunConfig) -> str:
    """The primary set's name: the first of ``eval.test_sets``, else the score stage's."""
    if config.eval.test_sets:
        return config.eval.test_sets[0].name
    return "synthetic" if config.data.source == "synthetic" else config.data.eval_sets[1]


def stage_config(config: RunConfig) -> dict[str, Any]:
    """The pair, the decoding, the primary set's name, each extra set (a prefix's files by
    their bytes: an edited file reruns the stage), and the metric libraries' versions."""
    return {
        "pair": config.data.pair,
        "decode": to_dict(config.decoding),
        "primary": primary_name(config),
        "sets": [set_identity(config, s) for s in config.eval.extra],
        "mirror": config.data.mirror,
        "sacrebleu": metadata.version("sacrebleu"),
        "sacremoses": metadata.version("sacremoses"),
    }


def set_identity(config: RunConfig, s: EvalSet) -> dict[str, Any]:
    """What a set's fingerprint hashes: its name, split or prefix (a prefix's files by their
    bytes), and whether it is held out."""
    if s.prefix is None:
        return {"name": s.name, "split": s.split, "holdout": s.holdout}
    from corpora.local_files import fingerprinted_files
    from tasks.framework.content import file_digests

    prefix = Path(s.prefix)
    files = fingerprinted_files(prefix.parent, prefix.name, config.languages)
    digests = file_digests(files, prefix.parent)
    return {"name": s.name, "prefix": s.prefix, "files": digests, "holdout": s.holdout}


def build(ctx: BuildContext) -> dict[str, Any]:
    """Every extra set read, translated (unless the previous folder has it) and scored into
    ``ctx.tmp/sets/<name>``; the table of all sets."""
    config, tmp = ctx.config, ctx.tmp
    extra = config.eval.extra
    keys = {s.name: _key(ctx, read_set(ctx, s, tmp / SETS / s.name)) for s in extra}
    previous = _previous_translations(ctx)
    rows = [_primary_row(config, ctx.inputs["score"])]
    translated, reused = [], []
    for s in extra:
        folder = tmp / SETS / s.name
        key = keys[s.name]
        if key in previous:
            shutil.copyfile(previous[key], folder / previous[key].name)
            reused.append(s.name)
        else:
            _translate(ctx, folder, key)
            translated.append(s.name)
        rows.append(_score_set(ctx, s, folder, key, reused=s.name in reused))
    _write_table(tmp, rows)
    _log_metrics(rows)
    log.info("evaluate: %d test sets\n%s", len(rows), format_table(rows))
    return {
        "sets": len(rows),
        "translated": ",".join(translated),
        "reused": ",".join(reused),
        "primary": rows[0]["test_set"],
    }


def read_set(ctx: BuildContext, s: EvalSet, folder: Path) -> dict[str, Path]:
    """Set ``s`` as read into ``folder/test.<lang>``: those files by language. A missing,
    misaligned or empty set fails in one line naming it and its files."""
    from corpora import CorpusError, assemble
    from tasks.download import cache_dir, lock_path

    config = ctx.config
    data, (src, tgt) = config.data, config.languages
    folder.mkdir(parents=True)
    outputs = {lang: folder / f"test.{lang}" for lang in (src, tgt)}
    try:
        if s.prefix is not None:
            assemble.from_local_set(outputs, Path(s.prefix), data.pair)
        else:
            assert s.split is not None  # the config's rule: a split or a prefix
            assemble.from_registry_set(
                outputs,
                source=data.source,
                split=s.split,
                pair=data.pair,
                mirror=data.mirror,
                cache=cache_dir(config, ctx.workdir),
                lock_file=lock_path(config, ctx.workdir),
                max_retries=data.max_retries,
            )
    except CorpusError as exc:
        raise StageError(f"test set {s.name!r}: {exc}") from None
    return outputs


def _key(ctx: BuildContext, files: dict[str, Path]) -> str:
    """A set's translation key: its bytes, the model's and the tokenizer's fingerprints and the
    decoding."""
    from transformer_core.folders import sha256_file

    return fingerprint(
        {
            "content": [sha256_file(files[lang]) for lang in ctx.config.languages],
            "model": ctx.input_fps["average"],
            "tokenizer": ctx.input_fps["tokenizer"],
            "decode": to_dict(ctx.config.decoding),
        }
    )


def _previous_translations(ctx: BuildContext) -> dict[str, Path]:
    """Key -> the hypothesis file of each set in the stage's previous folder, if any."""
    manifest = ctx.workdir.manifest(STAGE)
    if manifest is None:
        return {}
    folders, _ = ctx.workdir.input_folders({STAGE: STAGE}, {STAGE: manifest["fingerprint"]})
    found = {}
    tgt = ctx.config.languages[1]
    for scores in sorted((folders[STAGE] / SETS).glob(f"*/{SCORES_FILE}")):
        hyp = scores.parent / f"hyp.{tgt}"
        key = json.loads(scores.read_text(encoding="utf-8")).get("key")
        if key and hyp.is_file():
            found[key] = hyp
    return found


def _translate(ctx: BuildContext, folder: Path, key: str) -> None:
    """The set's normalised source translated into ``folder/hyp.<tgt>`` (shards kept on this
    node under the key until then, so a killed run resumes)."""
    import pyarrow.parquet as pq

    from filesystem.storage import StoredPath
    from serving.corpus_translation import translate_shards
    from tasks.framework.runtime import ensure_ray
    from transformer_core.checkpoint import model_file

    config, (src, tgt) = ctx.config, ctx.config.languages
    weights = model_file(ctx.inputs["average"])
    if not weights.is_file():
        raise StageError(f"no checkpoint at {weights} (run `tfm stage average` first)")
    sources = normalised((folder / f"test.{src}").read_text(encoding="utf-8").splitlines())
    shards = ctx.workdir.node_path(f"cache/{STAGE}/{key[:16]}")
    ensure_ray(config.ray)
    translate_shards(
        ctx.stored["average"] / weights.name,
        StoredPath(ctx.stored["tokenizer"]),
        sources,
        config.decoding,
        shards,
        ROWS_PER_SHARD,
        export_dir=ctx.workdir.node_path(f"cache/ctranslate2/{ctx.input_fps['average'][:16]}"),
        label=f"evaluate {folder.name}",
    )
    hyps = [
        h
        for part in sorted(shards.glob("part-*.parquet"))
        for h in pq.read_table(part)["tgt"].to_pylist()
    ]
    (folder / f"hyp.{tgt}").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    shutil.rmtree(shards, ignore_errors=True)


def judged_sets(folder: Path, tgt: str) -> list[tuple[dict[str, Any], list[str], list[str]]]:
    """Each extra set of an evaluate stage's ``folder``, in name order: its ``scores.json``,
    references and hypotheses (what register keeps of it)."""
    from corpora.text import read_lines

    found = []
    for scores in sorted((folder / SETS).glob(f"*/{SCORES_FILE}")):
        refs, hyps = (
            read_lines(scores.parent / f"test.{tgt}"),
            read_lines(scores.parent / f"hyp.{tgt}"),
        )
        found.append((json.loads(scores.read_text(encoding="utf-8")), refs, hyps))
    return found


def normalised(lines: list[str]) -> list[str]:
    """``lines`` normalised as clean normalises a test set."""
    import pyarrow as pa

    from corpora.filters import normalize_array

    return normalize_array(pa.array(lines, pa.string())).to_pylist()


def _score_set(
    ctx: BuildContext, s: EvalSet, folder: Path, key: str, *, reused: bool
) -> dict[str, Any]:
    """Score ``folder/hyp.<tgt>`` against ``folder/test.<tgt>``: its ``scores.json`` and
    ``sentences.tsv``, with its overlap with the training split; its row of the table."""
    from corpora.overlap import training_overlap
    from corpora.parquet import part_files
    from corpora.text import read_lines
    from evaluation import bleu

    src, tgt = ctx.config.languages
    name = s.name
    hyps, refs = read_lines(folder / f"hyp.{tgt}"), read_lines(folder / f"test.{tgt}")
    sources = read_lines(folder / f"test.{src}")
    if len(hyps) != len(refs):
        raise StageError(f"test set {name!r}: {len(hyps)} translations of {len(refs)} lines")
    scores = bleu.score_texts(hyps, refs, tgt)
    train = part_files(ctx.inputs["clean"] / "train")
    overlap = training_overlap(train, normalised(sources), normalised(refs))
    result = {
        **scores,
        "test_set": name,
        "test_segments": len(refs),
        "pair": ctx.config.data.pair,
        "signature": scores["bleu_sacre_signature"],
        "held_out": s.holdout,
        **overlap,
        "key": key,
        "reused": reused,
    }
    (folder / SCORES_FILE).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    bleu.write_sentences(
        folder / SENTENCES_FILE, sources, refs, hyps, bleu.sentence_bleu(hyps, refs, tgt)
    )
    return _row(result)


def _primary_row(config: RunConfig, score: Path) -> dict[str, Any]:
    """The primary set's row, from the score stage's ``scores.json``: clean removed it from
    training (held out)."""
    result = json.loads((score / SCORES_FILE).read_text(encoding="utf-8"))
    return _row({**result, "test_set": primary_name(config), "held_out": True})


def _row(result: dict[str, Any]) -> dict[str, Any]:
    """A set's figures and signatures as the table and the top-level ``scores.json`` keep them."""
    keys = (
        "test_set",
        "test_segments",
        *COLUMNS,
        *(f"{m}_signature" for m in COLUMNS),
        "held_out",
        "sources_seen",
        "targets_seen",
    )
    return {k: result.get(k) for k in keys}


def format_table(rows: list[dict[str, Any]]) -> str:
    """The sets as a text table, the primary one first and marked ``*``; a held-out set's
    overlap is ``held out`` (clean removed it)."""
    head = ["set", "segments", *COLUMNS, "src seen", "tgt seen"]
    lines = [head]
    for i, row in enumerate(rows):
        seen = (
            ["held out", "held out"]
            if row["held_out"]
            else [f"{row['sources_seen']:.1%}", f"{row['targets_seen']:.1%}"]
        )
        name = f"{row['test_set']}{' *' if i == 0 else ''}"
        lines.append([name, str(row["test_segments"]), *(f"{row[m]:.2f}" for m in COLUMNS), *seen])
    widths = [max(len(line[j]) for line in lines) for j in range(len(head))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if j == 0 else cell.rjust(w)
            for j, (cell, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in lines
    )


def _write_table(tmp: Path, rows: list[dict[str, Any]]) -> None:
    """``scores.json`` (every set's row) and ``scores.tsv`` (the table) at the folder's top,
    which the runner logs as MLflow artifacts."""
    (tmp / SCORES_FILE).write_text(json.dumps({"sets": rows}, indent=2) + "\n", encoding="utf-8")
    keys = ("test_set", "test_segments", *COLUMNS, "held_out", "sources_seen", "targets_seen")
    text = "".join("\t".join(str(row[k]) for k in keys) + "\n" for row in rows)
    (tmp / TABLE_FILE).write_text("\t".join(keys) + "\n" + text, encoding="utf-8")


def _log_metrics(rows: list[dict[str, Any]]) -> None:
    """Each set's figures into the stage's MLflow run, if any: ``bleu_sacre/<set>``..."""
    from tracking.journal import log_record
    from tracking.run import current

    run = current()
    if run is None:
        return
    metrics = {
        f"{m}/{row['test_set']}": float(row[m]) for row in rows for m in (*COLUMNS, "test_segments")
    }
    for row in rows:
        if not row["held_out"]:
            for m in ("sources_seen", "targets_seen"):
                metrics[f"{m}/{row['test_set']}"] = float(row[m])
    run.append([log_record(metrics=metrics)])
