"""The download stage's multi30k source against a Multi30k mirror built by the test (gzipped
files laid out as the multi30k/dataset repository, served as file:// and over HTTP with the WMT14
tests' Range-honouring server), and against the real shared mirror when it is there."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from pathlib import Path

import pytest
from helpers.mirror import MirrorServer, read_lines

from corpora import CorpusError, assemble, sources
from corpora.archives import CorruptArchiveError
from corpora.fetch import ChecksumError
from tasks.framework.config import RunConfig, config_from_dict
from tasks.framework.manifest import MANIFEST, read_manifest
from tasks.framework.runner import run_stage

pytestmark = pytest.mark.integration

SHARED_MULTI30K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "multi30k"
RAW = "data/task1/raw"
CANONICAL = "https://raw.githubusercontent.com/multi30k/dataset/master/"

# Tiny splits with the repository's languages per split.
SPLITS = {
    "train": (("en", "de", "fr", "cs"), 40),
    "val": (("en", "de", "fr", "cs"), 3),
    "test_2016_flickr": (("en", "de", "fr", "cs"), 4),
    "test_2017_flickr": (("en", "de", "fr"), 2),
    "test_2017_mscoco": (("en", "de", "fr"), 2),
    "test_2018_flickr": (("en", "de", "fr", "cs"), 5),
}


def captions(split: str, lang: str, n: int) -> list[str]:
    return [f"{split} {lang} {i}: Ein Hund läuft über die Wiese." for i in range(n)]


def gz(lines: list[str]) -> bytes:
    return gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0)


def write_file(root: Path, split: str, lang: str, n: int | None = None) -> Path:
    """``<root>/data/task1/raw/<split>.<lang>.gz`` with ``n`` captions (the split's size by
    default)."""
    path = root / RAW / f"{split}.{lang}.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gz(captions(split, lang, SPLITS[split][1] if n is None else n)))
    return path


@pytest.fixture
def mirror_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A mirror of made-up captions: the registry's sha256 pins are the real files', so they are
    lifted here; these files are pinned by the lock file only, as an unpinned source's are."""
    monkeypatch.setattr(sources, "MULTI30K_SHA256", {})
    root = tmp_path / "multi30k"
    for split, (langs, _) in SPLITS.items():
        for lang in langs:
            write_file(root, split, lang)
    return root


def make_config(tmp_path: Path, **data: object) -> RunConfig:
    return config_from_dict(
        {"name": "m30k", "workdir": str(tmp_path / "run"), "data": {"source": "multi30k", **data}}
    )


def lock_entries(config: RunConfig) -> dict:
    lock_file = config.root / "downloads.lock.json"
    return json.loads(lock_file.read_text())["files"] if lock_file.exists() else {}


# ----------------------------------------------------------------------------- the stage


@pytest.mark.parametrize(("pair", "src", "tgt"), [("en-de", "en", "de"), ("de-en", "de", "en")])
def test_file_mirror_gives_the_contract_layout_in_either_direction(
    tmp_path: Path, mirror_root: Path, pair: str, src: str, tgt: str
):
    config = make_config(tmp_path, pair=pair, mirror=mirror_root.as_uri())
    out = run_stage(config, "download", {}).path

    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == sorted(
        [
            MANIFEST,
            "dev.de",
            "dev.en",
            "test.de",
            "test.en",
            "train/multi30k.de",
            "train/multi30k.en",
        ]
    )
    for lang in (src, tgt):
        assert read_lines(out / "train" / f"multi30k.{lang}") == captions("train", lang, 40)
        assert read_lines(out / f"dev.{lang}") == captions("val", lang, 3)
        assert read_lines(out / f"test.{lang}") == captions("test_2016_flickr", lang, 4)

    stats = read_manifest(out)["stats"]
    assert (stats["source"], stats["src"], stats["tgt"]) == ("multi30k", src, tgt)
    assert (stats["train_lines"], stats["dev_lines"], stats["test_lines"]) == (40, 3, 4)
    assert [stats["corpora"][k]["name"] for k in ("multi30k", "dev", "test")] == [
        "multi30k",
        "val",
        "test_2016_flickr",
    ]
    dev_src = stats["corpora"]["dev"]["inputs"][src]
    served = (mirror_root / RAW / f"val.{src}.gz").read_bytes()
    assert dev_src == {
        "url": f"{CANONICAL}{RAW}/val.{src}.gz",
        "bytes": len(served),
        "sha256": hashlib.sha256(served).hexdigest(),
    }
    assert stats["corpora"]["dev"]["files"] == {src: f"dev.{src}", tgt: f"dev.{tgt}"}

    # Each file is pinned under its canonical GitHub URL, whichever mirror served it.
    lock = lock_entries(config)
    assert sorted(lock) == sorted(
        f"{CANONICAL}{RAW}/{s}.{lang}.gz"
        for s in ("train", "val", "test_2016_flickr")
        for lang in ("en", "de")
    )
    assert lock[dev_src["url"]] == {"bytes": dev_src["bytes"], "sha256": dev_src["sha256"]}
    assert (config.root / "cache" / "downloads" / "multi30k" / RAW / "train.de.gz").is_file()


