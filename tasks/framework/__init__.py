"""The stage framework: what runs a stage, not what a stage computes.

``graph`` (which stages a pipeline runs and what each reads), ``runner`` (the one place a stage
runs: fingerprint, skip, temporary folder, manifest, tracking, publish; and ``tfm status``),
``contract`` (``BuildContext``: what a stage is given), ``config`` + ``config_sections`` (the run
config), ``workdir`` + ``workdir_store`` + ``workdir_place`` (the work dir seam: a local folder or
an object store), ``runtime`` (local Ray or a cluster), ``mlflow_runs`` (a config's MLflow runs,
through the ``tracking`` package: the flow's, a stage's, training's, the registry; ``tfm tracking
replay``), ``code_fingerprint`` (the definitions a stage reaches) and ``content`` (outside files by
their bytes). Nothing here imports a stage module: the runner finds stage ``x`` as ``tasks.x`` by
its name, the same name the code fingerprint reads. Everything in this package is plumbing to the
code fingerprint: changing it reruns no stage.
"""
