"""Stage export: the averaged model as a CTranslate2 folder (the distill pipeline's student,
int8 by default: what distilled students ship as).

In: ``average`` (``model.pt``), ``tokenizer``. Out: ``ctranslate2/`` (``serving.ct2_export``:
the weights in ``export.quantization``, the tokenizer files, and ``export.json`` with the
keyword arguments of ``ctranslate2.Translator.translate_batch`` that decode as the config's
``decode`` section says). Needs the ``ctranslate2`` package (the ``serve`` extra).
"""

from __future__ import annotations

import logging
from typing import Any

from tasks.framework.config import RunConfig, to_dict
from tasks.framework.contract import BuildContext

log = logging.getLogger(__name__)

STAGE = "export"
FOLDER = "ctranslate2"


def stage_config(config: RunConfig) -> dict[str, Any]:
    """The export section and the decoding the export describes."""
    return {"export": to_dict(config.export), "decode": to_dict(config.decoding)}


def build(ctx: BuildContext) -> dict[str, Any]:
    """Export ``inputs["average"]`` with ``inputs["tokenizer"]`` into ``ctx.tmp/ctranslate2``."""
    from serving.export import export
    from transformer_core.checkpoint import model_file

    config = ctx.config
    quantization = config.export.quantization
    out = export(
        "ctranslate2",
        model_file(ctx.inputs["average"]),
        ctx.inputs["tokenizer"],
        ctx.tmp / FOLDER,
        quantization,
        config.decoding,
    )
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    log.info("export: CTranslate2, %s, %.1f MB", quantization, size / 1e6)
    return {"to": "ctranslate2", "quantization": quantization, "bytes": size}
