"""Stage 2, clean: normalise and filter the parallel training corpus through Ray Data.

Every line pair gets one verdict, the first filter that drops it (``REASONS``): invalid UTF-8,
empty side, too short / too long (whitespace tokens), length ratio, source equal to target,
contaminated (either side occurs in the dev or test sets), duplicate. The filters are plain
functions on Arrow arrays; Ray Data applies them per batch, where one batch is one range of
``clean.batch_size`` lines read straight from both files (a cheap newline index in the driver
finds the ranges, so the two files stay aligned without being zipped first).

Exact duplicates are found after the map, in the driver, while the ordered output streams into
Parquet: each pair carries a 64-bit hash and the driver keeps the set of hashes seen (about
60 bytes per unique pair: 0.3 GB for WMT14 En-De's 4.5M pairs). The first occurrence in
(corpus name, line) order is kept, so the output is deterministic. The dev/test set used for
decontamination is small and is broadcast with the map function.
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks.artifacts import StageError, run_stage
from tasks.config import CleanConfig

log = logging.getLogger(__name__)

__all__ = [
    "REASONS", "normalize", "normalize_array", "decode_lines", "token_counts", "filter_reasons",
    "pair_hashes", "clean_lines", "mark_duplicates", "count_reasons", "line_index", "read_lines",
    "ParquetShardWriter", "languages", "run", "stage_config", "iter_train",
]

# Verdict codes; the order is the order the filters are applied in.
REASONS = ("kept", "invalid_utf8", "empty", "too_short", "too_long", "ratio", "identical",
           "contaminated", "duplicate")
CODE = {name: i for i, name in enumerate(REASONS)}
TRAIN_SCHEMA = pa.schema([("src", pa.string()), ("tgt", pa.string())])

# C0/C1 control characters other than whitespace, the BOM and the zero-width space: removed.
_CONTROL = r"[\x{0}-\x{8}\x{E}-\x{1F}\x{7F}-\x{84}\x{86}-\x{9F}\x{FEFF}\x{200B}]"
# ASCII whitespace, vertical tab, NEL and every Unicode space separator (NBSP, U+2028, ...): one space.
_SPACE = r"[\s\x{B}\x{85}\p{Z}]+"
# The lines _SPACE changes: a run of two or more of its characters, or one that is not " ".
# ([\t-\r] is \s and \x{B} less " "; [^\PZ ] is \p{Z} less " ".) Matching is ~10x cheaper than
# replacing every single space, and most lines have nothing to collapse.
_SPACE_TO_FIX = r"[\t-\r\x{85}\p{Z}]{2,}|[\t-\r\x{85}]|[^\PZ ]"


# ----------------------------------------------------------------------------- pure filters


def normalize_array(texts: pa.Array) -> pa.Array:
    """NFC, control characters removed, whitespace runs collapsed to one space, trimmed."""
    # pyarrow's utf8_normalize leaves combining sequences uncomposed here (pyarrow 25), so NFC
    # is Python's; most lines are already NFC and take the fast check only.
    texts = pa.array(
        [t if t is None or unicodedata.is_normalized("NFC", t) else unicodedata.normalize("NFC", t)
         for t in texts.to_pylist()],
        pa.string(),
    )
    texts = pc.replace_substring_regex(texts, _CONTROL, "")
    fix = pc.fill_null(pc.match_substring_regex(texts, _SPACE_TO_FIX), False)
    rows = np.flatnonzero(fix.to_numpy(zero_copy_only=False))
    if len(rows):  # the same replacement, on the lines it changes only
        fixed = pc.replace_substring_regex(texts.take(pa.array(rows)), _SPACE, " ")
        texts = pc.replace_with_mask(texts, fix, fixed)
    return pc.utf8_trim(texts, " ")


def normalize(text: str) -> str:
    """``normalize_array`` for one string (what dev and test lines get, too)."""
    return normalize_array(pa.array([text], pa.string()))[0].as_py()


def decode_lines(lines: list[bytes]) -> tuple[pa.Array, np.ndarray]:
    """Lines as an Arrow string array, and a mask of the lines that were valid UTF-8 ("" if not)."""
    raw = pa.array(lines, pa.binary())
    try:
        return raw.cast(pa.string()), np.ones(len(lines), dtype=bool)
    except pa.ArrowInvalid:
        valid = np.ones(len(lines), dtype=bool)
        texts = []
        for i, line in enumerate(lines):
            try:
                texts.append(line.decode("utf-8"))
            except UnicodeDecodeError:
                valid[i] = False
                texts.append("")
        return pa.array(texts, pa.string()), valid


def token_counts(texts: pa.Array) -> np.ndarray:
    """Whitespace tokens per normalised text (0 for the empty string)."""
    # Arrow splits "" into [""]: count only non-empty pieces.
    pieces = pc.utf8_split_whitespace(texts)
    flat = pc.list_flatten(pieces)
    parents = pc.list_parent_indices(pieces).to_numpy(zero_copy_only=False)
    nonempty = pc.not_equal(flat, "").to_numpy(zero_copy_only=False)
    return np.bincount(parents[nonempty], minlength=len(texts)).astype(np.int64)


def filter_reasons(
    src: pa.Array,
    tgt: pa.Array,
    config: CleanConfig,
    *,
    valid: np.ndarray | None = None,
    contaminants: pa.Array | None = None,
) -> np.ndarray:
    """One verdict code (``REASONS``) per normalised pair, duplicates aside: the first filter that drops it."""
    n = len(src)
    reasons = np.zeros(n, dtype=np.int8)

    def mark(code: str, mask: np.ndarray) -> None:
        reasons[(reasons == 0) & mask] = CODE[code]

    if valid is not None:
        mark("invalid_utf8", ~valid)
    ls, lt = token_counts(src), token_counts(tgt)
    mark("empty", (ls == 0) | (lt == 0))
    mark("too_short", (ls < config.min_len) | (lt < config.min_len))
    mark("too_long", (ls > config.max_len) | (lt > config.max_len))
    longer, shorter = np.maximum(ls, lt), np.maximum(np.minimum(ls, lt), 1)
    mark("ratio", longer > config.max_ratio * shorter)
    if config.drop_identical:
        mark("identical", pc.equal(src, tgt).to_numpy(zero_copy_only=False))
    if config.decontaminate and contaminants is not None and len(contaminants):
        hit = pc.or_(pc.is_in(src, value_set=contaminants), pc.is_in(tgt, value_set=contaminants))
        mark("contaminated", hit.to_numpy(zero_copy_only=False))
    return reasons


def pair_hashes(src: pa.Array, tgt: pa.Array) -> np.ndarray:
    """A stable 64-bit hash per pair (pandas' SipHash with its fixed key; same in every process)."""
    import pandas as pd

    # Normalised text holds no tab, so "src\ttgt" identifies the pair.
    joined = pc.binary_join_element_wise(src, tgt, "\t")
    # categorize=False: the same values as the default (which hashes the unique strings and maps
    # them back), without the factorization, five times faster on mostly unique pairs.
    return pd.util.hash_array(joined.to_numpy(zero_copy_only=False), categorize=False)


def clean_lines(
    src_lines: list[bytes],
    tgt_lines: list[bytes],
    config: CleanConfig,
    contaminants: pa.Array | None = None,
) -> pa.Table:
    """Decode, normalise and judge raw line pairs: columns src, tgt ("" when dropped), reason, hash."""
    src, src_ok = decode_lines(src_lines)
    tgt, tgt_ok = decode_lines(tgt_lines)
    src, tgt = normalize_array(src), normalize_array(tgt)
    reasons = filter_reasons(src, tgt, config, valid=src_ok & tgt_ok, contaminants=contaminants)
    hashes = pair_hashes(src, tgt)
    dropped = pa.array(reasons != 0)
    # Dropped rows travel as empty strings: the driver only counts them.
    src = pc.if_else(dropped, "", src)
    tgt = pc.if_else(dropped, "", tgt)
    return pa.table({"src": src, "tgt": tgt, "reason": pa.array(reasons), "hash": pa.array(hashes)})


def mark_duplicates(reasons: np.ndarray, hashes: np.ndarray, seen: set[int]) -> np.ndarray:
    """Mark kept pairs whose hash is in ``seen`` as duplicates; add the others to ``seen``."""
    reasons = reasons.copy()
    dup = CODE["duplicate"]
    kept = np.flatnonzero(reasons == 0)
    for i, h in zip(kept.tolist(), hashes[kept].tolist(), strict=True):
        if h in seen:
            reasons[i] = dup
        else:
            seen.add(h)
    return reasons


def count_reasons(reasons: np.ndarray) -> dict[str, int]:
    """Rows per verdict, every verdict present."""
    counts = np.bincount(reasons.astype(np.int64), minlength=len(REASONS))
    return {name: int(counts[i]) for i, name in enumerate(REASONS)}


# ----------------------------------------------------------------------------- reading


def line_index(path: Path, every: int) -> tuple[list[int], int]:
    """Byte offsets where lines 0, every, 2*every, ... start, and the number of lines."""
    starts, newlines, pos, last = [0], 0, 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            nl = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
            ordinal = np.arange(newlines + 1, newlines + 1 + len(nl))
            starts.extend((pos + nl[ordinal % every == 0] + 1).tolist())
            newlines += len(nl)
            pos += len(block)
            last = block[-1:]
    n_lines = newlines + (1 if pos and last != b"\n" else 0)
    return [s for s in starts if s < pos], n_lines


def read_lines(path: str, start: int, end: int) -> list[bytes]:
    """The lines in bytes ``start..end`` of a file, without their newlines."""
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    return lines


def languages(config: Any) -> tuple[str, str]:
    """Source and target file suffixes: from ``data.pair`` (``en-de`` -> ``("en", "de")``), or
    ``("words", "tree")`` for the parsing pipeline (the linearize stage's dev/test names)."""
    if config.data.source == "treebank":
        return "words", "tree"
    src, _, tgt = config.data.pair.partition("-")
    if not src or not tgt:
        raise StageError(f"data.pair: {config.data.pair!r} must look like src-tgt, e.g. en-de")
    return src, tgt


def _ranges(download: Path, src: str, tgt: str, every: int) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Aligned line ranges of every training corpus, in corpus-name order."""
    train = download / "train"
    corpora = sorted(p.name[: -len(src) - 1] for p in train.glob(f"*.{src}"))
    if not corpora:
        raise StageError(f"clean: no training corpus *.{src} in {train}")
    items, lines = [], {}
    for corpus in corpora:
        src_path, tgt_path = train / f"{corpus}.{src}", train / f"{corpus}.{tgt}"
        if not tgt_path.is_file():
            raise StageError(f"clean: corpus {corpus!r} has {src_path.name} but no {tgt_path.name}")
        src_starts, n_src = line_index(src_path, every)
        tgt_starts, n_tgt = line_index(tgt_path, every)
        if n_src != n_tgt:
            raise StageError(
                f"clean: corpus {corpus!r} is misaligned: {src_path.name} has {n_src} lines, "
                f"{tgt_path.name} has {n_tgt}"
            )
        lines[corpus] = n_src
        src_ends = src_starts[1:] + [src_path.stat().st_size]
        tgt_ends = tgt_starts[1:] + [tgt_path.stat().st_size]
        for i in range(len(src_starts)):
            items.append({
                "src_path": str(src_path), "tgt_path": str(tgt_path),
                "src_start": src_starts[i], "src_end": src_ends[i],
                "tgt_start": tgt_starts[i], "tgt_end": tgt_ends[i],
                "lines": min(every, n_src - i * every),
            })
    return items, lines


def _clean_ranges(batch: Mapping[str, np.ndarray], config: CleanConfig, contaminants: pa.Array) -> pa.Table:
    """Ray Data batch function: read and clean each line range of the batch."""
    tables = []
    for i in range(len(batch["src_path"])):
        src_lines = read_lines(str(batch["src_path"][i]), int(batch["src_start"][i]), int(batch["src_end"][i]))
        tgt_lines = read_lines(str(batch["tgt_path"][i]), int(batch["tgt_start"][i]), int(batch["tgt_end"][i]))
        expected = int(batch["lines"][i])
        if len(src_lines) != expected or len(tgt_lines) != expected:  # pragma: no cover - file changed
            raise StageError(f"clean: {batch['src_path'][i]} changed while it was being read")
        tables.append(clean_lines(src_lines, tgt_lines, config, contaminants))
    return pa.concat_tables(tables)


# ----------------------------------------------------------------------------- writing


class ParquetShardWriter:
    """Writes an ordered stream of Arrow tables as ``part-00000.parquet``... of ``rows_per_file`` rows.

    Same input tables, same files byte for byte: each incoming table (cut at file boundaries)
    becomes one row group, and the writer options are fixed.
    """

    def __init__(self, folder: Path, schema: pa.Schema, rows_per_file: int, compression: str = "zstd"):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.schema = schema
        self.rows_per_file = rows_per_file
        self.compression = compression
        self.files: list[Path] = []
        self.rows = 0
        self._writer: pq.ParquetWriter | None = None
        self._in_file = 0

    def write(self, table: pa.Table) -> None:
        """Append rows (in order)."""
        table = table.select(self.schema.names).cast(self.schema)
        offset = 0
        while offset < table.num_rows:
            if self._writer is None or self._in_file == self.rows_per_file:
                self._open()
            take = min(self.rows_per_file - self._in_file, table.num_rows - offset)
            chunk = table.slice(offset, take)
            self._writer.write_table(chunk, row_group_size=max(1, take))
            self._in_file += take
            self.rows += take
            offset += take

    def close(self) -> list[Path]:
        """Finish the last file (an empty stream still gives one file with the schema); the paths."""
        if self._writer is None:
            self._open()
        self._writer.close()
        self._writer = None
        return self.files

    def _open(self) -> None:
        if self._writer is not None:
            self._writer.close()
        path = self.folder / f"part-{len(self.files):05d}.parquet"
        self.files.append(path)
        self._writer = pq.ParquetWriter(path, self.schema, compression=self.compression)
        self._in_file = 0


# ----------------------------------------------------------------------------- the stage


def _copy_through(src_file: Path, out_file: Path) -> dict[str, int]:
    """Normalise a dev/test file line by line (lines are kept, never dropped: they are references)."""
    raw = src_file.read_bytes()
    lines = raw.split(b"\n")
    if raw.endswith(b"\n"):
        lines.pop()
    texts, valid = decode_lines(lines)
    invalid = int((~valid).sum())
    if invalid:  # keep the line count; replace what cannot be decoded
        texts = pa.array([line.decode("utf-8", errors="replace") for line in lines], pa.string())
    texts = normalize_array(texts).to_pylist()
    out_file.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    return {"lines": len(texts), "invalid_utf8": invalid}


def _eval_sets(download: Path, out: Path, src: str, tgt: str) -> tuple[dict[str, Any], list[str]]:
    stats: dict[str, Any] = {}
    sentences: set[str] = set()
    for split in ("dev", "test"):
        counts = {}
        for lang in (src, tgt):
            path = download / f"{split}.{lang}"
            if not path.is_file():
                raise StageError(f"clean: {path} is missing (the download stage writes dev and test sets)")
            counts[lang] = _copy_through(path, out / f"{split}.{lang}")
            sentences.update((out / f"{split}.{lang}").read_text(encoding="utf-8").splitlines())
        if counts[src]["lines"] != counts[tgt]["lines"]:
            raise StageError(
                f"clean: {split} set is misaligned: {split}.{src} has {counts[src]['lines']} lines, "
                f"{split}.{tgt} has {counts[tgt]['lines']}"
            )
        stats[split] = {"lines": counts[src]["lines"],
                        "invalid_utf8": counts[src]["invalid_utf8"] + counts[tgt]["invalid_utf8"]}
    sentences.discard("")
    return stats, sorted(sentences)


def clean_corpus(
    download: Path, out: Path, config: CleanConfig, src: str, tgt: str, *, rows_per_file: int
) -> dict[str, Any]:
    """Clean ``download`` into ``out`` (train/*.parquet, dev.*, test.*); the manifest stats."""
    import ray

    download, out = Path(download), Path(out)
    eval_stats, eval_sentences = _eval_sets(download, out, src, tgt)
    items, corpus_lines = _ranges(download, src, tgt, config.batch_size)
    contaminants = pa.array(eval_sentences, pa.string())

    ds = ray.data.from_items(items, override_num_blocks=max(1, len(items)))
    ds = ds.map_batches(
        _clean_ranges,
        batch_size=1,
        batch_format="numpy",
        fn_kwargs={"config": config, "contaminants": contaminants},
    )
    ds.context.execution_options.preserve_order = True  # dedup keeps the first in corpus order

    writer = ParquetShardWriter(out / "train", TRAIN_SCHEMA, rows_per_file)
    seen: set[int] = set()
    totals = np.zeros(len(REASONS), dtype=np.int64)
    for block in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
        reasons = block["reason"].to_numpy()
        if config.dedup:
            reasons = mark_duplicates(reasons, block["hash"].to_numpy(), seen)
        totals += np.bincount(reasons.astype(np.int64), minlength=len(REASONS))
        kept = block.filter(pa.array(reasons == 0))
        if kept.num_rows:
            writer.write(kept)
    files = writer.close()
    counts = {name: int(totals[i]) for i, name in enumerate(REASONS)}
    kept_rows = counts.pop("kept")
    n_input = sum(corpus_lines.values())
    if kept_rows == 0:
        raise StageError(f"clean: no training pairs left after cleaning {n_input} (dropped: {counts})")
    return {
        "input": n_input,
        "dropped": counts,
        "kept": kept_rows,
        "corpora": corpus_lines,
        "train_files": len(files),
        **eval_stats,
    }


def stage_config(config: Any) -> CleanConfig:
    """What the stage fingerprints besides its input: the clean section."""
    return config.clean


def run(config: Any, inputs: Mapping[str, Path], *, force: bool = False) -> Path:
    """Run the clean stage: ``inputs["download"]`` -> ``<root>/clean``."""
    from tasks.runtime import ensure_ray

    download = Path(inputs["download"])
    src, tgt = languages(config)

    def build(tmp: Path) -> dict[str, Any]:
        ensure_ray(config.ray)
        stats = clean_corpus(download, tmp, config.clean, src, tgt, rows_per_file=config.clean.rows_per_file)
        log.info("clean: %d of %d pairs kept; dropped %s", stats["kept"], stats["input"], stats["dropped"])
        return stats

    return run_stage("clean", config.root / "clean", stage_config(config), {"download": download}, build, force=force)


def iter_train(folder: Path, columns: Iterable[str] = ("src", "tgt"), batch_size: int = 65536):
    """Stream the clean stage's training pairs as Arrow record batches, in order."""
    for path in sorted((Path(folder) / "train").glob("*.parquet")):
        yield from pq.ParquetFile(path).iter_batches(batch_size=batch_size, columns=list(columns))
