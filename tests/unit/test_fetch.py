"""Downloads from file:// URLs, checksum and lock-file verification, safe tar streaming, readers."""

from __future__ import annotations

import hashlib
import io
import random
import tarfile
from pathlib import Path

import pytest

from corpora import CorpusError
from corpora.archives import (
    CorruptArchiveError,
    MissingMemberError,
    UnsafeArchiveError,
    iter_members,
)
from corpora.fetch import ChecksumError, DownloadError, Expected, download, mirror_url
from corpora.lockfile import LockFile
from corpora.text import LineWriter, read_lines, read_sgm, read_text_lines, read_tsv

# ----------------------------------------------------------------------------- helpers


def make_tar(
    path: Path, members: list[tuple[str, bytes] | tarfile.TarInfo], mode: str = "w:gz"
) -> Path:
    """A tarball of (name, data) files and raw TarInfo headers (links, devices, ...)."""
    with tarfile.open(path, mode) as tar:
        for item in members:
            if isinstance(item, tarfile.TarInfo):
                tar.addfile(item)
            else:
                name, data = item
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def special(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info


# ----------------------------------------------------------------------------- mirrors


def test_mirror_replaces_statmt_and_keeps_the_path():
    url = "https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz"
    assert mirror_url(url, None) == url
    assert (
        mirror_url(url, "http://10.0.0.5:8000/wmt/")
        == "http://10.0.0.5:8000/wmt/wmt13/training-parallel-europarl-v7.tgz"
    )
    assert (
        mirror_url(url, "file:///srv/statmt")
        == "file:///srv/statmt/wmt13/training-parallel-europarl-v7.tgz"
    )
    assert mirror_url("http://statmt.org/wmt14/dev.tgz", "file:///m") == "file:///m/wmt14/dev.tgz"
    with pytest.raises(CorpusError, match="file:// folder or an http"):
        mirror_url(url, "/srv/statmt")


# ----------------------------------------------------------------------------- downloads


def test_file_download_verifies_and_is_cached(tmp_path: Path):
    source = tmp_path / "mirror" / "a.bin"
    source.parent.mkdir()
    source.write_bytes(b"x" * 5000)
    dest = tmp_path / "cache" / "a.bin"
    sha = hashlib.sha256(b"x" * 5000).hexdigest()

    seen = download(source.as_uri(), dest, [Expected(bytes=5000, sha256=sha)])
    assert (seen.bytes, seen.sha256) == (5000, sha)
    assert dest.read_bytes() == b"x" * 5000
    assert sorted(p.name for p in dest.parent.iterdir()) == ["a.bin"]  # no .part left behind

    source.unlink()  # a verified cached copy is used without touching the source
    assert download(source.as_uri(), dest, [Expected(sha256=sha)]).sha256 == sha


def test_checksum_mismatch_fails_clearly_and_keeps_nothing(tmp_path: Path):
    source = tmp_path / "a.bin"
    source.write_bytes(b"payload")
    dest = tmp_path / "cache" / "a.bin"
    with pytest.raises(
        ChecksumError, match=r"sha256 is [0-9a-f]{64}, but the registry expects 0{64}"
    ):
        download(source.as_uri(), dest, [Expected(sha256="0" * 64)])
    assert not dest.parent.exists() or list(dest.parent.iterdir()) == []
    with pytest.raises(ChecksumError, match="bytes is 7, but the registry expects 8"):
        download(source.as_uri(), dest, [Expected(bytes=8)])
    assert not dest.exists()


def test_a_corrupt_cached_file_is_downloaded_again(tmp_path: Path):
    source = tmp_path / "a.bin"
    source.write_bytes(b"good bytes")
    dest = tmp_path / "a.cached"
    dest.write_bytes(b"bad bytes")
    sha = hashlib.sha256(b"good bytes").hexdigest()
    assert download(source.as_uri(), dest, [Expected(sha256=sha)]).sha256 == sha
    assert dest.read_bytes() == b"good bytes"


def test_missing_mirror_file_names_the_path(tmp_path: Path):
    with pytest.raises(DownloadError, match="no such file .*nothere.tgz"):
        download((tmp_path / "nothere.tgz").as_uri(), tmp_path / "out.tgz")


def test_lock_file_pins_the_first_download(tmp_path: Path):
    lock = LockFile(tmp_path / "downloads.lock.json")
    url = "https://www.statmt.org/wmt14/dev.tgz"
    assert lock.expected(url) is None
    source = tmp_path / "dev.tgz"
    source.write_bytes(b"first version")
    seen = download(source.as_uri(), tmp_path / "c1" / "dev.tgz")
    lock.pin(url, seen)
    pinned = lock.expected(url)
    assert (pinned.bytes, pinned.sha256) == (seen.bytes, seen.sha256)
    assert str(lock.path) in pinned.origin

    # The file changes upstream: a fresh download no longer matches the pin.
    source.write_bytes(b"second version!")
    with pytest.raises(
        ChecksumError,
        match=f"downloads.lock.json expects .* remove the entry '{url}' from {lock.path} and rerun",
    ):
        download(source.as_uri(), tmp_path / "c2" / "dev.tgz", [pinned])
    assert not (tmp_path / "c2" / "dev.tgz").exists()
    lock.pin(url, download(source.as_uri(), tmp_path / "c3" / "dev.tgz"))  # pin never overwrites
    assert lock.expected(url).sha256 == seen.sha256


# ----------------------------------------------------------------------------- safe extraction


@pytest.mark.parametrize(
    ("member", "reason"),
    [
        (("../evil", b"x"), "'..' path component"),
        (("data/../../evil", b"x"), "'..' path component"),
        (("/etc/evil", b"x"), "absolute path"),
        (
            special("training/link", tarfile.SYMTYPE, "/etc/passwd"),
            "symbolic link to '/etc/passwd'",
        ),
        (special("training/hard", tarfile.LNKTYPE, "training/a.de"), "hard link"),
        (special("training/fifo", tarfile.FIFOTYPE), "FIFO"),
        (special("training/dev", tarfile.CHRTYPE), "device file"),
    ],
)
def test_unsafe_members_refuse_the_archive(tmp_path: Path, member, reason: str):
    archive = make_tar(tmp_path / "bad.tgz", [("training/a.de", b"hallo\n"), member])
    name = member[0] if isinstance(member, tuple) else member.name
    with pytest.raises(
        UnsafeArchiveError, match=f"refusing member {name!r} of .*bad.tgz: {reason}"
    ):
        list(iter_members(archive, ["training/a.de"]))
    assert not (tmp_path / "evil").exists()


def test_only_named_members_are_read_in_archive_order(tmp_path: Path):
    archive = make_tar(
        tmp_path / "ok.tar",
        [("./training/b.en", b"b\n"), ("training/skip.en", b"s\n"), ("training/a.de", b"a\n")],
        mode="w",
    )
    got = [
        (name, stream.read())
        for name, stream in iter_members(archive, ["training/a.de", "training/b.en"])
    ]
    assert got == [("training/b.en", b"b\n"), ("training/a.de", b"a\n")]
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["ok.tar"]  # nothing written


def test_missing_member_lists_similar_names(tmp_path: Path):
    archive = make_tar(tmp_path / "ok.tgz", [("training/europarl-v7.de-en.de", b"a\n")])
    with pytest.raises(
        MissingMemberError,
        match="no member 'training/europarl-v7.de-en.en'.*"
        "similar members: training/europarl-v7.de-en.de",
    ):
        list(iter_members(archive, ["training/europarl-v7.de-en.en"]))


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"<html>not found</html>", "shorter than one tar header: an error page or the wrong file"),
        (
            b"<html>not found</html>\n" * 50,
            "no tar header at its start .*: an error page or the wrong file",
        ),
        (b"", "empty"),
    ],
)
def test_a_file_that_is_not_a_tarball_fails_clearly(tmp_path: Path, content: bytes, reason: str):
    bogus = tmp_path / "x.tgz"
    bogus.write_bytes(content)
    with pytest.raises(
        CorruptArchiveError, match=f"truncated or corrupt archive .*x.tgz \\({reason}"
    ):
        list(iter_members(bogus, ["a"]))


