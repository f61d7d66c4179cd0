"""Running a training job (``training.job_spec.TrainJob``, what every Ray Train worker is given):
``run_job`` runs it under ``TorchTrainer`` (DDP) with Ray Train's storage and checkpointing, and
exports the checkpoints it kept into a folder.

Ray Train keeps its checkpoints in ``run_dir`` (``storage_path/run_name``), which outlives a
run: a job with the same ``run_dir`` continues from its latest checkpoint. The folder ``run_job``
writes holds weights-only copies of the kept checkpoints
(``checkpoints/step-000000006/model.pt``), ``final/model.pt`` (the latest), ``best/model.pt``
(the best by ``val_bleu``, when measured) and ``checkpoints.json`` listing them.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filesystem.location import Location
from training.allocator import worker_runtime_env
from training.job_spec import TrainJob
from training.worker import JOB_KEY, train_loop_per_worker
from transformer_core import checkpoint as ckpt
from transformer_core.checkpoint import MODEL_FILE
from transformer_core.config import ModelConfig

if TYPE_CHECKING:
    from ray.train.v2.api.result import Result
    from ray.train.v2.torch.torch_trainer import TorchTrainer  # (both: see torch_trainer)

__all__ = [
    "CHECKPOINTS_JSON",
    "JobError",
    "TrainJob",
    "TrainOutcome",
    "export",
    "run_job",
    "torch_trainer",
]

CHECKPOINTS_JSON = "checkpoints.json"


class JobError(RuntimeError):
    """Training failed or left nothing to export; the message says where its checkpoints are."""


@dataclass(frozen=True)
class TrainOutcome:
    """What a finished ``run_job`` did."""

    stats: dict[str, Any]
    """The last checkpoint's step and metrics, the checkpoints exported, the best by
    ``val_bleu``, whether the run is complete and the last worker group's summary."""
    summary: dict[str, Any]
    """Rank 0's return value (``training.worker.summary``)."""


def run_job(job: TrainJob, out: Path) -> TrainOutcome:
    """Train ``job`` on Ray Train (continuing ``job.run_dir``'s latest checkpoint, if any) and
    export its checkpoints into ``out``; a JobError if training failed."""
    import ray.train
    from ray.train.v2.api.result import Result

    try:
        result = torch_trainer(job).fit()
    except ray.train.TrainingFailedError as exc:
        raise JobError(
            f"training failed (Ray Train run folder {job.run_dir.name}; rerun the same config to "
            f"resume from its latest checkpoint): {exc}"
        ) from exc
    assert isinstance(result, Result)  # V2's; Ray annotates fit with ray.train's V1-or-V2 name
    summary = result.return_value or {}
    exported = export(result, out, job.best_path if job.train.bleu_sentences else None)
    tc, last = job.train, exported["step"]
    scaling = job.scaling()
    stats = {
        **exported,
        "complete": last >= tc.steps or bool(summary.get("stopped_early")),
        "stopped_early": bool(summary.get("stopped_early")),
        "resumed_from_step": summary.get("start_step", last),
        "world_size": summary.get("world_size", scaling["world_size"]),  # the last group's
        "accumulation": summary.get("accumulation", scaling["accumulation"]),
        **{k: summary.get(k) for k in SUMMARY_STATS},
        "ray_run_dir": job.run_dir.name,
    }
    return TrainOutcome(stats=stats, summary=summary)


SUMMARY_STATS = (
    "n_parameters",
    "tokens_per_s",
    "loop_seconds",
    "loop_split",
    "torch_threads",
    "torch_interop_threads",
    "keep_freed_memory",
    "page_faults_per_step",
    "max_rss_mib",
)
"""Rank 0's summary values a finished job reports as they are (None if absent)."""


