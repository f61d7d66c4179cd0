"""The published Multi30k recipe's data for every toolkit of ``benchmarks/peers``.

Our pipeline's own stages (download, clean, tokenizer, shard of configs/multi30k_en_de_tiny.yaml,
as ``tfm stage`` runs them) prepare it once in a work dir; then the clean text goes through the
tokenizer folder's pretokenization (lowercase, Moses, subword-nmt's 10k-merge BPE) into the
plain ``@@``-marked text files fairseq-preprocess and eole read:
``text/{train,valid,test}.{en,de}``.
Ours trains on the shard folder's ids of the same sentences.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "multi30k_en_de_tiny.yaml"
MIRROR = ROOT.parent / "shared" / "data" / "multi30k"
STAGES = ("download", "clean", "tokenizer", "shard")
SPLITS = {"train": "train", "valid": "dev", "test": "test"}
"""Peer file prefix -> our split name."""


@dataclass(frozen=True)
class Corpus:
    """Where the prepared data lives."""

    workdir: Path
    """The pipeline's work dir (its stage folders)."""
    text: Path
    """``{train,valid,test}.{src,tgt}``: pretokenized, BPE-segmented text, one sentence a line."""
    languages: tuple[str, str]
    """Source and target language codes."""
    pairs: dict[str, int]
    """Sentences per split in the text files."""

    @property
    def shard(self) -> Path:
        return self.workdir / "shard"

    @property
    def tokenizer(self) -> Path:
        return self.workdir / "tokenizer"

    def raw_test(self) -> Path:
        """The clean (not pretokenized) test2016 source: what ``tfm translate`` reads."""
        return self.workdir / "clean" / f"test.{self.languages[0]}"

    def reference(self) -> Path:
        """The clean test2016 references (cased, untokenized)."""
        return self.workdir / "clean" / f"test.{self.languages[1]}"


def default_mirror() -> str | None:
    """The shared Multi30k mirror when it is beside the checkout, else None (the config's URLs)."""
    return MIRROR.resolve().as_uri() if MIRROR.is_dir() else None


def prepare(workdir: Path, mirror: str | None) -> Corpus:
    """Our stages through shard in ``workdir`` (skipped when up to date), then the text files."""
    from tasks.framework.config import load_config
    from tasks.framework.runner import run_stage

    workdir = workdir.resolve()
    overrides: dict[str, object] = {"workdir": str(workdir)}
    if mirror:
        overrides["data.mirror"] = mirror
    config = load_config(CONFIG, overrides)
    for stage in STAGES:
        result = run_stage(config, stage)
        print(f"  {stage}: {'ran' if result.ran else 'up to date'}", flush=True)
    return write_text(workdir, config.languages)


def write_text(workdir: Path, languages: tuple[str, str]) -> Corpus:
    """``workdir/text``: the clean splits as the tokenizer folder prepares them (lowercased,
    Moses-tokenized, BPE pieces joined by spaces); rewritten only when the tokenizer changed."""
    import pyarrow.parquet as pq

    from corpora.parquet import part_files
    from corpora.text import read_lines
    from serving import tokenizer as tokenizer_lib

    text, stamp_file = workdir / "text", workdir / "text" / "stamp.json"
    manifest = json.loads((workdir / "tokenizer" / "manifest.json").read_text(encoding="utf-8"))
    stamp = {"tokenizer": manifest["fingerprint"]}
    if stamp_file.is_file() and json.loads(stamp_file.read_text())["stamp"] == stamp:
        return Corpus(workdir, text, languages, json.loads(stamp_file.read_text())["pairs"])
    tokenizer = tokenizer_lib.load(workdir / "tokenizer")
    text.mkdir(parents=True, exist_ok=True)
    pairs = {}
    for prefix, split in SPLITS.items():
        if split == "train":
            tables = [
                pq.read_table(f, columns=["src", "tgt"])
                for f in part_files(workdir / "clean" / "train")
            ]
            sides = [[s for t in tables for s in t.column(c).to_pylist()] for c in ("src", "tgt")]
        else:
            sides = [read_lines(workdir / "clean" / f"{split}.{lang}") for lang in languages]
        for side, (lang, lines) in enumerate(zip(languages, sides, strict=True)):
            prepared = tokenizer.prepare(lines, side)
            (text / f"{prefix}.{lang}").write_text("\n".join(prepared) + "\n", encoding="utf-8")
        pairs[prefix] = len(sides[0])
    stamp_file.write_text(json.dumps({"stamp": stamp, "pairs": pairs}) + "\n", encoding="utf-8")
    return Corpus(workdir, text, languages, pairs)
