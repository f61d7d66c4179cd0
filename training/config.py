"""The train section of a run config: the paper's recipe (section 5) and its Ray Train scaling."""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from transformer_core.config import Decay
from transformer_core.config_checks import OMITTED_AT_DEFAULT, ConfigError, check_choices

PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
"""Ray placement-group strategies (``train.placement_strategy``)."""


Frozen = Literal["embeddings", "encoder"]
"""A part of the model ``train.freeze`` can keep as the parent trained it."""

Precision = Literal["auto", "float32", "bf16"]
"""What a training step computes in (``train.precision``)."""

Compiled = Literal["model", "loss"]
"""What ``train.compile`` can name: the model (with its loss) or the loss alone."""

COMPILE_IS_A_LIST = "a list now: [model] (what true was), [loss] or [] (what false was)"
"""Why ``train.compile: true`` (or false), the switch it was before, is refused."""

REPLACED = types.MappingProxyType(
    {
        "bf16": "replaced by train.precision (false: precision: float32; true: auto)",
        "cpu_bf16": "replaced by train.precision (bf16 on a CPU: precision: bf16)",
        "compile_loss": "replaced by train.compile: [loss]",
    }
)
"""Keys of the train section that older configs set, each with the line that names what
replaced it (the loader's answer instead of "unknown key")."""


def replaced(name: str, value: Any) -> str | None:
    """Why an older config's train key ``name`` set to ``value`` is refused, naming the key that
    replaced it; None for a current key."""
    if name == "compile" and isinstance(value, bool):
        return COMPILE_IS_A_LIST
    return REPLACED.get(name)


