"""Parsing recipes on the NLTK WSJ sample without Ray: one short training, dev F1 along the way.

For comparing recipes quickly (a lent GPU runs several side by side); `benchmarks/parsing_f1.py`
runs the real pipeline and gives the reported numbers. The pipeline's stages prepare the data
(treebank, linearize, tokenizer with the config's target symbols), then this trains
transformer_core directly: the model (with the train stage's target vocabulary), the
label-smoothed loss, Adam with the paper's schedule and token-budget batches, as the train
stage's worker does, without Ray, checkpoints or MLflow. At each ``--evals`` step and at the end
it decodes dev (or test) with beam search, constrained and plain (``--plain``), repairs and
scores with EVALB's rules, and prints one JSON line.

    python benchmarks/parsing_recipes.py --steps 8000 --evals 1000,2000,4000 --device cuda
    python benchmarks/parsing_recipes.py --set model.norm_first=false --set train.lr_scale=0.6
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from common import parse_overrides  # noqa: E402  (the script's own folder is first on sys.path)


def prepare(config):
    """Token ids of train and the evaluation splits, via the pipeline's own stages."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from corpora.parquet import part_files
    from serving import tokenizer as tokenizer_lib
    from tasks.framework import runner
    from tasks.train import target_vocab_size

    for name in ("treebank", "linearize", "tokenizer"):
        runner.run_stage(config, name)
    root = config.root
    tok = tokenizer_lib.load(root / "tokenizer")
    table = pa.concat_tables(pq.read_table(f) for f in part_files(root / "linearize" / "train"))
    tgt_vocab = target_vocab_size(config, {"tokenizer": root / "tokenizer"})
    src = tok.encode_batch(table.column("src").to_pylist())
    tgt = tok.encode_batch(table.column("tgt").to_pylist())
    return tok, tgt_vocab, src, tgt


def evaluate(model, tok, config, split, beam, constrained, limit=None):
    """Scores of ``split`` (its first ``limit`` sentences) decoded with beam search (constrained
    or plain), repaired."""
    import torch

    from evaluation.evalb import score_corpus
    from parsing.constrain import bracket_vocab
    from parsing.linearize import POS_TAGS, repair, structure_tokens
    from parsing.trees import read_trees
    from transformer_core.constraints import TreeConstraint
    from transformer_core.search import SearchSettings, search

    root, form = config.root, config.parsing.form
    words = (root / "linearize" / f"{split}.words").read_text(encoding="utf-8").splitlines()
    golds = list(read_trees(root / "treebank" / f"{split}.trees"))
    words, golds = words[:limit], golds[:limit]
    constraint = bracket_vocab(tok, form, model.tgt_vocab_size) if constrained else None
    settings = SearchSettings(
        beam_size=beam, alpha=config.parsing.alpha, max_len_offset=config.parsing.max_len_offset
    )
    ids = tok.encode_batch(words)
    device = next(model.parameters()).device
    hyps: list[str] = [""] * len(ids)
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    for start in range(0, len(order), 32):
        rows = order[start : start + 32]
        src = torch.zeros(len(rows), max(len(ids[i]) for i in rows), dtype=torch.long)
        for j, i in enumerate(rows):
            src[j, : len(ids[i])] = torch.tensor(ids[i])
        step = None if constraint is None else TreeConstraint(constraint)
        found = search(model, src.to(device), settings, step)
        for j, i in enumerate(rows):
            hyps[i] = tok.decode(found[j][0].tokens) if found[j] else ""
    fixed = [
        repair(h, w, form, tags=g.tags() if form == "vinyals" else None)
        for h, w, g in zip(hyps, words, golds, strict=True)
    ]
    total, _ = score_corpus(golds, [r.tree for r in fixed])
    slots = sum(sum(t in POS_TAGS or t == "XX" for t in structure_tokens(h, form)) for h in hyps)
    n_words = sum(len(w.split()) for w in words)
    return {
        "f1": round(total.f1, 2),
        "tagging": round(total.tagging_accuracy, 2),
        "slots_per_word": round(slots / n_words, 4),
        "repaired": sum(bool(r.fixes) for r in fixed),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "ptb_sample.yaml"))
    parser.add_argument("--workdir", default=str(ROOT / "runs" / "parsing_recipes"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--steps", type=int, default=8000)
    parser.add_argument("--evals", default="", help="comma-separated steps to evaluate at")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--split", default="dev", choices=("dev", "test"))
    parser.add_argument("--plain", action="store_true", help="also decode unconstrained")
    parser.add_argument("--sentences", type=int, default=None, help="score only the first N")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--name", default="recipe")
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    from tasks.framework.config import load_config
    from transformer_core import Transformer
    from transformer_core.batching import collate, plan_batches
    from transformer_core.loss import label_smoothed_nll
    from transformer_core.schedule import make_optimizer, make_scheduler

    config = load_config(args.config, {"workdir": args.workdir, **parse_overrides(args.set)})
    if config.train.tokens_per_step != config.train.max_tokens_per_batch:
        # The train stage's step is ceil(tokens_per_step / max_tokens_per_batch) micro-batches
        # of max_tokens_per_batch; this loop takes one batch of tokens_per_step per step.
        raise SystemExit(
            f"train.tokens_per_step ({config.train.tokens_per_step}) must equal "
            f"train.max_tokens_per_batch ({config.train.max_tokens_per_batch}) here: one batch "
            "per step, as the train stage takes it then"
        )
    tok, tgt_vocab, src, tgt = prepare(config)
    mc, tc = config.model, config.train
    torch.manual_seed(config.seed)
    model = Transformer(mc, tok.vocab_size, tgt_vocab).to(args.device)
    optimizer = make_optimizer(model)
    schedule = make_scheduler(optimizer, mc.d_model, tc.warmup_steps, tc.lr_scale)
    src_lens, tgt_lens = np.array([len(s) for s in src]), np.array([len(t) for t in tgt])
    evals = {int(e) for e in args.evals.split(",") if e} | {args.steps}

    def report(step: int, started: float) -> None:
        row = {"name": args.name, "step": step, "minutes": round((time.time() - started) / 60, 2)}
        row.update(
            {
                f"c_{k}": v
                for k, v in evaluate(
                    model, tok, config, args.split, args.beam, True, args.sentences
                ).items()
            }
        )
        if args.plain:
            plain = evaluate(model, tok, config, args.split, args.beam, False, args.sentences)
            row.update({f"p_{k}": v for k, v in plain.items()})
        row["overrides"] = args.set
        print(json.dumps(row), flush=True)
        model.train()

    step, epoch, started = 0, 0, time.time()
    model.train()
    while step < args.steps:
        for rows in plan_batches(
            src_lens, tgt_lens, tc.tokens_per_step, seed=config.seed, epoch=epoch
        ):
            batch = collate([src[i] for i in rows], [tgt[i] for i in rows], mc.pad_id, mc.bos_id)
            s, t_in, t_out = (x.to(args.device) for x in batch)
            loss, _, n = label_smoothed_nll(model(s, t_in), t_out, mc.label_smoothing, mc.pad_id)
            optimizer.zero_grad(set_to_none=True)
            (loss / n).backward()
            optimizer.step()
            schedule.step()
            step += 1
            if step in evals:
                report(step, started)
            if step >= args.steps:
                break
        epoch += 1


if __name__ == "__main__":
    main()
