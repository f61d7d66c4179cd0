"""The GPU measurement suite, one command (``make bench-gpu``), one GPU, a few minutes.

1. Training throughput of Transformer base and big, bf16 autocast, torch.compile off and on:
   tokens/s (source + target), target tokens/s, model TFLOP/s and MFU (transformer_core/flops.py
   against the device's datasheet bf16 peak), peak memory. The paper's batch: one 25k-token
   step, lengths from a log-normal with WMT14 En-De BPE's means (~27 source, ~30 target pieces)
   and a long tail, a 37k vocabulary, pad_multiple 8, fused Adam, prefetched pinned batches;
   each speed switch flipped once (train.fused_loss: the projection fused with the loss).
2. The same Trainer loop inside a Ray Train worker (1 GPU) against the plain loop in this
   process, interleaved plain, Ray, plain, Ray, plain (the plain runs' spread is the noise).
3. Where the time goes: torch.profiler over 3 more steps of each run: the share of wall time the
   GPU was busy, which scaled-dot-product-attention kernels ran (with the padding masks), and for
   the largest model GPU time by kernel kind and the top kernels.
4. Beam-search decoding of base (beam 4, batches 64 and 128, 50-token outputs with EOS masked),
   float32 and bfloat16 weights.
5. Time to BLEU: configs/multi30k_en_de_gpu.yaml's model trained for ``--multi30k-minutes`` on
   the shards its pipeline prepared (``--multi30k WORKDIR``), dev BLEU at every validation and
   test2016 BLEU of the last weights (the Trainer driven directly: no Prefect or MLflow needed).
6. With ``--peers-wheels``: fairseq (``--fp16``) and eole (bf16) train the same sizes on the
   same rows beside ours: target tokens/s and MFU (``benchmarks/gpu_peers.py``).

    python benchmarks/gpu.py --preflight          # exit 2 with one line when CUDA is absent
    python benchmarks/gpu.py --out benchmarks/results/gpu [--quick] [--sizes big] \
        [--skip ray,switches,compile,decode] [--multi30k WORKDIR [--multi30k-minutes 3]] \
        [--peers-wheels .whl/peers]

``make bench-gpu BENCH_FLAGS="..."`` passes flags through. A Multi30k workdir comes from
``for s in download clean tokenizer shard; do tfm stage $s --config
configs/multi30k_en_de_gpu.yaml --set workdir=WORKDIR; done`` on any machine.

Writes ``gpu.json`` and ``gpu.md`` (the tables) under ``--out`` and prints the tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    import numpy as np
    import torch
except ImportError as err:  # the preflight's one line where this Python has no torch at all
    print(
        f"bench-gpu: no {err.name} in {sys.executable} (set BENCH_GPU_PYTHON to a Python with a "
        "CUDA build of torch)",
        file=sys.stderr,
    )
    sys.exit(2)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from training.config import TrainConfig  # noqa: E402
from training.data import TokenData  # noqa: E402
from training.trainer import Trainer  # noqa: E402
from transformer_core import EOS_ID, Transformer, presets  # noqa: E402

VOCAB = 37_000
ROWS = 200_000
# WMT14 En-De with a 37k joint BPE: ~27 source and ~29 target pieces per pair on average, a
# long right tail; lengths are clipped to 2..250 (the shard stage drops rows past the limits).
SRC_LOG_MEAN, TGT_LOG_MEAN, LOG_SD = 3.12, 3.19, 0.62


def synthetic_corpus(rows: int, seed: int = 0) -> TokenData:
    """Random ids with WMT-like lengths, in the shards' CSR layout (the speed depends on shapes)."""
    rng = np.random.default_rng(seed)
    sides = []
    for mean in (SRC_LOG_MEAN, TGT_LOG_MEAN):
        lens = np.clip(np.rint(rng.lognormal(mean, LOG_SD, rows)), 2, 250).astype(np.int64)
        values = rng.integers(4, VOCAB, int(lens.sum()), dtype=np.int64).astype(np.uint16)
        ends = np.cumsum(lens)
        values[ends - 1] = EOS_ID
        sides += [values, np.r_[0, ends]]
    return TokenData(*sides)


def train_config(**changes: Any) -> TrainConfig:
    base = TrainConfig(
        steps=10_000,
        tokens_per_step=25_000,
        max_tokens_per_batch=25_000,
        warmup_steps=4000,
        use_gpu=True,
        pad_multiple=8,
        eval_every=10_000,
        checkpoint_every=0,
        checkpoint_minutes=0,
    )
    return dataclasses.replace(base, **changes)


