"""Side by side with the toolkits users would pick instead: fairseq and eole against ours on the
published Multi30k recipe, on this machine's CPU (``make bench-peers``).

1. Data: our pipeline's stages (download, clean, tokenizer, shard) of
   configs/multi30k_en_de_tiny.yaml in ``--workdir`` (on the shared Multi30k mirror when it is
   beside the checkout), and the same lowercased, Moses-tokenized, subword-nmt 10k-merge text as
   plain files for the peers (``benchmarks/peers/data.py``): the same 28,989 training pairs.
2. Each peer in its own environment under ``.peers/`` over the same CPU torch
   (``benchmarks/peers/env.py``); a peer that cannot be installed or run is reported in one line
   and the others go on.
3. Training, one toolkit after the other: the same model (4+4 layers, d_model 128, d_ff 256, 4
   heads, shared embeddings, dropout 0.3, label smoothing 0.1, Adam, inverse-sqrt) for
   ``--updates`` updates of 8,192 tokens (2 x 4,096) on two threads: fairseq-train, eole train,
   ours as ``tfm run`` trains it (Ray Train, two workers of one thread) and as one plain
   process of two threads. Target tokens a second over the updates after the first
   ``--log-every`` (warm-up), each toolkit's own count.
4. Decoding test2016 (1,000 captions), beam 5, batches of 4,096 tokens, outputs at most the
   source + 50: fairseq-generate, eole predict and ``tfm translate``'s translator with each
   engine, each on the model it trained in step 3 (the same shape): sentences a second of the
   generator alone (after loading), the output's length, and bleu_tok_lc (so that a faster
   decoder is not one that stopped earlier).
5. Decoding on the same weights: the one-process fairseq training's checkpoint (the one
   fairseq-generate decoded in step 4) imported by our ``fairseq_import`` stage (``tfm import
   fairseq``'s, without registering), then decoded by our translator with engine torch and
   with its CTranslate2 export, at fairseq-generate's settings (``peers.ours.fairseq_decoding``:
   beam 5, ``length_norm`` fairseq with alpha 1 for its ``--lenpen`` 1, ``length_rule``
   fairseq for its ``--min-len`` 1 and the EOS it forces after ``--max-len-a`` 1 x the source
   + ``--max-len-b`` 50 tokens), timed over the encoded source as fairseq-generate times its
   binarized one. Each row says the share of its hypotheses identical to fairseq-generate's,
   compared as the dictionary's symbols before BPE is removed (the same subword sequence: no
   detokenization can merge or split a difference); both are scored by one path (BPE removed
   as ``--remove-bpe``, Moses-detokenized). One model, one search: our model scores
   fairseq's hypotheses as fairseq does (to 1e-5), so what differs is the decoder's speed, the
   arithmetic of a near tie, and the output limit: fairseq's is its batch's widest source + 50,
   ours each sentence's own + 50, so a hypothesis that runs to it (a repetition loop) stops a
   few tokens earlier on our side (the only differences on a 434-update model: 3 of 1,000).

    python benchmarks/peers [--updates 30 --log-every 10] [--peers fairseq,eole] [--no-install]
    python benchmarks/peers --no-train [--peers fairseq]   # decode the work dir's last models

Writes ``peers.json`` and ``peers.md`` under ``--out`` (benchmarks/results/ by default) and
prints the table. Every figure is from this one run; other load on the machine moves them all.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import figures

from . import eole, fairseq
from .data import Corpus, default_mirror, prepare
from .decoding import decode_all
from .env import Peer, Recipe, Shape, ensure, last_line
from .procs import free_port, guarded, ours, run, run_ranks
from .report import (
    FAIRSEQ,
    FAIRSEQ_2P,
    GENERATE,
    LAYOUTS,
    OURS,
    SAME_WEIGHTS,
    best,
    best_of,
    cpu_model,
    rate,
    tables,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

PEERS = ("fairseq", "eole")


def recipe(args) -> Recipe:
    """The recipe every toolkit trains with; ``--warmup`` reaches the same peak sooner."""
    return Recipe(threads=args.threads, warmup=args.warmup or Recipe.warmup)


# ------------------------------------------------------------------------------ training


def train_fairseq(
    peer: Peer, corpus: Corpus, out: Path, args, processes: int = 1
) -> dict[str, Any]:
    """fairseq-train in ``processes`` processes of ``threads / processes`` threads each."""
    data_bin = out / "fairseq" / "data-bin"
    if not (data_bin / "dict.en.txt").is_file():
        shutil.rmtree(data_bin, ignore_errors=True)
        cmd = fairseq.preprocess_command(peer, corpus.text, corpus.languages, data_bin)
        code, text, _ = run(cmd, peer.env(args.threads), out / "fairseq" / "preprocess.log")
        if code != 0:
            return {"problem": f"fairseq-preprocess: exit {code}: {last_line(text)}"}
    suffix = "" if processes == 1 else f"-{processes}p"
    save = out / "fairseq" / f"checkpoints{suffix}"
    shutil.rmtree(save, ignore_errors=True)
    port = free_port()
    cmds = [
        fairseq.train_command(
            peer,
            data_bin,
            save,
            Shape(),
            recipe(args),
            args.updates,
            args.log_every,
            languages=corpus.languages,
            rank=(rank, processes, port) if processes > 1 else None,
        )
        for rank in range(processes)
    ]
    threads = max(1, args.threads // processes)
    code, text, seconds = run_ranks(cmds, peer.env(threads), out / "fairseq" / f"train{suffix}.log")
    if code != 0:
        return {"problem": f"fairseq-train: exit {code}: {last_line(text)}"}
    return fairseq.train_rates(text, args.log_every) | {
        "wall_s": seconds,
        "checkpoint": str(save / "checkpoint_last.pt"),
        "data_bin": str(data_bin),
    }


def train_eole(peer: Peer, corpus: Corpus, out: Path, args) -> dict[str, Any]:
    folder = out / "eole"
    shutil.rmtree(folder / "model", ignore_errors=True)
    config = eole.write_config(
        folder,
        corpus.text,
        corpus.languages,
        Shape(),
        recipe(args),
        args.updates,
        args.log_every,
    )
    code, text, _ = run(
        eole.vocab_command(peer, config), peer.env(args.threads), folder / "vocab.log"
    )
    if code != 0:
        return {"problem": f"eole build_vocab: exit {code}: {last_line(text)}"}
    code, text, seconds = run(
        eole.train_command(peer, config), peer.env(args.threads), folder / "train.log"
    )
    if code != 0:
        return {"problem": f"eole train: exit {code}: {last_line(text)}"}
    return eole.train_rates(text, args.log_every) | {
        "wall_s": seconds,
        "checkpoint": str(eole.last_checkpoint(folder / "model")),
    }


def train_ours(kind: str, corpus: Corpus, out: Path, args) -> dict[str, Any]:
    folder = out / f"ours-{kind}"
    shutil.rmtree(folder, ignore_errors=True)
    extra = ["--threads", str(args.threads)] if kind == "plain" else []
    if args.warmup:
        extra += ["--warmup", str(args.warmup)]
    argv = [
        str(corpus.workdir),
        str(folder),
        "--updates",
        str(args.updates),
        "--log-every",
        str(args.log_every),
    ]
    return ours(kind, argv + extra, args.threads, out / "logs" / f"ours-{kind}.log")


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workdir", type=Path, default=ROOT / "runs" / "bench-peers")
    parser.add_argument(
        "--mirror",
        default=default_mirror(),
        help="data.mirror (default: the shared Multi30k mirror if present)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated: fairseq,eole")
    parser.add_argument("--updates", type=int, default=30, help="updates each toolkit trains")
    parser.add_argument(
        "--log-every",
        type=int,
        default=10,
        help="updates a logging interval; the first is the warm-up",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="updates to the recipe's peak learning rate (default the recipe's 2,000); shorter "
        "for models that translate after a few hundred updates, for the decoding comparison",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--no-install", action="store_true", help="use the peers' environments as they are"
    )
    parser.add_argument("--skip-decode", action="store_true")
    parser.add_argument(
        "--time-to-bleu",
        type=float,
        metavar="MINUTES",
        help="instead: the laptop recipe trained MINUTES by ours and by fairseq, BLEU against "
        "minutes (benchmarks/peers/ttb.py)",
    )
    parser.add_argument(
        "--eval-minutes", type=float, default=1.0, help="--time-to-bleu: minutes between scores"
    )
    parser.add_argument(
        "--no-train",
        action="store_true",
        help="decode the models an earlier run trained in --workdir (no training rows)",
    )
    return parser


def train_all(peers: dict[str, Peer], corpus: Corpus, work: Path, args) -> dict[str, Any]:
    """Every toolkit's training, one after the other: a row each, ``problem`` if it failed."""
    train: dict[str, Any] = {}
    trainers: dict[str, tuple[str, Callable[..., dict[str, Any]], tuple[Any, ...]]] = {
        "fairseq": ("fairseq", train_fairseq, ()),
        FAIRSEQ_2P: ("fairseq", train_fairseq, (2,)),
        "eole": ("eole", train_eole, ()),
    }
    for label, (name, trainer, extra) in trainers.items():
        peer = peers.get(name)
        if peer is None:
            continue
        print(f"training: {label}", flush=True)
        train[label] = (
            {"problem": peer.problem}
            if peer.problem
            else guarded(f"{label} training", trainer, peer, corpus, work, args, *extra)
        )
    for kind, label in (("ray", "ours (Ray Train, as tfm run)"), ("plain", "ours (one process)")):
        print(f"training: {label}", flush=True)
        train[label] = train_ours(kind, corpus, work, args)
    for name, r in train.items():
        r.setdefault("layout", LAYOUTS[name])
        if "problem" in r:
            print(f"  {name}: not run: {r['problem']}", flush=True)
    return train