def test_other_pairs_and_test_sets(tmp_path: Path, mirror_root: Path):
    """Straight through from_multi30k: Czech into English on the 2018 test set."""
    out = tmp_path / "out"
    stats = assemble.from_multi30k(
        out,
        pair="cs-en",
        dev="val",
        test="test_2018_flickr",
        mirror=mirror_root.as_uri(),
        cache=tmp_path / "cache",
        lock_file=tmp_path / "lock.json",
        max_retries=1,
    )
    assert read_lines(out / "test.cs") == captions("test_2018_flickr", "cs", 5)
    assert sorted(p.name for p in (out / "train").iterdir()) == ["multi30k.cs", "multi30k.en"]
    assert (stats["pair"], stats["test_lines"], stats["corpora"]["test"]["name"]) == (
        "cs-en",
        5,
        "test_2018_flickr",
    )


def test_a_dropped_connection_resumes_with_range(tmp_path: Path, server: MirrorServer):
    path = f"{RAW}/train.de.gz"
    served = (server.root / path).read_bytes()
    server.drop_after[path] = 100
    config = make_config(tmp_path, pair="en-de", mirror=server.url)
    out = run_stage(config, "download", {}).path

    assert [rng for p, rng in server.requests if p == path] == [None, "bytes=100-"]
    assert read_lines(out / "train" / "multi30k.de") == captions("train", "de", 40)
    inputs = read_manifest(out)["stats"]["corpora"]["multi30k"]["inputs"]["de"]
    assert inputs["sha256"] == hashlib.sha256(served).hexdigest()
    # A forced rerun reuses the cache: no request at all.
    n = len(server.requests)
    assert run_stage(config, "download", {}, force=True).ran and len(server.requests) == n


def test_a_partial_download_left_by_an_interrupted_run_is_resumed(
    tmp_path: Path, server: MirrorServer
):
    """What a run killed mid-download leaves: ``<file>.part`` and its companion naming the URL
    and the server's validator. The next run asks for the rest only."""
    path = f"{RAW}/train.en.gz"
    served = (server.root / path).read_bytes()
    config = make_config(tmp_path, pair="en-de", mirror=server.url)
    part = config.root / "cache" / "downloads" / "multi30k" / f"{path}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(served[:64])
    etag = '"' + hashlib.sha256(served).hexdigest()[:16] + '"'  # as MirrorServer sends it
    Path(f"{part}.json").write_text(json.dumps({"url": f"{server.url}/{path}", "validator": etag}))

    out = run_stage(config, "download", {}).path
    assert [rng for p, rng in server.requests if p == path] == ["bytes=64-"]
    assert read_lines(out / "train" / "multi30k.en") == captions("train", "en", 40)
    assert not part.exists() and not Path(f"{part}.json").exists()


# ---------------------------------------------------------------- a broken mirror, then a fixed one


def _break(case: str, path: Path) -> None:
    data = path.read_bytes()
    if case == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif case == "no gzip trailer":
        path.write_bytes(data[:-8])
    elif case == "bad crc":
        path.write_bytes(data[:-8] + bytes(b ^ 0xFF for b in data[-8:-4]) + data[-4:])
    elif case == "not gzip":
        path.write_bytes(b"<html><body>404: Not Found</body></html>\n")


