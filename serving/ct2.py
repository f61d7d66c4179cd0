"""The CTranslate2 engine: a checkpoint as a CTranslate2 model, and beam search through it.

The paper's Transformer is CTranslate2's ``TransformerSpec`` as it stands (ReLU feed-forward,
post-norm or, with ``norm_first``, pre-norm with final norms, embeddings times sqrt(d_model)), so
``export_ctranslate2`` copies our weights onto the spec one to one: q/k/v fused the way
CTranslate2 stores them, our sinusoid table written out as the position encodings (its own
table lays sines and cosines out in halves, ours interleaves them), torch's layer-norm epsilon.
The vocabulary is the sentencepiece model's pieces in id order, ``<pad>`` included, so every
CTranslate2 id is our id and its decoder start token ``<s>`` is our BOS.

``CTranslate2Engine.search`` keeps what beam size, alpha and the output limit mean for our own
search (``transformer_core.search``); see ``CTranslate2Engine.hypotheses`` for how.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from serving import ServingError
from transformer_core.config import UNK_ID, ConfigError, ModelConfig
from transformer_core.folders import (
    publish,
    remove_stale_temporaries,
    sha256_file,
    temporary_sibling,
)
from transformer_core.search import Hypothesis

if TYPE_CHECKING:
    from transformer_core.model import Transformer

__all__ = [
    "COMPUTE_TYPES",
    "QUANTIZATIONS",
    "CTranslate2Engine",
    "default_export_dir",
    "export_ctranslate2",
    "load_engine",
    "save_model",
]

QUANTIZATIONS = (
    "float32",
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
)
"""Weight types CTranslate2 can store (``ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES``)."""

COMPUTE_TYPES = ("default", "auto", *QUANTIZATIONS)
"""What ``ctranslate2.Translator(compute_type=...)`` accepts: "default" keeps the stored type
(or the nearest one the device supports), "auto" picks the fastest the device supports."""

INFO_FILE = "export.json"
"""Written last into an export: what it was made from; its presence marks the export complete."""

EXPORT_FORMAT = 1
"""Bumped when the mapping changes, so that older exports are rebuilt rather than reused."""

LAYER_NORM_EPS = 1e-5
"""torch.nn.LayerNorm's default; CTranslate2's own default is 1e-6."""

MIN_LENGTH_PENALTY = 1e-6
"""The smallest length_penalty passed to CTranslate2 (see ``_penalty``)."""


# ----------------------------------------------------------------------------- export


def check_quantization(quantization: str) -> None:
    """ConfigError naming ``quantization`` unless CTranslate2 can store it."""
    if quantization not in QUANTIZATIONS:
        raise ConfigError(
            "quantization", f"{quantization!r} is not one of {', '.join(QUANTIZATIONS)}"
        )


def check_exportable(config: ModelConfig) -> None:
    """ServingError for the configs CTranslate2's spec cannot hold (different d_k and d_v)."""
    if config.head_dim_k != config.head_dim_v:
        raise ServingError(
            f"d_k={config.head_dim_k} differs from d_v={config.head_dim_v}: CTranslate2's "
            "attention has one head width; use engine torch for this model"
        )


