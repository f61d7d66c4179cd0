"""A fairseq ``transformer`` checkpoint as our model's config and weights.

fairseq's ``transformer`` (fairseq 0.9 to 0.12: ``transformer``, ``transformer_tiny``,
``transformer_wmt_en_de``, ``transformer_vaswani_wmt_en_de_big``, ...) is the paper's model,
as ours: ReLU feed-forward, post-norm (or pre-norm with a final norm after each stack, as our
``norm_first``), torch's layer norm (eps 1e-5), embeddings times sqrt(d_model), q/k/v/out
projections with biases. Its layers keep the names ``weight_adapters.marian.LAYER_NAMES`` lists.

The checkpoint is read with ``torch.load(weights_only=True)``, allowing one class besides
tensors and plain data: ``argparse.Namespace``, which holds the settings under ``args``
(fairseq before 0.10) and under ``cfg["model"]`` (0.10 and later, for an ``--arch`` of the
``transformer`` model). Those settings give our ``ModelConfig``; the weights' shapes must agree.

What differs, and how the weights make up for it:

- Positions: fairseq's sinusoids (tensor2tensor's: frequencies 10000^(-i / (D/2 - 1)), sines in
  the first half of the width, cosines in the second) are not ours (10000^(-2i / D),
  interleaved), and fairseq counts positions from ``padding_idx + 1``. No permutation of the
  features turns one table into the other (the frequencies differ), so the import stores
  fairseq's table, from that offset on, as our learned position table (``positional:
  learned``); fairseq's learned positions are refused (ours: one table for both stacks).
- Vocabulary: fairseq's ids are not ours (``weight_adapters.fairseq_vocab``), and fairseq's decoder
  starts from ``</s>`` where ours starts from ``<s>``. The rows of every embedding and of the
  output projection are permuted to our ids; our ``<s>`` embedding is fairseq's ``</s>`` row
  while our ``<s>`` output row is fairseq's ``<s>`` row, so the imported model keeps three
  matrices (``share_embeddings: false``) whatever fairseq shared, and every logit and
  log-probability is fairseq's.

fairseq 0.12.2's encoder layers also save copies of their weights for its fast inference path
(``in_proj_weight``, ``fc1_weight``, ...; filled from the real ones when a model is loaded):
they are skipped, as are the version buffers and old sinusoid placeholders. Any other weight,
and any setting our model cannot express, is refused in one line naming the file.

Hand-written: fairseq is no dependency of ours (it does not even build on every Python we run),
and no library maps its weights onto another model; the sinusoid table is its formula, a few lines.
"""

from __future__ import annotations

import argparse
import math
import pickle
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from transformer_core.config import ModelConfig
from transformer_core.config_checks import ConfigError
from weight_adapters import WeightsError
from weight_adapters.fairseq_vocab import SPECIALS, Vocabulary
from weight_adapters.marian import LAYER_NAMES

if TYPE_CHECKING:
    from transformer_core.model import Transformer

__all__ = [
    "ARCHS",
    "FairseqAdapter",
    "fairseq_sinusoids",
    "languages",
    "load_weights",
    "model_config",
    "read",
]

ARCHS = (
    "transformer",
    "transformer_tiny",
    "transformer_iwslt_de_en",
    "transformer_wmt_en_de",
    "transformer_vaswani_wmt_en_de_big",
    "transformer_vaswani_wmt_en_fr_big",
    "transformer_wmt_en_de_big",
    "transformer_wmt_en_de_big_t2t",
)
"""fairseq's architectures of its ``transformer`` model (fairseq 0.12's list)."""
PADDING_IDX = SPECIALS["<pad>"]

