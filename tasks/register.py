"""Stage register: the averaged model as an MLflow pyfunc "translator", versioned and aliased.

In: ``average``, ``tokenizer``, ``score``, ``evaluate`` where the config has more test sets,
and in the distill pipeline ``teacher`` (the fairseq pipeline: ``fairseq_import`` as both of the
first two, and no score). Out: ``registered.json``
(model name, version, aliases, the champion decision). Each registration logs the model
(``serving.pyfunc``: weights, tokenizer, model and decoding configs as artifacts), creates a
registry version with lineage tags (every upstream stage's fingerprint and code fingerprint, the
run config, the git commit, a distilled model's teacher, an imported model's file), the weights'
sha256, its scores and each test set's figures (``eval.<set>.*``), keeps each set's hypotheses
with the version (``evaluation.evidence``: the evidence a later candidate is compared with) and
points the ``candidate`` alias at it; ``champion`` moves as ``evaluation.champion`` decides
(``register.rule``), and the log, the version's tags and ``registered.json`` say why, with each
compared set's difference, interval and p-value. A fine-tuned model is also compared with its
registered parent on every set both were judged on (``parent.evidence.<set>.*``, the log and
``against_parent`` in ``registered.json``): what it gained, and what it forgot.

The pyfunc carries its own code (``code_paths``: copies of ``serving``, ``transformer_core`` and
``parsing``, nothing else) rather than a pip requirement on this project: the project is not on a
package index, so an environment built from the model's requirements (``mlflow models serve``
with virtualenv or conda) could not install it, and the copy pins the exact code that wrote the
weights. Its ``pip_requirements`` pin what that code imports (torch, sentencepiece, numpy) to
the installed versions; MLflow adds itself. Served with ``mlflow models serve -m
models:/<name>@champion``, it answers ``{"inputs": ["sentence", ...]}``.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from corpora.pretokenize import Pretokenizer
from evaluation.champion import Decision, Rule, choose, protocol, row_line, row_tags
from evaluation.evidence import (
    EVIDENCE_PATH,
    SetOutputs,
    figure_tags,
    write_evidence,
)
from filesystem.redact import redact_text, redact_uri, redacted
from tasks.framework import mlflow_runs
from tasks.framework.code_fingerprint import git_state, stage_code
from tasks.framework.config import RunConfig, fingerprint, to_dict
from tasks.framework.contract import BuildContext
from tasks.framework.lineage import lineage, parent_tags, teacher_tags
from tasks.framework.manifest import read_manifest
from tasks.framework.registry_evidence import compared_with_parent, stored_evidence
from tasks.framework.results import StageError
from tasks.framework.stage_fingerprint import code_version

log = logging.getLogger(__name__)

STAGE = "register"
CANDIDATE = "candidate"
CHAMPION = "champion"
ARTIFACT_NAME = "translator"
SCORES_FILE = "scores.json"
REGISTERED_FILE = "registered.json"
REQUIREMENTS = ("torch", "sentencepiece", "numpy")
"""What ``serving`` and ``transformer_core`` import (MLflow adds itself)."""


def stage_config(config: RunConfig) -> dict[str, Any]:
    """The register section, the decoding settings and request limits it stores, and the
    registry it writes to."""
    return {
        "register": to_dict(config.register),
        "decode": to_dict(config.decoding),
        "limits": to_dict(config.serve.limits),
        "tracking_uri": config.tracking_uri,
    }


# ----------------------------------------------------------------------------- pure helpers


def pip_requirements(engine: str = "torch", pretokenizer: Pretokenizer | None = None) -> list[str]:
    """``name==version`` of the installed distributions the pyfunc imports, ctranslate2 for that
    engine, and what the tokenizer folder's ``pretokenizer`` runs (sacremoses, subword-nmt);
    local labels such as ``+cpu`` dropped: an index serves ``torch==2.13.0``, not ``2.13.0+cpu``."""
    names = REQUIREMENTS + (("ctranslate2",) if engine == "ctranslate2" else ())
    if pretokenizer is not None:
        names += (("sacremoses",) if pretokenizer.moses else ()) + (
            ("subword-nmt",) if pretokenizer.bpe_codes else ()
        )
    return [f"{name}=={metadata.version(name).split('+')[0]}" for name in names]


def read_scores(score_dir: Path, metric: str) -> dict[str, Any]:
    """The score folder's scores.json; a clear error if it or the deciding metric is missing."""
    path = Path(score_dir) / SCORES_FILE
    try:
        scores = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StageError(f"register: {path} does not exist (run `tfm stage score` first)") from None
    except json.JSONDecodeError as exc:
        raise StageError(f"register: {path} is not valid JSON: {exc}") from None
    value = scores.get(metric)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise StageError(
            f"register: {path} has no numeric {metric!r} (register.metric); keys: {sorted(scores)}"
        )
    return scores


