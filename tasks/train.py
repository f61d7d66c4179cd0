"""The train stage: Ray Train (``TorchTrainer``, DDP) on the shards, tracked in MLflow.

Resume: Ray Train's storage lives outside the stage folder, at a stable place keyed by the
*resume key* (the stage fingerprint without the fields that do not change what is trained:
``steps``, the logging, evaluation and checkpoint cadence, ``max_failures``, ``storage_path`` and
the ``stop_after``/``fail_at_step`` hooks). Rerunning the same config, or one that only raises
``steps`` or drops ``stop_after``, continues from the latest checkpoint at the exact step and
batch, logging into the same MLflow run. The stage folder is written at the end: weights-only
copies of the kept checkpoints, ``final/model.pt`` and ``checkpoints.json``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tasks.artifacts import (
    StageError,
    input_fingerprint,
    read_manifest,
    run_stage,
    stage_fingerprint,
)
from tasks.config import RunConfig, to_dict
from tasks.runtime import ensure_ray, stage_run

log = logging.getLogger(__name__)

STAGE = "train"
CHECKPOINTS_JSON = "checkpoints.json"
MLFLOW_RUN_FILE = "mlflow_run.json"
# TrainConfig fields that change neither the weights nor the data order of the steps they share.
NOT_IN_RESUME_KEY = (
    "steps",
    "stop_after",
    "fail_at_step",
    "storage_path",
    "max_failures",
    "log_every",
    "eval_every",
    "checkpoint_every",
    "checkpoint_minutes",
    "keep_checkpoints",
    "cpus_per_worker",
)


def stage_config(config: RunConfig) -> dict[str, Any]:
    """What the stage fingerprints besides its inputs: seed, model and train sections."""
    return {"seed": config.seed, "model": to_dict(config.model), "train": to_dict(config.train)}


def resume_key(config: RunConfig, input_fps: Mapping[str, str]) -> str:
    """The fingerprint that names the Ray Train run folder (what a rerun resumes from)."""
    cfg = stage_config(config)
    cfg["train"] = {k: v for k, v in cfg["train"].items() if k not in NOT_IN_RESUME_KEY}
    return stage_fingerprint(STAGE, cfg, input_fps)


def storage_location(config: RunConfig, inputs: Mapping[str, Path]) -> tuple[str, str]:
    """``(storage_path, run name)`` for Ray Train's ``RunConfig``; the run folder is their join."""
    fps = {name: input_fingerprint(Path(p), name) for name, p in inputs.items()}
    key = resume_key(config, fps)[:12]
    if config.train.storage_path:
        storage = config.train.storage_path
        if "://" not in storage:
            storage = str(Path(storage).resolve())
        return storage, f"{config.name}-train-{key}"
    return str((config.root / "train_ray").resolve()), f"train-{key}"


def run(config: RunConfig, inputs: Mapping[str, Path], *, force: bool = False) -> Path:
    """Train on ``inputs["shard"]`` with the tokenizer ``inputs["tokenizer"]``; returns the folder."""
    inputs = {name: Path(inputs[name]) for name in ("shard", "tokenizer")}
    return run_stage(
        STAGE,
        config.root / STAGE,
        stage_config(config),
        inputs,
        lambda tmp: _train(config, inputs, tmp),
        force=force,
    )


# ----------------------------------------------------------------------------- checks


def check_inputs(config: RunConfig, inputs: Mapping[str, Path]) -> dict[str, int]:
    """Row counts and the vocabulary size; a StageError naming the path or key if anything is off."""
    import pyarrow.parquet as pq

    from tasks.train_loop import open_fs, shard_files

    shard = Path(inputs["shard"])
    counts = {}
    for split in ("train", "dev"):
        files = shard_files(str(shard / split))
        if not files:
            raise StageError(f"no shards: {shard / split} has no part-*.parquet files")
        fs, _ = open_fs(str(shard / split))
        rows = 0
        for f in files:
            meta = pq.read_metadata(f, filesystem=fs)
            names = set(meta.schema.to_arrow_schema().names)
            missing = {"src_ids", "tgt_ids"} - names
            if missing:
                raise StageError(f"shard {f} lacks column(s) {sorted(missing)}")
            rows += meta.num_rows
        if rows == 0:
            raise StageError(f"empty shards: {shard / split} holds 0 rows")
        counts[f"{split}_rows"] = rows
    counts["vocab_size"] = vocab_size(config, inputs)
    return counts


def vocab_size(config: RunConfig, inputs: Mapping[str, Path]) -> int:
    """The model's vocabulary: the tokenizer's piece count, checked against the shard manifest
    (``stats.vocab_size``) and against ``tokenizer.vocab_size`` in the config."""
    spm_file = Path(inputs["tokenizer"]) / "spm.model"
    if not spm_file.is_file():
        raise StageError(f"tokenizer model {spm_file} does not exist")
    import sentencepiece

    pieces = sentencepiece.SentencePieceProcessor(model_file=str(spm_file)).get_piece_size()
    stats = (read_manifest(Path(inputs["shard"])) or {}).get("stats", {})
    if "vocab_size" in stats and int(stats["vocab_size"]) != pieces:
        raise StageError(
            f"vocabulary mismatch: {inputs['shard']}/manifest.json says vocab_size "
            f"{stats['vocab_size']} but the tokenizer {spm_file} has {pieces} pieces"
        )
    if config.tokenizer.vocab_size != pieces:
        raise StageError(
            f"tokenizer.vocab_size: the config says {config.tokenizer.vocab_size} but the "
            f"tokenizer {spm_file} has {pieces} pieces (the model's vocabulary)"
        )
    return pieces