def build_spec(model: Transformer, pieces: Sequence[str]) -> Any:
    """A ``ctranslate2.specs.TransformerSpec`` holding ``model``'s weights and ``pieces`` as
    source and target vocabulary (``pieces[i]`` is token id i)."""
    from ctranslate2.specs import common_spec, transformer_spec

    config = model.config
    check_exportable(config)
    for name, size in (("source", model.src_vocab_size), ("target", model.tgt_vocab_size)):
        if size != len(pieces):
            raise ServingError(
                f"the model's {name} vocabulary has {size} ids but the tokenizer {len(pieces)}"
            )
    # Given only when it is not d_model / n_heads (Table 3 rows A change it).
    head_dim = None if config.head_dim_k * config.n_heads == config.d_model else config.head_dim_k
    layout = {
        "num_layers": config.n_layers,
        "num_heads": config.n_heads,
        "pre_norm": config.norm_first,
        "activation": common_spec.Activation.RELU,
        "head_dim": head_dim,
    }
    spec = transformer_spec.TransformerSpec(
        transformer_spec.TransformerEncoderSpec(**layout),
        transformer_spec.TransformerDecoderSpec(**layout),
    )
    spec.config.layer_norm_epsilon = LAYER_NORM_EPS
    # Our special pieces by id, whatever the tokenizer named them; the decoder starts from the
    # embedding of BOS, as our search does.
    spec.config.unk_token = pieces[UNK_ID]
    spec.config.bos_token = pieces[config.bos_id]
    spec.config.eos_token = pieces[config.eos_id]
    spec.config.decoder_start_token = pieces[config.bos_id]
    weights = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    positions = _positions(model)
    _set_encoder(spec.encoder, weights, positions, config)
    _set_decoder(spec.decoder, weights, positions, config)
    spec.register_source_vocabulary(list(pieces))
    spec.register_target_vocabulary(list(pieces))
    return spec


def _positions(model: Transformer) -> Any:
    # Ours, written out: CTranslate2's built-in sinusoids are laid out differently.
    if model.config.positional == "learned":
        return model.pos_embed.weight.detach().float().cpu()
    return model.pos_table.float().cpu()


def _set_encoder(spec: Any, w: dict, positions: Any, config: ModelConfig) -> None:
    spec.embeddings[0].weight = w["src_embed.weight"]
    spec.position_encodings.encodings = positions
    if config.norm_first:
        _set_norm(spec.layer_norm, w, "encoder_norm")
    for i, layer in enumerate(spec.layer):
        p = f"encoder_layers.{i}"
        _set_self_attention(layer.self_attention, w, f"{p}.self_attn")
        _set_norm(layer.self_attention.layer_norm, w, f"{p}.norm1")
        _set_ffn(layer.ffn, w, p)
        _set_norm(layer.ffn.layer_norm, w, f"{p}.norm2")


def _set_decoder(spec: Any, w: dict, positions: Any, config: ModelConfig) -> None:
    spec.embeddings.weight = w["tgt_embed.weight"]
    spec.position_encodings.encodings = positions
    spec.projection.weight = w["generator.weight"]
    if config.norm_first:
        _set_norm(spec.layer_norm, w, "decoder_norm")
    for i, layer in enumerate(spec.layer):
        p = f"decoder_layers.{i}"
        _set_self_attention(layer.self_attention, w, f"{p}.self_attn")
        _set_norm(layer.self_attention.layer_norm, w, f"{p}.norm1")
        _set_cross_attention(layer.attention, w, f"{p}.cross_attn")
        _set_norm(layer.attention.layer_norm, w, f"{p}.norm2")
        _set_ffn(layer.ffn, w, p)
        _set_norm(layer.ffn.layer_norm, w, f"{p}.norm3")


def _set_self_attention(spec: Any, w: dict, prefix: str) -> None:
    # CTranslate2 stores self-attention's q, k, v as one fused projection.
    _set_linear(spec.linear[0], w, [f"{prefix}.{n}" for n in ("q_proj", "k_proj", "v_proj")])
    _set_linear(spec.linear[1], w, [f"{prefix}.out_proj"])


def _set_cross_attention(spec: Any, w: dict, prefix: str) -> None:
    # Queries from the decoder; keys and values (fused) from the encoder output.
    _set_linear(spec.linear[0], w, [f"{prefix}.q_proj"])
    _set_linear(spec.linear[1], w, [f"{prefix}.k_proj", f"{prefix}.v_proj"])
    _set_linear(spec.linear[2], w, [f"{prefix}.out_proj"])


def _set_ffn(spec: Any, w: dict, prefix: str) -> None:
    _set_linear(spec.linear_0, w, [f"{prefix}.ffn.w1"])
    _set_linear(spec.linear_1, w, [f"{prefix}.ffn.w2"])


def _set_linear(spec: Any, w: dict, names: list[str]) -> None:
    import torch

    spec.weight = torch.cat([w[f"{n}.weight"] for n in names])
    spec.bias = torch.cat([w[f"{n}.bias"] for n in names])


