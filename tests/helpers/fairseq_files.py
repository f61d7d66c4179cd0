"""A fairseq ``transformer`` model's files as fairseq writes them, made without fairseq: its
subword-nmt codes, its joined dictionary (``fairseq-preprocess --joined-dictionary``), and a
checkpoint with random weights under fairseq's key names, settings as fairseq 0.12 saves them
(``cfg``, whose ``model`` is an ``argparse.Namespace`` for an ``--arch``) or as fairseq 0.9 did
(``args``). Also fairseq's text pipeline (lowercase, Moses, BPE, dictionary ids), to compare ours
with. Imported by name: this folder is on pytest's sys.path."""

from __future__ import annotations

import argparse
import collections
import io
import math
from pathlib import Path

import torch

LANGUAGES = ("en", "de")
TEXTS = [
    "A man in a red shirt rides a bike.",
    "Two dogs play in the snow!",
    "A woman, a man and a child walk on the beach.",
    "Zwei Hunde spielen im Schnee.",
    "Ein Mann in einem roten Hemd fährt Fahrrad.",
    "Eine Frau geht mit einem Kind am Strand.",
    "The children's toys are red and blue.",
]
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]
PAD, EOS, UNK = 1, 2, 3


def prepared(texts: list[str], lang: str) -> list[str]:
    """``texts`` lowercased and Moses-tokenized as a fairseq user does before BPE."""
    from sacremoses import MosesTokenizer

    moses = MosesTokenizer(lang=lang)
    return [moses.tokenize(t.lower(), escape=False, return_str=True) for t in texts]


def write_bpe(folder: Path, merges: int = 60) -> tuple[Path, list[str]]:
    """``folder/bpe.codes`` learned on ``TEXTS`` and ``folder/dict.{en,de}.txt`` of the
    segmented text, ordered and padded as fairseq's ``Dictionary.finalize`` does (count, then
    symbol; ``madeupwordNNNN`` up to a multiple of 8); the codes and the symbols."""
    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe

    lines = prepared(TEXTS[:3], "en") + prepared(TEXTS[3:6], "de")
    codes = io.StringIO()
    learn_bpe(io.StringIO("\n".join(lines * 3)), codes, merges, min_frequency=2)
    (folder / "bpe.codes").write_text(codes.getvalue(), encoding="utf-8")
    bpe = BPE(io.StringIO(codes.getvalue()))
    counts = collections.Counter(w for line in lines for w in bpe.segment(line).split())
    symbols = sorted(counts, key=lambda s: (-counts[s], s))
    padding = [f"madeupword{i:04d}" for i in range(-(len(symbols) + 4) % 8)]
    listing = "".join(f"{s} {counts.get(s, 0)}\n" for s in symbols + padding)
    for lang in LANGUAGES:
        (folder / f"dict.{lang}.txt").write_text(listing, encoding="utf-8")
    return folder / "bpe.codes", symbols + padding


def read_dictionary(folder: Path) -> list[str]:
    """The symbols of ``folder/dict.en.txt``."""
    lines = (folder / "dict.en.txt").read_text(encoding="utf-8").splitlines()
    return [line.rsplit(" ", 1)[0] for line in lines]


def fairseq_ids(texts: list[str], lang: str, codes: Path, symbols: list[str]) -> list[list[int]]:
    """fairseq's ids of ``texts``: prepared, BPE-segmented, each word's dictionary id (unknown:
    ``<unk>``) and ``</s>`` (``Dictionary.encode_line``)."""
    from subword_nmt.apply_bpe import BPE

    bpe = BPE(io.StringIO(codes.read_text(encoding="utf-8")))
    index = {s: i for i, s in enumerate(SPECIALS + symbols)}
    return [
        [index.get(w, UNK) for w in bpe.segment(line).split()] + [EOS]
        for line in prepared(texts, lang)
    ]


def settings(**changes) -> argparse.Namespace:
    """An ``--arch transformer`` model's settings after fairseq's ``base_architecture``, tiny."""
    values = dict(
        arch="transformer",
        _name="transformer",
        source_lang="en",
        target_lang="de",
        encoder_embed_dim=16,
        encoder_ffn_embed_dim=24,
        encoder_layers=2,
        encoder_attention_heads=2,
        encoder_normalize_before=False,
        encoder_learned_pos=False,
        decoder_embed_dim=16,
        decoder_ffn_embed_dim=24,
        decoder_layers=2,
        decoder_attention_heads=2,
        decoder_normalize_before=False,
        decoder_learned_pos=False,
        decoder_output_dim=16,
        decoder_input_dim=16,
        attention_dropout=0.0,
        activation_dropout=0.0,
        activation_fn="relu",
        dropout=0.3,
        adaptive_softmax_cutoff=None,
        adaptive_softmax_dropout=0,
        share_decoder_input_output_embed=True,
        share_all_embeddings=True,
        no_token_positional_embeddings=False,
        adaptive_input=False,
        no_cross_attention=False,
        cross_self_attention=False,
        no_scale_embedding=False,
        layernorm_embedding=False,
        tie_adaptive_weights=False,
        checkpoint_activations=False,
        offload_activations=False,
        encoder_layerdrop=0,
        decoder_layerdrop=0,
        quant_noise_pq=0,
        quant_noise_pq_block_size=8,
        quant_noise_scalar=0,
        max_source_positions=1024,
        max_target_positions=1024,
        no_decoder_final_norm=False,
        encoder_embed_path=None,
        decoder_embed_path=None,
    )
    values.update(changes)
    return argparse.Namespace(**values)


