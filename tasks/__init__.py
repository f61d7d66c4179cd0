"""tasks: the pipeline's stages, one module each, and what they share.

Stages (each ``run(config, inputs, *, force) -> StageResult`` and ``stage_config(config)``):
``download``, ``clean``, ``tokenizer``, ``shard``, ``train``, ``average``, ``translate``,
``score``, ``register`` (WMT14 and every translation source), and ``treebank``, ``linearize``,
``parse_score`` (the parsing pipeline, which reuses tokenizer to translate). Shared: the stage
contract (``contract``: manifests, fingerprints, atomic writes), the stage graph (``graph``),
the run config (``config``) and the runtimes (``runtime``: Ray, MLflow). Stages are thin: the
work is done by the libraries (``corpora``, ``parsing``, ``training``, ``evaluation``,
``serving``, ``transformer_core``), which never import a stage.
"""
