"""The download stage end to end against a local statmt.org mirror built by the test.

A threaded HTTP server on 127.0.0.1 serves tiny tarballs in the real WMT14 layouts (it honours
Range and If-Range, can drop a connection part-way, and records every request); the same folder
also serves as a file:// mirror.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import re
import tarfile
from pathlib import Path
from xml.sax.saxutils import escape

import pytest
from helpers.mirror import MirrorServer, read_lines
from sacrebleu.dataset import DATASETS

from corpora import CorpusError, sources
from corpora.archives import CorruptArchiveError, MissingMemberError, UnsafeArchiveError
from corpora.fetch import ChecksumError, NetworkError, download
from corpora.lockfile import LockFile
from tasks.framework.config import RunConfig, config_from_dict
from tasks.framework.manifest import MANIFEST, read_manifest
from tasks.framework.results import StageError
from tasks.framework.runner import run_stage

pytestmark = pytest.mark.integration

SHARED_SAMPLE = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "wmt14_ende_sample"


# -------------------------------------------------------------------------- archives in WMT layouts


def lines(corpus: str, lang: str, n: int) -> list[str]:
    return [f"{corpus} {lang} {i} Grüße & «quotes»" for i in range(n)]


def text(segments: list[str]) -> bytes:
    return ("\n".join(segments) + "\n").encode()


def sgm(kind: str, lang: str, segments: list[str]) -> bytes:
    """A WMT-style SGM file: two documents whose segment ids restart."""
    half = len(segments) // 2
    out = [f'<{kind}set setid="newstest2014" srclang="any" trglang="{lang}">']
    for doc, chunk in enumerate((segments[:half], segments[half:])):
        out.append(f'<doc sysid="ref" docid="doc{doc}" genre="news" origlang="en">')
        out += [f'<seg id="{i + 1}">{escape(s)}</seg>' for i, s in enumerate(chunk)]
        out.append("</doc>")
    out.append(f"</{kind}set>")
    return ("\n".join(out) + "\n").encode()


TRAIN_SIZES = {"europarl-v7": 4, "commoncrawl": 3, "news-commentary-v9": 2, "un": 3, "giga-fren": 5}
DEV_SIZE, FULL_SIZE, FILTERED_SIZE = 3, 6, 4


def wmt_layout() -> dict[str, dict[str, bytes]]:
    """archive path -> member -> bytes, as statmt.org lays them out (tiny contents)."""
    europarl, cc, nc = {}, {}, {}
    for pair in ("de-en", "fr-en"):
        for lang in pair.split("-"):
            europarl[f"training/europarl-v7.{pair}.{lang}"] = text(lines("europarl-v7", lang, 4))
            cc[f"commoncrawl.{pair}.{lang}"] = text(lines("commoncrawl", lang, 3))
            nc[f"training/news-commentary-v9.{pair}.{lang}"] = text(
                lines("news-commentary-v9", lang, 2)
            )
        cc[f"commoncrawl.{pair}.annotation"] = b"x\n" * 3
    europarl["training/europarl-v7.cs-en.cs"] = text(["not wanted"])
    dev = {
        f"test/newstest2013-src.{lang}.sgm": sgm("src", lang, lines("newstest2013", lang, DEV_SIZE))
        for lang in ("de", "en", "fr")
    }
    dev["test/newstest2013-src.cs.sgm"] = sgm("src", "cs", ["not wanted"])
    full, filtered = {}, {}
    for pair in ("deen", "fren"):
        other = pair[:2]
        for lang in (other, "en"):
            for kind in ("src", "ref"):
                full[f"test-full/newstest2014-{pair}-{kind}.{lang}.sgm"] = sgm(
                    kind, lang, lines("full", lang, FULL_SIZE)
                )
                filtered[f"test/newstest2014-{pair}-{kind}.{lang}.sgm"] = sgm(
                    kind, lang, lines("filtered", lang, FILTERED_SIZE)
                )
    return {
        "wmt13/training-parallel-europarl-v7.tgz": europarl,
        "wmt13/training-parallel-commoncrawl.tgz": cc,
        "wmt14/training-parallel-nc-v9.tgz": nc,
        "wmt13/training-parallel-un.tgz": {
            f"un/undoc.2000.fr-en.{lang}": text(lines("un", lang, 3)) for lang in ("fr", "en")
        },
        "wmt10/training-giga-fren.tar": {
            f"giga-fren.release2.fixed.{lang}.gz": gzip.compress(
                text(lines("giga-fren", lang, 5)), mtime=0
            )
            for lang in ("fr", "en")
        },
        "wmt13/test.tgz": dev,
        "wmt14/test-full.tgz": full,
        "wmt14/test-filtered.tgz": filtered,
    }


def write_archive(path: Path, members: dict[str, bytes], extra: list[tarfile.TarInfo] = ()) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w" if path.suffix == ".tar" else "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info)


def write_mirror(root: Path, layout: dict[str, dict[str, bytes]]) -> Path:
    for archive, members in layout.items():
        write_archive(root / archive, members)
    return root


@pytest.fixture(autouse=True)
def _no_published_checksums(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny test archives are not statmt's: drop the registries' published checksums."""
    for key, archive in list(sources.ARCHIVES.items()):
        monkeypatch.setitem(
            sources.ARCHIVES, key, dataclasses.replace(archive, md5=None, sha256=None, bytes=None)
        )
    for key in sources.EVAL_SETS.values():
        monkeypatch.setattr(DATASETS[key], "md5", [])


