"""Normalisation and filters of parallel text: plain functions on Arrow arrays, no I/O.

Every line pair gets one verdict, the first filter that drops it (``REASONS``): invalid UTF-8,
empty side, too short / too long (whitespace tokens), too many characters, length ratio, source
equal to target, contaminated (either side occurs in the dev or test sets), duplicate.
``corpora.cleaning`` applies them through Ray Data.

The character bound exists because the token bounds count whitespace tokens only: a line without
spaces (a URL, base64, a table) is one "token" however long it is. The shard stage still drops
rows longer in pieces than the model takes (``corpora.encoding``); this bound is the cheap first
cut, before the tokenizer trains on such lines.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transformer_core.config_checks import ConfigError

__all__ = [
    "REASONS",
    "CleanConfig",
    "char_counts",
    "clean_lines",
    "count_reasons",
    "decode_lines",
    "filter_reasons",
    "mark_duplicates",
    "normalize_array",
    "pair_hashes",
    "token_counts",
]


@dataclass(frozen=True, kw_only=True)
class CleanConfig:
    """Filters of the clean stage."""

    min_len: int = 1
    """Fewest whitespace tokens per side."""
    max_len: int = 250
    """Most whitespace tokens per side."""
    max_chars: int = 3000
    """Most characters per side (after normalisation). The token bounds count whitespace tokens
    only; real text at max_len's 250 tokens is ~1,500 characters, so 3,000 keeps every sentence
    they keep and drops what they cannot see: lines without spaces (URLs, base64, markup) that
    would also run past the model's length in pieces."""
    max_ratio: float = 1.5
    """Largest allowed token-count ratio between the longer and the shorter side."""
    dedup: bool = True
    """Drop exact duplicate pairs."""
    drop_identical: bool = True
    """Drop pairs whose source equals their target."""
    decontaminate: bool = True
    """Drop training pairs whose source or target occurs in the dev or test sets."""
    batch_size: int = 4096
    """Lines per Ray Data batch (one batch is one range of lines read from both files)."""
    rows_per_file: int = 1_000_000
    """Kept pairs per output Parquet file."""

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.rows_per_file < 1:
            raise ConfigError(
                "batch_size",
                f"batch_size {self.batch_size} and rows_per_file {self.rows_per_file} must be >= 1",
            )
        if self.min_len < 0 or self.max_len < max(1, self.min_len):
            raise ConfigError(
                "max_len", f"{self.max_len} must be >= min_len {self.min_len} and >= 1"
            )
        if self.max_chars < 1:
            raise ConfigError("max_chars", f"{self.max_chars} must be >= 1")
        if self.max_ratio < 1.0:
            raise ConfigError("max_ratio", f"{self.max_ratio} must be >= 1.0")


# Verdict codes; the order is the order the filters are applied in.
REASONS = (
    "kept",
    "invalid_utf8",
    "empty",
    "too_short",
    "too_long",
    "too_many_chars",
    "ratio",
    "identical",
    "contaminated",
    "duplicate",
)
CODE = {name: i for i, name in enumerate(REASONS)}
TRAIN_SCHEMA = pa.schema([("src", pa.string()), ("tgt", pa.string())])

# C0/C1 control characters other than whitespace, the BOM and the zero-width space: removed.
_CONTROL = r"[\x{0}-\x{8}\x{E}-\x{1F}\x{7F}-\x{84}\x{86}-\x{9F}\x{FEFF}\x{200B}]"
# ASCII whitespace, vertical tab, NEL and every Unicode space separator (NBSP, U+2028, ...):
# one space.
_SPACE = r"[\s\x{B}\x{85}\p{Z}]+"
# The lines _SPACE changes: a run of two or more of its characters, or one that is not " ".
# ([\t-\r] is \s and \x{B} less " "; [^\PZ ] is \p{Z} less " ".) Matching is much cheaper than
# replacing every single space, and most lines have nothing to collapse.
_SPACE_TO_FIX = r"[\t-\r\x{85}\p{Z}]{2,}|[\t-\r\x{85}]|[^\PZ ]"


# ----------------------------------------------------------------------------- pure filters


def normalize_array(texts: pa.Array) -> pa.Array:
    """NFC, control characters removed, whitespace runs collapsed to one space, trimmed."""
    # pyarrow's utf8_normalize leaves combining sequences uncomposed here (pyarrow 25), so NFC
    # is Python's; most lines are already NFC and take the fast check only.
    texts = pa.array(
        [
            t
            if t is None or unicodedata.is_normalized("NFC", t)
            else unicodedata.normalize("NFC", t)
            for t in texts.to_pylist()
        ],
        pa.string(),
    )
    texts = pc.replace_substring_regex(texts, _CONTROL, "")
    fix = pc.fill_null(pc.match_substring_regex(texts, _SPACE_TO_FIX), False)
    rows = np.flatnonzero(fix.to_numpy(zero_copy_only=False))
    if len(rows):  # the same replacement, on the lines it changes only
        fixed = pc.replace_substring_regex(texts.take(pa.array(rows)), _SPACE, " ")
        texts = pc.replace_with_mask(texts, fix, fixed)
    return pc.utf8_trim(texts, " ")


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


def char_counts(texts: pa.Array) -> np.ndarray:
    """Characters (code points) per text."""
    return pc.fill_null(pc.utf8_length(texts), 0).to_numpy(zero_copy_only=False).astype(np.int64)


def filter_reasons(
    src: pa.Array,
    tgt: pa.Array,
    config: CleanConfig,
    *,
    valid: np.ndarray | None = None,
    contaminants: pa.Array | None = None,
) -> np.ndarray:
    """One verdict code (``REASONS``) per normalised pair, duplicates aside: the first filter
    that drops it."""
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
    mark(
        "too_many_chars",
        (char_counts(src) > config.max_chars) | (char_counts(tgt) > config.max_chars),
    )
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
    # them back), without the factorization, which mostly unique pairs make pure overhead.
    return pd.util.hash_array(joined.to_numpy(zero_copy_only=False), categorize=False)


def clean_lines(
    src_lines: list[bytes],
    tgt_lines: list[bytes],
    config: CleanConfig,
    contaminants: pa.Array | None = None,
) -> pa.Table:
    """Decode, normalise and judge raw line pairs: columns src, tgt ("" when dropped), reason,
    hash."""
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