def refuse_replaced(train: Any) -> None:
    """A ConfigError for a key an older config's train section (``train``, as loaded) set
    (``cpu_bf16``, ``compile: true``), in the one line that names what replaced it, instead of
    "unknown key"."""
    if not isinstance(train, dict):
        return
    for key, value in train.items():
        why = replaced(str(key), value)
        if why is not None:
            raise ConfigError(f"train.{key}", why)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """The training recipe (paper section 5) and its Ray Train scaling."""

    steps: int = 100_000
    """Optimizer steps (base 100k, big 300k)."""
    tokens_per_step: int = 25_000
    """Padded tokens a side per optimizer step (the paper: ~25k source + ~25k target tokens),
    in whole micro-batches: world size x ceil(tokens_per_step / (world size x
    max_tokens_per_batch)) of them, so a budget that does not divide rounds the step up."""
    max_tokens_per_batch: int = 4096
    """Padded tokens a side per device micro-batch (its rows x the longer side's padded
    length); accumulation reaches tokens_per_step."""
    warmup_steps: int = 4000
    """Linear warmup steps to the schedule's peak, d_model^-0.5 x warmup_steps^-0.5 x lr_scale."""
    lr_scale: float = 1.0
    """Multiplier on the paper's learning-rate formula."""
    decay: Decay = "inverse_sqrt"
    """The learning rate after the warmup. inverse_sqrt: the paper's, with the inverse square root
    of the step. linear: linearly to zero at ``steps``, for a run whose length is set in advance
    (the Multi30k laptop recipe's; docs/log/multi30k-laptop.md measures it against the paper's).
    ``steps`` is part of this schedule: a resume that changes it changes the rates ahead."""
    adam_betas: tuple[float, float] = (0.9, 0.98)
    """Adam beta1, beta2."""
    adam_eps: float = 1e-9
    """Adam epsilon."""
    clip_norm: float | None = None
    """Gradient clipping norm; null disables."""
    num_workers: int | tuple[int, int] = 1
    """Ray Train workers (one per GPU on a cluster); ``[min, max]``: elastic, as many as the
    cluster holds between the two (a resize restarts from the latest checkpoint), with the same
    batches per step whatever the count (docs/training.md, "Elastic training")."""
    elastic_check_seconds: float = 60.0
    """With ``num_workers: [min, max]``: how often Ray Train looks for room for more workers."""
    use_gpu: bool = False
    """Train on GPUs (bf16 autocast unless ``precision`` is float32)."""
    precision: Precision = "auto"
    """What the forward computes in; weights, Adam and the loss's softmax stay float32. auto
    (the default): bf16 on a GPU, float32 on a CPU. bf16: bf16 autocast on a GPU, and on a CPU
    with native bf16 (AVX512-BF16 or AMX), where the linear layers and the pre-softmax
    projection run in bf16 (the matmuls in 0.41x their float32 time) and attention and softmax
    in float32; a CPU without it logs one warning and trains in float32. float32: float32
    throughout on any device, as the published fairseq recipes ran. CPU bf16 kernels differ by
    CPU, so scores move in their last digits between CPUs. The loss's layout (``fused_loss``)
    and the batch shapes (``static_shapes``) are keys of their own, not numerics."""
    compile: tuple[Compiled, ...] = ()
    """What torch.compile compiles (dynamic shapes: one graph for every batch shape): model (the
    model and the loss) or loss (the loss only: with ``fused_loss``, each chunk's loss and
    gradient as one fused loop; else the plain label-smoothed loss); []: nothing. Inductor needs
    a C++ compiler on a CPU: without one, one warning and the step runs eagerly."""
    merge_micro_batches: bool = False
    """Run a rank's micro-batches of an update as one padded batch: the same sentences and the
    same gradient (up to rounding and dropout's draws) in one forward and backward instead of
    several. For a small model on a GPU, where launching kernels bounds the step; it costs
    padding and memory (the published Multi30k recipe's model: ~900 top-level operations in each
    micro-batch's forward and backward, measured with torch.profiler)."""
    static_shapes: bool = False
    """Pad every micro-batch up to one of a few bucketed shapes (at most 1/8 more rows, source or
    target positions) and, on a GPU, capture each shape's forward and backward once as a CUDA
    graph and replay it: for a small model whose update is bound by the host launching kernels
    (the Multi30k recipe's; ``training.static_shapes``). Needs one worker and one micro-batch an
    update (``merge_micro_batches``), without ``compile`` or ``fused_loss``. A CPU only pads."""
    fused_loss: bool = False
    """The pre-softmax projection and the label-smoothed loss fused, in chunks of rows: the whole
    (tokens, vocab) logits never exist: less peak memory for a little speed (measured in
    docs/benchmarks.md)."""
    fused_adam: bool | None = None
    """Adam's fused kernel; null: fused on GPUs, torch's multi-tensor (foreach) Adam elsewhere."""
    pad_multiple: int = 1
    """Pad each batch's source and target length to a multiple of this (8 or 64 on GPUs, for
    tensor-core-friendly shapes); the batch planner counts the padded length in the budget."""
    batching: Literal["fill", "fairseq"] = "fill"
    """How the training batches are cut. fill: rows by the longer side's length, shuffled within a
    length, cut greedily, a new plan every epoch. fairseq: fairseq 0.9's (the published Multi30k
    recipe's): one seeded order by source then target length, batches of a multiple of 8 rows,
    the same batches every epoch in a new order (``transformer_core.batching``)."""
    cudnn_attention: bool = False
    """Let SDPA choose cuDNN's attention kernels; off: FlashAttention (causal self-attention)
    and the memory-efficient kernel (padding masks), as cuDNN builds a plan per batch shape."""
    prefetch: int = 2
    """Steps of micro-batches collated ahead in a background thread (pinned memory on GPUs,
    copied with non_blocking); 0 collates inside the step."""
    cpus_per_worker: float = 1.0
    """CPUs reserved per worker; fractional on small machines so Ray Data is never starved."""
    placement_strategy: str = "PACK"
    """Ray's placement of the workers: PACK (as few nodes as possible: the GPUs of one node
    first), SPREAD (across nodes where possible), STRICT_PACK or STRICT_SPREAD."""
    keep_freed_memory: bool = True
    """On CPUs, the workers' glibc allocator keeps what a step frees for the next step (one arena,
    no mmap, no trimming) instead of unmapping the step's large buffers, which the kernel would
    fault in and zero again each step: 1.29x the speed on the Multi30k recipe's shape, for a
    higher resident peak (docs/log/benchmarks.md, "Freed memory kept"). No effect with GPUs, or
    without glibc."""
    torch_threads: int | None = None
    """Intra-op threads per worker; null: the node's cores divided among its workers (Ray would
    give a 1-CPU worker one thread, and training reads its own shards, so the rest would idle)."""
    eval_max_tokens: int | None = None
    """Padded tokens per validation batch (the loss and dev BLEU's greedy search); null:
    ``max_tokens_per_batch``. Larger, fewer batches validate faster on a GPU."""
    eval_every: int = 1000
    """Validation loss and perplexity (and val_bleu, with bleu_sentences) every N steps."""
    bleu_sentences: int = 0
    """Dev sentences translated greedily at every validation for val_bleu (sacreBLEU); the best
    checkpoint by val_bleu is kept besides the last ones. 0: no BLEU while training."""
    patience: int | None = None
    """Stop early after this many validations without a better val_bleu; null: never."""
    checkpoint_every: int = 1000
    """Checkpoint every N steps (0 disables the step trigger)."""
    checkpoint_minutes: float = 10.0
    """Checkpoint every M minutes as well (the paper: 10); 0 disables the time trigger."""
    keep_checkpoints: int = 20
    """Checkpoints kept (at least what averaging needs)."""
    max_failures: int = 3
    """Restarts after a worker dies."""
    log_every: int = 100
    """Metrics to MLflow and a progress line on the console every N steps."""
    warn_encoder_spread: float = 0.05
    """Warn (console and an MLflow tag) when val_encoder_spread falls below this: the encoder has
    collapsed to a source-independent output (about 0.5 at initialisation); 0 disables."""
    storage_path: str | None = None
    """Ray Train storage for resume (shared folder or s3://); null: <workdir>/train_ray."""
    stop_after: int | None = None
    """Stop after this step (checkpointed), publish a partial result; not in the resume key."""
    init_from: str | None = field(default=None, metadata=OMITTED_AT_DEFAULT)
    """Fine-tuning: start from a trained model's weights instead of random ones, a registered
    version (models:/<name>@<alias> or models:/<name>/<version>) or a work dir's average/ or
    train/ folder (its tokenizer/ beside it); the run takes the parent's tokenizer, and trains
    with a fresh optimizer and schedule (warmup_steps, lr_scale). Null: random weights."""
    freeze: tuple[Frozen, ...] = field(default=(), metadata=OMITTED_AT_DEFAULT)
    """With init_from: parts of the parent kept as they are, embeddings (with
    share_embeddings, the output projection too) and/or encoder; empty: all of it trains."""
    keep_optimizer: bool = field(default=False, metadata=OMITTED_AT_DEFAULT)
    """With init_from a Ray Train checkpoint folder (<workdir>/train_ray/<run>/step-<n>/, which
    holds Adam's state; a registered version holds weights only): Adam's moments continue the
    parent's, under the fine-tuning's own schedule."""

    def __post_init__(self) -> None:
        check_choices(self)  # batching, as a config file's loader checks it
        if self.stop_after is not None and self.stop_after < 1:
            raise ConfigError("stop_after", f"{self.stop_after} must be >= 1 or null")
        self._check_parent()
        self._at_least(1, "steps", "tokens_per_step", "max_tokens_per_batch", "pad_multiple")
        self._check_workers()
        self._at_least(0, "elastic_check_seconds")
        self._at_least(1, "warmup_steps")
        if self.decay == "linear" and self.warmup_steps > self.steps:
            why = f"{self.warmup_steps} exceeds steps {self.steps} (decay: linear ends at steps)"
            raise ConfigError("warmup_steps", why)
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ConfigError("torch_threads", f"{self.torch_threads} must be >= 1 or null")
        self._at_least(0, "prefetch")
        if self.pad_multiple > self.max_tokens_per_batch:
            raise ConfigError(
                "pad_multiple",
                f"{self.pad_multiple} exceeds max_tokens_per_batch {self.max_tokens_per_batch}",
            )
        if self.cpus_per_worker <= 0:
            raise ConfigError("cpus_per_worker", f"{self.cpus_per_worker} must be > 0")
        if self.placement_strategy not in PLACEMENT_STRATEGIES:
            raise ConfigError(
                "placement_strategy",
                f"{self.placement_strategy!r} is not one of {', '.join(PLACEMENT_STRATEGIES)}",
            )
        self._at_least(0, "bleu_sentences")
        if self.patience is not None and (self.patience < 1 or not self.bleu_sentences):
            raise ConfigError(
                "patience", f"{self.patience} needs bleu_sentences > 0 and must be >= 1 or null"
            )
        self._at_least(1, "eval_every", "log_every", "keep_checkpoints")
        if self.eval_max_tokens is not None and self.eval_max_tokens < 1:
            raise ConfigError("eval_max_tokens", f"{self.eval_max_tokens} must be >= 1 or null")
        self._check_compile()
        self._check_static_shapes()
        if self.checkpoint_every < 0 or self.checkpoint_minutes < 0:
            raise ConfigError(
                "checkpoint_every", "checkpoint_every and checkpoint_minutes must be >= 0"
            )

    def _check_parent(self) -> None:
        """What fine-tuning's settings need: a parent, and for Adam's state, one that holds it."""
        for name in ("freeze", "keep_optimizer"):
            if getattr(self, name) and self.init_from is None:
                raise ConfigError(name, "needs init_from: a random model has nothing to keep")
        if len(set(self.freeze)) != len(self.freeze):
            raise ConfigError("freeze", f"{list(self.freeze)} names a part twice")
        if self.keep_optimizer and (self.init_from or "").startswith("models:"):
            raise ConfigError(
                "keep_optimizer",
                "a registered version holds weights only: init_from a Ray Train checkpoint "
                "folder (<workdir>/train_ray/<run>/step-<n>) to keep Adam's state",
            )
        if self.keep_optimizer and self.freeze:
            raise ConfigError("keep_optimizer", "with freeze: Adam holds fewer parameters")

    def _at_least(self, minimum: int, *names: str) -> None:
        for name in names:
            if getattr(self, name) < minimum:
                raise ConfigError(name, f"{getattr(self, name)} must be >= {minimum}")

    def _check_static_shapes(self) -> None:
        if not self.static_shapes:
            return
        one_batch = self.merge_micro_batches or self.tokens_per_step <= self.max_tokens_per_batch
        if self.num_workers != 1 or not one_batch:
            raise ConfigError(
                "static_shapes",
                "needs one micro-batch an update on one worker: num_workers 1 and "
                "merge_micro_batches true (or tokens_per_step <= max_tokens_per_batch)",
            )
        if self.compile or self.fused_loss:
            raise ConfigError(
                "static_shapes", "does not combine with compile ([model] or [loss]) or fused_loss"
            )

    def _check_compile(self) -> None:
        """``compile``: a list (no longer a switch) of known parts, each named once, and model
        alone where it compiles the loss as well."""
        if isinstance(self.compile, bool):
            raise ConfigError("compile", COMPILE_IS_A_LIST)
        parts = list(self.compile)
        written = f"[{', '.join(map(str, parts))}]"
        unknown = [p for p in parts if p not in typing.get_args(Compiled)]
        if unknown:
            raise ConfigError("compile", f"{unknown[0]!r} is not one of 'model', 'loss'")
        if len(set(parts)) != len(parts):
            raise ConfigError("compile", f"{written} names a part twice")
        if set(parts) == {"model", "loss"}:
            raise ConfigError("compile", f"{written}: model compiles the loss too: [model]")

    @property
    def eval_tokens(self) -> int:
        """Padded tokens per validation batch: ``eval_max_tokens`` or ``max_tokens_per_batch``."""
        return self.eval_max_tokens or self.max_tokens_per_batch

    def _check_workers(self) -> None:
        if self.min_workers < 1:
            raise ConfigError("num_workers", f"{self.num_workers} must be >= 1")
        if self.min_workers > self.max_workers:
            raise ConfigError(
                "num_workers", f"[{self.min_workers}, {self.max_workers}]: min exceeds max"
            )
        if self.elastic and self.max_workers > self.step_batches:
            raise ConfigError(
                "num_workers",
                f"at most {self.step_batches} elastic workers: every worker needs one of the "
                f"{self.step_batches} micro-batches of a step (tokens_per_step / "
                "max_tokens_per_batch, rounded up)",
            )

    @property
    def elastic(self) -> bool:
        """``num_workers`` is a ``[min, max]`` range."""
        return isinstance(self.num_workers, tuple)

    @property
    def min_workers(self) -> int:
        return self.num_workers[0] if isinstance(self.num_workers, tuple) else self.num_workers

    @property
    def max_workers(self) -> int:
        return self.num_workers[1] if isinstance(self.num_workers, tuple) else self.num_workers

    @property
    def step_batches(self) -> int:
        """Micro-batches of an elastic step, over all workers: ceil(tokens_per_step /
        max_tokens_per_batch), whatever the worker count."""
        return -(-self.tokens_per_step // self.max_tokens_per_batch)

    def batches_per_step(self, world_size: int) -> int:
        """Micro-batches of one optimizer step over all ``world_size`` workers: elastic,
        ``step_batches`` (dealt round-robin, so a worker takes one more than another when
        ``world_size`` does not divide it); fixed, ``world_size`` x the accumulation steps."""
        if self.elastic:
            return self.step_batches
        per_worker = -(-self.tokens_per_step // (world_size * self.max_tokens_per_batch))
        return world_size * max(1, per_worker)

    @property
    def last_step(self) -> int:
        """The step this run stops at: ``steps``, or ``stop_after`` if that comes first."""
        return min(self.steps, self.stop_after or self.steps)