_REFUSED = {
    "layernorm_embedding": "a layer norm after the embeddings",
    "no_scale_embedding": "embeddings not scaled by sqrt(d_model)",
    "no_token_positional_embeddings": "no positional embeddings",
    "encoder_learned_pos": "learned positions (ours: one table for encoder and decoder)",
    "decoder_learned_pos": "learned positions (ours: one table for encoder and decoder)",
    "adaptive_input": "adaptive input embeddings",
    "adaptive_softmax_cutoff": "an adaptive softmax",
    "cross_self_attention": "decoder self-attention over the encoder output",
    "no_cross_attention": "a decoder without encoder attention",
}
"""fairseq settings that our model cannot express when they are on, and what they mean."""
_SAME = (
    ("encoder_layers", "decoder_layers"),
    ("encoder_embed_dim", "decoder_embed_dim"),
    ("encoder_ffn_embed_dim", "decoder_ffn_embed_dim"),
    ("encoder_attention_heads", "decoder_attention_heads"),
    ("encoder_normalize_before", "decoder_normalize_before"),
    ("decoder_embed_dim", "decoder_input_dim"),
    ("decoder_embed_dim", "decoder_output_dim"),
)
"""Pairs of settings that are one setting of ours: they must be equal."""
_SKIPPED = re.compile(
    r"(encoder|decoder)\.version|(encoder|decoder)\.embed_positions\.(_float_tensor|weights)"
    r"|encoder\.layers\.\d+\.(in_proj|out_proj|fc1|fc2)_(weight|bias)"
)
"""fairseq weights that hold nothing of the model (module doc)."""
_OUTPUT_NAMES = ("decoder.output_projection.weight", "decoder.embed_out")
"""fairseq's output projection: 0.10 and later, and earlier when not shared."""


def read(path: Path) -> dict[str, Any]:
    """The checkpoint ``path`` (``torch.load``, weights only, ``argparse.Namespace`` allowed)."""
    if not path.is_file():
        raise WeightsError(f"{path} does not exist")
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for truncated or foreign files
        unsafe = _unsafe_globals(path) if isinstance(exc, pickle.UnpicklingError) else []
        if unsafe:
            raise WeightsError(
                f"{path} holds pickled objects that torch.load(weights_only=True) refuses "
                f"({', '.join(unsafe[:3])}): only tensors, plain data and argparse.Namespace "
                "are read"
            ) from None
        raise WeightsError(f"{path} is not a readable checkpoint: {_reason(exc)}") from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), Mapping):
        raise WeightsError(f"{path} holds no model state (no 'model' weights)")
    return data


