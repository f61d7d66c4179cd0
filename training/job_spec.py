"""What every Ray Train worker is given: ``TrainJob``, one training run as a typed value (the one
``train_loop_config`` value). ``training.ray_trainer`` runs it under ``TorchTrainer`` and
``training.worker`` trains it on each rank; it lives below both, so neither file needs the other
to be read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from filesystem.location import Location
from filesystem.storage import StoredFolder
from tracking.journal import RecordSink
from training.config import TrainConfig
from training.trainer import Callback
from transformer_core.checkpoint import MODEL_FILE
from transformer_core.config import ModelConfig

__all__ = ["TrainJob"]


@dataclass(frozen=True, kw_only=True)
class TrainJob:
    """Everything a worker needs to train (or resume) one run."""

    model: ModelConfig
    """The architecture."""
    train: TrainConfig
    """The recipe and its scaling."""
    seed: int
    """Initial weights, batch order and dropout derive from it."""
    vocab_size: int
    """The (source, or joint) vocabulary: the tokenizer's piece count."""
    tgt_vocab_size: int | None = None
    """A decoder vocabulary of the first ids only; None: joint."""
    shard_folder: StoredFolder
    """The shard stage's folder (``train/`` and ``dev/`` splits): each node's workers read their
    node's copy of it (``StoredFolder.local``; a local work dir's folder where it is)."""
    tokenizer_folder: StoredFolder | None = None
    """The tokenizer's folder, whose sentencepiece model detokenizes dev BLEU's translations
    (``bleu_sentences``), read as ``shard_folder``."""
    storage: Location
    """Ray Train's storage: a local folder, or a prefix in the work dir's object store (its
    client, which Ray Train pickles to the workers as it does its own)."""
    run_name: str
    """Ray Train's run folder in ``storage``: what a rerun resumes from."""
    relay: RecordSink | None = None
    """Where rank 0 logs: its MLflow run's journal (a relay to it on the driver's node, which
    the driver's sender drains); None: no logging."""
    parent_folder: StoredFolder | None = None
    """Fine-tuning (``train.init_from``): the parent stage's folder, whose ``model.pt`` the weights
    start from, read as ``shard_folder``; None: random weights."""
    callbacks: tuple[Callback, ...] = ()
    """Called with the Trainer after every step on every rank (tests inject failures); not part
    of what is trained."""

    @property
    def run_dir(self) -> Location:
        """Ray Train's run folder: its checkpoints, the MLflow run record, the best weights."""
        return self.storage.child(self.run_name)

    def shard(self) -> str:
        """The shard folder this process reads: this node's copy (or the local folder)."""
        return str(self.shard_folder.local())

    def tokenizer(self) -> str | None:
        """The sentencepiece model this process reads, in this node's copy of its folder."""
        if self.tokenizer_folder is None:
            return None
        return str(self.tokenizer_folder.local() / "spm.model")

    @property
    def best_path(self) -> Location:
        """Where rank 0 keeps the best weights by ``val_bleu`` (beside Ray's checkpoints, which
        it keeps by recency), and where ``run_job`` exports them from."""
        return self.run_dir.child(f"best/{MODEL_FILE}")

    def scaling(self) -> dict[str, Any]:
        """Workers and accumulation (``min..max`` ranges when elastic: the same batches per step
        for every count), tokens per step and the run folder: MLflow params."""
        tc = self.train
        per_step = tc.batches_per_step(tc.max_workers)  # elastic: the same for every worker count
        if tc.elastic:
            world: int | str = f"{tc.min_workers}..{tc.max_workers}"
            accum: int | str = f"{-(-per_step // tc.max_workers)}..{-(-per_step // tc.min_workers)}"
        else:
            world, accum = tc.max_workers, per_step // tc.max_workers  # one count: num_workers
        return {
            "world_size": world,
            "accumulation": accum,
            "tokens_per_step": per_step * tc.max_tokens_per_batch,
            "ray_run_dir": self.run_dir.name,
        }
