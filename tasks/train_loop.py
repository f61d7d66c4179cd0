"""The per-worker training loop that Ray Train runs on every rank (paper section 5).

Data: every worker loads the token columns of the train and dev shards, and the planner makes
one global, seeded plan of token-budget batches per epoch. The plan is read as an endless
stream of batches; optimizer step ``s`` takes the next ``W * A`` of them (``W`` workers, ``A``
accumulated micro-batches) and worker ``r`` trains on ``r, r + W, ...`` of those. So the data
order, and each step's target-token count (used to normalise the loss), are the same on every
rank without communication, and a checkpoint's ``(epoch, index)`` stream position resumes at the
exact next batch.

Checkpoints go through ``ray.train.report`` (a barrier on every rank): rank 0 writes ``model.pt``
(model, optimizer, step, data position, its RNG states) with ``transformer_core.checkpoint``,
and every rank writes ``rng-rank-<r>.pt`` with its own RNG states (dropout differs by rank);
Ray merges the ranks' folders into one. Rank 0 logs metrics to MLflow with the tracking URI and
run id it is given (Ray Train V2 rejects Tune's logger callbacks).
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from transformer_core import checkpoint as ckpt
from transformer_core.batching import collate, plan_batches
from transformer_core.config import ModelConfig
from transformer_core.loss import label_smoothed_nll
from transformer_core.model import Memory, Transformer, count_parameters
from transformer_core.schedule import learning_rate, make_optimizer

log = logging.getLogger(__name__)

MODEL_FILE = "model.pt"
FAIL_MARKER = "fail_at_step-{step}.done"


# ----------------------------------------------------------------------------- data


def open_fs(path: str) -> tuple[Any, str]:
    """A pyarrow filesystem and the path inside it, for a local path or a URI (s3://, gs://)."""
    import pyarrow.fs as pafs

    if "://" in path:
        return pafs.FileSystem.from_uri(path)
    return pafs.LocalFileSystem(), str(Path(path).resolve())


def shard_files(folder: str) -> list[str]:
    """The Parquet parts of one shard split (``part-*.parquet``), sorted; [] if none."""
    import pyarrow.fs as pafs

    fs, root = open_fs(folder)
    info = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    names = [i.path for i in info if i.type == pafs.FileType.File]
    return sorted(p for p in names if Path(p).name.startswith("part-") and p.endswith(".parquet"))


@dataclass
class TokenData:
    """One shard split in memory: flat token values and row offsets per side (CSR layout)."""

    src_values: np.ndarray
    src_offsets: np.ndarray
    tgt_values: np.ndarray
    tgt_offsets: np.ndarray

    @classmethod
    def read(cls, folder: str, vocab_size: int) -> TokenData:
        """Read every ``part-*.parquet`` of ``folder`` in name order."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        files = shard_files(folder)
        if not files:
            raise FileNotFoundError(f"no part-*.parquet files in {folder}")
        fs, _ = open_fs(folder)
        table = pa.concat_tables(
            pq.read_table(f, columns=["src_ids", "tgt_ids"], filesystem=fs) for f in files
        )
        # uint16 halves the memory of every worker's copy when the vocabulary allows it.
        dtype = np.uint16 if vocab_size <= 1 << 16 else np.int32
        sides = []
        for name in ("src_ids", "tgt_ids"):
            arr = table.column(name).combine_chunks()
            offsets = np.asarray(arr.offsets, dtype=np.int64)
            values = np.asarray(arr.values)[offsets[0] : offsets[-1]].astype(dtype)
            sides += [values, offsets - offsets[0]]
        data = cls(*sides)
        for values, name in ((data.src_values, "src_ids"), (data.tgt_values, "tgt_ids")):
            if values.size and int(values.max()) >= vocab_size:
                raise ValueError(
                    f"{folder}: {name} holds id {int(values.max())} >= vocab_size {vocab_size}"
                )
        return data

    def __len__(self) -> int:
        return self.src_offsets.size - 1

    @property
    def src_lens(self) -> np.ndarray:
        return np.diff(self.src_offsets)

    @property
    def tgt_lens(self) -> np.ndarray:
        return np.diff(self.tgt_offsets)

    def batch(self, rows: np.ndarray, pad_id: int, bos_id: int) -> tuple[torch.Tensor, ...]:
        """``src (B, S)``, ``tgt_in (B, T)``, ``tgt_out (B, T)`` for the given row indices."""
        so, to = self.src_offsets, self.tgt_offsets
        src = [self.src_values[so[i] : so[i + 1]] for i in rows]
        tgt = [self.tgt_values[to[i] : to[i + 1]] for i in rows]
        return collate(src, tgt, pad_id, bos_id)


class BatchStream:
    """The epochs' seeded batch plans read as one endless stream; ``(epoch, index)`` is the cursor."""

    def __init__(self, data: TokenData, max_tokens: int, seed: int, epoch: int = 0, index: int = 0):
        self.src_lens, self.tgt_lens = data.src_lens, data.tgt_lens
        self.max_tokens, self.seed = max_tokens, seed
        self.epoch, self.index = epoch, index
        self._plan: list[np.ndarray] | None = None

    def _current(self) -> list[np.ndarray]:
        if self._plan is None:
            self._plan = plan_batches(
                self.src_lens, self.tgt_lens, self.max_tokens, seed=self.seed, epoch=self.epoch
            )
        return self._plan

    def take(self, n: int) -> list[np.ndarray]:
        """The next ``n`` batches (row indices), crossing into the next epoch when one ends."""
        out = []
        while len(out) < n:
            plan = self._current()
            if self.index >= len(plan):
                self.epoch, self.index, self._plan = self.epoch + 1, 0, None
                continue
            out.append(plan[self.index])
            self.index += 1
        return out

    @property
    def position(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}


def accumulation_steps(tokens_per_step: int, world_size: int, max_tokens_per_batch: int) -> int:
    """Micro-batches per worker per step: ceil(tokens_per_step / (workers * max_tokens))."""
    return max(1, math.ceil(tokens_per_step / (world_size * max_tokens_per_batch)))


# ----------------------------------------------------------------------------- RNG


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch (CPU and CUDA) RNG states as checkpoint-safe data."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` captured."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    keys = n["keys"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_all(seed: int, rank: int) -> None:
    """Seed python, numpy and torch with a per-rank seed derived from ``(seed, rank)``."""
    derived = int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])
    random.seed(derived)
    np.random.seed(derived)
    torch.manual_seed(derived)


