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
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.attention import sdpa_kernel

from training.best import BestCheckpoint
from training.config import TrainConfig
from training.data import BatchStream, TokenData
from training.dev_bleu import DevBleu
from training.distributed import all_reduce_sum, broadcast_flag, rng_state, seed_all, set_rng_state
from training.numerics import autocast_dtype, compiled_parts, loss_function
from training.prefetch import Prefetcher
from training.static_shapes import StaticShapeLoss, pad_to_bucket
from training.throughput import ThroughputMeter
from training.validation import Validation
from transformer_core.config_checks import ConfigError
from transformer_core.flops import peak_flops, train_flops
from transformer_core.model import NO_CUDNN, Transformer
from transformer_core.schedule import make_optimizer, make_scheduler

Callback = Callable[["Trainer"], None]
"""Called with the Trainer after every ``train_step``, on every rank."""


class Listener:
    """What ``Trainer.fit`` reports as it goes, on every rank; this one ignores it all."""

    def logged(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        """After every step: its metrics on logging steps, else ``{}``."""

    def validated(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        """After a validation, with its metrics (``trainer.best`` has counted it)."""


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
        check_pad_multiple(config, train, module.config.max_len)
        self.module, self.model = module, model if model is not None else module
        self.config, self.train_data = config, train
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.callbacks = list(callbacks)
        self.device = next(module.parameters()).device
        self.params = [p for p in module.parameters() if p.requires_grad]
        fused = self.device.type == "cuda" if config.fused_adam is None else config.fused_adam
        self.optimizer = make_optimizer(
            module, tuple(config.adam_betas), config.adam_eps, fused=fused
        )
        self.scheduler = make_scheduler(
            self.optimizer,
            module.config.d_model,
            config.warmup_steps,
            config.lr_scale,
            config.decay,
            config.steps,
        )
        self.per_step = config.batches_per_step(world_size)  # micro-batches, all ranks
        self.accumulation = -(-self.per_step // world_size)  # the most a rank takes
        self.prefetcher = Prefetcher(
            BatchStream(
                train,
                config.max_tokens_per_batch,
                seed,
                pad_multiple=config.pad_multiple,
                fairseq=config.batching == "fairseq",
            ),
            per_step=self.per_step,
            mine=slice(rank, None, world_size),
            collate=self._collate,
            depth=config.prefetch,
            pin=self.device.type == "cuda",
            merge=config.merge_micro_batches,
        )
        self.validation = Validation(dev, config, seed, rank, world_size, dev_bleu)
        # The wrapper's no_sync (DDP's), looked up before compiling hides it.
        self._no_sync = getattr(self.model, "no_sync", None)
        self.compiled = compiled_parts(config, self.device)  # train.compile, or eager
        # Dynamic shapes: token-budget batches vary in both dimensions, so one graph serves all
        # of them instead of a recompilation per shape.
        compiled_model = "model" in self.compiled
        self._forward = torch.compile(self.model, dynamic=True) if compiled_model else self.model
        self.fused_loss = config.fused_loss
        self.dtype = autocast_dtype(config, self.device)
        self._loss = loss_function(config, module, self.device, self.dtype, self.compiled)
        self._static = None
        if config.static_shapes:  # the step's forward, loss and backward as CUDA graphs
            self._static = StaticShapeLoss(module, self._loss, self._contexts)
        cuda = self.device.type == "cuda"
        self.meter = ThroughputMeter(
            world_size, peak_flops(torch.cuda.get_device_name(self.device)) if cuda else None
        )
        self.best = BestCheckpoint(config.patience)
        self.step = self.start_step = 0
        self.train_seconds = 0.0  # summed step times, across resumes
        # This process's loop, by part: where an update's wall time goes (``fit``)
        self.loop_split = dict.fromkeys(("step", "log", "validation", "checkpoint"), 0.0)
        self.latest: dict[str, Any] = {}  # the last logged and validation metrics
        self._sums: list[torch.Tensor] | None = None  # loss, nll, tokens since the last log
        self._last_checkpoint = time.time()
        seed_all(seed, rank)  # dropout differs by rank
        self.model.train()

    # -------------------------------------------------------------------------- state

    def state_dict(self) -> dict[str, Any]:
        """Weights, optimizer, schedule, step, data position, this rank's RNG states, train
        seconds, the best validation and the validations since."""
        return {
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "data": dict(self.prefetcher.position),
            "rng": rng_state(),
            "world_size": self.world_size,
            "train_seconds": self.train_seconds,
            **self.best.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` left off. Without RNG states, or from another world size,
        the per-rank streams are derived afresh from ``(seed + step, rank)``."""
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = self.start_step = int(state["step"])
        self.prefetcher.seek(state["data"])
        self._sums = None  # logged intervals start afresh
        self.meter.reset()
        self.train_seconds = float(state.get("train_seconds", 0.0))
        self.best.load_state_dict(state)
        same_world = int(state.get("world_size", self.world_size)) == self.world_size
        if state.get("rng") is not None and same_world:
            set_rng_state(state["rng"])
        else:
            seed_all(self.seed + self.step, self.rank)

    # -------------------------------------------------------------------------- the loop

    @property
    def last_step(self) -> int:
        """The step this run stops at (``steps``, or ``stop_after`` if earlier)."""
        return self.config.last_step

    @property
    def done(self) -> bool:
        """At the last step, or out of patience (``patience`` validations without a better
        ``val_bleu``): the same answer on every rank, as the BLEU is summed over all of them."""
        return self.step >= self.last_step or self.best.out_of_patience

    def fit(self, save: Callable[[dict[str, Any]], None], listener: Listener | None = None) -> None:
        """Step until ``done``: validate and checkpoint (``save``) when due (``maybe_evaluate``,
        ``maybe_checkpoint``), telling ``listener`` what was logged and validated. The prefetch
        thread is stopped at the end, however it ends."""
        listener = listener or Listener()
        try:
            split, clock = self.loop_split, time.time()
            while not self.done:
                metrics = self.train_step()
                clock = _lap(split, "step", clock)
                listener.logged(self, metrics)
                clock = _lap(split, "log", clock)
                validation = self.maybe_evaluate()
                if validation:
                    listener.validated(self, validation)
                clock = _lap(split, "validation", clock)
                self.maybe_checkpoint(save)
                clock = _lap(split, "checkpoint", clock)
        finally:
            self.close()

    @property
    def timed_tokens(self) -> int:
        """Tokens trained on in the timed intervals (all but the first after each start)."""
        return self.meter.timed_tokens

    @property
    def timed_seconds(self) -> float:
        """Wall seconds of the timed intervals."""
        return self.meter.timed_seconds

    # -------------------------------------------------------------------------- steps

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bf16 autocast where ``autocast_dtype`` says so (``train.precision`` on this
        device), else nothing."""
        if self.dtype is None:
            return contextlib.nullcontext()
        # A CUDA graph replays the casts it captured: autocast's cache of them must be off.
        cache = not self.config.static_shapes
        return torch.autocast(self.device.type, dtype=self.dtype, cache_enabled=cache)

    @contextlib.contextmanager
    def _contexts(self) -> Iterator[None]:
        """What the model's forward runs under: ``autocast`` and the attention kernels."""
        with self.autocast(), self._attention_kernels():
            yield

    def _attention_kernels(self) -> contextlib.AbstractContextManager[Any]:
        """SDPA's kernel choice (``train.cudnn_attention``); the backward follows the forward's."""
        if self.config.cudnn_attention:
            return contextlib.nullcontext()
        return sdpa_kernel(NO_CUDNN)

    def _collate(self, rows: np.ndarray) -> tuple[torch.Tensor, ...]:
        mc = self.module.config
        batch = self.train_data.batch(rows, mc.pad_id, mc.bos_id, self.config.pad_multiple)
        if self._static is None:
            return batch
        ids = {"pad_id": mc.pad_id, "bos_id": mc.bos_id, "eos_id": mc.eos_id}
        return pad_to_bucket(*batch, max_len=mc.max_len, **ids)

    def train_step(self) -> dict[str, float]:
        """One optimizer step over this rank's micro-batches (gradients all-reduced on the last
        only). On logging steps, the step's metrics over all ranks; else ``{}`` and no host sync."""
        started = time.time()
        self.step += 1
        batches, host = self.prefetcher.next()
        rows = np.concatenate(batches)
        src_lens, tgt_lens = self.train_data.src_lens[rows], self.train_data.tgt_lens[rows]
        targets = int(tgt_lens.sum())
        flops = train_flops(self.module.config, self.module.tgt_vocab_size, src_lens, tgt_lens)
        self.meter.add(started, targets + int(src_lens.sum()), targets, flops)
        lr = float(self.scheduler.get_last_lr()[0])  # a float: our schedule sets no tensor lr
        # DDP averages over ranks; this makes the gradient a per-token mean over all of them.
        self._forward_backward(host, scale=self.world_size / targets)
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

    def _forward_backward(self, host: list[tuple[torch.Tensor, ...]], scale: float) -> None:
        """Gradients of this rank's micro-batches (synced on the last), their loss, NLL and
        target tokens added to the sums since the last log, on the device."""
        if self._sums is None:
            self._sums = [torch.zeros((), device=self.device) for _ in range(3)]
        sums, no_sync, mc = self._sums, self._no_sync, self.module.config
        for i, tensors in enumerate(host):
            src, tgt_in, tgt_out = (t.to(self.device, non_blocking=True) for t in tensors)
            last = i == len(host) - 1
            with no_sync() if no_sync is not None and not last else contextlib.nullcontext():
                if self._static is not None:
                    loss, nll, n = self._static(src, tgt_in, tgt_out)
                else:
                    with self._contexts():
                        # (B, T, V) logits, or (B, T, D) states for the fused projection and loss
                        out = self._forward(src, tgt_in, project=not self.fused_loss)
                    loss, nll, n = self._loss(
                        out, target=tgt_out, epsilon=mc.label_smoothing, pad_id=mc.pad_id
                    )
                (loss * scale).backward()
            for total, value in zip(sums, (loss.detach(), nll.detach(), n), strict=True):
                total += value

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
        assert self._sums is not None
        loss, nll, n = all_reduce_sum(self._sums, self.device)
        self._sums = None
        # The first interval after a (re)start is warm-up; the all-reduce waited for the device.
        timed = self.step > self.start_step + self.config.log_every or self.step == self.last_step
        rates = self.meter.read(time.time(), timed)
        self.latest = {
            "loss": loss / n,
            "nll": nll / n,
            "ppl": math.exp(min(nll / n, 50.0)),
            "lr": lr,
            **rates,
            "grad_norm": None if grad_norm is None else float(grad_norm),
            "memory_gb": memory_gb(self.device),
            "epoch": self.prefetcher.position["epoch"],
            "batch_index": self.prefetcher.position["index"],
            **self._graph_metrics(),
        }
        return dict(self.latest)

    def _graph_metrics(self) -> dict[str, float]:
        """With ``static_shapes`` on CUDA: the shapes captured so far and the seconds it took."""
        if self._static is None or not self._static.shapes:
            return {}
        return {
            "graph_shapes": self._static.shapes,
            "graph_capture_s": self._static.capture_seconds,
        }

    def close(self) -> None:
        """Stop the prefetch thread (a new one starts with the next step)."""
        self.prefetcher.close()

    # -------------------------------------------------------------------------- evaluation

    def maybe_evaluate(self) -> dict[str, float]:
        """``evaluate()`` every ``eval_every`` steps and at the last step; else ``{}``."""
        if self.step % self.config.eval_every == 0 or self.step == self.last_step:
            return self.evaluate()
        return {}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Validation loss/NLL per target token and perplexity over every rank's share of the dev
        batches, ``val_encoder_spread`` and, with ``dev_bleu``, ``val_bleu`` (counted by
        ``best``): ``Validation.run``."""
        val = self.validation.run(self.module, self.device, self.autocast)
        if "val_bleu" in val:
            self.best.update(self.step, val["val_bleu"])
        self.latest.update(val)
        self.meter.reset()  # time training only
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
                **self.prefetcher.position,
                **{k: v for k, v in self.latest.items() if v is not None},
            }
        )
        self._last_checkpoint = time.time()
        self.meter.reset()
        return True


def _lap(split: dict[str, float], part: str, since: float) -> float:
    """Add the seconds since ``since`` to ``split[part]``; now."""
    now = time.time()
    split[part] += now - since
    return now


def check_pad_multiple(config: TrainConfig, train: TokenData, max_len: int) -> None:
    """``train.pad_multiple`` must not pad the longest row past the model's positions."""
    longest = max(int(train.src_lens.max()), int(train.tgt_lens.max()), 1)
    if -(-longest // config.pad_multiple) * config.pad_multiple > max_len:
        raise ConfigError(
            "train.pad_multiple",
            f"{config.pad_multiple} pads the longest row ({longest}) past model.max_len "
            f"{max_len}; use a divisor of max_len",
        )


def memory_gb(device: torch.device) -> float:
    """Peak CUDA memory, or the process's resident memory on CPU, in GiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import psutil

    return psutil.Process().memory_info().rss / 2**30
