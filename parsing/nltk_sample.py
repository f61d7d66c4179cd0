"""Where NLTK keeps its 10% sample of the WSJ treebank (``python -m nltk.downloader treebank``):
the folder a parsing config that names no ``parsing.treebank_dir`` reads.

NLTK is no dependency of the pipeline: when it is installed its own search path
(``nltk.data.path``) is asked, else the folders NLTK searches by default (``NLTK_DATA``, then
``~/nltk_data``, then the system's), so a sample fetched with another Python is found as well.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

__all__ = ["DOWNLOAD", "SAMPLE", "data_paths", "find_sample"]

DOWNLOAD = "python -m nltk.downloader treebank"
"""The command that fetches the sample (it needs ``pip install nltk``)."""
SAMPLE = Path("corpora") / "treebank" / "combined"
"""The sample's ``.mrg`` files (wsj_0001.mrg ... wsj_0199.mrg) under an NLTK data folder."""


def data_paths() -> list[Path]:
    """NLTK's data folders in the order NLTK searches them (module doc)."""
    if importlib.util.find_spec("nltk") is not None:
        return [Path(p) for p in importlib.import_module("nltk.data").path]
    # NLTK's defaults (nltk/data.py), read when asked, never at import.
    given = [Path(p) for p in os.environ.get("NLTK_DATA", "").split(os.pathsep) if p]
    prefix = Path(sys.prefix)
    return [
        *given,
        Path.home() / "nltk_data",
        prefix / "nltk_data",
        prefix / "share" / "nltk_data",
        prefix / "lib" / "nltk_data",
        Path("/usr/share/nltk_data"),
        Path("/usr/local/share/nltk_data"),
        Path("/usr/lib/nltk_data"),
        Path("/usr/local/lib/nltk_data"),
    ]


def find_sample(paths: list[Path] | None = None) -> Path | None:
    """The sample's folder under the first of ``paths`` (NLTK's, by default) that holds it, or
    None."""
    for root in data_paths() if paths is None else paths:
        if (root / SAMPLE).is_dir():
            return root / SAMPLE
    return None
