"""Our side of ``benchmarks/peers``: the recipe's training as ``tfm run`` runs it and as one
plain process, and decoding with ``tfm translate``. Run as a script, one JSON line comes out:

    python benchmarks/peers ours ray WORKDIR OUT --updates 40 --log-every 10 \
        [--seed N] [--set model.init=torch ...]
    python benchmarks/peers ours plain WORKDIR OUT --updates 40 --log-every 10 --threads 2 \
        [--seed N] [--set model.init=torch ...]
    python benchmarks/peers ours decode WORKDIR CHECKPOINT --engine torch --source FILE
    python benchmarks/peers ours imported FOLDER --engine torch --source FILE --export-dir DIR

``ray`` is the train stage's own path (``training.ray_trainer.run_job``: Ray Train's
``TorchTrainer``, configs/multi30k_en_de_tiny.yaml's two workers of one torch thread, its allocator
settings and batches) on the shards the pipeline wrote, without MLflow, validation BLEU or
checkpoints before the last update. ``plain`` steps the same ``Trainer`` in this process with every
update's two batches accumulated on ``--threads`` threads (the peers' layout); ``peers.run`` starts
it with the workers' allocator settings. Both count target tokens over the logging intervals after
the first (warm-up), and take ``--seed`` and ``--set`` overrides of the recipe (to ask what an early
learning curve depends on); ``plain`` also prints and returns the training loss (label-smoothed,
nats a target token) of every logging interval. ``decode`` times the ``tfm translate`` path's
translator (``--checkpoint``, ``--tokenizer``, the config's decoding, beam 5) over the whole test
set after a warm-up call. ``imported`` decodes with fairseq's weights as ``tfm import fairseq``'s
stage wrote them (``FOLDER``: ``model.pt`` beside the tokenizer's files) and fairseq-generate's
settings (``fairseq_decoding``); see ``imported``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from common import parse_overrides

ROOT = Path(__file__).resolve().parents[2]

if TYPE_CHECKING:
    from tasks.framework.config import RunConfig
    from training.config import TrainConfig

CONFIG = ROOT / "configs" / "multi30k_en_de_tiny.yaml"
MARK = "\u2581"
"""sentencepiece's word mark, before each of an imported dictionary's symbols."""


def recipe_config(
    workdir: Path,
    updates: int,
    log_every: int,
    warmup: int | None = None,
    overrides: dict[str, object] | None = None,
):
    """The recipe's config in ``workdir``, trained for ``updates`` updates: logged every
    ``log_every``, validated and checkpointed only at the end, no dev BLEU. ``warmup``: the
    peak learning rate reached after that many updates instead of the recipe's (the same peak:
    the schedule's scale grows with the square root of the warm-up). ``overrides``: ``--set``
    pairs applied to the recipe first."""
    from tasks.framework.config import load_config

    config = load_config(CONFIG, {**(overrides or {}), "workdir": str(workdir)})
    schedule = {}
    if warmup is not None:
        scale = config.train.lr_scale * (warmup / config.train.warmup_steps) ** 0.5
        schedule = {"warmup_steps": warmup, "lr_scale": scale}
    train = dataclasses.replace(
        config.train,
        **schedule,
        steps=updates,
        log_every=log_every,
        eval_every=updates,
        bleu_sentences=0,
        checkpoint_every=0,
        checkpoint_minutes=0.0,
        keep_checkpoints=1,
    )
    return config.replace(train=train)


def vocab_size(workdir: Path) -> int:
    manifest = json.loads((workdir / "shard" / "manifest.json").read_text(encoding="utf-8"))
    return int(manifest["stats"]["vocab_size"])


def train_ray(config: RunConfig, workdir: Path, out: Path) -> dict:
    """The train stage's Ray Train job on ``recipe_config``'s ``config``; its rank-0 summary."""
    from filesystem.location import open_location
    from filesystem.storage import folder_at
    from tasks.framework.runtime import ensure_ray
    from training.job_spec import TrainJob
    from training.ray_trainer import run_job

    ensure_ray(config.ray)
    with tempfile.TemporaryDirectory(prefix="peers-ray-") as storage:
        job = TrainJob(
            model=config.model,
            train=config.train,
            seed=config.seed,
            vocab_size=vocab_size(workdir),
            shard_folder=folder_at(str((workdir / "shard").resolve())),
            storage=open_location(storage),
            run_name="bench-peers",
        )
        summary = run_job(job, out).summary
    return rates(summary["timed_target_tokens"], summary["timed_seconds"], config.train) | {
        "workers": summary["world_size"],
        "threads_per_worker": summary["torch_threads"],
        "checkpoint": str(out / "final" / "model.pt"),
    }


def train_plain(config: RunConfig, workdir: Path, out: Path, threads: int) -> dict:
    """The same Trainer on ``recipe_config``'s ``config`` in this process, one worker on
    ``threads`` threads (two batches an update accumulated); the final weights saved as a
    checkpoint, the loss of every logging interval printed and returned."""
    import torch

    from training.data import TokenData
    from training.trainer import Trainer
    from training.worker import set_threads
    from transformer_core import checkpoint as ckpt
    from transformer_core.model import Transformer

    set_threads(threads)
    train = dataclasses.replace(config.train, num_workers=1, torch_threads=threads)
    vocab = vocab_size(workdir)
    shard = workdir / "shard"
    data = TokenData.read(str(shard / "train"), vocab)
    dev = TokenData.read(str(shard / "dev"), vocab)
    torch.manual_seed(config.seed)
    module = Transformer(config.model, vocab)
    trainer = Trainer(module, train, data, dev, seed=config.seed)
    losses = {}
    try:
        while trainer.step < trainer.last_step:
            if metrics := trainer.train_step():
                losses[trainer.step] = round(metrics["loss"], 4)
                print(f"update {trainer.step}: loss {metrics['loss']:.3f}", flush=True)
    finally:
        trainer.close()
    checkpoint = out / "final" / "model.pt"
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    ckpt.save(checkpoint, module, module.config, vocab_size=vocab, step=trainer.step)
    meter = trainer.meter
    return rates(meter.timed_targets, meter.timed_seconds, config.train) | {
        "workers": 1,
        "threads_per_worker": torch.get_num_threads(),
        "checkpoint": str(checkpoint),
        "seed": config.seed,
        "losses": losses,
    }


def rates(targets: int, seconds: float, train: TrainConfig) -> dict:
    timed = train.steps - train.log_every  # the first logging interval is the warm-up
    return {
        "target_tokens_per_s": targets / seconds,
        "target_tokens_per_update": targets / timed,
        "timed_updates": timed,
        "timed_seconds": seconds,
    }


def decode(workdir: Path, checkpoint: Path, engine: str, source: Path, beam: int) -> dict:
    """Seconds the ``tfm translate`` translator takes for every line of ``source`` (after a
    warm-up call on its first 8 lines: the CTranslate2 export and first allocations)."""
    from corpora.text import read_lines
    from serving import stream
    from tasks.framework.config import load_config

    decode_config = dataclasses.replace(load_config(CONFIG).decoding, beam_size=beam, engine=engine)
    predict = stream.from_checkpoint(checkpoint, workdir / "tokenizer", decode_config)
    lines = read_lines(source)
    predict(lines[:8])
    started = time.perf_counter()
    outputs = predict(lines)
    seconds = time.perf_counter() - started
    return {"sentences": len(lines), "decode_seconds": seconds, "hypotheses": outputs}


def fairseq_decoding(beam: int, engine: str, max_len_b: int = 50, tokens: int = 4096):
    """fairseq-generate's decoding (``peers.fairseq.generate_command``) as our ``DecodeConfig``:
    beam ``beam``, its length penalty (``--lenpen`` 1: the summed log-probability / |Y|), its
    ends (``length_rule``: ``--min-len`` 1, the EOS forced after ``--max-len-a`` 1 x the
    source's tokens, its EOS counted, + ``--max-len-b`` ``max_len_b``), batches of
    ``tokens``."""
    from serving.decode_config import DecodeConfig

    return DecodeConfig(
        beam_size=beam,
        alpha=1.0,
        length_norm="fairseq",
        max_len_offset=max_len_b,
        length_rule="fairseq",
        max_tokens_per_batch=tokens,
        engine=engine,
    )


def imported(
    folder: Path, engine: str, source: Path, beam: int, export_dir: Path, prepared: Path | None
) -> dict:
    """Seconds the translator takes to decode every line of ``source`` with the imported model
    in ``folder`` and ``fairseq_decoding``: the lines encoded first, then ``translate_ids`` alone
    timed (as fairseq-generate's timer runs over its binarized input; after a warm-up call on 8
    lines). The outputs as the fairseq dictionary's symbols, BPE marks kept (the
    ``fairseq-generate`` output they are compared with). ``prepared``: the source as the peers
    read it (lowercased, Moses, BPE); the lines whose pieces differ from ours are counted
    (``source_mismatches``: 0 when both read the same source tokens)."""
    from corpora.text import read_lines
    from serving.translator import Translator

    decode = fairseq_decoding(beam, engine)
    translator = Translator.load(folder, folder, decode, export_dir=export_dir)
    sp = translator.tokenizer.sp
    lines = read_lines(source)
    src_ids = translator.encode(lines)
    translator.translate_ids(src_ids[:8])
    started = time.perf_counter()
    outputs = translator.translate_ids(src_ids)
    seconds = time.perf_counter() - started

    def symbols(ids: list[int]) -> str:  # fairseq_vocab's pieces: its symbols behind a word mark
        return " ".join(sp.id_to_piece(t).removeprefix(MARK) for t in ids)

    result = {
        "sentences": len(lines),
        "decode_seconds": seconds,
        "hypotheses": [symbols(ids) for ids in outputs],
        "pieces": True,
    }
    if prepared is not None:  # a symbol outside the dictionary is <unk> on both sides
        theirs = [sp.encode(line) for line in read_lines(prepared)]
        result["source_mismatches"] = sum(a[:-1] != b for a, b in zip(src_ids, theirs, strict=True))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["ray", "plain", "decode", "imported"])
    parser.add_argument("workdir", type=Path, help="imported: the import's folder")
    parser.add_argument(
        "path", type=Path, nargs="?", help="ray/plain: output folder; decode: checkpoint"
    )
    parser.add_argument("--updates", type=int, default=40)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=None, help="default: the recipe's")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--engine", default="torch")
    parser.add_argument("--source", type=Path)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--export-dir", type=Path, help="imported: the CTranslate2 export's folder")
    parser.add_argument("--prepared", type=Path, help="imported: the source as the peers read it")
    parser.add_argument("--seed", type=int, default=None, help="training: the recipe's if unset")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="training: overrides"
    )
    args = parser.parse_args(argv)
    overrides = parse_overrides(args.set) | ({} if args.seed is None else {"seed": args.seed})
    if overrides and args.what in ("decode", "imported"):
        parser.error("--seed and --set are for training (ray, plain); decode reads the checkpoint")
    if (args.path is None) != (args.what == "imported"):
        parser.error("ray, plain and decode take a PATH, imported none")
    if args.what in ("ray", "plain"):
        config = recipe_config(args.workdir, args.updates, args.log_every, args.warmup, overrides)
        if args.what == "ray":
            result = train_ray(config, args.workdir, args.path)
        else:
            result = train_plain(config, args.workdir, args.path, args.threads)
    elif args.what == "decode":
        result = decode(args.workdir, args.path, args.engine, args.source, args.beam)
    else:
        export = args.export_dir or args.workdir.parent / f"{args.workdir.name}-ct2"
        result = imported(args.workdir, args.engine, args.source, args.beam, export, args.prepared)
    print("PEERS-RESULT " + json.dumps(result), flush=True)
    return 0