@pytest.fixture
def mirror_root(tmp_path: Path) -> Path:
    return write_mirror(tmp_path / "mirror", wmt_layout())


def make_config(tmp_path: Path, **data: object) -> RunConfig:
    return config_from_dict(
        {"name": "dl", "workdir": str(tmp_path / "run"), "data": {"source": "wmt14", **data}}
    )


# ----------------------------------------------------------------------------- the stage over HTTP


def test_wmt14_en_de_over_http_has_the_contract_layout(tmp_path: Path, server: MirrorServer):
    config = make_config(tmp_path, pair="en-de", mirror=server.url)
    result = run_stage(config, "download", {})
    out = result.path

    assert out == config.root / "download" and result.ran
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == sorted(
        [MANIFEST, "dev.de", "dev.en", "test.de", "test.en"]
        + [
            f"train/{c}.{lang}"
            for c in ("europarl-v7", "commoncrawl", "news-commentary-v9")
            for lang in ("en", "de")
        ]
    )
    assert read_lines(out / "train" / "commoncrawl.de") == lines("commoncrawl", "de", 3)
    assert read_lines(out / "dev.en") == lines("newstest2013", "en", DEV_SIZE)
    # newstest2014 full: the en-de source side is deen-src.en, the target deen-ref.de, unescaped.
    assert read_lines(out / "test.en") == lines("full", "en", FULL_SIZE)
    assert read_lines(out / "test.de") == lines("full", "de", FULL_SIZE)

    manifest = read_manifest(out)
    stats = manifest["stats"]
    assert (stats["src"], stats["tgt"], stats["train_lines"]) == ("en", "de", 4 + 3 + 2)
    europarl = stats["corpora"]["europarl-v7"]
    served = (server.root / "wmt13/training-parallel-europarl-v7.tgz").read_bytes()
    assert europarl["url"] == "https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz"
    assert (europarl["bytes"], europarl["sha256"]) == (
        len(served),
        hashlib.sha256(served).hexdigest(),
    )
    assert europarl["lines"] == 4 and europarl["files"] == {
        "en": "train/europarl-v7.en",
        "de": "train/europarl-v7.de",
    }
    assert (
        stats["corpora"]["dev"]["name"] == "newstest2013"
        and stats["corpora"]["dev"]["lines"] == DEV_SIZE
    )
    assert stats["corpora"]["test"]["lines"] == FULL_SIZE

    lock = json.loads((config.root / "downloads.lock.json").read_text())["files"]
    assert lock[europarl["url"]] == {"bytes": len(served), "sha256": europarl["sha256"]}
    assert len(lock) == 5  # three corpora, dev, test-full

    # A rerun is skipped; a forced rerun reuses the download cache: no new requests either way.
    n = len(server.requests)
    assert not run_stage(config, "download", {}).ran
    assert run_stage(config, "download", {}, force=True).ran
    assert len(server.requests) == n
    assert read_manifest(out)["fingerprint"] == manifest["fingerprint"]