# ----------------------------------------------------------------------------- collectives


def _dist() -> Any:
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def all_reduce_sum(values: list[float | torch.Tensor], device: torch.device) -> list[float]:
    """Sum scalars across ranks (a no-op with one worker); returns Python floats."""
    t = torch.stack([torch.as_tensor(v, dtype=torch.float64, device=device) for v in values])
    dist = _dist()
    if dist is not None and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return [float(x) for x in t.tolist()]


def broadcast_flag(flag: bool, device: torch.device) -> bool:
    """Rank 0's decision, on every rank (so every rank calls ``report`` together)."""
    dist = _dist()
    if dist is None or dist.get_world_size() == 1:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.broadcast(t, src=0)
    return bool(t.item())


# ----------------------------------------------------------------------------- MLflow


class Tracker:
    """Rank 0's MLflow client; a no-op on other ranks or without a run id."""

    def __init__(self, tracking_uri: str | None, run_id: str | None, enabled: bool):
        self.run_id = run_id if enabled else None
        self.client = None
        if self.run_id and tracking_uri:
            from mlflow.tracking import MlflowClient

            self.client = MlflowClient(tracking_uri)

    def metrics(self, values: dict[str, float], step: int) -> None:
        if self.client is None:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in values.items() if v is not None]
        self.client.log_batch(self.run_id, metrics=batch)

    def param(self, key: str, value: Any) -> None:
        if self.client is not None:
            self.client.log_param(self.run_id, key, value)


# ----------------------------------------------------------------------------- the loop


def _memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import psutil

    return psutil.Process().memory_info().rss / 2**30


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    data: TokenData,
    batches: list[np.ndarray],
    mc: ModelConfig,
    device: torch.device,
    autocast: Any,
) -> dict[str, float]:
    """Validation loss/NLL per target token and perplexity over every rank's share of batches,
    and ``val_encoder_spread`` (see ``encoder_spread``) on each rank's first batch."""
    model.eval()
    totals = [torch.zeros((), device=device) for _ in range(5)]
    for i, rows in enumerate(batches):
        src, tgt_in, tgt_out = (t.to(device) for t in data.batch(rows, mc.pad_id, mc.bos_id))
        with autocast():
            memory = model.encode(src)  # model(src, tgt_in), with the encoder output kept
            logits = model.decode(tgt_in, memory)
            if i == 0:
                totals[3] += encoder_spread(memory)
                totals[4] += 1
        loss, nll, n = label_smoothed_nll(logits, tgt_out, mc.label_smoothing, mc.pad_id)
        totals[0] += loss
        totals[1] += nll
        totals[2] += n
    loss, nll, n, spread, ranks = all_reduce_sum(totals, device)
    model.train()
    n = max(n, 1.0)
    return {
        "val_loss": loss / n,
        "val_nll": nll / n,
        "val_ppl": math.exp(min(nll / n, 50.0)),
        "val_encoder_spread": spread / max(ranks, 1.0),
    }


