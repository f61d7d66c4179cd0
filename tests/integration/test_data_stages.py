"""Clean, tokenizer and shard through real Ray Data and sentencepiece, on tiny corpora made here."""

from __future__ import annotations

import dataclasses
import io
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sacremoses import MosesDetokenizer, MosesTokenizer

from corpora import CorpusError, synthetic
from corpora.encoding import SHARD_SCHEMA
from corpora.filters import normalize_array
from serving.tokenizer import load as load_tokenizer
from tasks import shard
from tasks.framework.config import (
    CleanConfig,
    DataConfig,
    RayConfig,
    RunConfig,
    ShardConfig,
    TokenizerConfig,
)
from tasks.framework.manifest import read_manifest
from tasks.framework.results import StageError
from tasks.framework.runner import build_folder, run_stage
from training.data import TokenData
from transformer_core.special_ids import EOS_ID

# Every test here runs stages on a local Ray.
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_local")]


def make_config(root: Path, **changes) -> RunConfig:
    config = RunConfig(
        name="t",
        workdir=str(root),
        data=DataConfig(synthetic_train=1500, synthetic_dev=60, synthetic_test=60),
        clean=CleanConfig(batch_size=200, rows_per_file=700),
        tokenizer=TokenizerConfig(vocab_size=400, sample_size=2000, threads=1),
        shard=ShardConfig(rows_per_shard=500, num_actors=2, batch_size=128, cpus_per_actor=0.5),
        ray=RayConfig(num_cpus=2),
    )
    return config.replace(**changes)


def write_download(
    root: Path,
    train: dict[str, tuple[list[bytes], list[bytes]]],
    dev: tuple[list[str], list[str]],
    test: tuple[list[str], list[str]],
) -> Path:
    """The download stage's layout, written by hand, with a real manifest."""

    def build(tmp: Path) -> dict:
        (tmp / "train").mkdir()
        for corpus, (src, tgt) in train.items():
            (tmp / "train" / f"{corpus}.en").write_bytes(b"".join(line + b"\n" for line in src))
            (tmp / "train" / f"{corpus}.de").write_bytes(b"".join(line + b"\n" for line in tgt))
        for split, (src, tgt) in (("dev", dev), ("test", test)):
            (tmp / f"{split}.en").write_text("".join(s + "\n" for s in src), encoding="utf-8")
            (tmp / f"{split}.de").write_text("".join(s + "\n" for s in tgt), encoding="utf-8")
        return {}

    tag = json.dumps([sorted(train), len(dev[0])])
    return build_folder("download", root / "download", {"hand": tag}, {}, build).path


# ----------------------------------------------------------------------------- clean


def test_clean_reports_every_filter_count(tmp_path):
    config = make_config(tmp_path, clean=CleanConfig(batch_size=16, rows_per_file=50, max_len=12))
    base_src = [f"sentence number {i} in english".encode() for i in range(100)]
    base_tgt = [f"Satz Nummer {i} auf Deutsch".encode() for i in range(100)]
    test_src = ["a test sentence that must not leak", "another test line here"]
    test_tgt = ["ein Testsatz der nicht lecken darf", "noch eine Testzeile hier"]
    planted = [
        (b"", b"nur deutsch"),  # empty
        (b"   \t ", b"leer nach Normalisierung"),  # empty (whitespace only)
        (b" ".join([b"w"] * 13), b" ".join([b"v"] * 13)),  # too_long (max_len 12)
        (b"one two three four five six", b"eins zwei"),  # ratio
        (b"Berlin Hamburg Bremen", b"Berlin Hamburg Bremen"),  # identical
        (test_src[0].encode(), b"irgendein deutscher Satz steht genau hier"),  # contaminated (src)
        (b"some english words", test_tgt[1].encode()),  # contaminated (tgt)
        (b"bad \xff\xfe bytes here", b"kaputte Bytes hier"),  # invalid_utf8
        (base_src[3], base_tgt[3]),  # duplicate
        (
            b"sentence  number 5 in\x00 english",
            b"Satz Nummer 5 auf Deutsch",
        ),  # duplicate after normalisation
    ]
    src = base_src[:50] + [p[0] for p in planted] + base_src[50:]
    tgt = base_tgt[:50] + [p[1] for p in planted] + base_tgt[50:]
    other_src = [b"cafe\xcc\x81 au lait please", b"one more pair"]  # NFD input
    other_tgt = [b"Milchkaffee bitte sehr", b"noch ein Paar"]
    download = write_download(
        tmp_path,
        {"europarl": (src, tgt), "zz": (other_src, other_tgt)},
        (["dev one two", "dev three four"], ["dev eins zwei", "dev drei vier"]),
        (test_src, test_tgt),
    )
    result = run_stage(config, "clean", {"download": download})
    out, stats = result.path, result.stats
    assert stats == read_manifest(out)["stats"]
    print("clean stats:", json.dumps(stats))
    assert stats["input"] == 112
    assert stats["dropped"] == {
        "invalid_utf8": 1,
        "empty": 2,
        "too_short": 0,
        "too_long": 1,
        "too_many_chars": 0,
        "ratio": 1,
        "identical": 1,
        "contaminated": 2,
        "duplicate": 2,
    }
    assert stats["kept"] == 102
    assert stats["corpora"] == {"europarl": 110, "zz": 2}
    files = sorted((out / "train").glob("*.parquet"))
    assert [f.name for f in files] == [
        "part-00000.parquet",
        "part-00001.parquet",
        "part-00002.parquet",
    ]
    table = pq.read_table(out / "train")
    assert table.column_names == ["src", "tgt"]
    rows = list(zip(table["src"].to_pylist(), table["tgt"].to_pylist(), strict=True))
    # corpus order, then line order; the first of two duplicates is kept
    assert rows[:50] == [
        (s.decode(), t.decode()) for s, t in zip(base_src[:50], base_tgt[:50], strict=True)
    ]
    assert rows[-2] == ("caf\u00e9 au lait please", "Milchkaffee bitte sehr")  # NFC
    assert not any(test_src[0] in s for s, _ in rows)
    assert (out / "test.en").read_text(encoding="utf-8").splitlines() == test_src