def test_filtered_test_set_and_corpus_subset(tmp_path: Path, server: MirrorServer):
    config = make_config(
        tmp_path,
        pair="de-en",
        mirror=server.url,
        corpora=["news-commentary-v9"],
        test_variant="filtered",
    )
    out = run_stage(config, "download", {}).path
    assert sorted(p.name for p in (out / "train").iterdir()) == [
        "news-commentary-v9.de",
        "news-commentary-v9.en",
    ]
    assert read_lines(out / "test.de") == lines("filtered", "de", FILTERED_SIZE)
    requested = {path for path, _ in server.requests}
    assert "wmt13/training-parallel-europarl-v7.tgz" not in requested


def test_file_mirror_en_fr_reads_un_and_gzipped_giga_members(tmp_path: Path, mirror_root: Path):
    config = make_config(
        tmp_path, pair="fr-en", mirror=mirror_root.as_uri(), corpora=["un", "giga-fren"]
    )
    out = run_stage(config, "download", {}).path
    assert read_lines(out / "train" / "giga-fren.fr") == lines("giga-fren", "fr", 5)
    assert read_lines(out / "train" / "un.en") == lines("un", "en", 3)
    assert read_lines(out / "test.fr") == lines(
        "full", "fr", FULL_SIZE
    )  # fren-src.fr is the source
    stats = read_manifest(out)["stats"]
    assert (
        stats["corpora"]["giga-fren"]["url"]
        == "https://www.statmt.org/wmt10/training-giga-fren.tar"
    )
    assert (config.root / "cache" / "downloads" / "wmt10" / "training-giga-fren.tar").is_file()


def test_a_newstest_set_alone_reads_as_the_download_stage_reads_it(tmp_path: Path, mirror_root):
    """An extra test set (``eval.test_sets``) of the WMT source: its source and reference sides,
    fetched and pinned as download does."""
    from corpora.assemble import from_registry_set

    outputs = {lang: tmp_path / f"test.{lang}" for lang in ("en", "de")}
    lines_read = from_registry_set(
        outputs,
        source="wmt14",
        split="newstest2013",
        pair="en-de",
        mirror=mirror_root.as_uri(),
        cache=tmp_path / "cache",
        lock_file=tmp_path / "lock.json",
        max_retries=1,
    )
    assert lines_read == DEV_SIZE
    assert read_lines(outputs["de"]) == lines("newstest2013", "de", DEV_SIZE)
    assert (tmp_path / "lock.json").is_file()


# ----------------------------------------------------------------------------- resume and retries


def test_dropped_connection_resumes_with_range(tmp_path: Path, server: MirrorServer):
    path = "wmt13/training-parallel-europarl-v7.tgz"
    served = (server.root / path).read_bytes()
    server.drop_after[path] = 100
    out = run_stage(make_config(tmp_path, pair="en-de", mirror=server.url), "download", {}).path

    europarl_requests = [rng for p, rng in server.requests if p == path]
    assert europarl_requests == [None, "bytes=100-"]
    assert (
        read_manifest(out)["stats"]["corpora"]["europarl-v7"]["sha256"]
        == hashlib.sha256(served).hexdigest()
    )


def test_a_server_that_ignores_range_restarts_the_file(tmp_path: Path, server: MirrorServer):
    path = "wmt13/test.tgz"
    served = (server.root / path).read_bytes()
    server.drop_after[path] = 50
    server.ignore_range = True
    dest = tmp_path / "cache" / "dev.tgz"
    seen = download(f"{server.url}/{path}", dest, max_retries=3, backoff=0.01)
    assert seen.sha256 == hashlib.sha256(served).hexdigest()
    assert dest.read_bytes() == served
    assert [rng for p, rng in server.requests if p == path] == [None, "bytes=50-"]


def test_a_file_that_changed_during_a_resume_comes_back_whole(tmp_path: Path, server: MirrorServer):
    """If-Range: the server answers a stale range with the whole new file, so nothing is spliced."""
    path = "wmt13/test.tgz"
    new = b"a different file, longer than before " * 10
    server.drop_after[path] = 20
    server.replace_after_drop[path] = new
    seen = download(f"{server.url}/{path}", tmp_path / "dev.tgz", max_retries=3, backoff=0.01)
    assert (tmp_path / "dev.tgz").read_bytes() == new
    assert seen.sha256 == hashlib.sha256(new).hexdigest()