def measure(trainer: Trainer, warmup: int, timed: int) -> dict[str, Any]:
    """``warmup`` steps (compilation, allocator, cuBLAS heuristics), then ``timed`` steps; the
    Trainer's own metrics over the timed interval (it syncs only at its logging steps)."""
    for _ in range(warmup - 1):
        trainer.train_step()
    trainer.train_step()  # logging step (log_every == warmup): closes the warm-up interval
    torch.cuda.reset_peak_memory_stats()
    for _ in range(timed - 1):
        trainer.train_step()
    metrics = trainer.train_step()
    metrics["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return metrics


def training_run(
    size: str, steps: int, corpus: TokenData, **switches: Any
) -> tuple[dict, list[dict], list[dict]]:
    """Throughput of ``steps`` timed steps after ``steps`` warm-up steps, then a profile of 3
    more: the row, GPU time by kernel kind, and the top kernels."""
    torch.manual_seed(0)
    module = Transformer(presets.get(size), VOCAB).cuda()
    tc = train_config(log_every=steps, **switches)
    trainer = Trainer(module, tc, corpus, corpus, seed=1)
    started = time.time()
    m = measure(trainer, steps, steps)
    kinds, top, busy, attention = profile(trainer)
    trainer.close()
    del trainer, module
    torch.cuda.empty_cache()
    row = {
        "model": size,
        "compile": tc.compile,
        "cudnn_attn": tc.cudnn_attention,
        "prefetch": tc.prefetch,
        "fused_loss": tc.fused_loss,
        "fused_adam": tc.fused_adam is not False,
        "pad": tc.pad_multiple,
        "tokens/s": m["tokens_per_s"],
        "tgt_tokens/s": m["target_tokens_per_s"],
        "TFLOP/s": m["tflops_per_worker"],
        "MFU": m["mfu"],
        "gpu_busy": busy,
        "peak_GiB": m["peak_memory_gb"],
        "graphs": compiled_graphs() if tc.compile else None,
        "attention kernels": attention,
        "wall_s": time.time() - started,
    }
    label = f"{size}{' compiled' if tc.compile else ''}{' fused loss' if tc.fused_loss else ''}"
    return row, [{"run": label, **k} for k in kinds], [{"run": label, **t} for t in top]


def compiled_graphs() -> int:
    """Graphs compiled so far in this process (a recompilation storm shows here)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def warm_up_gpu(seconds: float = 10.0) -> None:
    """Matrix products until the clocks have left idle (the first run would pay for it)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()
    del a
    torch.cuda.empty_cache()


# ------------------------------------------------------------------------------ Ray Train


def ray_worker(cfg: dict[str, Any]) -> None:
    """Inside a Ray Train worker: the same model, Trainer and measurement as the plain loop."""
    import ray.train.torch

    torch.manual_seed(0)
    module = Transformer(presets.get(cfg["size"]), VOCAB)
    model = ray.train.torch.prepare_model(module)  # one worker: moved to its GPU, no DDP
    corpus = synthetic_corpus(ROWS)
    tc = train_config(log_every=cfg["steps"])
    trainer = Trainer(module, tc, corpus, corpus, seed=1, model=model)
    m = measure(trainer, cfg["steps"], cfg["steps"])
    trainer.close()
    # Ray Train 2.60 keeps reported metrics only with a checkpoint: a file on this machine it is.
    Path(cfg["result"]).write_text(json.dumps({"tokens_per_s": m["tokens_per_s"]}))


def ray_vs_plain(size: str, steps: int, corpus: TokenData) -> list[dict]:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    def plain() -> float:
        torch.manual_seed(0)
        module = Transformer(presets.get(size), VOCAB).cuda()
        trainer = Trainer(module, train_config(log_every=steps), corpus, corpus, seed=1)
        value = measure(trainer, steps, steps)["tokens_per_s"]
        trainer.close()
        del trainer, module
        torch.cuda.empty_cache()
        return value

    def in_ray() -> float:
        with tempfile.TemporaryDirectory() as storage:
            result = Path(storage) / "result.json"
            TorchTrainer(
                ray_worker,
                train_loop_config={"size": size, "steps": steps, "result": str(result)},
                scaling_config=ScalingConfig(num_workers=1, use_gpu=True),
                run_config=RunConfig(storage_path=storage, name="bench"),
            ).fit()
            return float(json.loads(result.read_text())["tokens_per_s"])

    # Interleaved, plain first and last, so drift hits both paths alike.
    runs: list[tuple[str, float]] = [("plain", plain())]
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
    )
    ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        for _ in range(2):
            runs.append(("Ray Train, 1 worker", in_ray()))
            runs.append(("plain", plain()))
    finally:
        ray.shutdown()
    mean = {
        name: sum(v for n, v in runs if n == name) / sum(1 for n, _ in runs if n == name)
        for name, _ in runs
    }
    rows = [
        {
            "run": i + 1,
            "loop": name,
            "model": size,
            "tokens/s": value,
            "vs_plain_mean": value / mean["plain"],
        }
        for i, (name, value) in enumerate(runs)
    ]
    rows.append(
        {
            "run": "mean",
            "loop": "Ray Train / plain",
            "model": size,
            "tokens/s": mean["Ray Train, 1 worker"],
            "vs_plain_mean": mean["Ray Train, 1 worker"] / mean["plain"],
        }
    )
    return rows