def encoder_spread(memory: Memory) -> torch.Tensor:
    """How much the encoder's output differs between the positions of a sentence: the mean
    distance of each real position's state from its sentence's mean state, over the mean state
    norm. About 0.5 at initialisation and for a model that reads its source; near 0 when the
    encoder has collapsed to a source-independent output (the decoder then parses or
    translates from its own prefix alone)."""
    states = memory.states.float()  # (B, S, D)
    real = (~memory.src_pad).unsqueeze(-1).float()  # (B, S, 1)
    mean = (states * real).sum(1, keepdim=True) / real.sum(1, keepdim=True).clamp(min=1)
    spread = ((states - mean).norm(dim=-1, keepdim=True) * real).sum() / real.sum().clamp(min=1)
    scale = (states.norm(dim=-1, keepdim=True) * real).sum() / real.sum().clamp(min=1)
    return spread / scale.clamp(min=1e-12)


def train_loop_per_worker(cfg: dict[str, Any]) -> dict[str, Any]:
    """Ray Train's per-worker function. ``cfg`` (``train_loop_config``) holds plain data:
    ``model``, ``train`` (config sections as dicts), ``seed``, ``vocab_size``, ``shard_dir``,
    ``run_dir`` (the run's storage folder), ``tracking_uri``, ``mlflow_run_id``.
    """
    import ray.train
    import ray.train.torch

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    mc = ModelConfig.from_dict(cfg["model"])
    tc = cfg["train"]
    seed, vocab_size = int(cfg["seed"]), int(cfg["vocab_size"])
    device = ray.train.torch.get_device()
    on_gpu = device.type == "cuda"

    def autocast() -> Any:
        if on_gpu:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    train = TokenData.read(f"{cfg['shard_dir']}/train", vocab_size)
    dev = TokenData.read(f"{cfg['shard_dir']}/dev", vocab_size)
    dev_plan = plan_batches(
        dev.src_lens, dev.tgt_lens, tc["max_tokens_per_batch"], seed=seed, shuffle=False
    )[rank::world]

    torch.manual_seed(seed)  # the same initial weights on every rank
    raw_model = Transformer(mc, vocab_size)
    n_params = count_parameters(raw_model)
    seed_all(seed, rank)

    step, position, restored_rng, train_seconds = 0, {"epoch": 0, "index": 0}, None, 0.0
    optimizer_state = None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = ckpt.load(Path(d) / MODEL_FILE)
            raw_model.load_state_dict(state["model"])
            optimizer_state = state["optimizer"]
            step, position = int(state["step"]), dict(state["data"])
            train_seconds = float(state.get("train_seconds", 0.0))
            rng_file = Path(d) / f"rng-rank-{rank:05d}.pt"
            if int(state.get("world_size", world)) == world and rng_file.is_file():
                restored_rng = torch.load(rng_file, weights_only=True)
        if restored_rng is not None:
            set_rng_state(restored_rng)
        else:  # another world size: fresh per-rank streams, derived from the step
            seed_all(seed + step, rank)
    start_step = step

    # The only buffer is the fixed sinusoid table: broadcasting it every forward is waste.
    model = ray.train.torch.prepare_model(
        raw_model, parallel_strategy_kwargs={"broadcast_buffers": False}
    )
    ddp = model is not raw_model
    optimizer = make_optimizer(raw_model, tuple(tc["adam_betas"]), tc["adam_eps"])
    if optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state)
    params = [p for p in raw_model.parameters() if p.requires_grad]

    accum = accumulation_steps(tc["tokens_per_step"], world, tc["max_tokens_per_batch"])
    stream = BatchStream(train, tc["max_tokens_per_batch"], seed, **position)
    tracker = Tracker(cfg.get("tracking_uri"), cfg.get("mlflow_run_id"), enabled=rank == 0)
    tracker.param("n_parameters", n_params)
    last_step = min(tc["steps"], tc["stop_after"] or tc["steps"])
    src_lens, tgt_lens = train.src_lens, train.tgt_lens
    eps = mc.label_smoothing

    def save_checkpoint(metrics: dict[str, Any]) -> None:
        with tempfile.TemporaryDirectory() as d:
            if rank == 0:
                ckpt.save(
                    Path(d) / MODEL_FILE,
                    raw_model,
                    mc,
                    vocab_size=vocab_size,
                    optimizer=optimizer.state_dict(),
                    step=step,
                    data=stream.position,
                    rng=rng_state(),
                    world_size=world,
                    time=metrics["time"],
                    train_seconds=metrics["train_seconds"],
                )
            torch.save(rng_state(), Path(d) / f"rng-rank-{rank:05d}.pt")
            ray.train.report(
                metrics,
                checkpoint=ray.train.Checkpoint.from_directory(d),
                checkpoint_dir_name=f"step-{step:09d}",
            )

    model.train()
    loop_start = last_ckpt = interval_start = time.time()
    interval_tokens = timed_tokens = 0
    timed_seconds = 0.0
    step_loss = [torch.zeros((), device=device) for _ in range(3)]
    latest: dict[str, Any] = {}
    while step < last_step:
        step += 1
        step_started = time.time()
        batches = stream.take(world * accum)
        step_targets = int(sum(tgt_lens[b].sum() for b in batches))
        interval_tokens += step_targets + int(sum(src_lens[b].sum() for b in batches))
        scale = world / step_targets  # DDP averages over ranks; this makes it a per-token mean
        lr = learning_rate(step, mc.d_model, tc["warmup_steps"], tc["lr_scale"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        mine = batches[rank::world]
        for i, rows in enumerate(mine):
            src, tgt_in, tgt_out = (
                t.to(device, non_blocking=True) for t in train.batch(rows, mc.pad_id, mc.bos_id)
            )
            sync = contextlib.nullcontext() if (not ddp or i == len(mine) - 1) else model.no_sync()
            with sync:
                with autocast():
                    logits = model(src, tgt_in)  # (B, T, V)
                loss, nll, n = label_smoothed_nll(logits, tgt_out, eps, mc.pad_id)
                (loss * scale).backward()
            step_loss[0] += loss.detach()
            step_loss[1] += nll.detach()
            step_loss[2] += n
        grad_norm = None
        logging_now = step % tc["log_every"] == 0 or step == last_step
        if tc["clip_norm"]:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, tc["clip_norm"])
        elif logging_now:
            grad_norm = torch.nn.utils.get_total_norm(
                [p.grad for p in params if p.grad is not None]
            )
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        train_seconds += time.time() - step_started

        if tc["fail_at_step"] == step and rank == world - 1:
            _fail_once(cfg["run_dir"], step)

        if logging_now:
            loss_sum, nll_sum, n_sum = all_reduce_sum(step_loss, device)
            now = time.time()  # .tolist() above waited for the device
            seconds = now - interval_start
            tokens_per_s = interval_tokens / seconds if seconds > 0 else 0.0
            if step > start_step + tc["log_every"] or step == last_step:  # skip the warm-up
                timed_tokens += interval_tokens
                timed_seconds += seconds
            latest = {
                "loss": loss_sum / n_sum,
                "nll": nll_sum / n_sum,
                "ppl": math.exp(min(nll_sum / n_sum, 50.0)),
                "lr": lr,
                "tokens_per_s": tokens_per_s,
                "tokens_per_s_per_worker": tokens_per_s / world,
                "grad_norm": None if grad_norm is None else float(grad_norm),
                "memory_gb": _memory_gb(device),
                "epoch": stream.epoch,
                "batch_index": stream.index,
            }
            tracker.metrics(latest, step)
        # Only logged steps all-reduce the loss; the others start afresh.
        step_loss = [torch.zeros((), device=device) for _ in range(3)]

        final = step == last_step
        if step % tc["eval_every"] == 0 or final:
            val = evaluate(raw_model, dev, dev_plan, mc, device, autocast)
            latest.update(val)
            tracker.metrics(val, step)
        due = bool(tc["checkpoint_every"]) and step % tc["checkpoint_every"] == 0
        if tc["checkpoint_minutes"] > 0:
            late = rank == 0 and time.time() - last_ckpt >= 60 * tc["checkpoint_minutes"]
            due = broadcast_flag(late, device) or due
        if due or final:
            metrics = {
                "step": step,
                "time": time.time(),
                "train_seconds": train_seconds,
                **stream.position,
                **{k: v for k, v in latest.items() if v is not None},
            }
            save_checkpoint(metrics)
            last_ckpt = time.time()
        if logging_now or due or final or step % tc["eval_every"] == 0:
            interval_start, interval_tokens = time.time(), 0  # time training only

    return {
        "rank": rank,
        "start_step": start_step,
        "step": step,
        "n_parameters": n_params,
        "accumulation": accum,
        "world_size": world,
        "tokens_per_s": timed_tokens / timed_seconds if timed_seconds > 0 else None,
        "timed_tokens": timed_tokens,
        "timed_seconds": timed_seconds,
        "loop_seconds": time.time() - loop_start,
        "torch_threads": torch.get_num_threads(),
        **{k: latest[k] for k in ("val_loss", "val_nll", "val_ppl", "loss") if k in latest},
    }


def _fail_once(run_dir: str, step: int) -> None:
    """The ``fail_at_step`` test hook: raise the first time a run reaches ``step``."""
    fs, root = open_fs(run_dir)
    marker = f"{root}/{FAIL_MARKER.format(step=step)}"
    import pyarrow.fs as pafs

    if fs.get_file_info(marker).type != pafs.FileType.NotFound:
        return
    fs.create_dir(root, recursive=True)
    with fs.open_output_stream(marker) as f:
        f.write(b"failed once\n")
    raise RuntimeError(f"train.fail_at_step={step}: injected worker failure (test hook)")