def test_unavailable_server_is_retried_then_given_up(tmp_path: Path, server: MirrorServer):
    path = "wmt13/test.tgz"
    served = (server.root / path).read_bytes()
    server.unavailable[path] = 2
    seen = download(f"{server.url}/{path}", tmp_path / "a" / "dev.tgz", max_retries=3, backoff=0.01)
    assert seen.sha256 == hashlib.sha256(served).hexdigest()
    assert [p for p, _ in server.requests].count(path) == 3

    server.unavailable[path] = 5
    # NetworkError: the one download error a flow retries (pipelines.flows.worth_retrying).
    with pytest.raises(NetworkError, match="giving up after 2 attempts without progress: HTTP 503"):
        download(f"{server.url}/{path}", tmp_path / "b" / "dev.tgz", max_retries=2, backoff=0.01)
    assert not (tmp_path / "b" / "dev.tgz").exists()


def test_missing_file_on_the_mirror_fails_without_retrying(tmp_path: Path, server: MirrorServer):
    with pytest.raises(CorpusError, match="HTTP 404"):
        download(f"{server.url}/wmt14/nothere.tgz", tmp_path / "x.tgz", max_retries=3, backoff=0.01)
    assert [p for p, _ in server.requests] == ["wmt14/nothere.tgz"]


# ----------------------------------------------------------------------------- failures


def assert_nothing_looks_complete(config: RunConfig) -> None:
    root = config.root
    assert not (root / "download").exists()
    assert not [p for p in root.iterdir() if p.name.startswith(".download.tmp")]