def _set_norm(spec: Any, w: dict, name: str) -> None:
    spec.gamma = w[f"{name}.weight"]
    spec.beta = w[f"{name}.bias"]


def save_model(
    model: Transformer,
    pieces: Sequence[str],
    out: Path,
    quantization: str = "float32",
    identity: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` as a CTranslate2 model folder ``out`` through a temporary sibling renamed
    into place; ``identity`` (what it was made from) goes into ``export.json`` with the config."""
    import ctranslate2

    check_quantization(quantization)
    out = Path(out)
    spec = build_spec(model, pieces)
    spec.validate()
    spec.optimize(quantization=quantization)
    info = {
        **(identity or {}),
        "format": EXPORT_FORMAT,
        "ctranslate2": ctranslate2.__version__,
        "quantization": quantization,
        "model_config": model.config.to_dict(),
        "vocab_size": len(pieces),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out)
    tmp = temporary_sibling(out)
    try:
        tmp.mkdir()
        spec.save(str(tmp))
        (tmp / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
        publish(tmp, out, already=lambda folder: read_info(folder) == info)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def read_info(folder: Path) -> dict[str, Any] | None:
    """The ``export.json`` of a complete export in ``folder``, else None."""
    path = Path(folder) / INFO_FILE
    if not path.is_file() or not (Path(folder) / "model.bin").is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def export_ctranslate2(
    checkpoint: Path, tokenizer_dir: Path, out: Path, quantization: str = "float32"
) -> Path:
    """Export ``checkpoint`` (a model.pt or a folder holding one) with ``tokenizer_dir``'s
    vocabulary as a CTranslate2 model folder ``out``; a complete export of the same checkpoint,
    tokenizer and quantization already there is reused. Returns ``out``."""
    from serving import tokenizer as tokenizer_lib
    from serving.translator import model_file
    from transformer_core import checkpoint as checkpoint_lib

    check_quantization(quantization)
    require()
    checkpoint, out = model_file(checkpoint), Path(out)
    if not checkpoint.is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint} does not exist")
    tok = tokenizer_lib.load(Path(tokenizer_dir))
    identity = {
        "checkpoint_sha256": sha256_file(checkpoint),
        "tokenizer_sha256": sha256_file(tok.model_file),
    }
    if _is_export_of(out, identity, quantization):
        return out
    model = checkpoint_lib.load_model(checkpoint, map_location="cpu")
    pieces = [tok.sp.id_to_piece(i) for i in range(tok.vocab_size)]
    return save_model(model, pieces, out, quantization, identity)


def _is_export_of(out: Path, identity: dict[str, Any], quantization: str) -> bool:
    import ctranslate2

    info = read_info(out)
    want = {
        **identity,
        "format": EXPORT_FORMAT,
        "ctranslate2": ctranslate2.__version__,
        "quantization": quantization,
    }
    return info is not None and all(info.get(k) == v for k, v in want.items())


def default_export_dir(checkpoint: Path, quantization: str = "float32") -> Path:
    """Where the engine keeps a checkpoint's export: ``<dir>/<stem>.ct2-<quantization>`` next to
    the checkpoint file (``average/model.ct2-float32`` for the average stage's model.pt)."""
    from serving.translator import model_file

    checkpoint = model_file(checkpoint)
    return checkpoint.with_name(f"{checkpoint.stem}.ct2-{quantization}")


# ----------------------------------------------------------------------------- decoding


class CTranslate2Engine:
    """A loaded CTranslate2 model; ``search(src_ids, decode)`` as ``Translator`` calls it."""

    name = "ctranslate2"

    def __init__(
        self,
        model_dir: Path,
        *,
        device: str = "cpu",
        compute_type: str = "default",
        threads: int = 0,
    ):
        import ctranslate2

        info = read_info(model_dir)
        if info is None:
            raise ServingError(f"{model_dir} holds no complete CTranslate2 export ({INFO_FILE})")
        self.model_dir = Path(model_dir)
        self.device = device
        self.config = ModelConfig.from_dict(info["model_config"])
        self.pieces = json.loads((self.model_dir / "shared_vocabulary.json").read_text())
        self.ids = {piece: i for i, piece in enumerate(self.pieces)}
        kind, _, index = device.partition(":")
        if compute_type not in COMPUTE_TYPES:
            raise ConfigError(
                "compute_type", f"{compute_type!r} is not one of {', '.join(COMPUTE_TYPES)}"
            )
        try:
            self.translator = ctranslate2.Translator(
                str(self.model_dir),
                device=kind,
                device_index=int(index or 0),
                compute_type=compute_type,
                inter_threads=1,
                intra_threads=threads,
            )
        except ValueError as exc:  # e.g. float16 on a CPU: CTranslate2 says why
            raise ConfigError("compute_type", f"{compute_type!r} on {device}: {exc}") from exc
        # Never produced by our search either (it sets their log-probabilities to -inf).
        self.suppressed = [[self.pieces[self.config.pad_id]], [self.pieces[self.config.bos_id]]]

    @property
    def compute_type(self) -> str:
        """The compute type CTranslate2 actually uses (``default`` resolved)."""
        return self.translator.compute_type

    def search(self, src_ids: Sequence[Sequence[int]], decode: Any) -> list[list[int]]:
        """The best output ids (no BOS/EOS) per source, with ``decode``'s beam size, alpha and
        output limit (source length + ``max_len_offset``)."""
        found = self.hypotheses(src_ids, decode.beam_size, decode.alpha, decode.max_len_offset)
        return [hyps[0].tokens for hyps in found]

    def nbest(self, src_ids: Sequence[Sequence[int]], decode: Any, n_best: int) -> list[list[Any]]:
        """The ``n_best`` best hypotheses per source with ``decode``'s settings (as TorchEngine)."""
        return self.hypotheses(
            src_ids, decode.beam_size, decode.alpha, decode.max_len_offset, n_best=n_best
        )

    def hypotheses(
        self,
        src_ids: Sequence[Sequence[int]],
        beam_size: int = 4,
        alpha: float = 0.6,
        max_len_offset: int = 50,
        *,
        max_len: int | None = None,
        min_len: int = 0,
        n_best: int = 1,
    ) -> list[list[Hypothesis]]:
        """The ``n_best`` (<= beam size) hypotheses per source, best first, scored as our search
        scores them: summed log-probabilities / ((5 + len) / 6)^alpha, len counting EOS.

        CTranslate2 grows the same beams (top 2k continuations, EOS among the first k finishes,
        a sentence stops at k finished) but has one output limit per call: all sources are
        decoded under the longest limit, and those whose search ran up to their own limit
        (rare) again under it, grouped by limit; see ``_decode``. It keeps the k finished
        hypotheses best by its own raw / len^p; ``_penalty`` picks the p that ranks like GNMT
        near the source length, and the kept ones are re-ranked by GNMT's penalty exactly.
        """
        if not 1 <= n_best <= beam_size:
            raise ValueError(f"n_best {n_best} must be in [1, beam_size {beam_size}]")
        limits = [self._limit(len(seq), max_len_offset, max_len) for seq in src_ids]
        out: list[list[Hypothesis]] = [[] for _ in src_ids]

        def decode(rows: list[int], limit: int) -> list[int]:
            """Decode ``rows`` under ``limit`` into ``out``; the rows that need their own."""
            sources = [[self.pieces[t] for t in src_ids[i]] for i in rows]
            penalty = _penalty(alpha, sorted(map(len, sources))[len(sources) // 2])
            found = self._decode(sources, beam_size, alpha, penalty, limit, min(min_len, limit))
            redo = []
            for i, (hyps, steps) in zip(rows, found, strict=True):
                out[i] = hyps[:n_best]
                if steps >= limits[i] < limit:  # it reached its own limit: not its search
                    redo.append(i)
            return redo

        redo = decode(list(range(len(src_ids))), max(limits, default=1)) if src_ids else []
        for limit in sorted({limits[i] for i in redo}, reverse=True):
            decode([i for i in redo if limits[i] == limit], limit)
        return out

    def _limit(self, src_len: int, max_len_offset: int, max_len: int | None) -> int:
        # As transformer_core.search._output_limits: the decoder input must fit max_len.
        limit = src_len + max_len_offset if max_len is None else max_len
        return max(1, min(limit, self.config.max_len))

    def _decode(
        self,
        sources: list[list[str]],
        k: int,
        alpha: float,
        penalty: float,
        limit: int,
        min_len: int,
    ) -> list[tuple[list[Hypothesis], int]]:
        """Per source: its re-ranked hypotheses, and the steps its search ran.

        The steps are the longest returned hypothesis (EOS counted): a search stops on the step
        its k-th hypothesis finishes, and of the k - 1 + m that have finished then, the k kept
        include at least one of the m last. A search that stopped before a shorter limit is
        exactly the search under that limit; one that did not must be run again under it.
        """
        results = self.translator.translate_batch(
            sources,
            beam_size=k,
            num_hypotheses=k,
            length_penalty=penalty,
            return_scores=True,
            max_decoding_length=limit,
            min_decoding_length=min_len,
            max_input_length=0,  # the Translator already fits sources to max_len
            suppress_sequences=self.suppressed,
        )
        found = []
        for result in results:
            lengths = [len(p) + (len(p) < limit) for p in result.hypotheses]
            found.append((self._rerank(result, alpha, penalty, limit), max(lengths)))
        return found

    def _rerank(self, result: Any, alpha: float, penalty: float, limit: int) -> list[Hypothesis]:
        """CTranslate2's hypotheses with their raw scores recovered, divided by GNMT's penalty."""
        hyps = []
        for pieces, score in zip(result.hypotheses, result.scores, strict=True):
            # Decoded positions, EOS included (an output that reached the limit has none): the
            # length both CTranslate2's len^penalty and GNMT's ((5 + len) / 6)^alpha count.
            length = len(pieces) + (len(pieces) < limit)
            raw = score * length**penalty
            tokens = [self.ids[p] for p in pieces]
            hyps.append(Hypothesis(tokens, raw / ((5.0 + length) / 6.0) ** alpha))
        return sorted(hyps, key=lambda h: h.score, reverse=True)


def _penalty(alpha: float, length: int) -> float:
    """CTranslate2's length_penalty p for our alpha: d log lp / d log len of GNMT's
    lp = ((5 + len) / 6)^alpha is alpha * len / (5 + len), so near ``length`` len^p ranks
    hypotheses as GNMT does (p = alpha would over-reward length: short outputs get dropped)."""
    # Never 0: with a zero penalty CTranslate2 stops a sentence once its top beam ends, not
    # after k finished hypotheses as our search does.
    return max(alpha * length / (5.0 + length), MIN_LENGTH_PENALTY)


def load_engine(
    checkpoint: Path,
    tokenizer_dir: Path,
    decode: Any,
    *,
    export_dir: Path | None = None,
    device: str | None = None,
) -> CTranslate2Engine:
    """Export ``checkpoint`` in float32 (or reuse its export) into ``export_dir`` (default:
    ``default_export_dir``) and load it with ``decode.compute_type`` and ``decode.threads``;
    CTranslate2 converts the float32 weights to the compute type as it loads them."""
    require()
    out = Path(export_dir) if export_dir is not None else default_export_dir(checkpoint)
    export_ctranslate2(checkpoint, tokenizer_dir, out)
    return CTranslate2Engine(
        out,
        device=device or default_device(),
        compute_type=decode.compute_type,
        threads=decode.threads,
    )


def require() -> None:
    """ServingError unless the ctranslate2 package is installed."""
    import importlib.util

    if importlib.util.find_spec("ctranslate2") is None:
        raise ServingError(
            "decode.engine ctranslate2 needs the ctranslate2 package "
            "(pip install 'attention-pipeline[serve]')"
        )


def default_device() -> str:
    """``cuda`` when CTranslate2 sees a GPU, else ``cpu``."""
    import ctranslate2

    return "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
