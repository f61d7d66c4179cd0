"""Decoding: batched greedy and beam search on the incremental decoder state (section 6.1).

Both return, per input row and in input order, the output token ids without BOS and EOS.
The maximum output length of a sentence is its source length (non-pad tokens) plus
``max_len_offset``, or ``max_len`` when given; a hypothesis that reaches it ends there.
Padding and BOS are never produced (their log-probabilities are set to -inf).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn.attention import sdpa_kernel

from transformer_core import decoding
from transformer_core.constraints import BracketState, BracketVocab
from transformer_core.model import NO_CUDNN, Memory, Transformer


@dataclass(frozen=True)
class Hypothesis:
    """One finished output: token ids (no BOS/EOS) and its length-penalised log-probability."""

    tokens: list[int]
    score: float


def length_penalty(length: int | Tensor, alpha: float) -> float | Tensor:
    """GNMT's lp(Y) = ((5 + |Y|) / 6)^alpha (Wu et al. 2016), used by the paper with alpha=0.6.

    |Y| counts decoded positions, the final EOS included (as tensor2tensor)."""
    return ((5.0 + length) / 6.0) ** alpha


def _output_limits(
    model: Transformer, src: Tensor, max_len_offset: int, max_len: int | None
) -> Tensor:
    """Per-sentence maximum output length (B,), capped so the decoder input fits ``max_len``."""
    if max_len is not None:
        limits = torch.full((src.size(0),), max_len, dtype=torch.long)
    else:
        limits = src.ne(model.config.pad_id).sum(dim=1).cpu() + max_len_offset
    # Decoding L tokens feeds BOS + L-1 tokens to the decoder.
    return limits.clamp(min=1, max=model.config.max_len)


def _next_log_probs(logits: Tensor, model: Transformer, out: Tensor | None = None) -> Tensor:
    """(N, V) last-position logits -> float32 log-probabilities with PAD and BOS excluded
    (written into ``out`` when given, e.g. a buffer reused every step)."""
    if out is None:
        log_probs = torch.log_softmax(logits.float(), dim=-1)
    else:
        log_probs = torch.log_softmax(logits.float(), dim=-1, out=out)
    log_probs[:, [model.config.pad_id, model.config.bos_id]] = float("-inf")
    return log_probs


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

    def __exit__(self, *exc: object) -> None:
        self.kernels.__exit__(*exc)
        self.no_grad.__exit__(*exc)
        self.model.train(self.was_training)


def greedy_search(
    model: Transformer,
    src: Tensor,
    max_len_offset: int = 50,
    max_len: int | None = None,
    use_cache: bool = True,
) -> list[list[int]]:
    """Most probable next token at every step, for a batch of sources (B, S)."""
    config = model.config
    model.check_values(src=src)
    with _eval_mode(model):
        memory = model.encode(src)
        B = src.size(0)
        limits = _output_limits(model, src, max_len_offset, max_len).to(src.device)  # (B,)
        state = decoding.init_state(model, memory, int(limits.max())) if use_cache else None
        tokens = torch.full((B, 1), config.bos_id, dtype=torch.long, device=src.device)  # (B, 1)
        lengths = limits.clone()  # output length of each row, EOS excluded
        done = torch.zeros(B, dtype=torch.bool, device=src.device)
        for step in range(int(limits.max())):
            if use_cache:
                logits = decoding.decode_step(model, tokens[:, -1:], state)[:, -1]  # (B, V)
            else:
                logits = model.decode(tokens, memory)[:, -1]  # (B, V)
            next_token = _next_log_probs(logits, model).argmax(dim=-1)  # (B,)
            next_token = next_token.masked_fill(done, config.pad_id)
            tokens = torch.cat([tokens, next_token[:, None]], dim=1)  # (B, step + 2)
            ended = ~done & next_token.eq(config.eos_id)
            lengths = torch.where(ended, step, lengths)
            done |= ended | limits.le(step + 1)
            if bool(done.all()):
                break
        rows = tokens[:, 1:].tolist()
        return [row[:n] for row, n in zip(rows, lengths.tolist(), strict=True)]


def beam_search(
    model: Transformer,
    src: Tensor,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_len_offset: int = 50,
    use_cache: bool = True,
    max_len: int | None = None,
) -> list[list[int]]:
    """The best hypothesis of a length-penalised beam search, for each source row (B, S)."""
    return [
        best.tokens
        for best in beam_search_hypotheses(
            model, src, beam_size, alpha, max_len_offset, use_cache, max_len
        )
    ]


def beam_search_hypotheses(
    model: Transformer,
    src: Tensor,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_len_offset: int = 50,
    use_cache: bool = True,
    max_len: int | None = None,
) -> list[Hypothesis]:
    """Like ``beam_search``, returning the best ``Hypothesis`` (tokens and score) per row."""
    found = beam_search_nbest(
        model, src, beam_size, alpha, max_len_offset, use_cache=use_cache, max_len=max_len
    )
    return [hyps[0] if hyps else Hypothesis([], float("-inf")) for hyps in found]


def beam_search_nbest(
    model: Transformer,
    src: Tensor,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_len_offset: int = 50,
    n_best: int = 1,
    *,
    use_cache: bool = True,
    max_len: int | None = None,
    constraint: BracketVocab | None = None,
) -> list[list[Hypothesis]]:
    """The ``n_best`` (<= beam size) best hypotheses per source row, best first.

    With ``constraint`` every hypothesis is a well-formed bracketing with one leaf per source
    word (``transformer_core.constraints``): disallowed tokens get probability 0.

    At each step the 2k best continuations of the k open beams are ranked; EOS among the first k
    finishes a hypothesis, and the first k that are not EOS stay open. A sentence is done when
    it has k finished hypotheses, when no open one can beat its ``n_best``-th best finished one
    (its score can only fall, and the penalty only grows up to the length limit), or at the
    length limit. Done sentences leave the batch, so later steps cost only what is still open.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best must be in [1, beam_size {beam_size}], got {n_best}")
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0 (the early stop relies on it), got {alpha}")
    config = model.config
    model.check_values(src=src)
    k = beam_size
    device = src.device
    with _eval_mode(model):
        B = src.size(0)
        limits = _output_limits(model, src, max_len_offset, max_len)  # (B,) on CPU
        n_steps = int(limits.max())
        memory: Memory = model.encode(src)
        if use_cache:
            # One row per sentence for the first step (its k beams are still identical); then
            # the k beams of a sentence share its cross-attention keys/values (state.group).
            state = decoding.init_state(model, memory, capacity=n_steps)
        else:
            state = None
            beam_rows = torch.arange(B, device=device).repeat_interleave(k)  # (B*k,)
            memory = memory.index_select(beam_rows)  # (B*k, S, D)
        log_prob_buffer = None  # (B*k, V) reused every step: no per-step allocation

        finished: list[list[Hypothesis]] = [[] for _ in range(B)]
        active = torch.arange(B)  # original sentence index of each open sentence, on CPU
        # Decoder inputs so far, one row per beam: (n*k, t+1) with n open sentences.
        tokens = torch.full((B * k, 1), config.bos_id, dtype=torch.long, device=device)
        # Only the first beam is live at the start, so the first step does not pick k copies.
        scores = torch.full((B, k), float("-inf"), device=device)  # (n, k) summed log-probs
        scores[:, 0] = 0.0
        brackets = None
        if constraint is not None:
            constraint = constraint.to(device)
            per_beam = torch.arange(B, device=device).repeat_interleave(k)  # (B*k,)
            classes = constraint.word_classes(src)
            brackets = BracketState(
                constraint,
                constraint.words(src)[per_beam],
                limits.to(device)[per_beam],
                None if classes is None else classes[per_beam],
                src[per_beam] if constraint.copy_words else None,
            )

        for step in range(n_steps):
            n = active.numel()
            if use_cache and step == 0:
                logits = decoding.decode_step(model, tokens[::k, -1:], state)[:, -1]  # (n, V)
                log_probs = _next_log_probs(logits, model)  # (n, V), the same for each beam
                if brackets is not None:  # (n*k, V) -> each sentence's first beam
                    log_probs.masked_fill_(~brackets.allowed()[::k], float("-inf"))
                V = log_probs.size(-1)
                candidates = (scores.view(n, k, 1) + log_probs[:, None, :]).view(n, k * V)
            else:
                if use_cache:
                    logits = decoding.decode_step(model, tokens[:, -1:], state)[:, -1]  # (n*k, V)
                else:
                    logits = model.decode(tokens, memory)[:, -1]  # (n*k, V)
                V = logits.size(-1)
                if log_prob_buffer is None:
                    log_prob_buffer = torch.empty(n * k, V, device=device)
                # In the buffer's leading rows (contiguous), then + scores in place.
                log_probs = _next_log_probs(logits, model, out=log_prob_buffer[: n * k])
                if brackets is not None:
                    brackets.mask(log_probs)
                candidates = log_probs.add_(scores.view(n * k, 1)).view(n, k * V)  # (n, k*V)
            top_scores, top_index = candidates.topk(min(2 * k, k * V), dim=1)  # (n, 2k)
            top_beam = top_index // V  # (n, 2k) which beam each continuation extends
            top_token = top_index % V  # (n, 2k)

            length = step + 1  # decoded positions including the new token
            at_limit = limits[active].le(length)  # (n,) on CPU
            is_eos = top_token.eq(config.eos_id)
            in_top_k = torch.arange(top_scores.size(1), device=device) < k  # (2k,)
            finishing = top_scores.isfinite() & in_top_k & (is_eos | at_limit.to(device)[:, None])

            # Record finished hypotheses (a handful per step; Python lists keep this obvious).
            ended = finishing.nonzero().tolist()
            if ended:
                end_scores, end_beams, end_tokens = (
                    t.cpu() for t in (top_scores, top_beam, top_token)
                )
                prefixes = tokens[:, 1:].cpu()
                for i, j in ended:
                    out = prefixes[i * k + int(end_beams[i, j])].tolist()
                    if int(end_tokens[i, j]) != config.eos_id:  # ended by the length limit
                        out.append(int(end_tokens[i, j]))
                    score = float(end_scores[i, j]) / length_penalty(length, alpha)
                    finished[int(active[i])].append(Hypothesis(out, score))

            # The first k continuations that are not EOS stay open (there are always k: each
            # beam contributes at most one EOS among the 2k). A stable sort keeps score order.
            open_pick = torch.sort(is_eos.int(), dim=1, stable=True).indices[:, :k]  # (n, k)
            open_beam = top_beam.gather(1, open_pick)  # (n, k)
            open_token = top_token.gather(1, open_pick)  # (n, k)
            open_scores = top_scores.gather(1, open_pick)  # (n, k)

            # Which sentences are done: length limit, k finished, or no open beam can win.
            best_open = open_scores.max(dim=1).values.cpu()  # (n,)
            bound = best_open / length_penalty(limits[active].float(), alpha)  # (n,)
            still_open = []
            for sentence, limited, bound_i in zip(
                active.tolist(), at_limit.tolist(), bound.tolist(), strict=True
            ):
                hyps = finished[sentence]
                scores_done = sorted((h.score for h in hyps), reverse=True)
                nth_done = scores_done[n_best - 1] if len(scores_done) >= n_best else -math.inf
                done = limited or len(hyps) >= k or nth_done >= bound_i
                still_open.append(not done)
            keep = torch.tensor(still_open, dtype=torch.bool)
            if not bool(keep.any()):
                break
            keep_all = bool(keep.all())

            # Reorder the surviving beams (and drop done sentences) for the next step.
            keep_dev = keep.to(device)
            base = (torch.arange(n, device=device) * k)[:, None]  # (n, 1)
            rows = (base + open_beam)[keep_dev].reshape(-1)  # (n'*k,)
            tokens = torch.cat([tokens[rows], open_token[keep_dev].reshape(-1, 1)], dim=1)
            scores = open_scores[keep_dev]  # (n', k)
            active = active[keep]
            if brackets is not None:
                brackets.reorder(rows)
                brackets.advance(tokens[:, -1])
            if use_cache:
                # Rows index the n*k beams; at step 0 the state holds one row per sentence.
                state_rows = rows if step > 0 else torch.div(rows, k, rounding_mode="floor")
                groups = None if keep_all else keep.nonzero().view(-1).to(device)
                state.regroup(state_rows, groups, k)
            else:
                memory = memory.index_select(rows)

        return [sorted(hyps, key=lambda h: -h.score)[:n_best] for hyps in finished]
