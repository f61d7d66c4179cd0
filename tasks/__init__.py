"""tasks: the pipeline's stages, one module each; the machinery that runs them is
``tasks.framework``.

Stages: ``download``, ``clean``, ``tokenizer``, ``shard``, ``train``, ``average``,
``translate``, ``score``, ``register`` (WMT14 and every translation source), and ``treebank``,
``linearize``, ``parse_score`` (the parsing pipeline, which reuses tokenizer to translate), and
``fairseq_import`` (the fairseq pipeline: a fairseq checkpoint, then register). A
stage module says only what it alone knows: ``stage_config(config)`` (what it fingerprints
besides its inputs), ``build(ctx)`` (writes its output into ``ctx.tmp``, returns its stats) and,
for register, ``outdated(config, folder)``; ``tasks.framework.runner`` runs every one of them.
Stages are thin: the work is done by the libraries (``corpora``, ``parsing``, ``training``,
``evaluation``, ``serving``, ``transformer_core``), which never import a stage.
"""
