"""The train stage: Ray Train (``TorchTrainer``, DDP) on the shards, tracked in MLflow.

Resume: Ray Train's storage lives outside the stage folder, at a stable place keyed by the
*resume key* (the stage fingerprint without the fields that do not change what is trained:
``steps``, the logging, evaluation and checkpoint cadence, ``max_failures``, ``storage_path`` and
``stop_after``). Rerunning the same config, or one that only raises ``steps`` or drops
``stop_after``, continues from the latest checkpoint at the exact step and batch, logging into
the same MLflow run. The stage folder is written at the end: weights-only copies of the kept
checkpoints, ``final/model.pt`` and ``checkpoints.json``. The work is ``training``'s: this stage
checks its inputs, builds a ``training.job_spec.TrainJob`` and hands it to ``run_job`` (Ray Train,
the ``Trainer`` on every worker, the export into the stage folder).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from filesystem.location import Location, open_location
from filesystem.redact import redact_uri, redacted
from tasks.framework import mlflow_runs
from tasks.framework.config import RunConfig, flatten, to_dict
from tasks.framework.contract import BuildContext
from tasks.framework.manifest import read_manifest
from tasks.framework.results import StageError
from tasks.framework.runtime import ensure_ray
from tasks.framework.stage_fingerprint import code_version, stage_fingerprint
from tasks.framework.workdir import WorkDir
from training.data import shard_files
from training.job_spec import TrainJob
from training.ray_trainer import CHECKPOINTS_JSON, JobError, run_job
from training.trainer import Callback

log = logging.getLogger(__name__)

STAGE = "train"
# TrainConfig fields that change neither the weights nor the data order of the steps they share.
NOT_IN_RESUME_KEY = (
    "steps",
    "stop_after",
    "storage_path",
    "max_failures",
    "log_every",
    "eval_every",
    "checkpoint_every",
    "checkpoint_minutes",
    "keep_checkpoints",
    "cpus_per_worker",
    "placement_strategy",
    "elastic_check_seconds",
    "prefetch",
    "warn_encoder_spread",
    "torch_threads",
    "keep_freed_memory",
)


def stage_config(config: RunConfig) -> dict[str, Any]:
    """What the stage fingerprints besides its inputs: seed, model and train sections."""
    return {"seed": config.seed, "model": to_dict(config.model), "train": to_dict(config.train)}


def resume_key(config: RunConfig, input_fps: Mapping[str, str]) -> str:
    """The fingerprint that names the Ray Train run folder (what a rerun resumes from)."""
    cfg = stage_config(config)
    # Under linear decay the total sets every step's learning rate: another total, another run.
    neutral = set(NOT_IN_RESUME_KEY) - ({"steps"} if config.train.decay == "linear" else set())
    cfg["train"] = {k: v for k, v in cfg["train"].items() if k not in neutral}
    # The package version, not the code's digests: a fix in the code (a log line, say) must not
    # lose a 12-hour run's checkpoints; the stage's own fingerprint sees the change.
    return stage_fingerprint(STAGE, cfg, input_fps, code=code_version())


def storage_location(
    config: RunConfig, input_fps: Mapping[str, str], workdir: WorkDir
) -> tuple[Location, str]:
    """Ray Train's storage and run name, from the inputs' fingerprints (``input_fingerprints``):
    ``train.storage_path``, else ``train_ray`` in the work dir; the run folder is their join."""
    key = resume_key(config, input_fps)[:12]
    if config.train.storage_path:
        return open_location(config.train.storage_path), f"{config.name}-train-{key}"
    return workdir.location("train_ray"), f"train-{key}"


def build(ctx: BuildContext, *, callbacks: Sequence[Callback] = ()) -> dict[str, Any]:
    """Train on ``inputs["shard"]`` with the tokenizer ``inputs["tokenizer"]``; the weights into
    ``ctx.tmp``. ``callbacks(trainer)`` are called after every step in every worker (the tests
    kill a worker this way); not fingerprinted, they must not change what is trained."""
    # The inputs' fingerprints, checked once by the runner, name Ray's run folder too.
    return _train(ctx, callbacks)


# ----------------------------------------------------------------------------- checks


def check_inputs(config: RunConfig, inputs: Mapping[str, Path]) -> dict[str, int]:
    """Row counts and the vocabulary size; a StageError naming the path or key if anything is
    off."""
    import pyarrow.parquet as pq

    shard = Path(inputs["shard"])
    stats = (read_manifest(shard) or {}).get("stats", {})
    counts = {}
    for split in ("train", "dev"):
        files = shard_files(str(shard / split))
        if not files:
            raise StageError(f"no shards: {shard / split} has no part-*.parquet files")
        fs = open_location(shard / split).arrow
        rows = 0
        metas = []
        for f in files:
            meta = pq.read_metadata(f, filesystem=fs)
            names = set(meta.schema.to_arrow_schema().names)
            missing = {"src_ids", "tgt_ids"} - names
            if missing:
                raise StageError(f"shard {f} lacks column(s) {sorted(missing)}")
            rows += meta.num_rows
            metas.append(meta)
        if rows == 0:
            raise StageError(f"empty shards: {shard / split} holds 0 rows")
        check_lengths(config, shard / split, longest_row(stats.get(split, {}), metas))
        counts[f"{split}_rows"] = rows
    counts["vocab_size"] = vocab_size(config, inputs, stats)
    counts["tgt_vocab_size"] = target_vocab_size(config, inputs)
    return counts


def longest_row(split_stats: Mapping[str, Any], metas: Sequence[Any]) -> int | None:
    """Pieces in a split's longest row (either side): the shard manifest's ``max_src_len`` and
    ``max_tgt_len``, else the Parquet statistics of ``src_len``/``tgt_len``; None if neither
    says."""
    if "max_src_len" in split_stats and "max_tgt_len" in split_stats:
        return max(int(split_stats["max_src_len"]), int(split_stats["max_tgt_len"]))
    longest = 0
    for meta in metas:
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            columns = [group.column(j) for j in range(group.num_columns)]
            lens = [c for c in columns if c.path_in_schema in ("src_len", "tgt_len")]
            if len(lens) != 2 or not all(c.is_stats_set and c.statistics.has_min_max for c in lens):
                return None  # hand-written shards without lengths: plan_batches still refuses
            longest = max(longest, *(int(c.statistics.max) for c in lens))
    return longest


def check_lengths(config: RunConfig, folder: Path, longest: int | None) -> None:
    """The longest row must fit the model's positions and one micro-batch's token budget: the
    batch planner refuses a longer row, and Ray Train would only retry it until it gave up."""
    limits = (
        ("model.max_len", config.model.max_len),
        ("train.max_tokens_per_batch", config.train.max_tokens_per_batch),
    )
    for key, limit in limits:
        if longest is not None and longest > limit:
            raise StageError(
                f"{folder} holds a row of {longest} pieces but {key} is {limit}: rerun "
                f"`tfm stage shard --config <config>` (it drops longer rows) or raise {key}"
            )


def vocab_size(
    config: RunConfig, inputs: Mapping[str, Path], shard_stats: Mapping[str, Any]
) -> int:
    """The model's vocabulary: the tokenizer's piece count, checked against the shard manifest's
    ``shard_stats`` (``vocab_size``) and against ``tokenizer.vocab_size`` in the config (with
    ``kind: subword-nmt``, at most that many)."""
    spm_file = Path(inputs["tokenizer"]) / "spm.model"
    if not spm_file.is_file():
        raise StageError(f"tokenizer model {spm_file} does not exist")
    import sentencepiece

    pieces = sentencepiece.SentencePieceProcessor(model_file=str(spm_file)).get_piece_size()
    if "vocab_size" in shard_stats and int(shard_stats["vocab_size"]) != pieces:
        raise StageError(
            f"vocabulary mismatch: {inputs['shard']}/manifest.json says vocab_size "
            f"{shard_stats['vocab_size']} but the tokenizer {spm_file} has {pieces} pieces"
        )
    expected = config.tokenizer.vocab_size
    ceiling = config.tokenizer.kind == "subword-nmt"  # its vocabulary is what the merges make
    if pieces > expected or (pieces != expected and not ceiling):
        raise StageError(
            f"tokenizer.vocab_size: the config says {config.tokenizer.vocab_size} but the "
            f"tokenizer {spm_file} has {pieces} pieces (the model's vocabulary)"
        )
    return pieces


def target_vocab_size(config: RunConfig, inputs: Mapping[str, Path]) -> int | None:
    """With ``tokenizer.target_symbols`` the decoder's vocabulary is the special ids and the
    target symbols, which sentencepiece numbers right after them (a word-level target
    vocabulary: a softmax over ~100 tree tokens instead of every piece); else None (joint). In
    parsing's ``words`` form the targets hold the words' pieces too: joint."""
    from corpora.subwords import FIRST_SYMBOL_ID

    if not config.tokenizer.target_symbols or config.parsing.form == "words":
        return None
    stats = (read_manifest(Path(inputs["tokenizer"])) or {}).get("stats", {})
    if "target_symbols" not in stats:
        raise StageError(
            f"{inputs['tokenizer']}/manifest.json does not count its target symbols: rerun "
            "`tfm stage tokenizer --config <config> --force`"
        )
    return FIRST_SYMBOL_ID + int(stats["target_symbols"])


def check_parent(config: RunConfig, folder: Path) -> None:
    """With ``train.init_from``: the model must have the parent's shape (the parent stage's
    folder records it), and the parent Adam's state with ``keep_optimizer``; else a StageError
    in one line naming the settings that differ."""
    from training.parent_weights import shape_mismatch
    from transformer_core.config import ModelConfig

    stats = (read_manifest(folder) or {}).get("stats", {})
    if "model" not in stats:
        raise StageError(f"{folder}/manifest.json records no parent model: run the parent stage")
    problem = shape_mismatch(config.model, ModelConfig.from_dict(stats["model"]))
    if problem is None and config.train.keep_optimizer and not stats.get("optimizer"):
        problem = "train.keep_optimizer: its checkpoint holds weights only, no optimizer state"
    if problem is not None:
        raise StageError(f"train.init_from {config.train.init_from}: {problem}")


def check_resources(config: RunConfig) -> None:
    """GPUs and CPUs the workers ask for must exist (on a local Ray, all of them)."""
    import ray

    tc = config.train
    resources = ray.cluster_resources()
    local = not (config.ray.address or os.environ.get("RAY_ADDRESS"))
    gpus = resources.get("GPU", 0)
    if tc.use_gpu and gpus == 0:
        raise StageError("train.use_gpu is true but the Ray cluster has no GPU")
    if tc.use_gpu and gpus < tc.min_workers:
        message = (
            f"train.num_workers={tc.num_workers} GPU workers but the cluster has {gpus:g} GPUs"
        )
        if local:
            raise StageError(message)
        log.warning("%s; waiting for the autoscaler", message)
    cpus = resources.get("CPU", 0)
    if local and tc.min_workers * tc.cpus_per_worker > cpus:
        raise StageError(
            f"train.cpus_per_worker: {tc.min_workers} workers x {tc.cpus_per_worker:g} CPUs "
            f"exceed the local Ray's {cpus:g} CPUs"
        )


# ----------------------------------------------------------------------------- the stage


def _train(ctx: BuildContext, callbacks: Sequence[Callback]) -> dict[str, Any]:
    config, inputs, tmp = ctx.config, ctx.inputs, ctx.tmp
    counts = check_inputs(config, inputs)
    if config.train.init_from is not None:
        check_parent(config, inputs["tokenizer"])
    ensure_ray(config.ray)
    check_resources(config)
    job = make_job(ctx, counts, callbacks)
    (tmp / "config.json").write_text(json.dumps(redacted(to_dict(config)), indent=2) + "\n")
    with mlflow_runs.training_run(config, STAGE, job.run_dir) as run:
        params = {"vocab_size": counts["vocab_size"], "train_rows": counts["train_rows"]}
        # What training reads (seed, model, train), not the whole config again: a flow's parent
        # run holds that as params, and config.json (below) holds it for this run.
        run.log_new_params({**redacted(flatten(stage_config(config))), **job.scaling(), **params})
        run.log_artifact(tmp / "config.json")
        try:
            with run.relay() as relay:  # the ranks' records, into the run's journal
                outcome = run_job(replace(job, relay=relay), tmp)
        except JobError as exc:
            raise StageError(str(exc)) from exc
        curve = run.learning_curve(tmp / "learning_curve.png")
        for path in ([curve] if curve else []) + [tmp / CHECKPOINTS_JSON]:
            run.log_artifact(path)
        run.drain()  # while the server answers: its curves are there when the stage ends
    return {
        **counts,
        **outcome.stats,
        "mlflow_run_id": run.run_id,
        "tracking_uri": redact_uri(config.tracking_uri),
    }


def make_job(
    ctx: BuildContext, counts: Mapping[str, Any], callbacks: Sequence[Callback]
) -> TrainJob:
    """The training job of ``ctx.config`` on the checked inputs (``check_inputs``'s ``counts``),
    in the Ray Train run folder their fingerprints name (``storage_location``). The workers read
    the input folders they are handed (``ctx.stored``: each node reads its copy of an object
    store's, a local work dir's where it is) and Ray Train keeps its checkpoints in the work dir."""
    config = ctx.config
    storage, name = storage_location(config, ctx.input_fps, ctx.workdir)
    return TrainJob(
        model=config.model,
        train=config.train,
        seed=config.seed,
        vocab_size=counts["vocab_size"],
        tgt_vocab_size=counts["tgt_vocab_size"],
        shard_folder=ctx.stored["shard"],
        tokenizer_folder=ctx.stored["tokenizer"],
        # Fine-tuning: the parent stage's folder stands in for the tokenizer's, its weights in it.
        parent_folder=ctx.stored["tokenizer"] if config.train.init_from else None,
        storage=storage,
        run_name=name,
        callbacks=tuple(callbacks),
    )
