"""Decoding: one entry, ``search(model, src, settings, step)``, on the incremental decoder state.

It returns, per input row and in input order, the best hypotheses (ids without BOS and EOS).
The maximum output length of a sentence is its source length (non-pad tokens) plus
``max_len_offset``, or ``max_len`` when given; a hypothesis that reaches it ends there.
Padding and BOS are never produced (their log-probabilities are set to -inf).

``length_rule`` fairseq ends hypotheses as fairseq-generate's ``SequenceGenerator`` does
(``_fairseq_ends``): the limit counts the tokens before the EOS, one more position holds the EOS
it forces, and EOS is never the first token. fairseq's source length (``--max-len-a 1``) is its
batch's width, EOS included; ours is each sentence's, its EOS included: the same for the
longest sentence of a batch, and at most shorter for the others. Its search is ours otherwise:
the 2k best continuations, EOS finishing only among the first k, a sentence done with k
finished; ours also stops a sentence once no open beam can beat its finished ones, which never
changes what it returns.

Beam search runs in steps, each a function below: ``_start`` (the first expansion, from one row
per sentence while its k beams are still identical), ``_expand`` (every beam's continuations,
masked by the step processor, e.g. the tree constraint), ``_select`` (the 2k best, which finish,
which stay open), ``_finish`` (record the finished hypotheses), ``_sentences_left``
(termination) and ``_advance`` (reorder the beams, the decoder state and the step processor).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.nn.attention import sdpa_kernel

from transformer_core import decoding
from transformer_core.model import NO_CUDNN, Memory, Transformer
from transformer_core.search_settings import (
    Hypothesis,
    SearchSettings,
    StepProcessor,
    length_penalty,
)


def _output_limits(model: Transformer, src: Tensor, settings: SearchSettings) -> Tensor:
    """Per-sentence maximum decoded positions (B,), capped so the decoder input fits the
    model's ``max_len``; with ``length_rule`` fairseq one more, for the EOS after the limit."""
    if settings.max_len is not None:
        limits = torch.full((src.size(0),), settings.max_len, dtype=torch.long)
    else:
        limits = src.ne(model.config.pad_id).sum(dim=1).cpu() + settings.max_len_offset
    if settings.length_rule == "fairseq":  # at least one token, then the EOS
        return (limits.clamp(min=1) + 1).clamp(max=model.config.max_len)
    # Decoding L tokens feeds BOS + L-1 tokens to the decoder.
    return limits.clamp(min=1, max=model.config.max_len)


def _fairseq_ends(log_probs: Tensor, length: int, last: Tensor, eos_id: int) -> None:
    """fairseq-generate's ends on the log-probabilities (N, V) of decoded position ``length``,
    in place: no EOS first (its ``min_len`` 1), and in the rows ``last`` (N,), at their limit,
    nothing but EOS (the EOS it forces at ``max_len``, scored as any)."""
    if length == 1:
        log_probs[:, eos_id] = float("-inf")
    if bool(last.any()):
        eos = log_probs[last, eos_id]
        log_probs[last] = float("-inf")
        log_probs[last, eos_id] = eos


def _next_log_probs(logits: Tensor, model: Transformer, out: Tensor | None = None) -> Tensor:
    """(N, V) last-position logits -> float32 log-probabilities with PAD and BOS excluded
    (written into ``out`` when given, e.g. a buffer reused every step)."""
    if out is None:
        log_probs = torch.log_softmax(logits.float(), dim=-1)
    else:
        log_probs = torch.log_softmax(logits.float(), dim=-1, out=out)
    log_probs[:, [model.config.pad_id, model.config.bos_id]] = float("-inf")
    return log_probs


def _new_state(
    model: Transformer, memory: Memory, capacity: int, use_cache: bool
) -> decoding.IncrementalState:
    """The decoder state a search steps through: the cache, or (``use_cache=False``, tests and
    benchmarks only) the reference that recomputes the whole prefix every step."""
    if use_cache:
        return decoding.init_state(model, memory, capacity=capacity)
    return decoding.RecomputeState(memory)


