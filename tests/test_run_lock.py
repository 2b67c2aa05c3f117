"""workbench.engine.run_lock: one run per output folder, checked with real processes."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from workbench.engine import run_lock
from workbench.errors import OutputDirLockedError

# A second process that takes the lock, writes a real event log like a run, says so, and
# holds the lock until its stdin closes (or it is killed).
HOLDER = """
import sys
from workbench.engine import run_lock
from workbench.engine.events import EventLog
lock = run_lock.acquire(sys.argv[1])
log = EventLog(sys.argv[1], tensorboard=False)
log.write("start", total_steps=10)
log.close()
print("held", flush=True)
sys.stdin.read()
lock.release()
"""

# Several of these start together; each tries once and reports.
CONTENDER = """
import sys, time
from workbench.engine import run_lock
from workbench.errors import OutputDirLockedError
start_at = float(sys.argv[2])
time.sleep(max(0.0, start_at - time.time()))
try:
    lock = run_lock.acquire(sys.argv[1])
except OutputDirLockedError as exc:
    print("refused", exc.holder.get("pid"), flush=True)
else:
    print("held", flush=True)
    time.sleep(2.0)
    lock.release()
"""


def _start_holder(out):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_second_run_is_refused_with_the_holder_named_and_watch_still_reads(tmp_path):
    out = tmp_path / "run"
    holder = _start_holder(out)
    try:
        with pytest.raises(OutputDirLockedError) as err:
            run_lock.acquire(out)
        assert err.value.holder["pid"] == holder.pid
        assert err.value.holder["host"] == socket.gethostname()
        text = str(err.value)
        assert f"process {holder.pid} on host {socket.gethostname()}" in text
        assert "another output_dir" in err.value.fix and "watch" in err.value.fix
        # The lock is advisory: the folder stays readable to watch while the run holds it.
        from workbench.frontend import watch

        seen = watch(out, "none", follow=False)
        assert seen.start is not None and seen.start["total_steps"] == 10
        assert json.loads((out / run_lock.LOCK_FILE).read_text())["pid"] == holder.pid
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    # Released by the holder: the file is gone and the next run takes it without a note.
    assert not (out / run_lock.LOCK_FILE).exists()
    lock = run_lock.acquire(out)
    assert lock.note is None
    lock.release()


def test_lock_of_a_killed_run_is_taken_over_with_a_note(tmp_path):
    out = tmp_path / "run"
    holder = _start_holder(out)
    os.kill(holder.pid, signal.SIGKILL)  # no release: the record stays, the kernel drops the flock
    holder.wait(timeout=30)
    holder.stdout.close()
    holder.stdin.close()
    assert json.loads((out / run_lock.LOCK_FILE).read_text())["pid"] == holder.pid
    with run_lock.acquire(out) as lock:
        assert lock.note is not None
        assert f"process {holder.pid}" in lock.note and "no longer running" in lock.note
        assert run_lock.read_holder(out)["pid"] == os.getpid()
        # Our own second attempt (a second fit in the same kernel) is refused as well.
        with pytest.raises(OutputDirLockedError, match="in use by another run") as err:
            run_lock.acquire(out)
        assert "restart the kernel" in err.value.fix
    assert not (out / run_lock.LOCK_FILE).exists()


def test_runs_started_together_exactly_one_wins(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    start_at = time.time() + 1.5  # after every interpreter has started
    procs = [subprocess.Popen([sys.executable, "-c", CONTENDER, str(out), str(start_at)],
                              stdout=subprocess.PIPE, text=True) for _ in range(3)]
    results = [p.communicate(timeout=60)[0].split() for p in procs]
    winners = [p.pid for p, r in zip(procs, results, strict=True) if r[0] == "held"]
    refused = [r for r in results if r[0] == "refused"]
    assert len(winners) == 1, results
    assert len(refused) == 2 and all(int(r[1]) == winners[0] for r in refused), results


def test_refusal_in_the_moment_before_the_winner_writes_its_record_still_names_it(tmp_path):
    # The winner of a race takes the flock and writes its record a moment later; a run refused
    # in between must still name it (CI once saw "held by None" here).
    out = tmp_path / "run"
    out.mkdir()
    fd = os.open(out / run_lock.LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    record = {"pid": 4242, "host": "winner-host"}
    writer = threading.Timer(0.3, lambda: os.pwrite(fd, json.dumps(record).encode(), 0))
    writer.start()
    try:
        with pytest.raises(OutputDirLockedError) as err:
            run_lock.acquire(out)
    finally:
        writer.join()
        os.close(fd)
    assert err.value.holder.get("pid") == 4242
    assert "process 4242 on host winner-host" in str(err.value)


def test_lock_file_without_a_record_is_still_a_lock(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / run_lock.LOCK_FILE).write_text("not json")  # a holder killed mid-write
    lock = run_lock.acquire(out)
    assert "unknown process" in lock.note
    lock.release()


def test_the_probe_asks_the_lock_not_the_pid(tmp_path):
    out = tmp_path / "run"
    assert run_lock.probe(out) is False  # no folder, no lock file: nobody
    holder = _start_holder(out)
    try:
        assert run_lock.probe(out) is True
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    # The record still names the dead process (kill -9 releases nothing but the flock): not held.
    assert json.loads((out / run_lock.LOCK_FILE).read_text())["pid"] == holder.pid
    assert run_lock.probe(out) is False


def test_a_probe_at_the_moment_a_run_starts_never_refuses_it(tmp_path, monkeypatch):
    """The probe's shared lock lasts microseconds; acquire waits that out instead of calling the folder taken."""
    out = tmp_path / "run"
    out.mkdir()
    (out / run_lock.LOCK_FILE).write_text("")
    reader = os.open(out / run_lock.LOCK_FILE, os.O_RDONLY)
    fcntl.flock(reader, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a runs table probing right now
    threading.Timer(0.1, os.close, [reader]).start()
    with run_lock.acquire(out) as lock:
        assert lock.held


def test_a_fifo_as_the_lock_file_does_not_hang_the_probe(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    os.mkfifo(out / run_lock.LOCK_FILE)
    assert run_lock.probe(out) is None