def test_clean_fails_on_misaligned_corpus(tmp_path):
    config = make_config(tmp_path)
    download = write_download(
        tmp_path,
        {"commoncrawl": ([b"a b", b"c d", b"e f"], [b"x y", b"z w"])},
        (["d"], ["d"]),
        (["t"], ["t"]),
    )
    with pytest.raises(CorpusError, match=r"commoncrawl.*3 lines.*2"):
        run_stage(config, "clean", {"download": download})
    assert not (config.root / "clean").exists()


# ----------------------------------------------------------------------------- tokenizer


@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
def test_tokenizer_round_trips_and_is_deterministic(tmp_path, kind):
    config = make_config(
        tmp_path, tokenizer=TokenizerConfig(kind=kind, vocab_size=300, sample_size=1500, threads=2)
    )
    pairs = synthetic.generate_pairs(800, 3)

    def build(tmp: Path) -> dict:
        (tmp / "train").mkdir()
        pq.write_table(
            pa.table({"src": [p[0] for p in pairs], "tgt": [p[1] for p in pairs]}),
            tmp / "train" / "part-00000.parquet",
        )
        return {}

    clean_dir = build_folder("clean", tmp_path / "clean", {"hand": True}, {}, build).path
    first = run_stage(config, "tokenizer", {"clean": clean_dir}).path
    model_bytes = (first / "spm.model").read_bytes()
    again = run_stage(config, "tokenizer", {"clean": clean_dir}, force=True).path
    assert (again / "spm.model").read_bytes() == model_bytes
    tok = load_tokenizer(first)
    assert tok.vocab_size == 300
    assert read_manifest(first)["stats"]["sentences"] == 1500
    texts = [s for p in pairs[:200] for s in p] + ["Die Straße ist müde, weil ich schlafe."]
    for text, normalized in zip(texts, normalize_array(pa.array(texts)).to_pylist(), strict=True):
        ids = tok.encode(text)
        assert ids[-1] == EOS_ID and EOS_ID not in ids[:-1]
        assert tok.decode(ids) == normalized
    assert tok.decode([2] + tok.encode("Der Hund.") + [5, 6, 0]) == "Der Hund."

    too_big = config.replace(
        tokenizer=TokenizerConfig(kind=kind, vocab_size=60000, sample_size=1500)
    )
    with pytest.raises(CorpusError, match="tokenizer.vocab_size"):
        run_stage(too_big, "tokenizer", {"clean": clean_dir})


# ----------------------------------------------------------------------------- the chain


def run_chain(config: RunConfig) -> dict[str, Path]:
    raw = run_stage(config, "download", {}).path
    clean_dir = run_stage(config, "clean", {"download": raw}).path
    tok_dir = run_stage(config, "tokenizer", {"clean": clean_dir}).path
    shard_dir = run_stage(config, "shard", {"clean": clean_dir, "tokenizer": tok_dir}).path
    return {"download": raw, "clean": clean_dir, "tokenizer": tok_dir, "shard": shard_dir}