class _eval_mode:
    """Eval mode and inference mode (no autograd bookkeeping) for the duration of a search;
    restores the training flag after."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.no_grad = torch.inference_mode()
        # Not cuDNN's attention: it builds an execution plan per shape, and the cache grows by
        # one position every step (bf16 beam search on an H100 ran 10x slower with it).
        self.kernels = sdpa_kernel(NO_CUDNN)

    def __enter__(self) -> None:
        self.was_training = self.model.training
        self.model.eval()
        self.no_grad.__enter__()
        self.kernels.__enter__()

    def __exit__(self, *exc: Any) -> None:  # Any: the exception's type, value and traceback
        self.kernels.__exit__(*exc)
        self.no_grad.__exit__(*exc)
        self.model.train(self.was_training)


def search(
    model: Transformer,
    src: Tensor,
    settings: SearchSettings = SearchSettings(),
    step: StepProcessor | None = None,
) -> list[list[Hypothesis]]:
    """The ``settings.n_best`` best hypotheses per source row (B, S), best first; ``step``
    plugs a constraint into every beam step (none: unconstrained)."""
    if settings.greedy and step is not None:
        raise ValueError("the greedy loop takes no step processor (use beam_size=1 without greedy)")
    model.check_values(src=src)
    with _eval_mode(model):
        if settings.greedy:
            return [[hyp] for hyp in _greedy(model, src, settings)]
        return _beam(model, src, settings, step)


def _greedy(model: Transformer, src: Tensor, settings: SearchSettings) -> list[Hypothesis]:
    """Most probable next token at every step, for a batch of sources (B, S)."""
    config, B = model.config, src.size(0)
    limits = _output_limits(model, src, settings).to(src.device)
    state = _new_state(model, model.encode(src), int(limits.max()), settings.use_cache)
    tokens = torch.full((B, 1), config.bos_id, dtype=torch.long, device=src.device)  # (B, 1)
    lengths = limits.clone()  # output length of each row, EOS excluded
    scores = torch.zeros(B, device=src.device)  # (B,) summed log-probs, as the beam loop sums
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    by_eos = torch.zeros(B, dtype=torch.bool, device=src.device)  # ended by EOS, not the limit
    for step in range(int(limits.max())):
        logits = decoding.decode_step(model, tokens[:, -1:], state)[:, -1]  # (B, V)
        log_probs = _next_log_probs(logits, model)  # (B, V)
        if settings.length_rule == "fairseq":
            _fairseq_ends(log_probs, step + 1, limits.eq(step + 1), config.eos_id)
        next_token = log_probs.argmax(dim=-1)  # (B,)
        picked = log_probs.gather(1, next_token[:, None])[:, 0]  # (B,)
        scores = torch.where(done, scores, scores + picked)
        next_token = next_token.masked_fill(done, config.pad_id)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)  # (B, step + 2)
        ended = ~done & next_token.eq(config.eos_id)
        lengths = torch.where(ended, step, lengths)
        by_eos |= ended
        done |= ended | limits.le(step + 1)
        if bool(done.all()):
            break
    alpha, norm = settings.alpha, settings.length_norm
    return [
        # Decoded positions count the EOS, as in the beam loop.
        Hypothesis(row[:n], score / length_penalty(n + int(eos), alpha, norm))
        for row, n, eos, score in zip(
            tokens[:, 1:].tolist(), lengths.tolist(), by_eos.tolist(), scores.tolist(), strict=True
        )
    ]


def _beam(
    model: Transformer, src: Tensor, settings: SearchSettings, step: StepProcessor | None
) -> list[list[Hypothesis]]:
    """Length-penalised beam search with an optional step processor (``step``).

    At each step the 2k best continuations of the k open beams are ranked; EOS among the first k
    finishes a hypothesis, and the first k that are not EOS stay open. A sentence is done when
    it has k finished hypotheses, when no open one can beat its ``n_best``-th best finished one
    (its score can only fall, and the penalty only grows up to the length limit), or at the
    length limit. Done sentences leave the batch, so later steps cost only what is still open.
    """
    limits = _output_limits(model, src, settings)  # (B,) CPU
    search = _Search(model, settings, step, limits, src.size(0), src.device)
    candidates = _start(search, src)
    for step_index in range(int(limits.max())):
        if step_index > 0:
            candidates = _expand(search, step_index + 1)
        top = _select(search, candidates, step_index + 1)
        _finish(search, top, step_index + 1)
        keep = _sentences_left(search, top)
        if not bool(keep.any()):
            break
        _advance(search, top, keep, first=step_index == 0)
    return [sorted(hyps, key=lambda h: -h.score)[: settings.n_best] for hyps in search.finished]


class _Search:
    """What a beam search carries from step to step: n open sentences of k beams each."""

    def __init__(
        self,
        model: Transformer,
        settings: SearchSettings,
        step: StepProcessor | None,
        limits: Tensor,
        batch: int,
        device: torch.device,
    ) -> None:
        self.model, self.settings, self.step = model, settings, step
        k = self.k = settings.beam_size
        self.alpha, self.n_best = settings.alpha, settings.n_best
        self.length_norm = settings.length_norm
        self.limits: Tensor = limits  # (B,) on CPU: output length limit of each input row
        self.device: torch.device = device
        self.finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
        self.active = torch.arange(batch)  # (n,) input row of each open sentence, on CPU
        # Decoder inputs so far, one row per beam: (n*k, t+1).
        bos = model.config.bos_id
        self.tokens = torch.full((batch * k, 1), bos, dtype=torch.long, device=device)
        # Only the first beam is live at the start, so the first step does not pick k copies.
        self.scores = torch.full((batch, k), float("-inf"), device=device)  # (n, k) log-probs
        self.scores[:, 0] = 0.0
        self.state: decoding.IncrementalState
        self.log_prob_buffer: Tensor | None = None  # (n*k, V), reused: no per-step allocation


@dataclass
class _Top:
    """The 2k best continuations of each open sentence (n, 2k), best first, and the k of them
    that stay open (n, k)."""

    scores: Tensor
    beam: Tensor
    """Which of the sentence's beams each continuation extends."""
    token: Tensor
    finishing: Tensor
    """Continuations that end a hypothesis: EOS or the length limit, among the first k."""
    at_limit: Tensor
    """(n,) on CPU: sentences at their length limit."""
    open_beam: Tensor
    open_token: Tensor
    open_scores: Tensor