# Three members: random bytes (gzip cannot shrink them, so the middle of the .tgz lies inside the
# first member), then two small text files.
TRUNCATION_MEMBERS = [
    ("a/random.bin", random.Random(0).randbytes(30_000)),
    ("a/b.en", b"b\n" * 100),
    ("a/c.de", b"c\n"),
]


def read_all(archive: Path) -> dict[str, bytes]:
    return {
        name: stream.read()
        for name, stream in iter_members(archive, [n for n, _ in TRUNCATION_MEMBERS])
    }


def tar_offsets() -> dict[str, int]:
    """In the plain tar: where the second header and the end-of-archive block start."""
    padded = [512 + -(-len(data) // 512) * 512 for _, data in TRUNCATION_MEMBERS]
    return {"second": padded[0], "end": sum(padded)}


@pytest.mark.parametrize(
    ("mode", "cut", "reason"),
    [
        ("w:gz", lambda n, at: 5, "Compressed file ended"),
        ("w:gz", lambda n, at: n // 2, "Compressed file ended"),
        ("w:gz", lambda n, at: n - 12, "Compressed file ended"),
        ("w:gz", lambda n, at: n - 8, "Compressed file ended"),
        ("w:gz", lambda n, at: n - 1, "Compressed file ended"),
        ("w", lambda n, at: 3000, "unexpected end of data"),
        (
            "w",
            lambda n, at: at["second"],
            "the tar data ends at byte {second}, without an end-of-archive block",
        ),
        (
            "w",
            lambda n, at: at["second"] + 100,
            "the tar data ends inside the header at byte {second}",
        ),
        (
            "w",
            lambda n, at: at["end"],
            "the tar data ends at byte {end}, without an end-of-archive block",
        ),
    ],
    ids=[
        "tgz-in-gzip-header",
        "tgz-in-first-member",
        "tgz-in-end-of-archive-zeros",
        "tgz-without-trailer",
        "tgz-in-trailer",
        "tar-in-first-member",
        "tar-at-a-header",
        "tar-in-a-header",
        "tar-at-end-of-archive",
    ],
)
def test_truncated_archives_are_named_truncated_not_missing_a_member(
    tmp_path: Path, mode: str, cut, reason: str
):
    """Stream mode takes a short archive for a complete one; every cut must still be reported."""
    archive = make_tar(
        tmp_path / ("t.tgz" if mode == "w:gz" else "t.tar"), TRUNCATION_MEMBERS, mode=mode
    )
    assert read_all(archive) == dict(TRUNCATION_MEMBERS)  # whole, it reads
    whole = archive.read_bytes()
    offsets = tar_offsets()
    archive.write_bytes(whole[: cut(len(whole), offsets)])
    with pytest.raises(
        CorruptArchiveError,
        match=f"^truncated or corrupt archive {archive} \\(.*{reason.format(**offsets)}",
    ):
        read_all(archive)


@pytest.mark.parametrize(
    ("flip", "reason"),
    [
        (lambda n: n // 2, "CRC check failed"),
        (lambda n: n - 6, "CRC check failed"),
        (lambda n: n - 2, "Incorrect length"),
    ],
    ids=["in-first-member", "in-crc", "in-length"],
)
def test_a_corrupt_tgz_is_named_corrupt(tmp_path: Path, flip, reason: str):
    archive = make_tar(tmp_path / "t.tgz", TRUNCATION_MEMBERS)
    data = bytearray(archive.read_bytes())
    data[flip(len(data))] ^= 0xFF
    archive.write_bytes(bytes(data))
    with pytest.raises(
        CorruptArchiveError, match=f"truncated or corrupt archive .*t.tgz \\({reason}"
    ):
        read_all(archive)


# ----------------------------------------------------------------------------- readers and writer


def test_sgm_keeps_document_order_and_unescapes_entities():
    sgm = [
        '<srcset setid="newstest2014" srclang="any">',
        '<doc sysid="ref" docid="1" genre="news" origlang="en">',
        '<seg id="2">AT&amp;T says &quot;hi&quot; &lt;b&gt; &#228; &#x263A;</seg>',
        '<seg id="1">  two   spaces\tand tab  </seg>',
        "</doc>",
        '<doc docid="2"><seg id=1>M&S literal ampersand</seg>',
        "</doc></srcset>",
    ]
    assert list(read_sgm(sgm)) == [
        'AT&T says "hi" <b> ä ☺',
        "two spaces and tab",
        "M&S literal ampersand",
    ]
    with pytest.raises(ValueError, match="line 1: <seg> without a closing"):
        list(read_sgm(['<seg id="1">never closed']))


def test_tsv_rows_need_every_column():
    assert list(read_tsv(["a\tb", "c\td"], 2)) == [("a", "b"), ("c", "d")]
    with pytest.raises(ValueError, match="line 2: 3 tab-separated fields, expected 2"):
        list(read_tsv(["a\tb", "c\td\te"], 2))


def test_text_lines_split_on_newline_only():
    stream = io.BytesIO("one\r\ntwo\x85 still two\n".encode() + b"bad \xff byte\nlast")
    assert list(read_text_lines(stream)) == ["one", "two\x85 still two", "bad \ufffd byte", "last"]


def test_line_writer_keeps_every_reader_line_aligned(tmp_path: Path):
    path = tmp_path / "out.en"
    with LineWriter(path) as writer:
        for segment in ["plain", "carriage\rreturn", "line\u2028separator", "", "bad \ufffd"]:
            writer.write(segment)
    assert (writer.lines, writer.broken_lines, writer.replacement_chars) == (5, 2, 1)
    text = path.read_text(encoding="utf-8")
    assert text.splitlines() == ["plain", "carriage return", "line separator", "", "bad \ufffd"]
    assert read_lines(path) == text.splitlines()


def test_read_lines_splits_on_newline_only_and_keeps_empty_lines(tmp_path: Path):
    path = tmp_path / "hyp.tree"
    path.write_bytes("S /S\r\n\nNP\u2028/NP\nlast".encode())
    assert read_lines(path) == ["S /S", "", "NP\u2028/NP", "last"]
    with pytest.raises(CorpusError, match="absent.txt does not exist"):
        read_lines(tmp_path / "absent.txt")