def state_dict(s: argparse.Namespace, vocab: int, layout: str, seed: int = 0) -> dict:
    """Random weights under fairseq's names for ``s``: ``layout`` "0.12" (with its encoder
    layers' fast-path copies and ``decoder.output_projection``) or "0.9" (sinusoid placeholders;
    ``decoder.embed_out`` only when not shared)."""
    g = torch.Generator().manual_seed(seed)
    D, F = s.encoder_embed_dim, s.encoder_ffn_embed_dim

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * scale

    def linear(name: str, out: int, inp: int) -> dict:
        return {
            f"{name}.weight": rand(out, inp, scale=inp**-0.5),
            f"{name}.bias": rand(out, scale=0.1),
        }

    def norm(name: str) -> dict:
        return {f"{name}.weight": 1 + rand(D, scale=0.1), f"{name}.bias": rand(D, scale=0.1)}

    def attention(name: str) -> dict:
        return {k: v for p in "kvq" for k, v in linear(f"{name}.{p}_proj", D, D).items()} | linear(
            f"{name}.out_proj", D, D
        )

    embed = rand(vocab, D, scale=D**-0.5)
    state: dict = {"encoder.version": torch.tensor([3.0]), "encoder.embed_tokens.weight": embed}
    for i in range(s.encoder_layers):
        p = f"encoder.layers.{i}"
        if layout == "0.12":  # fairseq 0.12.2's fast-path copies: zeros until a model is loaded
            for n, shape in (
                ("in_proj", (3 * D, D)),
                ("out_proj", (D, D)),
                ("fc1", (F, D)),
                ("fc2", (D, F)),
            ):
                state[f"{p}.{n}_weight"], state[f"{p}.{n}_bias"] = (
                    torch.zeros(shape),
                    torch.zeros(shape[0]),
                )
        state |= attention(f"{p}.self_attn") | norm(f"{p}.self_attn_layer_norm")
        state |= linear(f"{p}.fc1", F, D) | linear(f"{p}.fc2", D, F) | norm(f"{p}.final_layer_norm")
    shared = s.share_all_embeddings
    state["decoder.embed_tokens.weight"] = embed if shared else rand(vocab, D, scale=D**-0.5)
    for i in range(s.decoder_layers):
        p = f"decoder.layers.{i}"
        state |= attention(f"{p}.self_attn") | norm(f"{p}.self_attn_layer_norm")
        state |= attention(f"{p}.encoder_attn") | norm(f"{p}.encoder_attn_layer_norm")
        state |= linear(f"{p}.fc1", F, D) | linear(f"{p}.fc2", D, F) | norm(f"{p}.final_layer_norm")
    if s.encoder_normalize_before:
        state |= norm("encoder.layer_norm") | norm("decoder.layer_norm")
    tied = shared or s.share_decoder_input_output_embed
    output = state["decoder.embed_tokens.weight"] if tied else rand(vocab, D, scale=D**-0.5)
    if layout == "0.12":
        state["decoder.output_projection.weight"] = output
    else:
        for stack in ("encoder", "decoder"):
            state[f"{stack}.embed_positions._float_tensor"] = torch.zeros(1)
        if not tied:
            state["decoder.embed_out"] = output
    state["decoder.version"] = torch.tensor([3.0])
    return state


def write_checkpoint(path: Path, s: argparse.Namespace, state: dict, layout: str) -> Path:
    """``path`` as fairseq's trainer saves it: 0.12 with ``cfg`` (its ``model`` the Namespace,
    ``args`` None), 0.9 with ``args``; optimizer history and extra state as plain data."""
    history = [
        {
            "criterion_name": "LabelSmoothedCrossEntropyCriterion",
            "optimizer_name": "FairseqAdam",
            "lr_scheduler_state": {"best": None},
            "num_updates": 10,
        }
    ]
    extra = {
        "train_iterator": {"epoch": 1, "iterations_in_epoch": 10, "shuffle": True},
        "val_loss": 9.5,
    }
    if layout == "0.12":
        cfg = {
            "_name": None,
            "common": {"seed": 1, "cpu": True, "fp16": False},
            "task": {
                "_name": "translation",
                "source_lang": s.source_lang,
                "target_lang": s.target_lang,
            },
            "model": s,
            "criterion": {"_name": "label_smoothed_cross_entropy", "label_smoothing": 0.1},
        }
        data = {
            "args": None,
            "cfg": cfg,
            "model": state,
            "criterion": None,
            "optimizer_history": history,
            "task_state": {},
            "extra_state": {**extra, "metrics": {}, "previous_training_time": 1.5},
        }
    else:
        data = {
            "args": s,
            "model": state,
            "optimizer_history": history,
            "extra_state": extra,
            "last_optimizer_state": {"state": {}, "param_groups": [{"lr": 1e-4}]},
        }
    torch.save(data, path)
    return path


