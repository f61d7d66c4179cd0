"""Named members out of tar archives, streamed, refusing anything unsafe.

The archives are read in one forward pass (``tarfile`` stream mode): the wanted members are
streamed to the caller and nothing else is written anywhere. Every header is checked: absolute
paths, ``..`` components, symbolic and hard links, devices and FIFOs make the whole archive
refused, with an error naming the member and the archive, wherever the member sits in it.
"""

from __future__ import annotations

import difflib
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import IO

from corpora import CorpusError

__all__ = ["MissingMemberError", "UnsafeArchiveError", "check_member", "iter_members"]



class UnsafeArchiveError(CorpusError):
    """An archive holds a member that could write outside the extraction folder."""


class MissingMemberError(CorpusError):
    """An archive lacks a member the registry names."""


def member_key(name: str) -> str:
    """A member name as the registry writes it (no leading ``./``)."""
    while name.startswith("./"):
        name = name[2:]
    return name


def check_member(member: tarfile.TarInfo, archive: Path) -> None:
    """Raise ``UnsafeArchiveError`` unless ``member`` is a plain file or folder inside the archive root."""
    where = f"member {member.name!r} of {archive}"
    path = PurePosixPath(member.name)
    if path.is_absolute() or member.name.startswith("\\") or (len(member.name) > 1 and member.name[1] == ":"):
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

    Read each stream before asking for the next. The rest of the archive is still scanned (not
    written) so that an unsafe member anywhere refuses the archive; a name the archive lacks is
    a ``MissingMemberError`` listing similar members.
    """
    archive = Path(archive)
    wanted = {member_key(n) for n in names}
    passed: list[str] = []
    if not wanted:
        return
    try:
        with tarfile.open(archive, mode="r|*") as tar:
            for member in tar:
                check_member(member, archive)
                key = member_key(member.name)
                passed.append(key)
                if key not in wanted:
                    continue
                if not member.isfile():
                    raise CorpusError(f"member {member.name!r} of {archive} is a folder, not a file")
                stream = tar.extractfile(member)
                assert stream is not None  # isfile() members always have one
                yield key, stream
                wanted.discard(key)
    except (tarfile.TarError, EOFError) as exc:
        raise CorpusError(f"{archive} is not a readable tar archive (truncated or corrupt?): {exc}") from None
    if not wanted:
        return
    missing = sorted(wanted)
    hints = sorted({h for name in missing for h in difflib.get_close_matches(name, passed, n=3)})
    raise MissingMemberError(
        f"{archive} has no member {', '.join(map(repr, missing))} (fix the path in corpora/sources.py)"
        + (f"; similar members: {', '.join(hints)}" if hints else "")
    )
