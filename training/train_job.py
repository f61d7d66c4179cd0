"""What every Ray Train worker is given: ``TrainJob``, one training run as a typed value (the one
``train_loop_config`` value). ``training.job`` runs it under ``TorchTrainer`` and
``training.worker`` trains it on each rank; it lives below both, so neither file needs the other
to be read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from corpora.storage import StoredFolder
from training.config import TrainConfig
from training.data import open_fs
from training.tracking_journal import RecordSink
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
    shard_dir: str
    """The shard stage's folder (absolute): ``train/`` and ``dev/`` splits."""
    tokenizer_file: str | None = None
    """The sentencepiece model that detokenizes dev BLEU's translations (``bleu_sentences``)."""
    storage_path: str
    """Ray Train's storage (a local folder or a URI; with ``storage_filesystem``, a path in it)."""
    storage_filesystem: Any = None  # a pyarrow FileSystem: pyarrow ships no types
    """The object store ``storage_path`` is in (a work dir on ``s3://``: its client, which Ray
    Train pickles to the workers as it does its own); None: the path says (``open_fs``)."""
    shard_source: StoredFolder | None = None
    """The shard folder on an object store: each node's workers read their node's copy of it
    (``StoredFolder.local``) instead of ``shard_dir``."""
    tokenizer_source: StoredFolder | None = None
    """The tokenizer folder on an object store, as ``shard_source``."""
    run_name: str
    """Ray Train's run folder in ``storage_path``: what a rerun resumes from."""
    journal: RecordSink | None = None
    """Where rank 0 logs: its MLflow run's journal (a relay to it on the driver's node, which
    the driver's sender drains); None: no logging."""
    callbacks: tuple[Callback, ...] = ()
    """Called with the Trainer after every step on every rank (tests inject failures); not part
    of what is trained."""

    @property
    def run_dir(self) -> str:
        """Ray Train's run folder: its checkpoints, the MLflow run record, the best weights."""
        return f"{self.storage_path.rstrip('/')}/{self.run_name}"

    def storage_fs(self, path: str) -> tuple[Any, str]:
        """A filesystem and the path in it for ``path`` under the storage (``run_dir``,
        ``best_path``)."""
        return (
            (self.storage_filesystem, path)
            if self.storage_filesystem is not None
            else open_fs(path)
        )

    def shard(self) -> str:
        """The shard folder this process reads: this node's copy, or ``shard_dir``."""
        return str(self.shard_source.local()) if self.shard_source else self.shard_dir

    def tokenizer(self) -> str | None:
        """The sentencepiece model this process reads: in this node's copy, or
        ``tokenizer_file``."""
        if self.tokenizer_source is not None:
            return str(self.tokenizer_source.local() / "spm.model")
        return self.tokenizer_file

    @property
    def best_path(self) -> str:
        """Where rank 0 keeps the best weights by ``val_bleu`` (beside Ray's checkpoints, which
        it keeps by recency), and where ``run_job`` exports them from."""
        return f"{self.run_dir}/best/{MODEL_FILE}"

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
            "ray_run_dir": self.run_dir,
        }