# ----------------------------------------------------------------------------- MLflow


def _alias_version(client: Any, name: str, alias: str) -> Any | None:
    """The version an alias points at, or None (no such model or alias)."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return None
        raise


def _stage_model_files(
    staging: Path, weights: Path, tokenizer_dir: Path, config: RunConfig
) -> dict[str, str]:
    """Copy what the pyfunc needs into ``staging``; returns the artifacts mapping."""
    from serving import tokenizer
    from serving.registered_version import (
        ARTIFACT_CTRANSLATE2,
        ARTIFACT_DECODE,
        ARTIFACT_LIMITS,
        ARTIFACT_MODEL_CONFIG,
        ARTIFACT_TOKENIZER,
        ARTIFACT_WEIGHTS,
    )
    from transformer_core import checkpoint

    tok = staging / "tokenizer"
    tok.mkdir()
    tokenizer.load(tokenizer_dir)  # a clear error if there is none
    for name in tokenizer.FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy2(tokenizer_dir / name, tok / name)
    model_config = checkpoint.load(weights)["config"]
    (staging / "model_config.json").write_text(json.dumps(model_config, indent=2, sort_keys=True))
    (staging / "decode.json").write_text(
        json.dumps(to_dict(config.decoding), indent=2, sort_keys=True)
    )
    # What a request to the served version may ask (mlflow models serve checks it too).
    (staging / "limits.json").write_text(
        json.dumps(to_dict(config.serve.limits), indent=2, sort_keys=True)
    )
    artifacts = {
        ARTIFACT_WEIGHTS: str(weights),
        ARTIFACT_TOKENIZER: str(tok),
        ARTIFACT_MODEL_CONFIG: str(staging / "model_config.json"),
        ARTIFACT_DECODE: str(staging / "decode.json"),
        ARTIFACT_LIMITS: str(staging / "limits.json"),
    }
    if config.decoding.engine == "ctranslate2":  # served at CTranslate2's speed, exported once here
        from serving.ct2_export import export_ctranslate2

        export = export_ctranslate2(weights, tok, staging / "ctranslate2", decode=config.decoding)
        artifacts[ARTIFACT_CTRANSLATE2] = str(export)
    return artifacts


def _stage_code(staging: Path) -> list[str]:
    """Clean copies of the packages a registered model runs (``serving``, ``transformer_core``,
    and ``parsing`` for tree-constrained decoding) for ``code_paths``, without caches."""
    import parsing
    import serving
    import transformer_core

    paths = []
    for package in (parsing, serving, transformer_core):
        src = Path(package.__file__).parent
        dst = staging / "code" / src.name
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        paths.append(str(dst))
    return paths


def register_model(
    config: RunConfig,
    weights: Path,
    tokenizer_dir: Path,
    scores: Mapping[str, Any],
    tags: Mapping[str, str],
    evidence: Sequence[SetOutputs] = (),
) -> dict[str, Any]:
    """Log the pyfunc (and ``evidence``, each test set's hypotheses), create a registry
    version, set aliases; returns what registered.json holds."""
    import mlflow

    import serving
    from serving.pyfunc import INPUT_EXAMPLE, signature

    name = config.register.model_name
    metric = config.register.metric
    # The one stage that needs the server: it waits for it (mlflow.registry_wait_seconds).
    with (
        tempfile.TemporaryDirectory(prefix="register-") as tmp,
        mlflow_runs.registry(config, STAGE) as (client, run_id),
    ):
        staging = Path(tmp)
        artifacts = _stage_model_files(staging, weights, tokenizer_dir, config)
        info = mlflow.pyfunc.log_model(
            name=ARTIFACT_NAME,
            # Models from code: a version is this file plus its artifacts; loading it runs
            # code from the version's copy of `serving`, and unpickles nothing.
            python_model=str(Path(serving.__file__).parent / "registered_model.py"),
            artifacts=artifacts,
            code_paths=_stage_code(staging),
            pip_requirements=pip_requirements(
                config.decoding.engine, Pretokenizer.load(tokenizer_dir)
            ),
            signature=signature(config.decoding),
            input_example=INPUT_EXAMPLE,
            registered_model_name=name,
        )
        if evidence:
            mlflow.log_artifacts(
                str(write_evidence(staging / EVIDENCE_PATH, evidence)), EVIDENCE_PATH
            )
    version = str(info.registered_model_version)
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)

    previous = _alias_version(client, name, CHAMPION)
    decision = choose_champion(config, scores, evidence, previous, tags)
    client.set_registered_model_alias(name, CANDIDATE, version)
    if decision.take:
        client.set_registered_model_alias(name, CHAMPION, version)
    log.info("register: %s version %s: %s", name, version, decision.reason)
    for line in decision.lines():
        log.info("register:   %s", line)
    against = None if previous is None else str(previous.version)
    for key, value in decision.tags(against).items():
        client.set_model_version_tag(name, version, key, value)
    aliases = sorted(client.get_model_version(name, version).aliases)
    return {
        "name": name,
        "version": int(version),
        "aliases": aliases,
        "model_uri": f"models:/{name}/{version}",
        "run_id": run_id,
        "tracking_uri": config.tracking_uri,
        "metric": {"name": metric, "value": _float_or_none(scores.get(metric))},
        "protocol": protocol(scores, metric),
        "champion": decision.take,
        "decision": decision.reason,
        "rule": config.register.rule,
        "max_p": config.register.max_p,
        "evidence": decision.sets,
        "previous_champion": None
        if previous is None
        else {
            "version": int(previous.version),
            metric: _float_or_none(previous.tags.get(metric)),
            "protocol": protocol(previous.tags, metric),
        },
    }


def choose_champion(
    config: RunConfig,
    scores: Mapping[str, Any],
    evidence: Sequence[SetOutputs],
    previous: Any | None,
    tags: Mapping[str, str],
) -> Decision:
    """The candidate (its ``scores``, ``evidence`` and ``tags``) against the champion
    (``previous``, a registry version or None), by ``evaluation.champion.choose``."""
    from serving.pyfunc import WEIGHTS_TAG
    from tasks.evaluate import primary_name

    section, old = config.register, None if previous is None else previous.tags
    rule = Rule(section.metric, section.rule, section.max_p, primary_name(config))
    stored = stored_evidence(config, previous) if rule.wants_evidence(scores, old) else None
    same = old is not None and old.get(WEIGHTS_TAG) == tags.get(WEIGHTS_TAG)
    return choose(rule, scores, old, evidence, stored, config.languages[1], same_weights=same)


def _float_or_none(value: str | float | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def version_tags(
    config: RunConfig, inputs: Mapping[str, Path], scores: Mapping[str, Any]
) -> dict[str, str]:
    """Lineage (each upstream stage's fingerprint and code fingerprint, the git commit and
    whether the checkout was dirty), config, code version, every scalar of scores.json
    (scores, signatures, test set: what ``protocol`` reads back) and, for an imported model, the
    file it came from (``imported_from.*``) as registry tags (strings)."""
    tags = {f"lineage.{stage}": fp for stage, fp in lineage(inputs).items()}
    codes = {**lineage(inputs, key="code"), STAGE: fingerprint(stage_code(STAGE))}
    tags.update({f"code.{stage}": fp for stage, fp in codes.items()})
    tags["code_version"] = code_version()
    tags.update(git_state())
    public = redacted(to_dict(config))  # no URI password in a registry tag, nor under a hash
    tags["config"] = json.dumps(public, sort_keys=True)
    tags["config_fingerprint"] = fingerprint(public)
    tags["pipeline.run"] = config.name
    tags["metric"] = config.register.metric
    manifest = read_manifest(inputs["average"]) if "average" in inputs else None
    origin = ((manifest or {}).get("stats") or {}).get("imported_from") or {}
    tags.update({f"imported_from.{key}": str(value) for key, value in origin.items()})
    for key, value in scores.items():
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            tags[key] = str(value)
    return tags


# ----------------------------------------------------------------------------- the stage


def judged_sets(
    config: RunConfig, inputs: Mapping[str, Path], scores: Mapping[str, Any]
) -> tuple[list[SetOutputs], dict[str, Mapping[str, Any]]]:
    """Each test set the model was judged on, the primary one (score's) first: its references
    and hypotheses, and its figures where they are whole (``evaluation.evidence.figure_tags``)."""
    from evaluation.bleu import read_sentences
    from evaluation.evidence import TAGGED
    from tasks import evaluate
    from tasks.score import SENTENCES_FILE

    if "score" not in inputs:
        return [], {}
    primary = evaluate.primary_name(config)
    sets, figures = [], {primary: scores}
    sentences = inputs["score"] / SENTENCES_FILE
    if sentences.is_file():
        _, refs, hyps = read_sentences(sentences)
        sets.append(SetOutputs(primary, refs, hyps))
    if "evaluate" in inputs:
        for result, refs, hyps in evaluate.judged_sets(inputs["evaluate"], config.languages[1]):
            sets.append(SetOutputs(result["test_set"], refs, hyps))
            figures[result["test_set"]] = result
    whole = ("segments", "bleu_sacre_signature", *TAGGED)
    return sets, {k: v for k, v in figures.items() if all(m in v for m in whole)}


def build(ctx: BuildContext) -> dict[str, Any]:
    """Register the averaged model; writes ``ctx.tmp/registered.json``."""
    from serving.pyfunc import WEIGHTS_TAG
    from transformer_core.checkpoint import MODEL_FILE
    from transformer_core.folders import sha256_file

    config, inputs = ctx.config, ctx.inputs
    weights = inputs["average"] / MODEL_FILE
    if not weights.is_file():
        raise StageError(f"register: no checkpoint at {weights} (run `tfm stage average` first)")
    # An imported model (the fairseq pipeline) comes unscored: it takes champion only where
    # there is none.
    scores = read_scores(inputs["score"], config.register.metric) if "score" in inputs else {}
    evidence, figures = judged_sets(config, inputs, scores)
    tags = {**version_tags(config, inputs, scores), **teacher_tags(inputs), **parent_tags(inputs)}
    tags.update(figure_tags(figures))
    tags[WEIGHTS_TAG] = sha256_file(weights)
    vs_parent = compared_with_parent(config, inputs, evidence)
    for row in vs_parent:
        log.info("register: against its parent, %s", row_line(row))
    tags.update(row_tags("parent.evidence", vs_parent))
    record = register_model(config, weights, inputs["tokenizer"], scores, tags, evidence)
    record["against_parent"] = vs_parent
    (ctx.tmp / REGISTERED_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return {
        "name": record["name"],
        "version": record["version"],
        "aliases": record["aliases"],
        "champion": record["champion"],
        "decision": record["decision"],
        config.register.metric: record["metric"]["value"],
        **({"teacher": tags["teacher.model_uri"]} if "teacher.model_uri" in tags else {}),
    }


def outdated(config: RunConfig, out_dir: Path) -> str | None:
    """Why an otherwise up-to-date output is stale: its registry version is gone (a new
    database); None if the version is there, or if the server does not answer (it may well be
    there: a server that is down reruns nothing)."""
    try:
        record = json.loads((out_dir / REGISTERED_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return f"{out_dir / REGISTERED_FILE} is unreadable"
    from mlflow.exceptions import MlflowException

    try:
        mlflow_runs.client(config).get_model_version(record["name"], str(record["version"]))
    except MlflowException as exc:
        if exc.get_http_status_code() != 404:
            log.warning(
                "register: could not check %s version %s (%s): kept as it is",
                record["name"],
                record["version"],
                redact_text(str(exc).splitlines()[0][:200]),
            )
            return None
        return (
            f"{record['name']} version {record['version']} "
            f"is not in {redact_uri(config.tracking_uri)}"
        )
    return None