BROKEN = [
    ("truncated", "Compressed file ended before the end-of-stream marker was reached"),
    ("no gzip trailer", "Compressed file ended before the end-of-stream marker was reached"),
    ("bad crc", "CRC check failed"),
    ("not gzip", "Not a gzipped file"),
]


@pytest.mark.parametrize(("case", "cause"), BROKEN, ids=[b[0] for b in BROKEN])
def test_a_corrupt_gz_names_the_file_and_a_fixed_mirror_succeeds(
    tmp_path: Path, mirror_root: Path, case: str, cause: str
):
    config = make_config(tmp_path, pair="en-de", mirror=mirror_root.as_uri())
    cache = config.root / "cache" / "downloads" / "multi30k" / RAW
    _break(case, mirror_root / RAW / "val.de.gz")

    with pytest.raises(CorruptArchiveError) as err:
        run_stage(config, "download", {})
    message = str(err.value)
    assert message.startswith(f"truncated or corrupt archive {cache / 'val.de.gz'} ({cause}")
    assert (
        f"removed the cached {cache / 'val.en.gz'} and {cache / 'val.de.gz'} and pinned nothing"
        in message
    )
    assert "\n" not in message
    assert not (cache / "val.de.gz").exists() and not (cache / "val.en.gz").exists()
    assert not [url for url in lock_entries(config) if "/val." in url]
    assert not (config.root / "download").exists()

    write_file(mirror_root, "val", "de")
    out = run_stage(config, "download", {}).path
    assert read_lines(out / "dev.de") == captions("val", "de", 3)
    good = hashlib.sha256((mirror_root / RAW / "val.de.gz").read_bytes()).hexdigest()
    assert lock_entries(config)[f"{CANONICAL}{RAW}/val.de.gz"]["sha256"] == good


def test_misaligned_languages_name_both_files_and_counts(tmp_path: Path, mirror_root: Path):
    write_file(mirror_root, "test_2016_flickr", "en", n=3)
    config = make_config(tmp_path, pair="en-de", mirror=mirror_root.as_uri())
    with pytest.raises(
        CorpusError,
        match=r"corpus test_2016_flickr is misaligned: "
        r"data/task1/raw/test_2016_flickr.en.gz \(en\) has 3 lines, "
        r"data/task1/raw/test_2016_flickr.de.gz \(de\) has 4 lines; "
        r"removed the cached .* and pinned nothing",
    ):
        run_stage(config, "download", {})
    assert not [url for url in lock_entries(config) if "test_2016" in url]


def test_an_empty_dev_set_fails_in_one_line_and_a_fixed_mirror_recovers(
    tmp_path: Path, mirror_root: Path
):
    """Empty val files fail the stage, naming them, and are neither pinned nor kept in the cache:
    after the mirror is fixed, a rerun (no --force needed) downloads them again."""
    for lang in ("en", "de"):
        write_file(mirror_root, "val", lang, n=0)
    config = make_config(tmp_path, mirror=mirror_root.as_uri())
    with pytest.raises(CorpusError) as err:
        run_stage(config, "download", {})
    message = str(err.value)
    assert "corpus val is empty" in message and "val.en.gz" in message and "\n" not in message
    assert "a rerun downloads them again" in message
    assert not any("val." in url for url in lock_entries(config))
    for lang in ("en", "de"):
        write_file(mirror_root, "val", lang)
    result = run_stage(config, "download", {})
    assert result.ran and len(read_lines(result.path / "dev.en")) == SPLITS["val"][1]


def test_a_pinned_empty_file_is_named_with_the_lock_entry_that_keeps_it(
    tmp_path: Path, mirror_root: Path
):
    """An empty dev set pinned by an earlier version (before it was refused): the error names the
    lock entry to drop, and --force alone does not silently keep using it."""
    for lang in ("en", "de"):
        write_file(mirror_root, "val", lang, n=0)
    config = make_config(tmp_path, mirror=mirror_root.as_uri())
    from corpora.fetch import hash_file
    from corpora.lockfile import LockFile

    lock = LockFile(tmp_path / "run" / "downloads.lock.json")
    for lang in ("en", "de"):
        url = f"{CANONICAL}{RAW}/val.{lang}.gz"
        lock.pin(url, hash_file(mirror_root / RAW / f"val.{lang}.gz"))
    with pytest.raises(CorpusError, match=r"corpus val is empty.*lock") as err:
        run_stage(config, "download", {}, force=True)
    assert "val.en.gz" in str(err.value)