def check_resources(config: RunConfig) -> None:
    """GPUs and CPUs the workers ask for must exist (on a local Ray, all of them)."""
    import ray

    tc = config.train
    resources = ray.cluster_resources()
    local = not (config.ray.address or os.environ.get("RAY_ADDRESS"))
    gpus = resources.get("GPU", 0)
    if tc.use_gpu and gpus == 0:
        raise StageError("train.use_gpu is true but the Ray cluster has no GPU")
    if tc.use_gpu and gpus < tc.num_workers:
        message = (
            f"train.num_workers={tc.num_workers} GPU workers but the cluster has {gpus:g} GPUs"
        )
        if local:
            raise StageError(message)
        log.warning("%s; waiting for the autoscaler", message)
    cpus = resources.get("CPU", 0)
    if local and tc.num_workers * tc.cpus_per_worker > cpus:
        raise StageError(
            f"train.cpus_per_worker: {tc.num_workers} workers x {tc.cpus_per_worker:g} CPUs "
            f"exceed the local Ray's {cpus:g} CPUs"
        )


# ----------------------------------------------------------------------------- MLflow


def _read_json(fs: Any, path: str) -> dict[str, Any] | None:
    import pyarrow.fs as pafs

    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return None
    with fs.open_input_stream(path) as f:
        return json.loads(f.read().decode())


def _write_json(fs: Any, path: str, data: dict[str, Any]) -> None:
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(path) as f:
        f.write(json.dumps(data).encode())


@contextmanager
def mlflow_run(config: RunConfig, run_dir: str) -> Iterator[tuple[str, str]]:
    """``(tracking_uri, run_id)`` to log into: the run this storage folder logged into before
    (resume), else the driver's active run, else a new stage run. Remembered in the folder."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from tasks.train_loop import open_fs

    fs, root = open_fs(run_dir)
    record_path = f"{root}/{MLFLOW_RUN_FILE}"
    stored = _read_json(fs, record_path)
    if stored is not None:
        client = MlflowClient(stored["tracking_uri"])
        try:
            client.get_run(stored["run_id"])
        except Exception:  # the tracking store was reset: start a new run
            stored = None
    if stored is not None:
        run_id, uri = stored["run_id"], stored["tracking_uri"]
        active = mlflow.active_run()
        if active is not None and active.info.run_id != run_id:
            mlflow.set_tag("train.mlflow_run_id", run_id)  # the flow's run points at the training
        client.update_run(run_id, status="RUNNING")
        try:
            yield uri, run_id
        except BaseException:
            client.set_terminated(run_id, "FAILED")
            raise
        client.set_terminated(run_id, "FINISHED")
        return
    active = mlflow.active_run()
    if active is not None:
        uri = mlflow.get_tracking_uri()
        _write_json(fs, record_path, {"tracking_uri": uri, "run_id": active.info.run_id})
        yield uri, active.info.run_id
        return
    with stage_run(config, STAGE) as run:
        uri = mlflow.get_tracking_uri()
        _write_json(fs, record_path, {"tracking_uri": uri, "run_id": run.info.run_id})
        yield uri, run.info.run_id


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"train": {"steps": 1}}`` -> ``{"train.steps": 1}``."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def log_params(client: Any, run_id: str, params: Mapping[str, Any]) -> None:
    """Log params a run does not have yet; a changed value (e.g. more steps on resume) is a tag."""
    from mlflow.entities import Param, RunTag

    existing = client.get_run(run_id).data.params
    new, changed = [], []
    for key, value in params.items():
        text = str(value)[:6000]
        if key not in existing:
            new.append(Param(key, text))
        elif existing[key] != text:
            changed.append(RunTag(f"param_changed.{key}", text))
    for i in range(0, len(new), 100):
        client.log_batch(run_id, params=new[i : i + 100])
    if changed:
        client.log_batch(run_id, tags=changed)


def learning_curve(client: Any, run_id: str, path: Path) -> Path | None:
    """Plot train loss and validation loss against step (matplotlib, Agg) into ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = False
    for key, label in (("loss", "train loss"), ("val_loss", "validation loss")):
        history = {m.step: m.value for m in client.get_metric_history(run_id, key)}
        if history:
            steps = sorted(history)
            ax.plot(
                steps,
                [history[s] for s in steps],
                label=label,
                marker="." if len(steps) < 50 else None,
            )
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("step")
    ax.set_ylabel("label-smoothed loss per token")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- the stage