def trained_before(peers: dict[str, Peer], work: Path) -> dict[str, Any]:
    """``--no-train``: the models an earlier run left in ``work``, where ``train_all`` saves
    them (each toolkit's last checkpoint), as training rows without rates."""
    found: dict[str, dict[str, Any]] = {}
    if "fairseq" in peers:
        fairseq_dir = work / "fairseq"
        found["fairseq"] = {
            "checkpoint": str(fairseq_dir / "checkpoints" / "checkpoint_last.pt"),
            "data_bin": str(fairseq_dir / "data-bin"),
        }
    if "eole" in peers:
        model = work / "eole" / "model"
        saved = model.is_dir() and any(model.glob("step_*"))
        found["eole"] = {"checkpoint": str(eole.last_checkpoint(model) if saved else model)}
    for kind, label in (("ray", "ours (Ray Train, as tfm run)"), ("plain", "ours (one process)")):
        found[label] = {"checkpoint": str(work / f"ours-{kind}" / "final" / "model.pt")}
    train: dict[str, Any] = {}
    for name, row in found.items():
        peer = peers.get(name)
        if peer is not None and peer.problem:
            train[name] = {"problem": peer.problem}
        elif not Path(row["checkpoint"]).exists():
            train[name] = {"problem": f"not trained in {work} before (--no-train)"}
        else:
            train[name] = row | {"reused": True}
        train[name]["layout"] = LAYOUTS[name]
    return train


