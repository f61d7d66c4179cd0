"""Named members out of tar archives, streamed, refusing anything unsafe or incomplete.

The archives are read in one forward pass (``tarfile`` stream mode): the wanted members are
streamed to the caller and nothing else is written anywhere. Every header is checked: absolute
paths, ``..`` components, symbolic and hard links, devices and FIFOs make the whole archive
refused, with an error naming the member and the archive, wherever the member sits in it. An
archive must also be whole: a compressed stream that ends early or fails its checksum, or a tar
that stops without its end-of-archive block, is a ``CorruptArchiveError``, not a missing member.
"""

from __future__ import annotations

import bz2
import difflib
import gzip
import io
import lzma
import tarfile
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath
from tarfile import ReadError, TarFile, TarInfo
from typing import IO, Any, Self

from corpora import CorpusError

__all__ = [
    "CorruptArchiveError",
    "MissingMemberError",
    "UnsafeArchiveError",
    "check_member",
    "iter_members",
]

CHUNK = 1 << 20
# Compressed formats by their magic bytes; the decompressors check their own trailers (CRC,
# length) and raise EOFError when the data stops early, which tarfile's own stream reader does not.
_DECOMPRESSORS: dict[bytes, Any] = {
    b"\x1f\x8b": gzip.GzipFile,
    b"BZh": bz2.BZ2File,
    b"\xfd7zXZ\x00": lzma.LZMAFile,
}
# What reading a damaged archive raises: tarfile's own errors, a short compressed stream, bad
# compressed data (gzip and bz2 report it as OSError).
_READ_ERRORS = (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, OSError)


class UnsafeArchiveError(CorpusError):
    """An archive holds a member that could write outside the extraction folder."""


class MissingMemberError(CorpusError):
    """An archive lacks a member the registry names."""


class CorruptArchiveError(CorpusError):
    """An archive is truncated or damaged: it cannot be read to its end."""


def member_key(name: str) -> str:
    """A member name as the registry writes it (no leading ``./``)."""
    while name.startswith("./"):
        name = name[2:]
    return name


def check_member(member: tarfile.TarInfo, archive: Path) -> None:
    """Raise ``UnsafeArchiveError`` unless ``member`` is a plain file or folder inside the
    archive root."""
    where = f"member {member.name!r} of {archive}"
    path = PurePosixPath(member.name)
    if (
        path.is_absolute()
        or member.name.startswith("\\")
        or (len(member.name) > 1 and member.name[1] == ":")
    ):
        raise UnsafeArchiveError(f"refusing {where}: absolute path")
    if ".." in path.parts or ".." in member.name.split("\\"):
        raise UnsafeArchiveError(f"refusing {where}: '..' path component")
    if member.issym():
        raise UnsafeArchiveError(f"refusing {where}: symbolic link to {member.linkname!r}")
    if member.islnk():
        raise UnsafeArchiveError(f"refusing {where}: hard link to {member.linkname!r}")
    if member.ischr() or member.isblk():
        raise UnsafeArchiveError(f"refusing {where}: device file")
    if member.isfifo():
        raise UnsafeArchiveError(f"refusing {where}: FIFO")
    if not (member.isfile() or member.isdir()):
        raise UnsafeArchiveError(f"refusing {where}: unsupported member type {member.type!r}")
    data_filter = getattr(tarfile, "data_filter", None)  # Python >= 3.10.12 / 3.11.4
    if data_filter is not None:
        try:
            data_filter(member, "/nonexistent/extraction-root")
        except tarfile.FilterError as exc:
            raise UnsafeArchiveError(f"refusing {where}: {exc}") from None