def started(folders: dict[str, Path]) -> dict[str, float]:
    return {name: read_manifest(path)["started"] for name, path in folders.items()}


def shard_bytes(folder: Path) -> dict[str, bytes]:
    files = sorted(folder.rglob("part-*.parquet")) + sorted(folder.rglob("part-*.arrow"))
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in files}


def test_chain_is_deterministic_skips_and_reruns_downstream(tmp_path):
    config = make_config(tmp_path / "a")
    folders = run_chain(config)

    shard_dir = folders["shard"]
    files = shard_bytes(shard_dir)
    train_files = [
        name for name in files if name.startswith("train/") and name.endswith(".parquet")
    ]
    # every Parquet part has its Arrow IPC twin (what training memory-maps), counted in the manifest
    assert {f"arrow/{name[:-8]}.arrow" for name in files if name.endswith(".parquet")} == {
        name for name in files if name.endswith(".arrow")
    }
    assert read_manifest(shard_dir)["files"]["arrow/train/part-00000.arrow"]["rows"] == 500
    mapped = TokenData.read(
        str(shard_dir / "train"), read_manifest(shard_dir)["stats"]["vocab_size"]
    )
    assert len(mapped.chunks) > 1 and not mapped.chunks[0][0].flags.owndata
    stats = read_manifest(shard_dir)["stats"]
    kept = read_manifest(folders["clean"])["stats"]["kept"]
    assert stats["train"]["rows"] == kept
    assert len(train_files) == -(-kept // 500) == stats["train"]["shards"]
    assert train_files[0] == "train/part-00000.parquet"
    assert {"dev/part-00000.parquet", "test/part-00000.parquet"} <= set(files)
    assert (shard_dir / "lengths.png").stat().st_size > 0
    assert stats["dev"]["rows"] == 60 and stats["test"]["rows"] == 60

    table = pq.read_table(shard_dir / "train" / "part-00000.parquet")
    assert table.schema.equals(SHARD_SCHEMA)
    assert pq.ParquetFile(shard_dir / "train" / "part-00000.parquet").metadata.num_rows == 500
    clean_rows = pq.read_table(folders["clean"] / "train").slice(0, 500)
    tok = load_tokenizer(folders["tokenizer"])
    for i in (0, 1, 250, 499):
        src_ids = table["src_ids"][i].as_py()
        assert src_ids[-1] == EOS_ID and table["src_len"][i].as_py() == len(src_ids)
        assert tok.decode(src_ids) == clean_rows["src"][i].as_py()
        assert tok.decode(table["tgt_ids"][i].as_py()) == clean_rows["tgt"][i].as_py()
    test_table = pq.read_table(shard_dir / "test")
    test_lines = (folders["clean"] / "test.de").read_text(encoding="utf-8").splitlines()
    assert [tok.decode(ids) for ids in test_table["tgt_ids"].to_pylist()] == test_lines

    # a second run elsewhere gives the same bytes
    other = run_chain(make_config(tmp_path / "b"))
    assert shard_bytes(other["shard"]) == files
    assert (other["tokenizer"] / "spm.model").read_bytes() == (
        folders["tokenizer"] / "spm.model"
    ).read_bytes()

    # an unchanged config skips every stage
    before = started(folders)
    assert started(run_chain(config)) == before

    # a new vocabulary size reruns tokenizer and shard, not clean
    changed = config.replace(tokenizer=TokenizerConfig(vocab_size=350, sample_size=2000, threads=1))
    after = started(run_chain(changed))
    assert after["download"] == before["download"] and after["clean"] == before["clean"]
    assert after["tokenizer"] != before["tokenizer"] and after["shard"] != before["shard"]
    assert load_tokenizer(folders["tokenizer"]).vocab_size == 350


def test_a_code_change_stales_the_stages_that_run_it_until_accepted(tmp_path, monkeypatch):
    """A changed body of a function clean calls (in a copy of the packages the fingerprints
    read) makes clean stale, names the function, and leaves download up to date; ``accept``
    keeps clean's output, which stays the identity tokenizer and shard were made from, so
    nothing reruns."""
    import ast
    import shutil

    from tasks.framework import code_fingerprint, runner

    config = make_config(
        tmp_path / "run", data=DataConfig(synthetic_train=300, synthetic_dev=20, synthetic_test=20)
    )
    folders = run_chain(config)
    copy = tmp_path / "code"
    for package in code_fingerprint.project_packages():
        shutil.copytree(
            code_fingerprint.REPO / package,
            copy / package,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    filters = copy / "corpora" / "filters.py"
    lines = filters.read_text().splitlines(keepends=True)
    reached = code_fingerprint.stage_code("clean")
    function = next(
        n for n in ast.parse("".join(lines)).body if getattr(n, "name", None) in reached
    )
    last = function.body[-1]  # a statement before its last: a change Python runs
    lines.insert(last.lineno - 1, " " * last.col_offset + "_unused = 1\n")
    filters.write_text("".join(lines))
    monkeypatch.setattr(code_fingerprint, "REPO", copy)
    why = f"code changed ({function.name})"

    rows = dict(runner.status(config))
    assert rows["download"].up_to_date
    assert (rows["clean"].state, rows["clean"].reason) == ("stale", why)
    assert rows["shard"].reason == "waits for clean, tokenizer"

    accepted = runner.accept_stage(config, "clean")
    assert accepted.reason == f"accepted: {why}" and not accepted.ran
    rows = dict(runner.status(config))
    assert all(rows[s].up_to_date for s in folders), rows
    assert "accepted" in rows["clean"].reason
    (entry,) = read_manifest(folders["clean"])["accepted"]
    assert entry["changed"] == why
    assert entry["fingerprint"] != read_manifest(folders["clean"])["fingerprint"]
    before = started(folders)
    assert started(run_chain(config)) == before  # nothing reruns


def test_overlong_rows_are_dropped_and_counted(tmp_path):
    """A 200,000-character pair without spaces (one whitespace token a side) is dropped by clean;
    a pair short in characters but long in pieces is dropped by shard, in dev too; test keeps it."""
    from tasks import train

    limit = 128
    config = make_config(tmp_path)
    config = config.replace(model=config.model.replace(max_len=limit))
    seen: set[str] = set()
    pairs = {
        split: synthetic.generate_pairs(n, split, exclude=seen)
        for split, n in (("train", 400), ("dev", 20), ("test", 20))
    }
    rng = random.Random(0)

    def junk() -> str:  # 400 letters without a space: ~350 pieces of the 400-piece vocabulary
        return "".join(rng.choice("abcdefghiklmnoprstuvw") for _ in range(400))

    huge, long_pair = (b"x" * 200_000, b"y" * 200_000), (junk(), junk())
    src = [s.encode() for s, _ in pairs["train"]]
    tgt = [t.encode() for _, t in pairs["train"]]
    src[200:200] = [huge[0], long_pair[0].encode()]
    tgt[200:200] = [huge[1], long_pair[1].encode()]
    evals = {
        split: ([s for s, _ in pairs[split]] + [junk()], [t for _, t in pairs[split]] + [junk()])
        for split in ("dev", "test")
    }
    download = write_download(tmp_path, {"synthetic": (src, tgt)}, evals["dev"], evals["test"])

    clean_dir = run_stage(config, "clean", {"download": download}).path
    clean_stats = read_manifest(clean_dir)["stats"]
    assert clean_stats["dropped"]["too_many_chars"] == 1
    clean_src = pq.read_table(clean_dir / "train")["src"].to_pylist()
    assert long_pair[0] in clean_src and not any(len(s) > 1000 for s in clean_src)

    tok_dir = run_stage(config, "tokenizer", {"clean": clean_dir}).path
    assert len(load_tokenizer(tok_dir).encode(long_pair[0])) > limit
    shard_dir = run_stage(config, "shard", {"clean": clean_dir, "tokenizer": tok_dir}).path
    stats = read_manifest(shard_dir)["stats"]
    print("shard stats:", json.dumps(stats))
    assert stats["max_pieces"] == limit
    assert stats["train"]["dropped_too_long"] == 1
    assert stats["train"]["rows"] == clean_stats["kept"] - 1
    assert max(stats["train"]["max_src_len"], stats["train"]["max_tgt_len"]) <= limit
    assert stats["dev"]["dropped_too_long"] == 1 and stats["dev"]["rows"] == 20
    # test shards stay line for line (translate reads test.<src>, not them); the row is counted
    assert stats["test"]["too_long_kept"] == 1 and stats["test"]["rows"] == 21
    assert max(pq.read_table(shard_dir / "train")["src_len"].to_pylist()) <= limit

    # the limit is the model's or one micro-batch's, whichever is smaller, and is fingerprinted
    longest = max(stats["train"]["max_src_len"], stats["train"]["max_tgt_len"])
    tight = config.replace(
        train=dataclasses.replace(config.train, max_tokens_per_batch=longest - 1)
    )
    assert shard.stage_config(tight)["max_pieces"] == longest - 1
    # train accepts the shards; with a budget below the longest row it refuses them, naming the key
    inputs = {"shard": shard_dir, "tokenizer": tok_dir}
    assert train.check_inputs(config, inputs)["train_rows"] == stats["train"]["rows"]
    with pytest.raises(StageError, match=f"train.max_tokens_per_batch is {longest - 1}"):
        train.check_inputs(tight, inputs)


def test_moses_lowercase_pretokenization_reaches_the_vocabulary_shards_and_decoding(tmp_path):
    config = make_config(
        tmp_path,
        tokenizer=TokenizerConfig(
            vocab_size=400, sample_size=2000, threads=1, moses=True, lowercase=True
        ),
    )
    folders = run_chain(config)
    assert read_manifest(folders["tokenizer"])["stats"]["pretokenize"] == "moses+lowercase"
    pieces = [
        line.split("\t")[0]
        for line in (folders["tokenizer"] / "spm.vocab").read_text().splitlines()
    ]
    specials = {"<pad>", "<unk>", "<s>", "</s>"}
    assert all(p == p.lower() for p in pieces if p not in specials)  # trained on lowercased text
    # no piece glues a word to the punctuation after it: Moses split it off before BPE
    assert not [p for p in pieces if len(p) > 1 and p[-1] in ",." and p.strip("\u2581,.")]

    # the shards hold the pieces of sacremoses' tokenization of the lowercased text
    table = pq.read_table(folders["shard"] / "train" / "part-00000.parquet")
    clean_rows = pq.read_table(folders["clean"] / "train").slice(0, 500)
    tok = load_tokenizer(folders["tokenizer"])
    moses = {lang: MosesTokenizer(lang=lang) for lang in ("en", "de")}
    for i in (0, 1, 250, 499):
        for side, lang in (("src", "en"), ("tgt", "de")):
            ids = table[f"{side}_ids"][i].as_py()
            text = clean_rows[side][i].as_py()
            assert tok.sp.decode(ids[:-1]) == moses[lang].tokenize(
                text.lower(), escape=False, return_str=True
            )
    # the folder's reader (translate, the registered model) applies the same step and undoes Moses
    assert tok.encode("Ein Mann, der läuft.", side=1) == tok.encode(
        "ein mann , der läuft .", side=1
    )
    assert tok.decode(tok.encode("Ein Hund, der läuft.", side=1)) == "ein hund, der läuft."


def test_subword_nmt_codes_reach_the_folder_the_shards_and_decoding(tmp_path):
    from subword_nmt.apply_bpe import BPE

    tokenizer = TokenizerConfig(
        kind="subword-nmt",
        merges=300,
        vocab_size=2000,
        sample_size=2000,
        threads=1,
        moses=True,
        lowercase=True,
    )
    folders = run_chain(make_config(tmp_path, tokenizer=tokenizer))
    tok_dir = folders["tokenizer"]
    stats = read_manifest(tok_dir)["stats"]
    assert stats["pretokenize"] == "moses+lowercase+subword-nmt" and stats["merges"] == 300
    assert stats["model_type"] == "word"
    codes = (tok_dir / "bpe.codes").read_text()
    assert len(codes.splitlines()) <= 301 and "bpe.codes" in read_manifest(tok_dir)["files"]

    # the shards hold one id per piece of subword-nmt's segmentation of the Moses-tokenized text
    bpe = BPE(io.StringIO(codes))
    tok = load_tokenizer(tok_dir)
    moses = MosesTokenizer(lang="de")
    table = pq.read_table(folders["shard"] / "train" / "part-00000.parquet")
    clean_rows = pq.read_table(folders["clean"] / "train").slice(0, 500)
    for i in (0, 1, 250, 499):
        pieces = bpe.segment(
            moses.tokenize(clean_rows["tgt"][i].as_py().lower(), escape=False, return_str=True)
        )
        ids = table["tgt_ids"][i].as_py()[:-1]
        assert [tok.sp.id_to_piece(x).lstrip("\u2581") for x in ids] == pieces.split()
        assert tok.decode(ids) == MosesDetokenizer(lang="de").detokenize(
            pieces.replace("@@ ", "").split()
        )