ROW_UPDATES = 300
"""The updates of the run whose figures docs/benchmarks.md gives (``--updates 300``)."""


def record_rows(results: dict[str, Any]) -> None:
    """A run of the rows' length writes its training and same-weights decoding figures to
    benchmarks/figures/peers.json."""
    train, decode = results["train"], results["decode"]
    ratio = results["ours_over_fairseq"]
    if results["updates"] != ROW_UPDATES or ratio is None:
        return
    ours, theirs = best(train, OURS), best(train, FAIRSEQ)
    figures.record(
        "peers",
        "peers-training",
        f"**{ratio:.2f}** ({ours:,.0f} against {theirs:,.0f} target tokens/s; ours: "
        f"{results['best_layouts']['ours']}, fairseq: {results['best_layouts']['fairseq']})",
    )
    same = decode.get(next(iter(SAME_WEIGHTS)), {})
    generate = decode.get(GENERATE, {})
    if rate(same) is not None and rate(generate) is not None and same.get("identical"):
        figures.record(
            "peers",
            "peers-decoding",
            f"**{rate(same) / rate(generate):.2f}x** fairseq-generate's sentences/s "
            f"({rate(same):.1f} against {rate(generate):.1f}); {same['identical']:.1%} of the "
            f"hypotheses identical, BLEU {same['bleu_tok_lc']:.2f} against "
            f"{generate['bleu_tok_lc']:.2f}",
        )


def main(argv: list[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    if args.time_to_bleu:
        from . import ttb

        return ttb.main(args)
    if args.updates < 2 * args.log_every or args.updates % args.log_every:
        cli.error("--updates must be a multiple of --log-every and at least two intervals")
    work = args.workdir / "peers"
    started = time.time()
    print("data: our stages through shard, then the text files", flush=True)
    corpus = prepare(args.workdir, args.mirror)
    peers: dict[str, Peer] = {}
    for name in filter(None, args.peers.split(",")):
        peer = ensure(name, install=not args.no_install)
        if peer.problem:
            print(f"skipped: {peer.problem}", flush=True)
        peers[name] = peer
    train = trained_before(peers, work) if args.no_train else train_all(peers, corpus, work, args)
    decode = {} if args.skip_decode else decode_all(peers, train, corpus, work, args)
    ours_rate, fairseq_rate = best(train, OURS), best(train, FAIRSEQ)
    results = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {cpu_model()}",
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "command": " ".join(
            [Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]
        ),
        "updates": args.updates,
        "warmup_updates": args.log_every,
        "lr_warmup_updates": recipe(args).warmup,
        "train_pairs": corpus.pairs.get("train"),
        "train": train,
        "decode": decode,
        "ours_over_fairseq": ours_rate / fairseq_rate if ours_rate and fairseq_rate else None,
        "best_layouts": {"ours": best_of(train, OURS), "fairseq": best_of(train, FAIRSEQ)},
        "wall_s": round(time.time() - started),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "peers.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    text = tables(results)
    (args.out / "peers.md").write_text(text, encoding="utf-8")
    print(
        "\n"
        + text
        + f"\n{args.out / 'peers.md'}, {args.out / 'peers.json'} ({results['wall_s']} s)"
    )
    record_rows(results)
    return 0
