"""Does the encoder collapse? Our Transformer beside a reference one, on exactly the same batches.

Both models are driven by the same ``Trainer`` (the same seeded batch stream, Adam, the paper's
schedule, label-smoothed loss and validation), so the only difference is the model code. The
reference is built from ``torch.nn.TransformerEncoder``/``TransformerDecoder`` layers (post-norm,
ReLU) with one embedding matrix shared by source, target and the pre-softmax projection, scaled
by sqrt(d_model), plus sinusoids, as the paper describes. Each row: validation perplexity and
``val_encoder_spread`` (about 0.5 for an encoder that reads its source, near 0 when it has
collapsed to one output for every position) after N steps.

    python benchmarks/encoder_collapse.py --shards runs/multi30k_en_de/shard \
        --steps 50 --eval-every 25 --models ours-xavier,ours,reference
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import report  # noqa: E402

from training.config import TrainConfig  # noqa: E402
from training.data import TokenData  # noqa: E402
from training.trainer import Trainer  # noqa: E402
from transformer_core.config import ModelConfig  # noqa: E402
from transformer_core.model import Memory, Transformer, sinusoids  # noqa: E402


class ReferenceTransformer(nn.Module):
    """The paper's architecture from PyTorch's own layers, with the interface ``Trainer`` uses
    (``config``, ``tgt_vocab_size``, ``encode``, ``decode``, ``forward``)."""

    def __init__(self, config: ModelConfig, vocab_size: int):
        super().__init__()
        if config.norm_first or not config.share_embeddings:
            raise ValueError("the reference is the paper's: post-norm, shared embeddings")
        self.config, self.src_vocab_size, self.tgt_vocab_size = config, vocab_size, vocab_size
        D = config.d_model
        self.embed = nn.Embedding(vocab_size, D)
        nn.init.normal_(self.embed.weight, 0.0, D**-0.5)
        self.register_buffer("pos_table", sinusoids(config.max_len, D), persistent=False)
        self.dropout = nn.Dropout(config.dropout)

        def layer(cls: type) -> nn.Module:
            return cls(
                D, config.n_heads, config.d_ff, config.dropout, batch_first=True, norm_first=False
            )

        # norm=None: post-norm layers end in a LayerNorm already (nn.Transformer adds another).
        self.encoder = nn.TransformerEncoder(
            layer(nn.TransformerEncoderLayer), config.n_layers, enable_nested_tensor=False
        )
        self.decoder = nn.TransformerDecoder(layer(nn.TransformerDecoderLayer), config.n_layers)

    def _embed(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens) * math.sqrt(self.config.d_model)
        return self.dropout(x + self.pos_table[: tokens.size(1)])

    def encode(self, src: Tensor) -> Memory:
        src_pad = src.eq(self.config.pad_id)
        return Memory(self.encoder(self._embed(src), src_key_padding_mask=src_pad), src_pad)

    def decode(self, tgt_in: Tensor, memory: Memory, project: bool = True) -> Tensor:
        T = tgt_in.size(1)
        causal = nn.Transformer.generate_square_subsequent_mask(T, device=tgt_in.device)
        x = self.decoder(
            self._embed(tgt_in),
            memory.states,
            tgt_mask=causal,
            tgt_is_causal=True,
            memory_key_padding_mask=memory.src_pad,
        )
        if not project:  # (B, T, D): for a loss fused with the projection (train.fused_loss)
            return x
        return x @ self.embed.weight.t()  # (B, T, V): the shared matrix as pre-softmax projection

    @property
    def generator(self) -> nn.Module:
        """The pre-softmax projection (the shared matrix), as ``Transformer.generator``."""
        return self.embed

    def forward(self, src: Tensor, tgt_in: Tensor, project: bool = True) -> Tensor:
        return self.decode(tgt_in, self.encode(src), project)


def reference_residual_dropout(config: ModelConfig, vocab_size: int) -> ReferenceTransformer:
    """The reference with dropout only where the paper puts it (and ours does): on the
    embeddings and on each sub-layer's output; PyTorch's layers also drop attention weights
    and the feed-forward network's hidden units."""
    model = ReferenceTransformer(config, vocab_size)
    for module in model.modules():
        if isinstance(module, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
            module.dropout.p = 0.0  # inside the feed-forward network
        if isinstance(module, nn.MultiheadAttention):
            module.dropout = 0.0  # on the attention weights
    return model


def ours_xavier(config: ModelConfig, vocab_size: int) -> Transformer:
    """Ours as it was initialised before: Xavier-uniform (gain 1) on every Linear, zero biases
    (tensor2tensor's choice). This is the one that collapsed."""
    model = Transformer(config, vocab_size)
    for module in model.modules():
        if isinstance(module, nn.Linear) and module is not model.generator:
            nn.init.xavier_uniform_(module.weight)
            nn.init.zeros_(module.bias)
    return model


def ours_xavier_ffn_default(config: ModelConfig, vocab_size: int) -> Transformer:
    """The Xavier init with only the feed-forward layers at nn.Linear's default."""
    model = ours_xavier(config, vocab_size)
    for name, module in model.named_modules():
        if name.endswith(("ffn.w1", "ffn.w2")):
            module.reset_parameters()
    return model


def _qkv(model: Transformer) -> list[nn.Linear]:
    """Every attention's query, key and value projections."""
    return [m for n, m in model.named_modules() if n.endswith(("q_proj", "k_proj", "v_proj"))]


def ours_fairseq_init(config: ModelConfig, vocab_size: int) -> Transformer:
    """fairseq's Transformer init: query/key/value Xavier with gain 1/sqrt(2), the attention
    output Xavier, the feed-forward layers nn.Linear's default."""
    model = ours_xavier_ffn_default(config, vocab_size)
    for proj in _qkv(model):
        nn.init.xavier_uniform_(proj.weight, gain=2**-0.5)
    return model


def ours_fairseq_fork_init(config: ModelConfig, vocab_size: int) -> Transformer:
    """The init of the fairseq fork behind Multi30k's published tiny Transformer
    (LividWo/Revisit-MMT, fairseq 0.9): ``model.init: fairseq``."""
    return Transformer(config.replace(init="fairseq"), vocab_size)


MODELS = {
    "ours": Transformer,  # PyTorch's Transformer layers' init (the default since 2026-11-23)
    "ours-xavier": ours_xavier,
    "ours-xavier-ffn-default": ours_xavier_ffn_default,
    "ours-fairseq-init": ours_fairseq_init,
    "ours-fairseq-fork-init": ours_fairseq_fork_init,
    "reference": ReferenceTransformer,
    "reference-residual-dropout": reference_residual_dropout,
}


def run(name: str, mc: ModelConfig, tc: TrainConfig, train, dev, vocab: int, seed: int) -> list:
    """Train model ``name`` for ``tc.steps`` steps; a row at initialisation and per evaluation."""
    torch.manual_seed(seed)
    module = MODELS[name](mc, vocab)
    trainer = Trainer(module, tc, train, dev, seed=seed)
    rows, started = [], time.time()

    def record(validation: dict, loss: float | None) -> None:
        row = {
            "model": name,
            "step": trainer.step,
            "loss": loss,
            "val_ppl": validation["val_ppl"],
            "spread": validation["val_encoder_spread"],
            "minutes": (time.time() - started) / 60,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)

    try:
        record(trainer.evaluate(), None)
        while trainer.step < tc.steps:
            trainer.train_step()
            validation = trainer.maybe_evaluate()
            if validation:
                record(validation, trainer.latest.get("loss"))
    finally:
        trainer.close()
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", required=True, help="a shard stage folder (train/, dev/)")
    parser.add_argument("--models", default="ours-xavier,ours,reference", help=", ".join(MODELS))
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=400)
    parser.add_argument("--lr-scale", type=float, default=1.0)
    parser.add_argument("--tokens-per-step", type=int, default=4096)
    parser.add_argument("--clip-norm", type=float, default=None)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--d-ff", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dropout", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    manifest = json.loads((Path(args.shards) / "manifest.json").read_text())
    vocab = int(manifest["stats"]["vocab_size"])
    train = TokenData.read(f"{args.shards}/train", vocab)
    dev = TokenData.read(f"{args.shards}/dev", vocab)
    mc = ModelConfig(
        n_layers=args.layers,
        d_model=args.d_model,
        d_ff=args.d_ff,
        n_heads=args.heads,
        dropout=args.dropout,
        max_len=max(256, int(max(train.src_lens.max(), train.tgt_lens.max())) + 2),
    )
    tc = TrainConfig(
        steps=args.steps,
        tokens_per_step=args.tokens_per_step,
        max_tokens_per_batch=min(args.tokens_per_step, 4096),
        warmup_steps=args.warmup,
        lr_scale=args.lr_scale,
        clip_norm=args.clip_norm,
        eval_every=args.eval_every,
        log_every=args.eval_every,
        prefetch=0,
    )
    peak = args.lr_scale * args.d_model**-0.5 * args.warmup**-0.5
    rows = []
    for name in args.models.split(","):
        rows += run(name, mc, tc, train, dev, vocab, args.seed)
    report(
        f"Encoder spread and validation perplexity, {args.layers}x{args.d_model}, peak lr "
        f"{peak:.2e} at step {args.warmup}, {args.tokens_per_step} tokens/step",
        rows,
        args.json,
    )


if __name__ == "__main__":
    main()