# ------------------------------------------------------------------------------ profile


KINDS = (
    ("attention", ("flash", "fmha", "attention", "efficient")),
    ("matmul", ("gemm", "cutlass", "sm90", "xmma", "nvjet", "cublas")),
    ("optimizer", ("adam", "multi_tensor")),
    ("softmax / loss", ("softmax", "nll", "log_softmax", "cross_entropy")),
    ("copy", ("memcpy", "memset", "copy")),
)


def kind_of(name: str) -> str:
    lower = name.lower()
    for kind, keys in KINDS:
        if any(k in lower for k in keys):
            return kind
    return "elementwise / other"


def profile(trainer: Trainer, steps: int = 3) -> tuple[list[dict], list[dict], float, str]:
    """GPU time by kernel kind and the top kernels over ``steps`` more training steps; the share
    of wall time the GPU was busy; the attention kernels that ran."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    torch.cuda.synchronize()
    started = time.perf_counter()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            trainer.train_step()
        torch.cuda.synchronize()
    wall = time.perf_counter() - started
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    total = sum(e.self_device_time_total for e in kernels) or 1.0
    by_kind: dict[str, float] = {}
    for e in kernels:
        by_kind[kind_of(e.key)] = by_kind.get(kind_of(e.key), 0.0) + e.self_device_time_total
    kinds = [
        {"kind": k, "ms/step": t / 1000 / steps, "share": t / total}
        for k, t in sorted(by_kind.items(), key=lambda kv: -kv[1])
    ]
    top = sorted(kernels, key=lambda e: -e.self_device_time_total)[:10]
    tops = [
        {
            "kernel": e.key[:80],
            "kind": kind_of(e.key),
            "calls/step": e.count // steps,
            "ms/step": e.self_device_time_total / 1000 / steps,
            "share": e.self_device_time_total / total,
        }
        for e in top
    ]
    attention = sorted({attention_kernel(e.key) for e in kernels} - {None})
    return kinds, tops, total / 1e6 / wall, ", ".join(attention)


def attention_kernel(name: str) -> str | None:
    """A short name for an SDPA kernel (forward or backward), None for anything else."""
    lower = name.lower()
    if "cudnn" in lower and "sdpa" in lower:
        return "cuDNN"
    if "flash" in lower:
        return "flash"
    if "fmha" in lower or "efficient_attention" in lower or "mem_eff" in lower:
        return "efficient"
    return None


# ------------------------------------------------------------------------------ decoding


def decoding(batches: tuple[int, ...], out_len: int) -> list[dict]:
    from common import best_tokens
    from decode import NoEOS, sources, timed  # masks EOS in decode_step (fixed-length outputs)

    rows = []
    torch.manual_seed(0)
    model = NoEOS(presets.get("base"), VOCAB).cuda().eval()
    for dtype in (torch.float32, torch.bfloat16):
        model = model.to(dtype)
        for batch in batches:
            src = sources(batch, 25, VOCAB, seed=batch).cuda()
            best_tokens(model, src, beam_size=4, max_len=4)  # this batch's shapes, warmed up
            seconds, out = timed(best_tokens, model, src, beam_size=4, max_len=out_len)
            assert all(len(o) == out_len for o in out)
            rows.append(
                {
                    "model": "base",
                    "dtype": str(dtype).removeprefix("torch."),
                    "beam": 4,
                    "batch": batch,
                    "out_len": out_len,
                    "tgt_tokens/s": batch * out_len / seconds,
                }
            )
    return rows


# ------------------------------------------------------------------------------ Multi30k


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


# ------------------------------------------------------------------------------ main


def markdown(title: str, rows: list[dict]) -> str:
    if not rows:
        return ""
    cols = list(rows[0])
    lines = [f"### {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(c)) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def fmt(v: Any) -> str:
    if isinstance(v, float):
        if abs(v) < 1:
            return f"{v:.3f}"
        return f"{v:,.1f}" if abs(v) < 100 else f"{v:,.0f}"
    return "" if v is None else str(v)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preflight", action="store_true", help="only check that CUDA is here")
    parser.add_argument("--out", default="benchmarks/results/gpu", help="folder for JSON + md")
    parser.add_argument("--quick", action="store_true", help="fewer steps (a smoke run)")
    parser.add_argument("--sizes", default="base,big")
    parser.add_argument(
        "--skip", default="", help="comma-separated: train,compile,switches,ray,decode,multi30k"
    )
    parser.add_argument(
        "--multi30k",
        default="",
        help="workdir where `tfm stage shard --config MULTI30K_CONFIG` prepared the shards "
        "(the Multi30k BLEU row is skipped without it)",
    )
    parser.add_argument("--multi30k-config", default="configs/multi30k_en_de_gpu.yaml")
    parser.add_argument("--multi30k-minutes", type=float, default=3.0)
    parser.add_argument(
        "--peers-wheels",
        default="",
        help="folder of `benchmarks/gpu_peers.py wheels`: fairseq and eole train each size too",
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(
            f"bench-gpu: no CUDA device visible to torch {torch.__version__} "
            "(a CUDA build of torch and an NVIDIA GPU are needed; set GPU_PYTHON to such a Python)",
            file=sys.stderr,
        )
        return 2
    if args.preflight:
        print(f"bench-gpu: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
        return 0
    skip = set(filter(None, args.skip.split(",")))  # train, compile, ray, decode
    steps = 5 if args.quick else 15
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "command": " ".join(sys.argv),
    }
    results: dict[str, Any] = {"environment": env}
    sections: list[tuple[str, str]] = [
        ("training", "Training throughput, bf16 autocast, 25k-token steps, one GPU"),
        ("ray", "Ray Train (1 worker) against the plain loop, same GPU"),
        ("profile_kinds", "Where the largest model's training step spends its GPU time"),
        ("profile_top", "Its top kernels"),
        ("decoding", "Beam search (base, beam 4, 50-token outputs), target tokens/s"),
        ("multi30k", "Multi30k En-De on one GPU: BLEU after a fixed time"),
        ("peers", "fairseq (--fp16) and eole (bf16) beside ours, same GPU, 25k-token updates"),
    ]

    def save() -> None:
        (out / "gpu.json").write_text(json.dumps(results, indent=2) + "\n")
        text = f"## {env['date']}, {env['device']}, torch {env['torch']} (CUDA {env['cuda']})\n\n"
        text += f"`{env['command']}`\n\n"
        for key, title in sections:
            text += markdown(title, results.get(key, [])) + "\n"
        (out / "gpu.md").write_text(text)

    def section(key: str, rows: list[dict]) -> None:
        results.setdefault(key, []).extend(rows)
        save()
        print(markdown(dict(sections)[key], rows), flush=True)

    started = time.time()
    corpus = synthetic_corpus(ROWS)
    sizes = args.sizes.split(",")

    def log(what: str) -> None:
        print(f"[{time.time() - started:5.0f}s] {what}", flush=True)

    warm_up_gpu()
    if "ray" not in skip:  # first, in a process that has not compiled or profiled anything
        log("Ray Train vs plain loop")
        section("ray", ray_vs_plain(sizes[0], 3 * steps, corpus))
    # Every size with the defaults and with the fused loss; each other switch flipped once, on
    # the smaller model; every size compiled, and the largest compiled with the fused loss too
    # (each compiled run costs 1-1.5 minutes of compiling: the suite stays under 9 minutes).
    runs = [(size, {"fused_loss": fused}) for size in sizes for fused in (False, True)]
    if "switches" not in skip:
        runs += [(sizes[0], {"cudnn_attention": True}), (sizes[0], {"prefetch": 0})]
        runs += [(sizes[0], {"fused_adam": False}), (sizes[0], {"pad_multiple": 1})]
    if "compile" not in skip:
        runs += [(size, {"compile": True}) for size in sizes]
        runs += [(sizes[-1], {"compile": True, "fused_loss": True})]
    if "train" not in skip:
        for size, switches in runs:
            log(f"training {size} {switches}")
            row, kinds, top = training_run(size, steps, corpus, **switches)
            section("training", [row])
            if size == sizes[-1] and set(switches) <= {"compile", "fused_loss"}:
                section("profile_kinds", kinds)
                section("profile_top", top)
    if "multi30k" not in skip and args.multi30k:
        log(f"Multi30k, {args.multi30k_minutes} minutes")
        section(
            "multi30k",
            multi30k_bleu(Path(args.multi30k), args.multi30k_config, args.multi30k_minutes),
        )
    if args.peers_wheels:
        import gpu_peers

        log("peers: fairseq, eole")
        rows = gpu_peers.rows(
            Path(args.peers_wheels), sizes, corpus, VOCAB, steps, out / "peers",
            results.get("training", []),
        )  # fmt: skip
        section("peers", rows)
    if "decode" not in skip:
        log("decoding")
        section("decoding", decoding((64, 128), 20 if args.quick else 50))
    print(f"[{time.time() - started:5.0f}s] done: {out / 'gpu.md'}, {out / 'gpu.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
