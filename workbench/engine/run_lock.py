"""One run per output folder: ``lock = run_lock.acquire(output_dir)`` ... ``lock.release()``.

Two runs writing one ``output_dir`` interleave their checkpoints and event logs and
both report success, so the second is refused. The lock is ``fcntl.flock`` on
``<output_dir>/.workbench.lock``: the kernel releases it when its holder exits in any
way (``kill -9``, a crashed kernel, a closed notebook tab), so a dead run never blocks
the folder and no "is that PID still alive?" guess is needed to break a stale lock.
The file also holds a readable JSON record of the holder (pid, host, start time,
command), used to name the holder in the refusal and to notice, when a run takes a
free lock whose file is still there, that the previous holder died without
releasing it.

The lock is advisory: readers (``workbench.watch``, ``result_from_disk``, a user's
``ls``) never take it and are never blocked. Whether a run is alive is asked of the lock
itself (:func:`probe`, a non-blocking shared ``flock`` that is dropped at once), never of a
PID: PIDs are reused (they wrap within an hour on a busy machine, and a restarted container
hands out the small ones again), and a PID says nothing about a process on another host.
A probe holds the lock for microseconds; :func:`acquire` retries for ``PROBE_PATIENCE_S``
before it calls a folder taken, so a runs table read at that moment never refuses a run.

Where the folder is on NFS, Linux emulates flock with NFS byte-range locks, which
work across machines with NFSv4; on filesystems without locking (some FUSE mounts)
:func:`acquire` says so instead of pretending to hold the folder.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import os
import socket
import stat
import sys
import time
from pathlib import Path
from typing import Any

from workbench.engine.safe_read import read_text_bounded
from workbench.errors import OutputDirLockedError, WorkbenchError

LOCK_FILE = ".workbench.lock"
PROBE_PATIENCE_S = 0.5  # acquire's retries while another process may only be probing the lock
_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
MAX_RECORD_BYTES = 64 << 10  # the holder's record is a few hundred bytes


def lock_path(output_dir: str | os.PathLike, lock_file: str = LOCK_FILE) -> Path:
    return Path(output_dir) / lock_file


def read_holder(output_dir: str | os.PathLike, lock_file: str = LOCK_FILE) -> dict[str, Any] | None:
    """The record of the run that holds (or last held, if it died) the folder; None if none."""
    try:
        # Bounded and without blocking (engine/safe_read.py): in a folder someone else made, the
        # lock may be a FIFO or a link to a device; that raises UnreadableFileError (an OSError).
        text = read_text_bounded(lock_path(output_dir, lock_file), MAX_RECORD_BYTES)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        holder = json.loads(text)
    except ValueError:  # written by a process killed mid-write, or not ours
        return {} if text.strip() else None
    return holder if isinstance(holder, dict) else {}


def describe_holder(holder: dict[str, Any]) -> str:
    if not holder:
        return "an unknown process (the lock file has no readable record)"
    where = f"process {holder.get('pid', '?')} on host {holder.get('host', '?')}"
    if holder.get("started"):
        where += f", started {holder['started']}"
    if holder.get("command"):
        where += f" ({holder['command']})"
    return where


class RunLock:
    """The held lock of one output folder. ``note`` says whether a dead run's lock was taken over."""

    def __init__(self, output_dir: Path, fd: int, record: dict[str, Any], note: str | None,
                 lock_file: str = LOCK_FILE, shared: bool = False):
        self.output_dir = output_dir
        self.path = lock_path(output_dir, lock_file)
        self.record = record
        self.note = note
        self.shared = shared  # one of several holders: they leave the file (and its record) alone
        self._fd: int | None = fd
        self._owner = os.getpid()  # a forked child's copy of this object must not release it

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Remove the lock file, then drop the lock. Safe to call twice."""
        if self._fd is None or os.getpid() != self._owner:
            return
        fd, self._fd = self._fd, None
        # Unlink while still holding the lock: a process waiting on the old file then finds
        # that its file is no longer the one at the path and retries (see acquire). A shared
        # holder never does: the others still hold that file.
        if not self.shared:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        os.close(fd)  # closing the last descriptor releases the flock

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self):  # a kernel that drops the object without release(): free the folder anyway
        with contextlib.suppress(Exception):
            self.release()


def _command() -> str:
    argv = " ".join(sys.argv)
    return argv if len(argv) <= 200 else argv[:197] + "..."


def acquire(output_dir: str | os.PathLike, *, lock_file: str = LOCK_FILE, kind: str = "run",
            shared: bool = False) -> RunLock:
    """Take the folder's lock or raise OutputDirLockedError naming the process that holds it.

    Creates ``output_dir`` if needed. A lock file left by a process that died is taken
    over; ``RunLock.note`` then says whose it was (log it: the folder may hold that
    run's half-finished work). ``lock_file`` and ``kind`` ("run", "sweep") name another lock
    of the folder and its holder in messages; ``shared``: one of several holders that
    exclude an exclusive one (a sweep's Slurm array tasks), writing no record.
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    path = lock_path(output_dir, lock_file)
    for _ in range(10):  # retried only when the file was replaced under us (see below)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o644)
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO there would block the read of the record
            os.close(fd)
            raise WorkbenchError(f"{path} is not a file (a named pipe or a device): it cannot be this folder's lock.",
                                 f"remove it (rm {path}), or pass another output_dir.")
        try:
            _flock_patiently(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        except OSError as exc:
            os.close(fd)
            if exc.errno in _BUSY:
                holder = _wait_for_holder(output_dir, lock_file=lock_file)
                raise _locked_error(output_dir, holder, kind) from None
            raise WorkbenchError(
                f"Cannot lock {path}: {exc.strerror or exc} (the filesystem may not support locks).",
                "put output_dir on a local disk or a volume that supports file locks.") from None
        # The holder we waited behind may have released (unlinked) the file between our
        # open and our flock: then we hold a lock on a file nobody else will ever see.
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            if shared:
                return RunLock(output_dir, fd, {}, None, lock_file, shared=True)
            return _take(output_dir, fd, lock_file)
        os.close(fd)
    raise WorkbenchError(f"Could not lock {path}: it keeps being replaced by another process.",
                         "make sure only one run uses this output_dir, then run again.")


def _flock_patiently(fd: int, mode: int = fcntl.LOCK_EX, patience_s: float = PROBE_PATIENCE_S) -> None:
    """``flock(mode | LOCK_NB)``, retried for ``patience_s`` while the lock is busy: a reader's
    probe holds it for microseconds, a run holds it for hours."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except OSError as exc:
            if exc.errno not in _BUSY or time.monotonic() >= deadline:
                raise
        time.sleep(0.01)


def probe(output_dir: str | os.PathLike) -> bool | None:
    """Whether a live process holds the folder's lock: True, False, or None when it cannot be told.

    A non-blocking shared ``flock`` on a read-only descriptor, released at once: it fails only
    while a run holds the folder, whatever became of the PID the lock file names, and on NFS
    (where Linux maps ``flock`` onto the server's byte-range locks) it sees holders on other
    hosts too. No lock file: False. None: not a regular file, unreadable, or a file system
    without locks.
    """
    path = lock_path(output_dir)
    try:  # O_NONBLOCK: a FIFO planted in the folder must not hang the reader
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        return True if exc.errno in _BUSY else None
    else:
        return False
    finally:
        os.close(fd)  # closing drops the shared lock, if it was taken


def _wait_for_holder(output_dir: Path, patience_s: float = 1.0, lock_file: str = LOCK_FILE) -> dict[str, Any] | None:
    """The holder's record, waiting briefly for it: a run that has just won the lock writes its
    record a moment after taking it, and a refusal that read the file in that moment would name
    "an unknown process". A holder killed before writing stays unknown after ``patience_s``."""
    deadline = time.monotonic() + patience_s
    while True:
        holder = read_holder(output_dir, lock_file)
        if (holder and "pid" in holder) or time.monotonic() >= deadline:
            return holder
        time.sleep(0.02)


def _take(output_dir: Path, fd: int, lock_file: str = LOCK_FILE) -> RunLock:
    previous = os.read(fd, 1 << 16).decode("utf-8", errors="replace").strip()
    note = None
    if previous:  # a lock file with a record but no lock: its holder died without releasing
        try:
            old = json.loads(previous)
        except ValueError:
            old = {}
        old = old if isinstance(old, dict) else {}
        note = (f"Took over the lock of {output_dir} from {describe_holder(old)}, which is no longer "
                "running: it stopped without releasing the folder (killed, or its kernel died).")
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": _command(),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record, indent=2) + "\n").encode("utf-8"), 0)
    return RunLock(output_dir, fd, record, note, lock_file)


def _locked_error(output_dir: Path, holder: dict[str, Any] | None, kind: str = "run") -> OutputDirLockedError:
    holder = holder or {}
    same_process = holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname()
    who = describe_holder(holder)
    if kind == "sweep":
        if not holder:  # shared holders write no record
            who = "its Slurm array tasks, which hold it together and write no record (`squeue` lists them)"
        fix = (f"wait for that sweep to finish (`workbench runs {output_dir}` shows its combinations), stop "
               "it, or give this one another --name (or --outputs).")
    elif same_process:
        fix = ("this notebook kernel is already running a fit on this folder (in another thread, or "
               "one still holding it): wait for it, or restart the kernel; or pass another output_dir.")
    else:
        fix = ("wait for that run to finish (follow it with workbench.watch(output_dir) or "
               f"`workbench watch {output_dir}`), stop it, or pass another output_dir.")
    return OutputDirLockedError(f"{output_dir} is in use by another {kind}: {who}.", fix,
                                output_dir=output_dir, holder=holder)