def torch_trainer(job: TrainJob) -> TorchTrainer:
    """The ``TorchTrainer`` of ``job``: its workers, checkpoints kept and failures retried."""
    # Ray Train V2's classes, which ``ray.train`` and ``ray.train.torch`` export while
    # RAY_TRAIN_V2_ENABLED is on (Ray 2.60's default; elastic workers need V2), imported from
    # where they live: through ``ray.train`` a type checker sees V1's or V2's.
    from ray.train.v2.api.config import (
        CheckpointConfig,
        FailureConfig,
        LoggingConfig,
        RunConfig,
        ScalingConfig,
    )
    from ray.train.v2.torch.torch_trainer import TorchTrainer

    from training.process_group import NodeBoundTorchConfig

    tc = job.train
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={JOB_KEY: job},
        # gloo/NCCL on the interface of each node's Ray address, the store on rank 0's
        # address only (training/process_group.py).
        torch_config=NodeBoundTorchConfig(),
        scaling_config=ScalingConfig(
            num_workers=tc.num_workers,
            elastic_resize_monitor_interval_s=tc.elastic_check_seconds,
            use_gpu=tc.use_gpu,
            resources_per_worker={"CPU": tc.cpus_per_worker, **({"GPU": 1} if tc.use_gpu else {})},
            placement_strategy=tc.placement_strategy,
        ),
        run_config=RunConfig(
            name=job.run_name,
            storage_path=job.storage.path,
            storage_filesystem=job.storage.arrow,
            checkpoint_config=CheckpointConfig(num_to_keep=tc.keep_checkpoints),
            failure_config=FailureConfig(max_failures=tc.max_failures),
            worker_runtime_env=worker_runtime_env(tc),
            logging_config=LoggingConfig(log_level=ray_train_log_level()),
        ),
    )


def ray_train_log_level() -> str:
    """Ray Train's own console lines at WARNING: its INFO lines (four that start the worker
    group, "Moving model to device") say what the progress lines' first says in one, and stay
    in its log files. At INFO when the command runs with ``-v`` (the root logger at DEBUG)."""
    return "INFO" if logging.getLogger().isEnabledFor(logging.DEBUG) else "WARNING"


def export(result: Result, out: Path, best: Location | None = None) -> dict[str, Any]:
    """Weights-only copies of the kept checkpoints, ``final/model.pt``, ``best/model.pt`` (the
    best by ``val_bleu``, from ``best``, when training measured it) and ``checkpoints.json``."""
    if result.checkpoint is None:
        raise JobError("training reported no checkpoint")
    kept = sorted(result.best_checkpoints or [], key=lambda cm: cm[1]["step"])
    entries: list[dict[str, Any]] = []
    final_metrics: dict[str, Any] = {}
    for checkpoint, metrics in kept:
        step = int(metrics["step"])
        rel = f"checkpoints/step-{step:09d}/{MODEL_FILE}"
        with checkpoint.as_directory() as d:
            state = ckpt.load(Path(d) / MODEL_FILE)
        ckpt.save(
            out / rel,
            state["model"],
            ModelConfig.from_dict(state["config"]),
            vocab_size=state["vocab_size"],
            tgt_vocab_size=state.get("tgt_vocab_size"),
            step=step,
            time=float(metrics["time"]),
        )
        entries.append(
            {"step": step, "time": float(metrics["time"]), "path": rel, "source": checkpoint.path}
        )
        final_metrics = metrics
    (out / "final").mkdir()
    shutil.copyfile(out / entries[-1]["path"], out / "final" / MODEL_FILE)  # the latest one
    listing: dict[str, Any] = {"checkpoints": entries, "final": f"final/{MODEL_FILE}"}
    stats: dict[str, Any] = {}
    if best is not None:
        listing["best"] = export_best(best, out)
        stats = {"best_step": listing["best"]["step"], "best_val_bleu": listing["best"]["val_bleu"]}
    (out / CHECKPOINTS_JSON).write_text(json.dumps(listing, indent=2) + "\n")
    return {
        "step": int(final_metrics["step"]),
        "checkpoints": len(entries),
        **stats,
        **{
            k: final_metrics[k]
            for k in ("val_loss", "val_ppl", "val_bleu", "loss")
            if k in final_metrics
        },
    }


def export_best(best: Location, out: Path) -> dict[str, Any]:
    """``best`` (a filesystem and the path in it) copied to ``out/best/model.pt``; its listing
    entry."""
    import pyarrow.fs as pafs

    fs, path = best.arrow, best.path
    if fs.get_file_info(path).type != pafs.FileType.File:
        raise JobError(f"training measured val_bleu but left no best checkpoint {path}")
    (out / "best").mkdir()
    pafs.copy_files(path, str(out / "best" / MODEL_FILE), source_filesystem=fs)
    state = ckpt.load(out / "best" / MODEL_FILE)
    step, val_bleu = int(state["step"]), float(state["val_bleu"])
    return {"path": f"best/{MODEL_FILE}", "step": step, "val_bleu": val_bleu}
