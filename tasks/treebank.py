"""Stage treebank: the user's treebank read, cleaned and split (``parsing.trees``).

In: nothing (``parsing.treebank_dir`` and the split patterns in the config). Out:
``{train,dev,test}.trees``, one cleaned tree per line; counts per split in the manifest.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from parsing import nltk_sample
from tasks.framework.config import ParsingConfig, RunConfig
from tasks.framework.content import files_digest
from tasks.framework.contract import BuildContext
from tasks.framework.results import StageError

STAGE = "treebank"
SPLITS = ("train", "dev", "test")


def located(parsing: ParsingConfig) -> ParsingConfig:
    """``parsing`` with its treebank folder: ``treebank_dir``, else NLTK's WSJ sample where the
    first NLTK data folder holding it has it (looked for here, by the stage: building a config
    looks at no data); as it is when neither is there (``split_files`` says how to get it)."""
    if parsing.treebank_dir is not None:
        return parsing
    sample = nltk_sample.find_sample()
    return parsing if sample is None else dataclasses.replace(parsing, treebank_dir=str(sample))


def split_files(parsing: ParsingConfig) -> dict[str, list[Path]]:
    """The files of each split: the union of its glob patterns under ``treebank_dir``, sorted.
    A pattern that matches nothing, or a file in two splits, is an error."""
    if not parsing.treebank_dir:
        raise StageError(
            f"parsing.treebank_dir is not set and no NLTK data folder holds {nltk_sample.SAMPLE}: "
            f"`{nltk_sample.DOWNLOAD}` fetches NLTK's WSJ sample (pip install nltk first), or "
            "point the key at a treebank folder, for example a licensed LDC99T42 copy's "
            "parsed/mrg/wsj (docs/parsing.md)"
        )
    root = Path(parsing.treebank_dir)
    if not root.is_dir():
        raise StageError(f"parsing.treebank_dir: {root} is not a folder")
    files: dict[str, list[Path]] = {}
    owner: dict[Path, str] = {}
    for split in SPLITS:
        found: set[Path] = set()
        for pattern in getattr(parsing, f"{split}_files"):
            matches = {p for p in root.glob(pattern) if p.is_file()}
            if not matches:
                raise StageError(f"parsing.{split}_files: {pattern!r} matches no file under {root}")
            found |= matches
        for path in found:
            if path in owner:
                raise StageError(
                    f"{path.relative_to(root)} is in both the {owner[path]} and the {split} split"
                )
            owner[path] = split
        files[split] = sorted(found, key=lambda p: p.relative_to(root).as_posix())
    return files


def stage_config(config: RunConfig) -> dict[str, Any]:
    """The folder, the patterns, and the matched files (relative path and bytes), so a changed
    treebank reruns the stage."""
    parsing = located(config.parsing)
    data: dict[str, Any] = {
        "treebank_dir": parsing.treebank_dir,
        "train_files": list(parsing.train_files),
        "dev_files": list(parsing.dev_files),
        "test_files": list(parsing.test_files),
    }
    try:
        files = split_files(parsing)
    except StageError:
        data["sources"] = None  # run() reports the problem; status() must not fail on it
        return data
    root = Path(parsing.treebank_dir or ".")
    data["sources"] = {
        split: {"files": len(paths), "digest": files_digest(paths, root)}
        for split, paths in files.items()
    }
    return data


def build(ctx: BuildContext) -> dict[str, Any]:
    """Read, clean and split the treebank into ``ctx.tmp/{train,dev,test}.trees``."""
    from parsing.trees import clean_tree, read_trees, write_tree

    tmp = ctx.tmp
    files = split_files(located(ctx.config.parsing))
    stats: dict[str, Any] = {}
    for split in SPLITS:
        trees = emptied = words = 0
        with open(tmp / f"{split}.trees", "w", encoding="utf-8") as out:
            for path in files[split]:
                for tree in read_trees(path):
                    cleaned = clean_tree(tree)
                    if cleaned is None:
                        emptied += 1
                        continue
                    out.write(write_tree(cleaned) + "\n")
                    trees += 1
                    words += len(cleaned.leaves())
        stats[f"{split}_files"] = len(files[split])
        stats[f"{split}_trees"] = trees
        stats[f"{split}_words"] = words
        stats[f"{split}_emptied"] = emptied
    return stats