def _start(search: _Search, src: Tensor) -> Tensor:
    """Encode, set up the decoder state and the step processor, and expand the first step from
    one row per sentence (its k beams are still identical): candidates (B, k*V)."""
    model, k = search.model, search.k
    capacity = int(search.limits.max())
    search.state = _new_state(model, model.encode(src), capacity, search.settings.use_cache)
    if search.step is not None:
        search.step.begin(src, search.limits, k)
    logits = decoding.decode_step(model, search.tokens[::k, -1:], search.state)[:, -1]  # (n, V)
    log_probs = _next_log_probs(logits, model)  # (n, V), the same for each beam
    _ends(search, log_probs, 1, rows_per_sentence=1)
    if search.step is not None:
        search.step.mask(log_probs, first=True)
    n, V = log_probs.shape
    return (search.scores.view(n, k, 1) + log_probs[:, None, :]).view(n, k * V)


def _ends(search: _Search, log_probs: Tensor, length: int, rows_per_sentence: int) -> None:
    """``length_rule`` fairseq's ends (``_fairseq_ends``) on the open sentences' rows."""
    if search.settings.length_rule != "fairseq":
        return
    last = search.limits[search.active].eq(length).repeat_interleave(rows_per_sentence)
    _fairseq_ends(log_probs, length, last.to(search.device), search.model.config.eos_id)


def _expand(search: _Search, length: int) -> Tensor:
    """Every open beam's continuations at decoded position ``length``, scored: candidates
    (n, k*V)."""
    model, k = search.model, search.k
    logits = decoding.decode_step(model, search.tokens[:, -1:], search.state)[:, -1]  # (n*k, V)
    n, V = search.active.numel(), logits.size(-1)
    if search.log_prob_buffer is None:
        search.log_prob_buffer = torch.empty(n * k, V, device=search.device)
    # In the buffer's leading rows (contiguous), then + scores in place.
    log_probs = _next_log_probs(logits, model, out=search.log_prob_buffer[: n * k])
    _ends(search, log_probs, length, rows_per_sentence=k)
    if search.step is not None:
        search.step.mask(log_probs, first=False)
    return log_probs.add_(search.scores.view(n * k, 1)).view(n, k * V)  # (n, k*V)