def iter_members(archive: Path, names: Iterable[str]) -> Iterator[tuple[str, IO[bytes]]]:
    """Yield ``(name, readable)`` for each named file member, in archive order, in one pass.

    Read each stream before asking for the next. The rest of the archive is still read (not
    written) so that an unsafe member anywhere refuses the archive and a truncated one is caught;
    a name the archive lacks is a ``MissingMemberError`` listing similar members.
    """
    archive = Path(archive)
    wanted = {member_key(n) for n in names}
    passed: list[str] = []
    if not wanted:
        return
    with open(archive, "rb") as raw:
        try:
            with (
                _decompressed(raw) as data,
                tarfile.open(fileobj=data, mode="r|", tarinfo=_WholeArchiveHeader) as tar,
            ):
                for member in tar:
                    check_member(member, archive)
                    key = member_key(member.name)
                    passed.append(key)
                    if key not in wanted:
                        continue
                    if not member.isfile():
                        raise CorpusError(
                            f"member {member.name!r} of {archive} is a folder, not a file"
                        )
                    stream = tar.extractfile(member)
                    # isfile() members always have one, tarfile's ExFileObject (a BufferedReader)
                    assert isinstance(stream, io.BufferedReader)
                    yield key, io.BufferedReader(_MemberReader(stream, archive), CHUNK)
                    wanted.discard(key)
                # tarfile stops at the end-of-archive block; a compressed trailer (CRC, length)
                # is only checked, and its absence noticed, when the decompressor reads to the end.
                while data.read(CHUNK):
                    pass
        except _READ_ERRORS as exc:
            raise corrupt_archive(archive, exc) from None
    if not wanted:
        return
    missing = sorted(wanted)
    hints = sorted({h for name in missing for h in difflib.get_close_matches(name, passed, n=3)})
    absent = ", ".join(map(repr, missing))
    raise MissingMemberError(
        f"{archive} has no member {absent} (fix the path in corpora/sources.py)"
        + (f"; similar members: {', '.join(hints)}" if hints else "")
    )


def corrupt_archive(archive: Path, cause: object) -> CorruptArchiveError:
    """The one error for an archive that cannot be read to its end, naming the file and the
    cause."""
    detail = str(cause) or type(cause).__name__
    return CorruptArchiveError(f"truncated or corrupt archive {archive} ({detail})")


def _decompressed(raw: io.BufferedReader) -> io.BufferedIOBase:
    """``raw`` itself for a plain tar, or a decompressing reader chosen by the magic bytes."""
    head = raw.peek(6)[:6]
    for magic, opener in _DECOMPRESSORS.items():
        if head.startswith(magic):
            return (
                opener(fileobj=raw, mode="rb")
                if opener is gzip.GzipFile
                else opener(raw, mode="rb")
            )
    return raw


# tarfile's header errors: CPython's, but undocumented, and typeshed's tarfile leaves them out.
_EMPTY_HEADER = tarfile.EmptyHeaderError  # pyrefly: ignore[missing-attribute]
_TRUNCATED_HEADER = tarfile.TruncatedHeaderError  # pyrefly: ignore[missing-attribute]
_INVALID_HEADER = tarfile.InvalidHeaderError  # pyrefly: ignore[missing-attribute]


class _WholeArchiveHeader(TarInfo):
    """Headers read as usual, except that a tar ending without its end-of-archive block, or a
    damaged header, is an error: tarfile takes either, after the first header, for the end."""

    @classmethod
    def fromtarfile(cls, tarfile: TarFile) -> Self:  # TarInfo's name for it, shadowing the module
        offset = tarfile.offset
        try:
            return super().fromtarfile(tarfile)
        except _EMPTY_HEADER:
            reason = (
                "empty"
                if offset == 0
                else f"the tar data ends at byte {offset}, without an end-of-archive block"
            )
        except _TRUNCATED_HEADER:
            reason = (
                "shorter than one tar header: an error page or the wrong file?"
                if offset == 0
                else f"the tar data ends inside the header at byte {offset}"
            )
        except _INVALID_HEADER as exc:
            reason = (
                f"no tar header at its start ({exc}): an error page or the wrong file?"
                if offset == 0
                else f"damaged tar header at byte {offset} ({exc})"
            )
        raise ReadError(reason)


class _MemberReader(io.RawIOBase):
    """A member's bytes; a short or damaged archive surfaces as ``CorruptArchiveError``
    in the caller's read, not as whatever tarfile or the decompressor raised."""

    def __init__(self, stream: io.BufferedIOBase, archive: Path) -> None:
        self._stream = stream
        self._archive = archive

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            return self._stream.readinto(buffer)
        except _READ_ERRORS as exc:
            raise corrupt_archive(self._archive, exc) from None