def test_a_file_the_mirror_lacks_is_named(tmp_path: Path, mirror_root: Path):
    config = make_config(
        tmp_path, pair="en-cs", test="test_2018_flickr", mirror=mirror_root.as_uri()
    )
    (mirror_root / RAW / "val.cs.gz").unlink()
    with pytest.raises(
        CorpusError, match=r"val\.cs\.gz: no such file .*is the mirror folder complete"
    ):
        run_stage(config, "download", {})


# --------------------------------------------------------------------------- the real shared mirror


@pytest.mark.shared_data("multi30k/data/task1/raw")
def test_the_shared_mirror_gives_the_published_counts(tmp_path: Path):
    config = make_config(tmp_path, pair="en-de", mirror=SHARED_MULTI30K.resolve().as_uri())
    out = run_stage(config, "download", {}).path
    stats = read_manifest(out)["stats"]
    assert (stats["train_lines"], stats["dev_lines"], stats["test_lines"]) == (29000, 1014, 1000)
    for name in (
        "train/multi30k.en",
        "train/multi30k.de",
        "dev.en",
        "dev.de",
        "test.en",
        "test.de",
    ):
        assert (out / name).stat().st_size > 0
    assert (
        read_lines(out / "dev.de")[0]
        == "Eine Gruppe von Männern lädt Baumwolle auf einen Lastwagen"
    )


def _copy_of_shared_mirror(root: Path, pair: tuple[str, str] = ("en", "de")) -> Path:
    """The shared files an ``en-de`` download reads, copied to ``root`` (a mirror to tamper
    with)."""
    for split in ("train", "val", "test_2016_flickr"):
        for lang in pair:
            dst = root / RAW / f"{split}.{lang}.gz"
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(SHARED_MULTI30K / RAW / dst.name, dst)
    return root


@pytest.fixture
def real_server(tmp_path: Path):
    """A copy of the shared mirror over HTTP (the registry's pins in place)."""
    srv = MirrorServer(_copy_of_shared_mirror(tmp_path / "mirror"))
    yield srv
    srv.close()


@pytest.mark.shared_data("multi30k/data/task1/raw")
def test_a_file_one_byte_off_the_published_one_fails_in_a_fresh_work_dir(
    tmp_path: Path, real_server
):
    """No lock file yet: the registry's sha256 of the public file catches a changed byte (same
    size) in one line naming the file and both hashes, whichever mirror served it."""
    published = (SHARED_MULTI30K / RAW / "val.de.gz").read_bytes()
    tampered = bytearray(published)
    tampered[len(tampered) // 2] ^= 0x01
    (real_server.root / RAW / "val.de.gz").write_bytes(bytes(tampered))
    config = make_config(tmp_path, pair="en-de", mirror=real_server.url)
    assert not (config.root / "downloads.lock.json").exists()

    with pytest.raises(ChecksumError) as err:
        run_stage(config, "download", {})
    message = str(err.value)
    assert message.startswith(
        f"{real_server.url}/{RAW}/val.de.gz: sha256 is {hashlib.sha256(tampered).hexdigest()}, "
    )
    assert f"the source registry expects {hashlib.sha256(published).hexdigest()}" in message
    assert "\n" not in message
    assert not (config.root / "cache" / "downloads" / "multi30k" / RAW / "val.de.gz").exists()
    assert not (config.root / "download").exists()
    assert not [url for url in lock_entries(config) if "/val." in url]

    (real_server.root / RAW / "val.de.gz").write_bytes(published)  # the mirror fixed: it passes
    out = run_stage(config, "download", {}).path
    assert (
        read_manifest(out)["stats"]["corpora"]["dev"]["inputs"]["de"]["sha256"]
        == hashlib.sha256(published).hexdigest()
    )