def _select(search: _Search, candidates: Tensor, length: int) -> _Top:
    """The 2k best of the candidates (n, k*V) and which of them finish at ``length`` decoded
    positions (the new token included)."""
    k, V = search.k, candidates.size(1) // search.k
    top_scores, top_index = candidates.topk(min(2 * k, k * V), dim=1)  # (n, 2k)
    top_beam = top_index // V  # (n, 2k) which beam each continuation extends
    top_token = top_index % V  # (n, 2k)
    at_limit = search.limits[search.active].le(length)  # (n,) on CPU
    is_eos = top_token.eq(search.model.config.eos_id)
    in_top_k = torch.arange(top_scores.size(1), device=search.device) < k  # (2k,)
    finishing = top_scores.isfinite() & in_top_k & (is_eos | at_limit.to(search.device)[:, None])
    # The first k continuations that are not EOS stay open (there are always k: each beam
    # contributes at most one EOS among the 2k). A stable sort keeps score order.
    open_pick = torch.sort(is_eos.int(), dim=1, stable=True).indices[:, :k]  # (n, k)
    open_beam = top_beam.gather(1, open_pick)  # (n, k)
    open_token = top_token.gather(1, open_pick)  # (n, k)
    open_scores = top_scores.gather(1, open_pick)  # (n, k)
    return _Top(
        top_scores, top_beam, top_token, finishing, at_limit, open_beam, open_token, open_scores
    )


def _finish(search: _Search, top: _Top, length: int) -> None:
    """Record the finished hypotheses (a handful per step; Python lists keep this obvious)."""
    ended = top.finishing.nonzero().tolist()
    if not ended:
        return
    k, eos_id = search.k, search.model.config.eos_id
    end_scores, end_beams, end_tokens = (t.cpu() for t in (top.scores, top.beam, top.token))
    prefixes = search.tokens[:, 1:].cpu()
    for i, j in ended:
        out = prefixes[i * k + int(end_beams[i, j])].tolist()
        if int(end_tokens[i, j]) != eos_id:  # ended by the length limit
            out.append(int(end_tokens[i, j]))
        score = float(end_scores[i, j]) / length_penalty(length, search.alpha, search.length_norm)
        search.finished[int(search.active[i])].append(Hypothesis(out, score))


def _sentences_left(search: _Search, top: _Top) -> Tensor:
    """(n,) bool on CPU: the sentences still open. One is done at its length limit, with k
    finished hypotheses, or when no open beam can beat its ``n_best``-th finished one."""
    best_open = top.open_scores.max(dim=1).values.cpu()  # (n,)
    limits = search.limits[search.active].float()
    bound = best_open / length_penalty(limits, search.alpha, search.length_norm)
    still_open = []
    for sentence, limited, bound_i in zip(
        search.active.tolist(), top.at_limit.tolist(), bound.tolist(), strict=True
    ):
        hyps = search.finished[sentence]
        scores_done = sorted((h.score for h in hyps), reverse=True)
        n_best = search.n_best
        nth_done = scores_done[n_best - 1] if len(scores_done) >= n_best else -math.inf
        done = limited or len(hyps) >= search.k or nth_done >= bound_i
        still_open.append(not done)
    return torch.tensor(still_open, dtype=torch.bool)


def _advance(search: _Search, top: _Top, keep: Tensor, first: bool) -> None:
    """Extend the open beams of the sentences in ``keep`` (n,) by their tokens, and reorder the
    decoder state and the constraint with them (done sentences drop out). ``first``: the state
    still holds one row per sentence."""
    k, device = search.k, search.device
    keep_all = bool(keep.all())
    keep_dev = keep.to(device)
    base = (torch.arange(search.active.numel(), device=device) * k)[:, None]  # (n, 1)
    rows = (base + top.open_beam)[keep_dev].reshape(-1)  # (n'*k,)
    new_tokens = top.open_token[keep_dev].reshape(-1, 1)  # (n'*k, 1)
    search.tokens = torch.cat([search.tokens[rows], new_tokens], dim=1)  # (n'*k, t+2)
    search.scores = top.open_scores[keep_dev]  # (n', k)
    search.active = search.active[keep]
    if search.step is not None:
        search.step.advance(rows, search.tokens[:, -1])
    # Rows index the n*k beams; at the first step the state holds one row per sentence.
    state_rows = torch.div(rows, k, rounding_mode="floor") if first else rows
    groups = None if keep_all else keep.nonzero().view(-1).to(device)
    search.state.regroup(state_rows, groups, k)
