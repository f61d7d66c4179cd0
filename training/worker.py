"""What Ray Train runs on every worker: the Trainer, resumed from Ray's latest checkpoint, stepped
to the last step, its checkpoints reported to Ray and its metrics logged to MLflow by rank 0.

A checkpoint goes through ``ray.train.report`` (a barrier on every rank): rank 0 writes
``model.pt`` (the Trainer's ``state_dict`` in ``transformer_core.checkpoint`` format) and every
rank writes ``rng-rank-<r>.pt`` with its own RNG states (dropout differs by rank); Ray merges the
ranks' folders into one. Rank 0 logs to the MLflow run it is given (Ray Train V2 rejects Tune's
logger callbacks).
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from filesystem.location import Location
from tracking.relay import Tracker
from training.allocator import kept_here
from training.data import TokenData
from training.dev_bleu import DevBleu
from training.job_spec import TrainJob
from training.parent_weights import keep_parent_moments, start_from_parent
from training.progress import Progress
from training.trainer import Listener, Trainer
from transformer_core import checkpoint as ckpt
from transformer_core.checkpoint import MODEL_FILE
from transformer_core.config import ModelConfig
from transformer_core.model import Transformer, count_parameters

JOB_KEY = "job"
"""``train_loop_config``'s one key, holding the run's ``training.job_spec.TrainJob`` (Ray
Train's run state wants a dict there)."""
SUMMARY_METRICS = ("val_loss", "val_nll", "val_ppl", "loss")


def train_loop_per_worker(config: Mapping[str, TrainJob]) -> dict[str, Any]:
    """Ray Train's per-worker function: ``config[JOB_KEY]``, the job, trained on this rank from
    Ray's latest checkpoint, if any. Returns ``summary``."""
    import ray.train

    job = config[JOB_KEY]
    quiet_ray_train_reports()
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    set_threads(job.train.torch_threads or worker_threads(ctx.get_local_world_size()))
    trainer = make_trainer(job, rank, world)
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            trainer.load_state_dict(read_state(Path(d), rank))
    tracker = make_tracker(job, rank)
    tracker.param("n_parameters", count_parameters(trainer.module))
    started, faults_before = time.time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    progress = Progress(
        trainer.last_step,
        trainer.start_step,
        enabled=rank == 0,
        spread_floor=job.train.warn_encoder_spread,
        eval_every=job.train.eval_every,
    )
    progress.begun(world)
    saver = Saver(trainer, job.model, job.vocab_size, job.tgt_vocab_size)
    try:
        listener = WorkerListener(tracker, progress, job.best_path, job.vocab_size)
        trainer.fit(saver.report, listener)
    finally:
        tracker.close()  # its records are in the journal (a failed group's too: Ray restarts it)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before
    return summary(trainer, time.time() - started, faults)


def make_tracker(job: TrainJob, rank: int) -> Tracker:
    """Rank 0's Tracker of ``job``: its records go to the run's journal, never to the server."""
    return Tracker(job.relay, enabled=rank == 0)


def quiet_ray_train_reports() -> None:
    """Drop Ray Train's two INFO lines per checkpoint (Ray 2.60), which crowded out the progress
    lines on the console and repeat what ``checkpoints.json`` and MLflow hold; its warnings still
    show. "Checkpoint successfully created" comes from its storage module's logger; "Reporting
    training result N: ..." (~900 characters) from a logger its context module names by its file's
    path (``logging.getLogger(__file__)``), hence the spec lookup."""
    logging.getLogger("ray.train.v2._internal.execution.storage").setLevel(logging.WARNING)
    context = importlib.util.find_spec("ray.train.v2._internal.execution.context")
    if context is not None and context.origin:
        logging.getLogger(context.origin).setLevel(logging.WARNING)


def set_threads(threads: int) -> None:
    """Intra-op and inter-op threads (independent ops run side by side) get the same share."""
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:  # settable once per process, before any inter-op work: a reused worker
        pass


def make_trainer(job: TrainJob, rank: int, world: int) -> Trainer:
    """The Trainer of this rank for ``job``: the shards memory-mapped, the
    model initialised alike on every rank and wrapped in DDP, dev BLEU with ``bleu_sentences``."""
    import ray.train.torch

    tc, seed, vocab_size = job.train, job.seed, job.vocab_size
    shard = job.shard()  # on an object store: this node's copy, fetched by its first worker
    train = TokenData.read(f"{shard}/train", vocab_size)
    dev = TokenData.read(f"{shard}/dev", vocab_size)
    torch.manual_seed(seed)  # the same initial weights on every rank
    module = Transformer(job.model, vocab_size, job.tgt_vocab_size)
    if job.parent_folder is not None:  # fine-tuning: the parent's weights, a fresh optimizer
        start_from_parent(module, job.parent_folder.local() / MODEL_FILE, tc.freeze)
    model = ray.train.torch.prepare_model(module, parallel_strategy_kwargs=ddp_options())
    dev_bleu = None
    if tc.bleu_sentences:
        dev_bleu = DevBleu(
            dev,
            _pieces_text(job.tokenizer()),
            tc.bleu_sentences,
            rank=rank,
            world_size=world,
            max_tokens=tc.eval_tokens,
        )
    trainer = Trainer(
        module,
        tc,
        train,
        dev,
        seed=seed,
        rank=rank,
        world_size=world,
        model=model,
        callbacks=job.callbacks,
        dev_bleu=dev_bleu,
    )
    if job.parent_folder is not None and tc.keep_optimizer:
        keep_parent_moments(trainer.optimizer, job.parent_folder.local() / MODEL_FILE)
    return trainer


def ddp_options() -> dict[str, bool]:
    """DDP's buffers not broadcast at every forward: the only buffer is the fixed sinusoid
    table, the same on every rank. torch 2.13 calls it ``forward_sync_buffers`` (its
    ``broadcast_buffers`` warns that it is deprecated); earlier torch, ``broadcast_buffers``."""
    init = torch.nn.parallel.DistributedDataParallel.__init__
    new = "forward_sync_buffers" in inspect.signature(init).parameters
    return {"forward_sync_buffers" if new else "broadcast_buffers": False}


class Saver:
    """Reports a checkpoint to Ray Train (a barrier on every rank): rank 0 writes ``model.pt``
    (the Trainer's state in ``transformer_core.checkpoint`` format), every rank its RNG states."""

    def __init__(
        self, trainer: Trainer, mc: ModelConfig, vocab_size: int, tgt_vocab_size: int | None
    ):
        self.trainer, self.mc = trainer, mc
        self.vocab_size, self.tgt_vocab_size = vocab_size, tgt_vocab_size

    def report(self, metrics: dict[str, Any]) -> None:
        """``Trainer.maybe_checkpoint``'s ``save``: the checkpoint and ``metrics`` to Ray."""
        import ray.train

        trainer, rank = self.trainer, self.trainer.rank
        with tempfile.TemporaryDirectory() as d:
            state = trainer.state_dict()
            if rank == 0:
                weights = state.pop("model")
                ckpt.save(
                    Path(d) / MODEL_FILE,
                    weights,
                    self.mc,
                    vocab_size=self.vocab_size,
                    tgt_vocab_size=self.tgt_vocab_size,
                    time=metrics["time"],
                    **state,
                )
            torch.save(state["rng"], Path(d) / f"rng-rank-{rank:05d}.pt")
            ray.train.report(
                metrics,
                checkpoint=ray.train.Checkpoint.from_directory(d),
                checkpoint_dir_name=f"step-{trainer.step:09d}",
            )


class WorkerListener(Listener):
    """Rank 0's metrics to MLflow and its lines to the console; the best weights by ``val_bleu``
    to ``best_path`` when a validation improves on it."""

    def __init__(self, tracker: Tracker, progress: Progress, best_path: Location, vocab_size: int):
        self.tracker, self.progress = tracker, progress
        self.best_path, self.vocab_size = best_path, vocab_size

    def logged(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        self.tracker.metrics(metrics, trainer.step)
        self.progress.step(trainer.step, metrics)

    def validated(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        self.tracker.metrics(metrics, trainer.step)
        if self.progress.validated(trainer.step, metrics):
            spread = metrics["val_encoder_spread"]
            warning = f"step {trainer.step}: spread {spread:.3f}"
            self.tracker.tag("warning.encoder_collapse", warning)
        if trainer.best.improved and trainer.rank == 0:
            save_best(self.best_path, trainer.module, trainer.best.record, self.vocab_size)


def summary(trainer: Trainer, loop_seconds: float, page_faults: int) -> dict[str, Any]:
    """What the worker returns (rank 0's reaches the driver): steps, throughput, threads, best,
    and what the allocator cost: minor page faults a step and the process's peak resident MiB."""
    steps = max(1, trainer.step - trainer.start_step)
    return {
        "rank": trainer.rank,
        "start_step": trainer.start_step,
        "step": trainer.step,
        "n_parameters": count_parameters(trainer.module),
        "accumulation": trainer.accumulation,
        "world_size": trainer.world_size,
        "tokens_per_s": trainer.meter.tokens_per_s,
        "timed_tokens": trainer.timed_tokens,
        "timed_target_tokens": trainer.meter.timed_targets,
        "timed_seconds": trainer.timed_seconds,
        "loop_seconds": loop_seconds,
        "loop_split": {part: round(s, 1) for part, s in trainer.loop_split.items()},
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "keep_freed_memory": kept_here(),
        "page_faults_per_step": round(page_faults / steps),
        "max_rss_mib": round(peak_rss_bytes() / 2**20),
        "best": dict(trainer.best.record),
        "stopped_early": trainer.step < trainer.last_step,
        **{k: v for k, v in trainer.latest.items() if k in SUMMARY_METRICS},
    }


def peak_rss_bytes() -> int:
    """This process's peak resident memory (getrusage counts KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def worker_threads(local_workers: int) -> int:
    """The cores this process may run on, shared among the workers of its node."""
    return max(1, len(os.sched_getaffinity(0)) // max(local_workers, 1))


def save_best(path: Location, module: Transformer, best: dict[str, Any], vocab_size: int) -> None:
    """The weights of the best validation so far to ``path``,
    replacing the previous best only once complete. Beside Ray's checkpoints, which it keeps by
    recency."""
    import pyarrow.fs as pafs

    fs, target = path.arrow, path.path
    partial = f"{target}.partial"
    with tempfile.TemporaryDirectory() as d:
        tgt = module.tgt_vocab_size if module.tgt_vocab_size != vocab_size else None
        local = ckpt.save(
            Path(d) / MODEL_FILE,
            module,
            module.config,
            vocab_size=vocab_size,
            tgt_vocab_size=tgt,
            **best,
        )
        fs.create_dir(str(Path(target).parent), recursive=True)
        pafs.copy_files(str(local), partial, destination_filesystem=fs)
    fs.move(partial, target)


def read_state(folder: Path, rank: int) -> dict[str, Any]:
    """The Trainer state in a checkpoint folder, with this rank's RNG states (None if absent)."""
    state = ckpt.load(folder / MODEL_FILE)
    rng_file = folder / f"rng-rank-{rank:05d}.pt"
    state["rng"] = torch.load(rng_file, weights_only=True) if rng_file.is_file() else None
    return state


def _pieces_text(model_file: str | None) -> Callable[[list[int]], str]:
    """Dev BLEU's text of piece ids: the pieces joined, and subword-nmt's pieces joined into
    words (``--remove-bpe``); not detokenized, so a pretokenized run's BLEU is on tokens."""
    import sentencepiece

    from corpora.pretokenize import Pretokenizer, join_pieces

    decode = sentencepiece.SentencePieceProcessor(model_file=model_file).decode
    pre = Pretokenizer.load(Path(str(model_file)).parent)
    if pre is None or not pre.bpe_codes:
        return decode
    return lambda ids: join_pieces(decode(ids))
