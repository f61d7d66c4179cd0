"""The Trainer: optimizer steps over one rank's share of the global batch plan (paper section 5).

Nothing here knows Ray. The caller builds the model, wraps it for data parallelism if it wants
(``model``, e.g. DDP), and saves what ``state_dict`` returns. Step ``s`` takes the next ``B``
batches of the seeded stream (``TrainConfig.batches_per_step``: ``W * A`` for ``W`` ranks of
``A`` accumulated micro-batches; with elastic workers the same ``B`` for every ``W``) and rank
``r`` trains on ``r, r + W, ...`` of them; the loss is divided by the step's target tokens over
all ranks, which every rank knows from the plan, so the gradient is a per-token mean whatever
``W`` and ``A`` are, and the data order is the same on every rank without communication.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.attention import sdpa_kernel

from training.config import TrainConfig
from training.data import BatchStream, TokenData
from training.dev_bleu import DevBleu
from training.distributed import all_reduce_sum, broadcast_flag, rng_state, seed_all, set_rng_state
from training.prefetch import Prefetcher
from transformer_core.batching import plan_batches
from transformer_core.config import ConfigError
from transformer_core.flops import peak_flops, train_flops
from transformer_core.loss import (
    chunk_loss_and_grad,
    label_smoothed_nll,
    linear_label_smoothed_nll,
)
from transformer_core.model import NO_CUDNN, Memory, Transformer
from transformer_core.schedule import make_optimizer, make_scheduler

Callback = Callable[["Trainer"], None]
"""Called with the Trainer after every ``train_step``, on every rank."""


class Trainer:
    """Adam and the paper's schedule on ``module``, fed by the seeded batch stream of ``train``;
    validation on ``dev`` (and ``val_bleu`` with ``dev_bleu``). ``model`` is ``module`` as
    wrapped for training (default: itself)."""

    def __init__(
        self,
        module: Transformer,
        config: TrainConfig,
        train: TokenData,
        dev: TokenData,
        *,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        model: nn.Module | None = None,
        callbacks: Sequence[Callback] = (),
        dev_bleu: DevBleu | None = None,
    ):
        self.module, self.model = module, model if model is not None else module
        self.dev_bleu = dev_bleu
        self.best: dict[str, Any] = {}  # step and val_bleu of the best validation so far
        self.since_best = 0  # validations since then
        self.improved = False  # the last validation set a new best
        self.config, self.train_data, self.dev_data = config, train, dev
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.callbacks = list(callbacks)
        self.device = next(module.parameters()).device
        self.params = [p for p in module.parameters() if p.requires_grad]
        mc = module.config
        longest = max(int(train.src_lens.max()), int(train.tgt_lens.max()), 1)
        if -(-longest // config.pad_multiple) * config.pad_multiple > mc.max_len:
            raise ConfigError(
                "train.pad_multiple",
                f"{config.pad_multiple} pads the longest row ({longest}) past model.max_len "
                f"{mc.max_len}; use a divisor of max_len",
            )
        fused = self.device.type == "cuda" if config.fused_adam is None else config.fused_adam
        self.optimizer = make_optimizer(
            module, tuple(config.adam_betas), config.adam_eps, fused=fused
        )
        self.scheduler = make_scheduler(
            self.optimizer, mc.d_model, config.warmup_steps, config.lr_scale
        )
        self.per_step = config.batches_per_step(world_size)  # micro-batches, all ranks
        self.accumulation = -(-self.per_step // world_size)  # the most a rank takes
        self.stream = BatchStream(
            train, config.max_tokens_per_batch, seed, pad_multiple=config.pad_multiple
        )
        self._prefetcher: Prefetcher | None = None  # started by the first step
        self.dev_batches = plan_batches(
            dev.src_lens,
            dev.tgt_lens,
            config.max_tokens_per_batch,
            seed=seed,
            shuffle=False,
            pad_multiple=config.pad_multiple,
        )[rank::world_size]
        # The wrapper's no_sync (DDP's), looked up before compiling hides it.
        self._no_sync = getattr(self.model, "no_sync", None)
        # Dynamic shapes: token-budget batches vary in both dimensions, so one graph serves all
        # of them instead of a recompilation per shape.
        self._forward = torch.compile(self.model, dynamic=True) if config.compile else self.model
        self.fused_loss = config.fused_loss
        if self.fused_loss:
            chunk = torch.compile(chunk_loss_and_grad, dynamic=True) if config.compile else None
            self._loss = functools.partial(
                linear_label_smoothed_nll,
                weight=module.generator.weight,
                # The loss runs outside the autocast region: the projection's dtype is explicit.
                dtype=torch.bfloat16 if self.device.type == "cuda" else None,
                **({"chunk_fn": chunk} if chunk is not None else {}),
            )
        else:
            self._loss = (
                torch.compile(label_smoothed_nll, dynamic=True)
                if config.compile
                else label_smoothed_nll
            )
        self.peak_flops = (
            peak_flops(torch.cuda.get_device_name(self.device))
            if self.device.type == "cuda"
            else None
        )
        self.step = self.start_step = 0
        self.train_seconds = 0.0  # summed step times, across resumes
        self.latest: dict[str, Any] = {}  # the last logged and validation metrics
        self.timed_tokens, self.timed_seconds = 0, 0.0  # throughput after the first interval
        # (start, tokens, target tokens, model FLOPs) since the last sync
        self._interval: tuple[float, int, int, float] | None = None
        self._sums: list[torch.Tensor] | None = None  # loss, nll, tokens since the last log
        self._last_checkpoint = time.time()
        seed_all(seed, rank)  # dropout differs by rank
        self.model.train()

    # -------------------------------------------------------------------------- state

    def state_dict(self) -> dict[str, Any]:
        """Weights, optimizer, schedule, step, data position, this rank's RNG states, train seconds."""
        return {
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "data": self.stream.position,
            "rng": rng_state(),
            "world_size": self.world_size,
            "train_seconds": self.train_seconds,
            "best": dict(self.best),
            "since_best": self.since_best,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` left off. Without RNG states, or from another world size,
        the per-rank streams are derived afresh from ``(seed + step, rank)``."""
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = self.start_step = int(state["step"])
        self.stream = BatchStream(
            self.train_data,
            self.config.max_tokens_per_batch,
            self.seed,
            **state["data"],
            pad_multiple=self.config.pad_multiple,
        )
        self.close()  # a running prefetcher reads from the old position
        self._sums = self._interval = None  # logged intervals start afresh
        self.train_seconds = float(state.get("train_seconds", 0.0))
        self.best = dict(state.get("best") or {})
        self.since_best = int(state.get("since_best", 0))
        same_world = int(state.get("world_size", self.world_size)) == self.world_size
        if state.get("rng") is not None and same_world:
            set_rng_state(state["rng"])
        else:
            seed_all(self.seed + self.step, self.rank)

    # -------------------------------------------------------------------------- steps

    @property
    def last_step(self) -> int:
        """The step this run stops at (``steps``, or ``stop_after`` if earlier)."""
        return self.config.last_step

    @property
    def done(self) -> bool:
        """At the last step, or out of patience (``patience`` validations without a better
        ``val_bleu``): the same answer on every rank, as the BLEU is summed over all of them."""
        patience = self.config.patience
        return self.step >= self.last_step or (patience is not None and self.since_best >= patience)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bf16 autocast on CUDA, nothing on CPU."""
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _attention_kernels(self) -> contextlib.AbstractContextManager[Any]:
        """SDPA's kernel choice (``train.cudnn_attention``); the backward follows the forward's."""
        if self.config.cudnn_attention:
            return contextlib.nullcontext()
        return sdpa_kernel(NO_CUDNN)

    def _collate(self, rows: np.ndarray) -> tuple[torch.Tensor, ...]:
        mc = self.module.config
        return self.train_data.batch(rows, mc.pad_id, mc.bos_id, self.config.pad_multiple)

    def _host_batches(self) -> tuple[list[np.ndarray], list[tuple[torch.Tensor, ...]]]:
        """The step's batches (all ranks') and this rank's collated micro-batches."""
        W, position = self.world_size, self.stream.position
        batches = self.stream.take(self.per_step)
        if not self.config.prefetch:
            return batches, [self._collate(rows) for rows in batches[self.rank :: W]]
        if self._prefetcher is None:
            ahead = BatchStream(
                self.train_data,
                self.config.max_tokens_per_batch,
                self.seed,
                **position,
                pad_multiple=self.config.pad_multiple,
            )
            self._prefetcher = Prefetcher(
                ahead,
                per_step=len(batches),
                mine=slice(self.rank, None, W),
                collate=self._collate,
                depth=self.config.prefetch,
                pin=self.device.type == "cuda",
            )
        ahead_batches, host = self._prefetcher.next()
        if not all(np.array_equal(a, b) for a, b in zip(ahead_batches, batches, strict=True)):
            raise RuntimeError("the prefetcher's batches left the stream's order")  # a bug
        return batches, host

    def train_step(self) -> dict[str, float]:
        """One optimizer step over this rank's micro-batches (gradients all-reduced on the last
        only). On logging steps, the step's metrics over all ranks; else ``{}`` and no host sync."""
        started = time.time()
        start, tokens, targets_seen, flops = self._interval or (started, 0, 0, 0.0)
        self.step += 1
        W, mc, data = self.world_size, self.module.config, self.train_data
        batches, host = self._host_batches()
        rows = np.concatenate(batches)
        src_lens, tgt_lens = data.src_lens[rows], data.tgt_lens[rows]
        targets = int(tgt_lens.sum())
        self._interval = (
            start,
            tokens + targets + int(src_lens.sum()),
            targets_seen + targets,
            flops + train_flops(mc, self.module.tgt_vocab_size, src_lens, tgt_lens),
        )
        scale = W / targets  # DDP averages over ranks; this makes it a per-token mean
        lr = self.scheduler.get_last_lr()[0]
        if self._sums is None:  # loss, nll, tokens since the last log, summed on the device
            self._sums = [torch.zeros((), device=self.device) for _ in range(3)]
        sums = self._sums
        no_sync = self._no_sync
        for i, tensors in enumerate(host):
            src, tgt_in, tgt_out = (t.to(self.device, non_blocking=True) for t in tensors)
            last = i == len(host) - 1
            with no_sync() if no_sync is not None and not last else contextlib.nullcontext():
                with self.autocast(), self._attention_kernels():
                    # (B, T, V) logits, or (B, T, D) states for the fused projection and loss
                    out = self._forward(src, tgt_in, project=not self.fused_loss)
                loss, nll, n = self._loss(
                    out, target=tgt_out, epsilon=mc.label_smoothing, pad_id=mc.pad_id
                )
                (loss * scale).backward()
            for total, value in zip(sums, (loss.detach(), nll.detach(), n), strict=True):
                total += value
        logging = self.step % self.config.log_every == 0 or self.step == self.last_step
        grad_norm = self._grad_norm(logging)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.train_seconds += time.time() - started
        metrics = self._log(lr, grad_norm) if logging else {}
        for callback in self.callbacks:
            callback(self)
        return metrics

    def _grad_norm(self, logging: bool) -> torch.Tensor | None:
        """Clip to ``clip_norm`` if set; without clipping the norm is computed on logging steps."""
        if self.config.clip_norm:
            return torch.nn.utils.clip_grad_norm_(self.params, self.config.clip_norm)
        if not logging:
            return None
        return torch.nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None])

    def _log(self, lr: float, grad_norm: Any) -> dict[str, float]:
        """Loss, NLL and perplexity per target token over every step since the last log (one
        step's batch alone swings with its sentence lengths), lr and throughput."""
        loss, nll, n = all_reduce_sum(self._sums, self.device)
        self._sums = None
        start, tokens, targets, flops = self._interval
        seconds = time.time() - start  # the all-reduce above waited for the device
        if self.step > self.start_step + self.config.log_every or self.step == self.last_step:
            self.timed_tokens += tokens  # the first interval after a (re)start is warm-up
            self.timed_seconds += seconds
        self._interval = None
        tokens_per_s = tokens / seconds if seconds > 0 else 0.0
        flops_per_s = flops / seconds / self.world_size if seconds > 0 else 0.0  # per worker
        self.latest = {
            "loss": loss / n,
            "nll": nll / n,
            "ppl": math.exp(min(nll / n, 50.0)),
            "lr": lr,
            "tokens_per_s": tokens_per_s,
            "tokens_per_s_per_worker": tokens_per_s / self.world_size,
            "target_tokens_per_s": targets / seconds if seconds > 0 else 0.0,
            "tflops_per_worker": flops_per_s / 1e12,
            "mfu": flops_per_s / self.peak_flops if self.peak_flops else None,
            "grad_norm": None if grad_norm is None else float(grad_norm),
            "memory_gb": memory_gb(self.device),
            "epoch": self.stream.epoch,
            "batch_index": self.stream.index,
        }
        return dict(self.latest)

    def close(self) -> None:
        """Stop the prefetch thread (a new one starts with the next step)."""
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None

    # -------------------------------------------------------------------------- evaluation

    def maybe_evaluate(self) -> dict[str, float]:
        """``evaluate()`` every ``eval_every`` steps and at the last step; else ``{}``."""
        if self.step % self.config.eval_every == 0 or self.step == self.last_step:
            return self.evaluate()
        return {}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Validation loss/NLL per target token and perplexity over every rank's share of the dev
        batches, ``val_encoder_spread`` (see ``encoder_spread``) on each rank's first batch and,
        with ``dev_bleu``, ``val_bleu``: sacreBLEU of greedy translations of the dev subset
        (``improved`` says whether it is the best so far)."""
        module, mc = self.module, self.module.config
        module.eval()
        totals = [torch.zeros((), device=self.device) for _ in range(5)]
        for i, rows in enumerate(self.dev_batches):
            src, tgt_in, tgt_out = (
                t.to(self.device) for t in self.dev_data.batch(rows, mc.pad_id, mc.bos_id)
            )
            with self.autocast():
                memory = module.encode(src)  # module(src, tgt_in), with the encoder output kept
                logits = module.decode(tgt_in, memory)
                if i == 0:
                    totals[3] += encoder_spread(memory)
                    totals[4] += 1
            loss, nll, n = label_smoothed_nll(logits, tgt_out, mc.label_smoothing, mc.pad_id)
            totals[0] += loss
            totals[1] += nll
            totals[2] += n
        loss, nll, n, spread, ranks = all_reduce_sum(totals, self.device)
        module.train()
        n = max(n, 1.0)
        val = {
            "val_loss": loss / n,
            "val_nll": nll / n,
            "val_ppl": math.exp(min(nll / n, 50.0)),
            "val_encoder_spread": spread / max(ranks, 1.0),
        }
        if self.dev_bleu is not None:
            val["val_bleu"] = self.dev_bleu.score(module, self.device)
            self.improved = val["val_bleu"] > self.best.get("val_bleu", -1.0)
            if self.improved:
                self.best, self.since_best = {"step": self.step, "val_bleu": val["val_bleu"]}, 0
            else:
                self.since_best += 1
        self.latest.update(val)
        self._interval = None  # time training only
        return val

    # -------------------------------------------------------------------------- checkpoints

    def maybe_checkpoint(self, save: Callable[[dict[str, Any]], None]) -> bool:
        """``save(metrics)`` on every rank every ``checkpoint_every`` steps, every
        ``checkpoint_minutes`` (rank 0's clock, broadcast so every rank saves) and when
        ``done``. ``metrics``: step, wall time, train seconds, data position and ``latest``."""
        tc = self.config
        due = bool(tc.checkpoint_every) and self.step % tc.checkpoint_every == 0
        if tc.checkpoint_minutes > 0:
            waited = time.time() - self._last_checkpoint
            late = self.rank == 0 and waited >= 60 * tc.checkpoint_minutes
            due = broadcast_flag(late, self.device) or due
        if not (due or self.done):
            return False
        save(
            {
                "step": self.step,
                "time": time.time(),
                "train_seconds": self.train_seconds,
                **self.stream.position,
                **{k: v for k, v in self.latest.items() if v is not None},
            }
        )
        self._last_checkpoint = time.time()
        self._interval = None
        return True


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


def memory_gb(device: torch.device) -> float:
    """Peak CUDA memory, or the process's resident memory on CPU, in GiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import psutil

    return psutil.Process().memory_info().rss / 2**30