def _reason(exc: Exception) -> str:
    """The line of torch's message that says what was wrong (after its advice on trust)."""
    _, marker, rest = str(exc).partition("WeightsUnpickler error:")
    lines = [line.strip() for line in (rest if marker else str(exc)).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _unsafe_globals(path: Path) -> list[str]:
    """What the checkpoint's pickle names beyond what ``read`` allows ([] if unreadable)."""
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # not a checkpoint at all: read says so
        return []
    return sorted(set(names) - {"argparse.Namespace"})


def _settings(data: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """The model's settings under fairseq's flat names (``encoder_embed_dim``, ...)."""
    found = data.get("args") or (data.get("cfg") or {}).get("model")
    if isinstance(found, argparse.Namespace):
        return vars(found)
    if not isinstance(found, Mapping):
        raise WeightsError(f"{path} holds no model settings (neither cfg['model'] nor args)")
    flat = dict(found)  # a dataclass config nests each stack's settings: encoder.embed_dim
    for stack in ("encoder", "decoder"):
        if isinstance(flat.get(stack), Mapping):
            flat.update({f"{stack}_{k}": v for k, v in flat.pop(stack).items()})
    return flat


def languages(data: Mapping[str, Any]) -> tuple[str, str] | None:
    """The (source, target) languages the checkpoint's task names, if it names both."""
    task = data.get("args") or (data.get("cfg") or {}).get("task") or {}
    task = vars(task) if isinstance(task, argparse.Namespace) else task
    pair = (task.get("source_lang"), task.get("target_lang"))
    return (str(pair[0]), str(pair[1])) if all(pair) else None


def model_config(data: Mapping[str, Any], path: Path) -> ModelConfig:
    """Our ``ModelConfig`` for the checkpoint's settings; one line naming ``path`` and the
    setting for what our model cannot express."""
    s = _settings(data, path)
    arch = s.get("arch", s.get("_name"))
    if arch not in ARCHS:
        raise WeightsError(
            f"{path}: arch {arch!r} cannot be imported: only fairseq's transformer "
            f"architectures ({', '.join(ARCHS)})"
        )
    for name, meaning in _REFUSED.items():
        if s.get(name):
            raise WeightsError(f"{path}: {name}={s[name]!r} cannot be imported: {meaning}")
    for a, b in _SAME:
        if s.get(a) != s.get(b, s.get(a)):
            raise WeightsError(
                f"{path}: {a}={s.get(a)!r} but {b}={s.get(b)!r} cannot be imported: "
                "our encoder and decoder share these settings"
            )
    if s.get("activation_fn", "relu") != "relu":
        raise WeightsError(
            f"{path}: activation_fn={s['activation_fn']!r} cannot be imported: ours is ReLU"
        )
    pre_norm = bool(s.get("encoder_normalize_before"))
    if pre_norm and s.get("no_decoder_final_norm"):
        raise WeightsError(
            f"{path}: no_decoder_final_norm=True cannot be imported: our pre-norm decoder "
            "ends with a layer norm"
        )
    try:
        return ModelConfig(
            n_layers=s["encoder_layers"],
            d_model=s["encoder_embed_dim"],
            d_ff=s["encoder_ffn_embed_dim"],
            n_heads=s["encoder_attention_heads"],
            dropout=float(s.get("dropout", 0.1)),
            attention_dropout=float(s.get("attention_dropout", 0.0)),
            init="fairseq",
            positional="learned",  # fairseq's sinusoids, stored (module doc)
            max_len=min(s.get("max_source_positions", 1024), s.get("max_target_positions", 1024)),
            share_embeddings=False,  # our <s> row differs between input and output (module doc)
            norm_first=pre_norm,
        )
    except KeyError as exc:
        raise WeightsError(f"{path}: no setting {exc.args[0]} among the model's") from None
    except ConfigError as exc:
        raise WeightsError(f"{path}: cannot be imported: {exc}") from None


def fairseq_sinusoids(rows: int, dim: int, padding_idx: int) -> Tensor:
    """fairseq's ``SinusoidalPositionalEmbedding`` table (rows, dim): row p holds
    sin(p * w_i) for i < dim/2, then cos(p * w_i), w_i = 10000^(-i / (dim/2 - 1)); an odd
    width's last column and row ``padding_idx`` are zero."""
    half = dim // 2
    w = torch.exp(torch.arange(half, dtype=torch.float) * -(math.log(10000) / (half - 1)))
    angle = torch.arange(rows, dtype=torch.float)[:, None] * w[None, :]  # (rows, half)
    table = torch.zeros(rows, dim)
    table[:, : 2 * half] = torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)
    table[padding_idx] = 0
    return table


class FairseqAdapter:
    """fairseq's weights as those of our model with ``expected``'s names and shapes (its
    ``state_dict()``) and ``config``: rows in our ids (``vocab``), fairseq's position table;
    errors name the checkpoint ``path``. Import only: no fairseq checkpoint is written."""

    def __init__(
        self,
        expected: Mapping[str, Tensor],
        config: ModelConfig,
        vocab: Vocabulary,
        path: Path,
        *,
        shared_output: bool = False,
    ) -> None:
        self.expected, self.config, self.vocab, self.path = expected, config, vocab, path
        self.shared_output = shared_output
        """fairseq's decoder projects with its input embedding (a checkpoint may then hold no
        output projection of its own)."""

    def from_ours(self, ours: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Not made: the import goes one way (fairseq is no dependency of ours)."""
        raise NotImplementedError("weights are imported from fairseq, never written for it")

    def to_ours(self, theirs: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Every fairseq weight placed where its shape fits, or skipped, or one line naming
        the first that is not; float32 copies under our names."""
        path, vocab, state = self.path, self.vocab, theirs
        for name in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
            if name not in state:
                raise WeightsError(f"{path}: no {name} among its weights")
        embedding = state["encoder.embed_tokens.weight"]
        if embedding.size(0) != len(vocab.outputs):
            rows = embedding.size(0)
            raise WeightsError(
                f"{path}: the embeddings have {rows} rows but the dictionary gives "
                f"{len(vocab.outputs)} ids (4 specials and its symbols): import it with its own "
                "dict"
            )
        output = next((n for n in _OUTPUT_NAMES if n in state), None)
        if output is None:  # fairseq 0.9 named no shared output projection of its own
            if not self.shared_output:
                raise WeightsError(f"{path}: no output projection ({' or '.join(_OUTPUT_NAMES)})")
            output = "decoder.embed_tokens.weight"
        inputs, outputs = torch.tensor(vocab.inputs), torch.tensor(vocab.outputs)
        ours = {
            "src_embed.weight": ("encoder.embed_tokens.weight", embedding[inputs]),
            "tgt_embed.weight": (
                "decoder.embed_tokens.weight",
                state["decoder.embed_tokens.weight"][inputs],
            ),
            "generator.weight": (output, state[output][outputs]),
        }
        placed = {name for name, _ in ours.values()}
        for name, tensor in state.items():
            if name not in placed and not _SKIPPED.fullmatch(name):
                ours[_our_name(name) or name] = (name, tensor)
        rows = PADDING_IDX + 1 + self.config.max_len
        table = fairseq_sinusoids(rows, self.config.d_model, PADDING_IDX)[PADDING_IDX + 1 :]
        ours["pos_embed.weight"] = ("(fairseq's sinusoids)", table)
        self._check(ours)
        return {k: t.detach().float() for k, (_, t) in ours.items()}

    def _check(self, ours: Mapping[str, tuple[str, Tensor]]) -> None:
        """One line for the first weight with no place or the wrong shape, or a missing one."""
        path, expected = self.path, self.expected
        for target, (name, tensor) in ours.items():
            if target not in expected:
                raise WeightsError(f"{path}: weight {name!r} has no place in our Transformer")
            if tensor.shape != expected[target].shape:
                raise WeightsError(
                    f"{path}: weight {name!r} is {tuple(tensor.shape)}, but the checkpoint's "
                    f"settings make it {tuple(expected[target].shape)}"
                )
        missing = sorted(set(expected) - set(ours))
        if missing:
            raise WeightsError(f"{path}: no fairseq weight for our {missing[0]}")


def load_weights(
    model: Transformer, data: Mapping[str, Any], vocab: Vocabulary, path: Path
) -> None:
    """Load the checkpoint's weights into ``model`` (``model_config``'s) through
    ``FairseqAdapter``."""
    state: Mapping[str, Tensor] = data["model"]
    has_output = any(name in state for name in _OUTPUT_NAMES)
    shared = not has_output and _shared_output(_settings(data, path))
    adapter = FairseqAdapter(model.state_dict(), model.config, vocab, path, shared_output=shared)
    model.load_state_dict(adapter.to_ours(state))


def _shared_output(settings: Mapping[str, Any]) -> bool:
    """Whether fairseq's decoder projects with its input embedding."""
    return bool(
        settings.get("share_decoder_input_output_embed") or settings.get("share_all_embeddings")
    )


def _our_name(name: str) -> str | None:
    """fairseq's name of a layer or final-norm weight -> ours (``decoder.layers.0.fc1.bias`` ->
    ``decoder_layers.0.ffn.w1.bias``); None if ours has no such weight."""
    parts = name.split(".")
    if len(parts) == 3 and parts[1] == "layer_norm":  # the final norm of a pre-norm stack
        return f"{parts[0]}_norm.{parts[2]}"
    if len(parts) < 4 or parts[1] != "layers" or parts[0] not in LAYER_NAMES:
        return None
    stack, index, rest = parts[0], parts[2], ".".join(parts[3:])
    for ours, theirs in LAYER_NAMES[stack].items():
        if rest.startswith(theirs + "."):
            return f"{stack}_layers.{index}.{ours}{rest[len(theirs) :]}"
    return None
