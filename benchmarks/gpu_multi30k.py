"""``benchmarks/gpu.py``'s time to BLEU: the Multi30k GPU config's model trained for a few minutes
on shards its pipeline prepared, then test2016 BLEU of the last weights."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import torch

from training.data import TokenData
from training.trainer import Trainer
from transformer_core import Transformer


def multi30k_bleu(workdir: Path, config_path: str, minutes: float) -> list[dict]:
    """Time to BLEU on one GPU: the Multi30k GPU config's model and Trainer on the shards its
    pipeline prepared in ``workdir`` (``tfm stage shard --config ...``), trained for at most
    ``minutes`` (compilation included) or the config's steps, with dev BLEU at every validation
    (greedy, as in the pipeline); then test2016 BLEU of the last weights with the config's beam
    search (sacreBLEU, no averaging). No Prefect or MLflow: the Trainer driven directly."""
    from sacrebleu.metrics import BLEU

    from corpora.text import read_lines
    from serving import tokenizer as tokenizer_lib
    from serving.translator import Translator
    from tasks.framework.config import load_config
    from training.dev_bleu import DevBleu

    config = load_config(config_path)
    tc = dataclasses.replace(config.train, checkpoint_every=0, checkpoint_minutes=0)
    tokenizer = tokenizer_lib.load(workdir / "tokenizer")
    vocab = tokenizer.vocab_size
    train = TokenData.read(str(workdir / "shard" / "train"), vocab)
    dev = TokenData.read(str(workdir / "shard" / "dev"), vocab)
    torch.manual_seed(config.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: a smoke run of this code
    module = Transformer(config.model, vocab).to(device)
    dev_bleu = DevBleu(dev, tokenizer.decode, tc.bleu_sentences, max_tokens=tc.max_tokens_per_batch)
    trainer = Trainer(module, tc, train, dev, seed=config.seed, dev_bleu=dev_bleu)
    curve: list[dict] = []
    started = time.time()
    while not trainer.done and time.time() - started < minutes * 60:
        metrics = trainer.train_step()
        metrics.update(trainer.maybe_evaluate())
        if "val_bleu" in metrics:
            curve.append(
                {
                    "step": trainer.step,
                    "minutes": (time.time() - started) / 60,
                    "val_bleu": metrics["val_bleu"],
                    "val_loss": metrics.get("val_loss"),
                }
            )
            print(f"  multi30k step {trainer.step}: dev BLEU {metrics['val_bleu']:.2f}", flush=True)
    trained = time.time() - started
    trainer.close()
    module.eval()
    src, tgt = config.languages
    sources = read_lines(workdir / "download" / f"test.{src}")
    references = read_lines(workdir / "download" / f"test.{tgt}")
    translator = Translator(module, tokenizer, config.decoding, device=device)
    decode_started = time.time()
    with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
        hyps = translator.translate(sources)
    decode_s = time.time() - decode_started
    bleu = BLEU().corpus_score(hyps, [references])
    return [
        {
            "config": Path(config_path).name,
            "steps": trainer.step,
            "train_minutes": trained / 60,
            "tokens/s": trainer.timed_tokens / max(trainer.timed_seconds, 1e-9),
            "best dev BLEU": max((c["val_bleu"] for c in curve), default=None),
            f"test BLEU (last, beam {config.decoding.beam_size})": bleu.score,
            "decode_s": decode_s,
            "curve": curve,
        }
    ]
