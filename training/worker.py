"""What Ray Train runs on every worker: the Trainer, resumed from Ray's latest checkpoint, stepped
to the last step, its checkpoints reported to Ray and its metrics logged to MLflow by rank 0.

A checkpoint goes through ``ray.train.report`` (a barrier on every rank): rank 0 writes
``model.pt`` (the Trainer's ``state_dict`` in ``transformer_core.checkpoint`` format) and every
rank writes ``rng-rank-<r>.pt`` with its own RNG states (dropout differs by rank); Ray merges the
ranks' folders into one. Rank 0 logs to the MLflow run it is given (Ray Train V2 rejects Tune's
logger callbacks).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from training.data import TokenData, open_fs
from training.dev_bleu import DevBleu
from training.progress import Progress
from training.tracking import Tracker
from training.trainer import Trainer
from transformer_core import checkpoint as ckpt
from transformer_core.checkpoint import MODEL_FILE
from transformer_core.model import Transformer, count_parameters

SUMMARY_METRICS = ("val_loss", "val_nll", "val_ppl", "loss")


def train_loop_per_worker(cfg: dict[str, Any]) -> dict[str, Any]:
    """Ray Train's per-worker function. ``cfg`` (``train_loop_config``): ``model``
    (``ModelConfig``), ``train`` (``TrainConfig``), ``seed``, ``vocab_size``, optionally
    ``tgt_vocab_size`` (a decoder vocabulary of the first ids only), ``shard_dir``,
    ``tokenizer_file``, ``best_path`` (where the best checkpoint by ``val_bleu`` goes),
    ``tracking_uri``, ``mlflow_run_id`` and ``callbacks`` (the Trainer's). Returns a summary."""
    import ray.train
    import ray.train.torch

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    mc, tc, seed, vocab_size = cfg["model"], cfg["train"], cfg["seed"], cfg["vocab_size"]
    threads = tc.torch_threads or worker_threads(ctx.get_local_world_size())
    torch.set_num_threads(threads)
    try:  # inter-op threads (independent ops run side by side) get the same share of cores
        torch.set_num_interop_threads(threads)
    except RuntimeError:  # settable once per process, before any inter-op work: a reused worker
        pass
    train = TokenData.read(f"{cfg['shard_dir']}/train", vocab_size)
    dev = TokenData.read(f"{cfg['shard_dir']}/dev", vocab_size)
    torch.manual_seed(seed)  # the same initial weights on every rank
    module = Transformer(mc, vocab_size, cfg.get("tgt_vocab_size"))
    # The only buffer is the fixed sinusoid table: broadcasting it every forward is waste.
    model = ray.train.torch.prepare_model(
        module, parallel_strategy_kwargs={"broadcast_buffers": False}
    )
    dev_bleu = None
    if tc.bleu_sentences:
        import sentencepiece

        tokenizer = sentencepiece.SentencePieceProcessor(model_file=cfg["tokenizer_file"])
        dev_bleu = DevBleu(
            dev,
            tokenizer.decode,
            tc.bleu_sentences,
            rank=rank,
            world_size=world,
            max_tokens=tc.max_tokens_per_batch,
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
        dev_bleu=dev_bleu,
    )
    trainer.callbacks.extend(cfg.get("callbacks", ()))
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            trainer.load_state_dict(read_state(Path(d), rank))
    tracker = Tracker(cfg.get("tracking_uri"), cfg.get("mlflow_run_id"), enabled=rank == 0)
    tracker.param("n_parameters", count_parameters(module))

    def save(metrics: dict[str, Any]) -> None:
        with tempfile.TemporaryDirectory() as d:
            state = trainer.state_dict()
            if rank == 0:
                weights, when = state.pop("model"), metrics["time"]
                ckpt.save(
                    Path(d) / MODEL_FILE,
                    weights,
                    mc,
                    vocab_size=vocab_size,
                    tgt_vocab_size=cfg.get("tgt_vocab_size"),
                    time=when,
                    **state,
                )
            torch.save(state["rng"], Path(d) / f"rng-rank-{rank:05d}.pt")
            ray.train.report(
                metrics,
                checkpoint=ray.train.Checkpoint.from_directory(d),
                checkpoint_dir_name=f"step-{trainer.step:09d}",
            )

    started = time.time()
    progress = Progress(
        trainer.last_step,
        trainer.start_step,
        enabled=rank == 0,
        spread_floor=tc.warn_encoder_spread,
    )
    progress.resumed(world)
    try:
        while not trainer.done:
            metrics = trainer.train_step()
            tracker.metrics(metrics, trainer.step)
            progress.step(trainer.step, metrics)
            validation = trainer.maybe_evaluate()
            tracker.metrics(validation, trainer.step)
            if progress.validated(trainer.step, validation):
                spread = validation["val_encoder_spread"]
                tracker.tag("warning.encoder_collapse", f"step {trainer.step}: spread {spread:.3f}")
            if validation and trainer.improved and rank == 0:
                save_best(cfg["best_path"], module, trainer.best, vocab_size)
            trainer.maybe_checkpoint(save)
    finally:
        trainer.close()
    timed = trainer.timed_seconds
    return {
        "rank": rank,
        "start_step": trainer.start_step,
        "step": trainer.step,
        "n_parameters": count_parameters(module),
        "accumulation": trainer.accumulation,
        "world_size": world,
        "tokens_per_s": trainer.timed_tokens / timed if timed > 0 else None,
        "timed_tokens": trainer.timed_tokens,
        "timed_seconds": timed,
        "loop_seconds": time.time() - started,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "best": trainer.best,
        "stopped_early": trainer.step < trainer.last_step,
        **{k: v for k, v in trainer.latest.items() if k in SUMMARY_METRICS},
    }


def worker_threads(local_workers: int) -> int:
    """The cores this process may run on, shared among the workers of its node."""
    return max(1, len(os.sched_getaffinity(0)) // max(local_workers, 1))


def save_best(path: str, module: Transformer, best: dict[str, Any], vocab_size: int) -> None:
    """The weights of the best validation so far to ``path`` (local or a URI), replacing the
    previous best only once complete. Beside Ray's checkpoints, which it keeps by recency."""
    import pyarrow.fs as pafs

    fs, target = open_fs(path)
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
