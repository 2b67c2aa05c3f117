"""Reading the files of a run folder that someone else may have made: never block, never read unbounded.

The runs table, ``watch``, the sweep and the runs widget read folders they did not write: a
course folder, an unpacked archive, another user's outputs. There ``events.jsonl`` may be a
named pipe (``open`` waits for a writer forever), a link to ``/dev/zero`` (``read()`` fills all
memory) or a sparse file of 50 GB. :func:`read_bounded` reads only regular files, checked
before they are opened and again on the open descriptor, and at most ``limit`` bytes; anything
else raises :class:`UnreadableFileError`, an ``OSError`` whose ``strerror`` says what the path
is, so callers that already report "cannot read X: <strerror>" say why.

Imports: the standard library only.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_KINDS = {stat.S_IFIFO: "a named pipe (FIFO)", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a folder"}


class UnreadableFileError(OSError):
    """A path that is not a regular file, or is larger than the reader's limit."""

    def __init__(self, path: str | os.PathLike, why: str):
        super().__init__(errno.EINVAL, why, str(path))


def _check(path: str | os.PathLike, info: os.stat_result, limit: int) -> None:
    if not stat.S_ISREG(info.st_mode):
        kind = _KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")
        raise UnreadableFileError(path, f"it is {kind}, not a file" if kind.startswith("a ") else kind)
    if info.st_size > limit:
        raise UnreadableFileError(path, f"it is {info.st_size:,} bytes, more than the {limit:,} read at most")


def open_regular(path: str | os.PathLike, flags: int = os.O_RDONLY, limit: int | None = None) -> int:
    """A descriptor of ``path`` opened without blocking, once it is known to be a regular file.

    ``os.stat`` first (a FIFO is never opened), then ``O_NONBLOCK`` and ``fstat`` on the
    descriptor (the path may have been swapped in between). FileNotFoundError passes through.
    """
    _check(path, os.stat(path), limit if limit is not None else 1 << 62)
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        _check(path, os.fstat(fd), limit if limit is not None else 1 << 62)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bounded(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them, else UnreadableFileError."""
    fd = open_regular(path, limit=limit)
    try:
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    if total > limit:  # it grew while being read
        raise UnreadableFileError(path, f"it is more than the {limit:,} bytes read at most")
    return b"".join(chunks)


def read_text_bounded(path: str | os.PathLike, limit: int) -> str:
    return read_bounded(Path(path), limit).decode("utf-8", errors="replace")
