"""Initial weights of the Transformer: ``model.init`` torch (the default) or fairseq.

The paper does not say how it initialises. torch is how PyTorch's own Transformer layers start;
fairseq is fairseq 0.9's Transformer, which the published Multi30k recipe trained with
(docs/multi30k.md). Both draw the embeddings from N(0, d_model^-0.5), as tensor2tensor and
fairseq do, because one matrix plays two roles: times sqrt(d_model) at the input it has unit
variance, matching the sinusoids' scale; as the pre-softmax projection it keeps initial logits
O(1).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from transformer_core.config import ModelConfig


@dataclass(frozen=True)
class Parts:
    """The layers the schemes treat apart, each list in the model's module order."""

    qkv: list[nn.Linear]
    """Every attention's query, key and value projections."""
    out: list[nn.Linear]
    """Every attention's output projection."""
    ffn: list[nn.Linear]
    """Both layers of every feed-forward network."""
    token_embeddings: list[nn.Embedding]
    """The source and target embeddings (one module when shared)."""
    generator: nn.Linear
    """The pre-softmax projection (tied to the target embedding when shared)."""


def initialise(model: nn.Module, config: ModelConfig, parts: Parts) -> None:
    """Draw every weight of ``model`` (from torch's global generator) by ``config.init``."""
    # torch: query/key/value Xavier-uniform as one packed (3 D x D) matrix, i.e. gain 1/sqrt(2)
    # per projection; the attention output and the feed-forward layers nn.Linear's default
    # (uniform in +-1/sqrt(fan_in), about half of Xavier's scale); zero attention biases.
    # Xavier at gain 1 everywhere (tensor2tensor's) makes every sub-layer's output outweigh the
    # residual it is added to: with post-norm, a short warmup and small data the encoder's output
    # then collapses to one vector for every position (Multi30k: val_encoder_spread 0.06 after 50
    # steps, against 0.25-0.33 for torch.nn.Transformer on the same batches; docs/training.md,
    # docs/log/training.md).
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=config.d_model**-0.5)
        elif isinstance(module, nn.Linear) and module is not parts.generator:
            module.reset_parameters()
    for proj in parts.qkv:  # after the pass above, which reaches them too
        nn.init.xavier_uniform_(proj.weight, gain=2**-0.5)
    for proj in (*parts.qkv, *parts.out):
        nn.init.zeros_(proj.bias)
    if config.init == "fairseq":
        _fairseq(config, parts)
    if not config.share_embeddings:  # an untied output embedding, initialised alike
        nn.init.normal_(parts.generator.weight, mean=0.0, std=config.d_model**-0.5)


def _fairseq(config: ModelConfig, parts: Parts) -> None:
    """fairseq 0.9's scheme where it differs from torch's: attention output and feed-forward
    Xavier at gain 1 with zero biases, q/k/v biases at nn.Linear's default U(+-1/sqrt(fan_in))
    (its MultiheadAttention leaves them), the token embeddings' padding row zero."""
    for embedding in parts.token_embeddings:
        nn.init.zeros_(embedding.weight[config.pad_id])
    for layer in (*parts.out, *parts.ffn):
        nn.init.xavier_uniform_(layer.weight)
        nn.init.zeros_(layer.bias)
    for proj in parts.qkv:
        bound = proj.in_features**-0.5
        nn.init.uniform_(proj.bias, -bound, bound)
