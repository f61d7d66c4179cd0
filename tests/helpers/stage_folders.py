"""Helpers the integration tests share (imported by name: this folder is on pytest's sys.path)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

TINY_TRAINING = {
    "model": {"preset": "debug", "n_layers": 1, "d_model": 32, "d_ff": 64, "n_heads": 2},
    "train": {
        "steps": 6,
        "tokens_per_step": 1024,
        "max_tokens_per_batch": 1024,
        "warmup_steps": 4,
        "eval_every": 3,
        "checkpoint_every": 3,
        "checkpoint_minutes": 0,
        "log_every": 1,
        "cpus_per_worker": 0.5,
    },
    "average": {"last": 2},
}
"""The model, train and average sections of the flow tests' configs: seconds of training."""

TINY_WORDS = "the a cat dog house tree sees likes big small red blue runs walks old new to".split()


def tiny_sentences(n: int, seed: int) -> list[str]:
    """Sentences of 1..24 words of ``TINY_WORDS`` whose lengths come in shuffled order."""
    rng = random.Random(seed)
    lengths = [1 + (7 * i) % 24 for i in range(n)]
    rng.shuffle(lengths)
    return [" ".join(rng.choice(TINY_WORDS) for _ in range(k)) for k in lengths]


def finished_folder(
    path: Path,
    stage: str,
    config: Any,
    build: Callable[[Path], Mapping[str, Any] | None],
    inputs: Mapping[str, Path] | None = None,
) -> Path:
    """A stage folder made by ``build(tmp) -> stats`` through the real stage contract."""
    from tasks.framework.runner import build_folder

    return build_folder(stage, path, config, inputs or {}, build).path


def tokenizer_folder(path: Path, sentences: list[str], vocab_size: int, **options: Any) -> Path:
    """A tokenizer stage folder holding a sentencepiece model trained on ``sentences`` with the
    pipeline's ids (pad 0, unk 1, bos 2, eos 3); ``options`` go to the trainer
    (``model_type``...)."""
    import sentencepiece as spm

    def build(tmp: Path) -> dict:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_prefix=str(tmp / "spm"),
            vocab_size=vocab_size,
            character_coverage=1.0,
            pad_id=0,
            unk_id=1,
            bos_id=2,
            eos_id=3,
            num_threads=1,
            minloglevel=2,
            **{"model_type": "bpe", **options},
        )
        return {}

    return finished_folder(
        path, "tokenizer", {"vocab_size": vocab_size, "sentences": len(sentences), **options}, build
    )


def encoded_split(
    folder: Path, texts: list[str], tokenizer_dir: Path, rows_per_file: int = 16
) -> list[Path]:
    """``folder/part-*.parquet``: ``texts`` encoded as the shard stage encodes a split (each text
    its own target too); the parts."""
    import pyarrow as pa

    from corpora.encoding import SHARD_SCHEMA, encode_table
    from corpora.parquet import ParquetShardWriter
    from serving import tokenizer

    tok = tokenizer.load(tokenizer_dir)
    writer = ParquetShardWriter(folder, SHARD_SCHEMA, rows_per_file)
    if texts:
        writer.write(encode_table(tok.sp, pa.table({"src": texts, "tgt": texts}), tok.pretokenizer))
    return writer.close()