# ----------------------------------------------------------------------------- fairseq's forward


def sinusoids(rows: int, dim: int) -> torch.Tensor:
    """fairseq's (tensor2tensor's) table: sines of p * 10000^(-i / (dim/2 - 1)) in the first half
    of the width, cosines in the second; row ``PAD`` zero."""
    half = dim // 2
    freq = torch.tensor([10000.0 ** (-i / (half - 1)) for i in range(half)])
    angle = torch.arange(rows, dtype=torch.float)[:, None] * freq
    table = torch.cat([angle.sin(), angle.cos()], dim=1)
    table[PAD] = 0
    return table


def forward(
    state: dict, s: argparse.Namespace, src: torch.Tensor, prev: torch.Tensor
) -> torch.Tensor:
    """fairseq's logits (B, T, V) for left-padded ``src`` (B, S) and right-padded
    ``prev`` (B, T) starting with ``</s>``, written with plain torch ops from its weights."""
    import torch.nn.functional as F

    D, H, pre = s.encoder_embed_dim, s.encoder_attention_heads, s.encoder_normalize_before
    table = sinusoids(64, D)

    def embed(name: str, tokens: torch.Tensor) -> torch.Tensor:
        real = tokens.ne(PAD).long()
        positions = torch.cumsum(real, dim=1) * real + PAD  # fairseq's make_positions
        return math.sqrt(D) * state[name][tokens] + table[positions]

    def ln(name: str, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (D,), state[f"{name}.weight"], state[f"{name}.bias"], 1e-5)

    def lin(name: str, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, state[f"{name}.weight"], state[f"{name}.bias"])

    def attend(name: str, x: torch.Tensor, mem: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, T, S = x.size(0), x.size(1), mem.size(1)
        q = (lin(f"{name}.q_proj", x) * (D // H) ** -0.5).view(B, T, H, -1).transpose(1, 2)
        k = lin(f"{name}.k_proj", mem).view(B, S, H, -1).transpose(1, 2)
        v = lin(f"{name}.v_proj", mem).view(B, S, H, -1).transpose(1, 2)
        weights = torch.softmax((q @ k.transpose(2, 3)).masked_fill(mask, float("-inf")), dim=-1)
        return lin(f"{name}.out_proj", (weights @ v).transpose(1, 2).reshape(B, T, D))

    def block(norm: str, x: torch.Tensor, f) -> torch.Tensor:
        return x + f(ln(norm, x)) if pre else ln(norm, x + f(x))

    def ffn(p: str, h: torch.Tensor) -> torch.Tensor:
        return lin(f"{p}.fc2", F.relu(lin(f"{p}.fc1", h)))

    def encoder_layer(p: str, x: torch.Tensor) -> torch.Tensor:
        x = block(f"{p}.self_attn_layer_norm", x, lambda h: attend(f"{p}.self_attn", h, h, src_pad))
        return block(f"{p}.final_layer_norm", x, lambda h: ffn(p, h))

    def decoder_layer(p: str, y: torch.Tensor) -> torch.Tensor:
        y = block(f"{p}.self_attn_layer_norm", y, lambda h: attend(f"{p}.self_attn", h, h, causal))
        y = block(
            f"{p}.encoder_attn_layer_norm",
            y,
            lambda h: attend(f"{p}.encoder_attn", h, memory, src_pad),
        )
        return block(f"{p}.final_layer_norm", y, lambda h: ffn(p, h))

    src_pad = src.eq(PAD)[:, None, None, :]
    x = embed("encoder.embed_tokens.weight", src)
    for i in range(s.encoder_layers):
        x = encoder_layer(f"encoder.layers.{i}", x)
    memory = ln("encoder.layer_norm", x) if pre else x
    causal = torch.ones(prev.size(1), prev.size(1), dtype=torch.bool).triu(1)
    y = embed("decoder.embed_tokens.weight", prev)
    for i in range(s.decoder_layers):
        y = decoder_layer(f"decoder.layers.{i}", y)
    y = ln("decoder.layer_norm", y) if pre else y
    output = next(
        state[n]
        for n in (
            "decoder.output_projection.weight",
            "decoder.embed_out",
            "decoder.embed_tokens.weight",
        )
        if n in state
    )
    return y @ output.T