def test_checksum_mismatch_fails_and_leaves_nothing_complete(
    tmp_path: Path, server: MirrorServer, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setitem(
        sources.ARCHIVES,
        "europarl-v7",
        dataclasses.replace(sources.ARCHIVES["europarl-v7"], sha256="0" * 64),
    )
    config = make_config(tmp_path, pair="en-de", mirror=server.url)
    with pytest.raises(
        ChecksumError, match="training-parallel-europarl-v7.tgz: sha256 is .* expects 0{64}"
    ):
        run_stage(config, "download", {})
    cached = config.root / "cache" / "downloads" / "wmt13"
    assert not list(cached.iterdir())  # neither the final file nor a .part
    assert_nothing_looks_complete(config)


def test_a_changed_upstream_file_fails_against_the_lock(tmp_path: Path, mirror_root: Path):
    config = make_config(
        tmp_path, pair="en-de", mirror=mirror_root.as_uri(), corpora=["commoncrawl"]
    )
    run_stage(config, "download", {})
    layout = wmt_layout()["wmt13/training-parallel-commoncrawl.tgz"]
    layout["commoncrawl.de-en.de"] = text(lines("changed", "de", 3))
    write_archive(mirror_root / "wmt13/training-parallel-commoncrawl.tgz", layout)
    fresh_cache = config.replace(
        data=dataclasses.replace(config.data, cache_dir=str(tmp_path / "cache2"))
    )
    with pytest.raises(ChecksumError, match="downloads.lock.json expects"):
        run_stage(fresh_cache, "download", {}, force=True)
    assert not (tmp_path / "cache2" / "wmt13" / "training-parallel-commoncrawl.tgz").exists()


def test_misaligned_corpus_names_both_counts(tmp_path: Path, mirror_root: Path):
    layout = wmt_layout()
    cc = layout["wmt13/training-parallel-commoncrawl.tgz"]
    cc["commoncrawl.de-en.en"] = text(lines("commoncrawl", "en", 2))
    write_archive(mirror_root / "wmt13/training-parallel-commoncrawl.tgz", cc)
    config = make_config(tmp_path, pair="en-de", mirror=mirror_root.as_uri())
    with pytest.raises(
        CorpusError,
        match=r"corpus commoncrawl is misaligned: commoncrawl.de-en.en \(en\) has 2 lines, "
        r"commoncrawl.de-en.de \(de\) has 3 lines",
    ):
        run_stage(config, "download", {})
    assert_nothing_looks_complete(config)


@pytest.mark.parametrize("bad", ["../evil", "symlink"])
def test_unsafe_tarball_is_refused(tmp_path: Path, mirror_root: Path, bad: str):
    info = tarfile.TarInfo(bad if bad != "symlink" else "training/evil-link")
    if bad == "symlink":
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    archive = mirror_root / "wmt14/training-parallel-nc-v9.tgz"
    write_archive(archive, wmt_layout()["wmt14/training-parallel-nc-v9.tgz"], extra=[info])
    config = make_config(
        tmp_path,
        pair="en-de",
        mirror=mirror_root.as_uri(),
        corpora=["news-commentary-v9", "europarl-v7"],
    )
    with pytest.raises(
        UnsafeArchiveError, match=f"refusing member '{info.name}' of .*training-parallel-nc-v9.tgz"
    ):
        run_stage(config, "download", {})
    assert not (tmp_path / "evil").exists() and not (config.root / "evil").exists()
    assert_nothing_looks_complete(config)


def test_missing_member_points_at_the_registry(
    tmp_path: Path, mirror_root: Path, monkeypatch: pytest.MonkeyPatch
):
    corpus = sources.TRAIN["de-en"]["commoncrawl"]
    wrong = dataclasses.replace(
        corpus, members={"de": "training/commoncrawl.de-en.de", "en": "commoncrawl.de-en.en"}
    )
    monkeypatch.setitem(sources.TRAIN["de-en"], "commoncrawl", wrong)
    config = make_config(
        tmp_path, pair="en-de", mirror=mirror_root.as_uri(), corpora=["commoncrawl"]
    )
    with pytest.raises(
        CorpusError,
        match="no member 'training/commoncrawl.de-en.de' .*sources.py.*"
        "similar members: commoncrawl.de-en.de",
    ):
        run_stage(config, "download", {})


# ---------------------------------------------------------------- a broken mirror, then a fixed one

CC = "wmt13/training-parallel-commoncrawl.tgz"
GIGA = "wmt10/training-giga-fren.tar"
DEV = "wmt13/test.tgz"


def _cut(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def _at_second_header(members: dict[str, bytes]) -> int:
    """Where the second member's header starts in a plain tar of ``members``."""
    return 512 + -(-len(next(iter(members.values()))) // 512) * 512


def _symlink() -> tarfile.TarInfo:
    info = tarfile.TarInfo("training/evil-link")
    info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    return info


def _break(case: str, path: Path, members: dict[str, bytes]) -> None:
    """Write ``path`` broken in the way ``case`` names."""
    members = dict(members)
    extra: list[tarfile.TarInfo] = []
    if case == "unsafe member":
        extra = [_symlink()]
    elif case == "missing member":
        del members["commoncrawl.de-en.de"]
    elif case == "misaligned":
        members["commoncrawl.de-en.en"] = text(lines("commoncrawl", "en", 2))
    elif case == "bad sgm":
        members["test/newstest2013-src.en.sgm"] = b'<srcset>\n<seg id="1">never closed\n</srcset>\n'
    elif case == "truncated gzip member":
        members["giga-fren.release2.fixed.en.gz"] = members["giga-fren.release2.fixed.en.gz"][:-10]
    write_archive(path, members, extra=extra)
    if case == "truncated tgz":
        _cut(path, path.stat().st_size // 2)
    elif case == "tgz without its gzip trailer":
        _cut(path, path.stat().st_size - 8)
    elif case == "tar cut at a member header":
        _cut(path, _at_second_header(members))


EN_DE_CC = {"pair": "en-de", "corpora": ["commoncrawl"]}
FR_EN_GIGA = {"pair": "fr-en", "corpora": ["giga-fren"]}


BROKEN = [  # case, the run's data section, the archive broken, the error and its message
    ("unsafe member", EN_DE_CC, CC, UnsafeArchiveError, "refusing member 'training/evil-link'"),
    ("missing member", EN_DE_CC, CC, MissingMemberError, "has no member 'commoncrawl.de-en.de'"),
    ("misaligned", EN_DE_CC, CC, CorpusError, "corpus commoncrawl is misaligned"),
    (
        "bad sgm",
        EN_DE_CC,
        DEV,
        CorpusError,
        "test/newstest2013-src.en.sgm' of .*<seg> without a closing",
    ),
    (
        "truncated tgz",
        EN_DE_CC,
        CC,
        CorruptArchiveError,
        "truncated or corrupt archive .*commoncrawl.tgz",
    ),
    (
        "tgz without its gzip trailer",
        EN_DE_CC,
        CC,
        CorruptArchiveError,
        "truncated or corrupt archive .*commoncrawl.tgz \\(Compressed file ended",
    ),
    (
        "tar cut at a member header",
        FR_EN_GIGA,
        GIGA,
        CorruptArchiveError,
        "truncated or corrupt archive .*giga-fren.tar "
        "\\(the tar data ends at byte \\d+, without an end-of-archive",
    ),
    (
        "truncated gzip member",
        FR_EN_GIGA,
        GIGA,
        CorruptArchiveError,
        "truncated or corrupt archive .*giga-fren.tar "
        "\\(member 'giga-fren.release2.fixed.en.gz': Compressed file ended",
    ),
]


@pytest.mark.parametrize(
    ("case", "data", "archive", "error", "message"), BROKEN, ids=[b[0] for b in BROKEN]
)
def test_a_broken_archive_is_not_kept_so_a_fixed_mirror_succeeds(
    tmp_path: Path,
    mirror_root: Path,
    case: str,
    data: dict,
    archive: str,
    error: type,
    message: str,
):
    """Bad mirror -> fail, nothing cached or pinned -> the mirror is fixed -> the same config
    succeeds."""
    config = make_config(tmp_path, mirror=mirror_root.as_uri(), **data)
    url = "https://www.statmt.org/" + archive
    cached = config.root / "cache" / "downloads" / archive
    lock_file = config.root / "downloads.lock.json"
    _break(case, mirror_root / archive, wmt_layout()[archive])

    with pytest.raises(error, match=f"{message}.*; removed the cached {cached} and pinned nothing"):
        run_stage(config, "download", {})
    assert not cached.exists()
    assert url not in (json.loads(lock_file.read_text())["files"] if lock_file.exists() else {})
    assert_nothing_looks_complete(config)

    write_archive(mirror_root / archive, wmt_layout()[archive])
    out = run_stage(config, "download", {}).path
    good = hashlib.sha256((mirror_root / archive).read_bytes()).hexdigest()
    assert json.loads(lock_file.read_text())["files"][url]["sha256"] == good
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == good
    assert read_manifest(out)["stats"]["train_lines"] == TRAIN_SIZES[data["corpora"][0]]


def test_a_bad_file_pinned_by_an_earlier_run_names_the_lock_entry(
    tmp_path: Path, server: MirrorServer
):
    """A lock written before bad archives were refused pins one: the errors say how to get past
    it."""
    config = make_config(tmp_path, mirror=server.url, **EN_DE_CC)
    url = "https://www.statmt.org/" + CC
    cached = config.root / "cache" / "downloads" / CC
    lock_file = config.root / "downloads.lock.json"
    # What an earlier run did: download the unsafe archive into the cache and pin it.
    _break("unsafe member", server.root / CC, wmt_layout()[CC])
    LockFile(lock_file).pin(url, download(f"{server.url}/{CC}", cached))
    write_archive(server.root / CC, wmt_layout()[CC])  # the mirror is fixed

    entry = re.escape(f"remove the entry {url!r} from {lock_file} and rerun")
    with pytest.raises(
        UnsafeArchiveError,
        match=f"refusing member .*; removed the cached {cached}\\. "
        f"If the pinned file is bad.*{entry}",
    ):
        run_stage(config, "download", {})
    assert not cached.exists()
    with pytest.raises(
        ChecksumError, match=f"(bytes|sha256) is .* but the lock file {lock_file} expects .*{entry}"
    ):
        run_stage(config, "download", {})

    # The user follows the advice: drop the entry, rerun.
    lock = json.loads(lock_file.read_text())
    del lock["files"][url]
    lock_file.write_text(json.dumps(lock))
    run_stage(config, "download", {})
    good = hashlib.sha256((server.root / CC).read_bytes()).hexdigest()
    assert json.loads(lock_file.read_text())["files"][url]["sha256"] == good


# ----------------------------------------------------------------------------- other sources


@pytest.mark.shared_data("wmt14_ende_sample")
def test_local_source_copies_the_shared_sample(tmp_path: Path):
    config = config_from_dict(
        {
            "name": "local",
            "workdir": str(tmp_path / "run"),
            "data": {
                "source": "local",
                "pair": "en-de",
                "local_dir": str(SHARED_SAMPLE),
                "local_train": ["train"],
                "local_dev": "newstest2012",
                "local_test": "newstest2014.full",
            },
        }
    )
    out = run_stage(config, "download", {}).path
    stats = read_manifest(out)["stats"]
    assert (stats["train_lines"], stats["dev_lines"], stats["test_lines"]) == (10000, 3000, 3003)
    assert sorted(p.name for p in (out / "train").iterdir()) == ["train.de", "train.en"]
    assert (out / "test.de").read_bytes() == (SHARED_SAMPLE / "newstest2014.full.de").read_bytes()
    assert stats["corpora"]["train"]["inputs"]["en"]["path"] == str(
        (SHARED_SAMPLE / "train.en").resolve()
    )
    assert read_lines(out / "dev.en") == read_lines(SHARED_SAMPLE / "newstest2012.en")


def test_local_source_names_missing_files(tmp_path: Path):
    folder = tmp_path / "data"
    folder.mkdir()
    for name in ("train.en", "train.de", "dev.en", "dev.de", "test.en"):
        (folder / name).write_text("a\n")
    config = config_from_dict(
        {
            "name": "l",
            "workdir": str(tmp_path / "run"),
            "data": {"source": "local", "local_dir": str(folder)},
        }
    )
    with pytest.raises(CorpusError, match=r"missing file\(s\): .*test\.de"):
        run_stage(config, "download", {})


def test_local_files_count_by_their_bytes(tmp_path: Path, monkeypatch):
    """An edited local file makes download stale, naming the file; a touched one does not."""
    import os

    from tasks.framework import runner

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # the digest cache: this test's
    folder = tmp_path / "data"
    folder.mkdir()
    for name in ("train.en", "train.de", "dev.en", "dev.de", "test.en", "test.de"):
        (folder / name).write_text("a b\nc d\n")
    config = config_from_dict(
        {
            "name": "l",
            "workdir": str(tmp_path / "run"),
            "data": {"source": "local", "local_dir": str(folder)},
        }
    )
    assert run_stage(config, "download", {}).ran

    def download_status():
        return dict(runner.status(config))["download"]

    later = (folder / "train.en").stat().st_mtime_ns + 5_000_000_000
    os.utime(folder / "train.en", ns=(later, later))
    assert download_status().up_to_date
    (folder / "train.en").write_text("a b\nc e\n")  # the same size, other bytes
    assert (download_status().state, download_status().reason) == (
        "stale",
        "config changed (local_files.train.en)",
    )
    rerun = run_stage(config, "download", {})
    assert rerun.ran and read_lines(rerun.path / "train" / "train.en")[-1] == "c e"


def test_synthetic_source_writes_the_layout_from_the_seed(tmp_path: Path):
    def config(seed: int):
        return config_from_dict(
            {
                "name": "syn",
                "seed": seed,
                "workdir": str(tmp_path / "run"),
                "data": {
                    "source": "synthetic",
                    "synthetic_train": 30,
                    "synthetic_dev": 5,
                    "synthetic_test": 5,
                },
            }
        )

    first = run_stage(config(1), "download", {})
    assert first.stats == {"corpus": "synthetic", "train": 30, "dev": 5, "test": 5}
    assert len(read_lines(first.path / "train" / "synthetic.de")) == 30
    before = read_lines(first.path / "test.en")
    # The grammar draws from the run's seed: another seed is another corpus, not "up to date".
    second = run_stage(config(2), "download", {})
    assert second.ran and read_lines(second.path / "test.en") != before


def test_treebank_source_is_refused(tmp_path: Path):
    config = config_from_dict(
        {
            "name": "tb",
            "workdir": str(tmp_path / "run"),
            "data": {"source": "treebank", "pair": "words-tree"},
        }
    )
    # The parsing pipeline has no download stage: it reads treebank files in its treebank stage.
    with pytest.raises(
        StageError, match="unknown stage 'download' for the parsing pipeline; stages: treebank"
    ):
        run_stage(config, "download", {})
