"""Stage download: a parallel corpus in, the raw corpus folder out (``corpora.assemble``).

Out (docs/contracts.md): ``train/<corpus>.<src>``, ``train/<corpus>.<tgt>``, ``dev.<src>``,
``dev.<tgt>``, ``test.<src>``, ``test.<tgt>``, with src/tgt from ``data.pair``. Sources:
``wmt14`` (statmt.org or a mirror) and ``multi30k`` (the multi30k/dataset repository or a
mirror), whose files are cached outside the stage folder and pinned in a lock file once they
read cleanly (one that does not read is dropped, so a rerun downloads it again); ``local``
(a team's own files: ``<prefix>.<lang>``, gzipped or not, or ``<prefix>.tsv[.gz]``) and
``synthetic`` (the quickstart's grammar). The parsing pipeline reads treebank files in its own
first stage instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.framework.config import RunConfig, to_dict
from tasks.framework.contract import BuildContext
from tasks.framework.results import StageError
from tasks.framework.workdir import WorkDir

STAGE = "download"
CACHE = "cache/downloads"
LOCK = "downloads.lock.json"


def stage_config(config: RunConfig) -> dict[str, Any]:
    """The data section (and the seed, which the synthetic grammar draws from; for local files,
    their bytes: an edited file reruns the stage, a touched one does not)."""
    data = to_dict(config.data.with_eval_sets())  # the sets' names as the loader keeps them
    if config.data.source == "synthetic":
        data["seed"] = config.seed
    if config.data.source == "local" and config.data.local_dir:
        from corpora.local_files import fingerprinted_files
        from tasks.framework.content import file_digests

        folder = Path(config.data.local_dir)
        prefixes = (*config.data.local_train, config.data.local_dev, config.data.local_test)
        files = [
            path
            for prefix in prefixes
            for path in fingerprinted_files(folder, prefix, config.languages)
        ]
        data["local_files"] = file_digests(files, folder)
    return data


def cache_dir(config: RunConfig, workdir: WorkDir) -> Path:
    """Where downloaded files are kept between runs: ``data.cache_dir``, else this node's
    ``cache/downloads`` of the run."""
    return Path(config.data.cache_dir) if config.data.cache_dir else workdir.node_path(CACHE)


def lock_path(config: RunConfig, workdir: WorkDir) -> Path:
    """The lock file pinning each download's sha256 and size: ``data.lock_file``, else this
    node's ``downloads.lock.json`` of the run."""
    return Path(config.data.lock_file) if config.data.lock_file else workdir.node_path(LOCK)


def build(ctx: BuildContext) -> dict[str, Any]:
    """The raw corpus from the configured source into ``ctx.tmp`` (no inputs)."""
    from corpora import assemble, synthetic

    config, out = ctx.config, ctx.tmp
    data = config.data
    dev, test = data.eval_sets
    if data.source == "wmt14":
        return assemble.from_wmt14(
            out,
            pair=data.pair,
            corpora=data.corpora,
            dev=dev,
            test=test,
            test_variant=data.test_variant,
            mirror=data.mirror,
            cache=cache_dir(config, ctx.workdir),
            lock_file=lock_path(config, ctx.workdir),
            max_retries=data.max_retries,
        )
    if data.source == "multi30k":
        return assemble.from_multi30k(
            out,
            pair=data.pair,
            dev=dev,
            test=test,
            mirror=data.mirror,
            cache=cache_dir(config, ctx.workdir),
            lock_file=lock_path(config, ctx.workdir),
            max_retries=data.max_retries,
        )
    if data.source == "local":
        return assemble.from_local(
            out,
            pair=data.pair,
            local_dir=data.local_dir,
            train=data.local_train,
            dev=data.local_dev,
            test=data.local_test,
        )
    if data.source == "synthetic":
        return synthetic.write_corpus(
            out,
            pair=data.pair,
            seed=config.seed,
            train=data.synthetic_train,
            dev=data.synthetic_dev,
            test=data.synthetic_test,
            domain=data.synthetic_domain,
        )
    raise StageError(
        f"data.source={data.source!r} is not read by the download stage (the parsing "
        "pipeline reads treebank files in its treebank stage)"
    )