def _train(config: RunConfig, inputs: Mapping[str, Path], tmp: Path) -> dict[str, Any]:
    import ray.train
    from mlflow.tracking import MlflowClient
    from ray.train.torch import TorchTrainer

    from tasks.train_loop import accumulation_steps, train_loop_per_worker

    tc = config.train
    counts = check_inputs(config, inputs)
    ensure_ray(config.ray)
    check_resources(config)
    storage, name = storage_location(config, inputs)
    run_dir = f"{storage.rstrip('/')}/{name}"
    accum = accumulation_steps(tc.tokens_per_step, tc.num_workers, tc.max_tokens_per_batch)

    (tmp / "config.json").write_text(json.dumps(to_dict(config), indent=2) + "\n")
    with mlflow_run(config, run_dir) as (tracking_uri, run_id):
        client = MlflowClient(tracking_uri)
        log_params(
            client,
            run_id,
            {
                **flatten(to_dict(config)),
                "world_size": tc.num_workers,
                "accumulation": accum,
                "tokens_per_step": tc.num_workers * accum * tc.max_tokens_per_batch,
                "vocab_size": counts["vocab_size"],
                "train_rows": counts["train_rows"],
                "ray_run_dir": run_dir,
            },
        )
        client.log_artifact(run_id, str(tmp / "config.json"))
        trainer = TorchTrainer(
            train_loop_per_worker,
            train_loop_config={
                "model": to_dict(config.model),
                "train": to_dict(tc),
                "seed": config.seed,
                "vocab_size": counts["vocab_size"],
                "shard_dir": str(Path(inputs["shard"]).resolve()),
                "run_dir": run_dir,
                "tracking_uri": tracking_uri,
                "mlflow_run_id": run_id,
            },
            scaling_config=ray.train.ScalingConfig(
                num_workers=tc.num_workers,
                use_gpu=tc.use_gpu,
                resources_per_worker={
                    "CPU": tc.cpus_per_worker,
                    **({"GPU": 1} if tc.use_gpu else {}),
                },
            ),
            run_config=ray.train.RunConfig(
                name=name,
                storage_path=storage,
                checkpoint_config=ray.train.CheckpointConfig(num_to_keep=tc.keep_checkpoints),
                failure_config=ray.train.FailureConfig(max_failures=tc.max_failures),
            ),
        )
        try:
            result = trainer.fit()
        except ray.train.TrainingFailedError as exc:
            raise StageError(
                f"training failed (Ray Train run folder {run_dir}; rerun the same config to "
                f"resume from its latest checkpoint): {exc}"
            ) from exc
        summary = result.return_value or {}
        stats = export(result, tmp)
        if learning_curve(client, run_id, tmp / "learning_curve.png"):
            client.log_artifact(run_id, str(tmp / "learning_curve.png"))
        client.log_artifact(run_id, str(tmp / CHECKPOINTS_JSON))

    last = stats["step"]
    return {
        **counts,
        **stats,
        "complete": last >= tc.steps,
        "resumed_from_step": summary.get("start_step", last),
        "world_size": tc.num_workers,
        "accumulation": accum,
        "n_parameters": summary.get("n_parameters"),
        "tokens_per_s": summary.get("tokens_per_s"),
        "loop_seconds": summary.get("loop_seconds"),
        "mlflow_run_id": run_id,
        "tracking_uri": tracking_uri,
        "ray_run_dir": run_dir,
    }


def export(result: Any, tmp: Path) -> dict[str, Any]:
    """Weights-only copies of the kept checkpoints, ``final/model.pt`` and ``checkpoints.json``."""
    from tasks.train_loop import MODEL_FILE
    from transformer_core import checkpoint as ckpt
    from transformer_core.config import ModelConfig

    if result.checkpoint is None:
        raise StageError("training reported no checkpoint")
    kept = sorted(result.best_checkpoints or [], key=lambda cm: cm[1]["step"])
    entries = []
    final_metrics: dict[str, Any] = {}
    for checkpoint, metrics in kept:
        step = int(metrics["step"])
        rel = f"checkpoints/step-{step:09d}/{MODEL_FILE}"
        with checkpoint.as_directory() as d:
            state = ckpt.load(Path(d) / MODEL_FILE)
        ckpt.save(
            tmp / rel,
            state["model"],
            ModelConfig.from_dict(state["config"]),
            vocab_size=state["vocab_size"],
            step=step,
            time=float(metrics["time"]),
        )
        entries.append(
            {"step": step, "time": float(metrics["time"]), "path": rel, "source": checkpoint.path}
        )
        final_metrics = metrics
    (tmp / "final").mkdir()
    shutil.copyfile(tmp / entries[-1]["path"], tmp / "final" / MODEL_FILE)  # the latest one
    (tmp / CHECKPOINTS_JSON).write_text(
        json.dumps({"checkpoints": entries, "final": f"final/{MODEL_FILE}"}, indent=2) + "\n"
    )
    return {
        "step": int(final_metrics["step"]),
        "checkpoints": len(entries),
        **{k: final_metrics[k] for k in ("val_loss", "val_ppl", "loss") if k in final_metrics},
    }
