"""The event log: written line by line, read back, followed live, across resumes."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from workbench.engine.events import EventLog, events_path, follow, read_events, writer_alive
from workbench.errors import WorkbenchError


def write_run(output_dir, steps=3, status="completed", tensorboard=False):
    with EventLog(output_dir, tensorboard=tensorboard) as log:
        log.write("start", total_steps=steps, num_epochs=1, config={}, world_size=1,
                  precision="fp32", device="cpu")
        for step in range(1, steps + 1):
            log.write("train", step=step, epoch=step / steps, loss=1.0 / step, lr=1e-3,
                      samples_per_s=100.0, gpu_mem_bytes=None, eta_s=steps - step, skipped_steps=0)
        log.write("eval", step=steps, epoch=1.0, eval_loss=0.3, eval_accuracy=0.9, eval_f1=0.88)
        log.write("end", status=status, step=steps, metrics={"eval_accuracy": 0.9})


def test_each_event_is_one_flushed_line(tmp_path):
    log = EventLog(tmp_path, tensorboard=False)
    event = log.write("train", step=1, epoch=0.1, loss=0.5, lr=2e-5)
    # Read through a separate handle before close(): the line is already on disk.
    lines = events_path(tmp_path).read_text().splitlines()
    log.close()
    assert len(lines) == 1
    on_disk = json.loads(lines[0])
    assert on_disk == event
    assert on_disk["kind"] == "train" and on_disk["loss"] == 0.5
    assert abs(on_disk["time"] - time.time()) < 60


def test_read_events_returns_whole_run_in_order(tmp_path):
    write_run(tmp_path, steps=3)
    events = read_events(tmp_path)
    assert [e["kind"] for e in events] == ["start", "train", "train", "train", "eval", "end"]
    assert [e["step"] for e in events if e["kind"] == "train"] == [1, 2, 3]
    assert events[0]["pid"] > 0 and events[0]["host"]


def test_values_from_numpy_torch_and_paths_are_serialised(tmp_path):
    torch = pytest.importorskip("torch")
    with EventLog(tmp_path, tensorboard=False) as log:
        log.write("train", step=1, loss=torch.tensor(0.25), lr=torch.tensor(1e-3).double())
        log.write("checkpoint", step=1, path=tmp_path / "checkpoint-1")
    train, ckpt = read_events(tmp_path)
    assert train["loss"] == pytest.approx(0.25) and isinstance(train["loss"], float)
    assert ckpt["path"] == str(tmp_path / "checkpoint-1")


def test_unknown_kind_is_refused(tmp_path):
    with EventLog(tmp_path, tensorboard=False) as log, pytest.raises(ValueError, match="unknown"):
        log.write("stepp", step=1)


def test_partial_last_line_is_skipped_and_resume_appends(tmp_path):
    write_run(tmp_path, steps=2, status="interrupted")
    with events_path(tmp_path).open("a") as f:
        f.write('{"time": 1, "kind": "train", "st')  # killed mid-write
    assert read_events(tmp_path)[-1]["kind"] == "end"  # the half line is not an event

    # The resumed run continues the same log; its start marks the resume.
    with EventLog(tmp_path, tensorboard=False) as log:
        log.write("start", total_steps=4, resumed_from_step=2)
        log.write("train", step=3, loss=0.2)
    kinds = [e["kind"] for e in read_events(tmp_path)]
    assert kinds == ["start", "train", "train", "eval", "end", "start", "train"]


def test_listener_gets_each_event_and_a_broken_one_does_not_stop_training(tmp_path, caplog):
    seen = []

    def broken(event):
        raise RuntimeError("display crashed")

    with EventLog(tmp_path, tensorboard=False) as log:
        log.add_listener(broken)
        log.add_listener(seen.append)
        log.write("message", text="hello", level="info")
        log.write("train", step=1, loss=0.1)
    assert [e["kind"] for e in seen] == ["message", "train"]
    assert seen[0]["text"] == "hello" and "time" in seen[0]
    assert sum("listener" in r.getMessage() for r in caplog.records) == 1  # logged once


def test_disabled_log_writes_nothing(tmp_path):
    out = tmp_path / "rank1"
    seen = []
    with EventLog(out, enabled=False) as log:
        log.add_listener(seen.append)
        event = log.write("train", step=1, loss=0.1)
    assert event["kind"] == "train"
    assert not out.exists()
    assert seen == []


@pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed"
)
def test_tensorboard_scalars_are_written(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    write_run(tmp_path, steps=3, tensorboard=None)
    tb_dir = tmp_path / "tensorboard"
    assert list(tb_dir.glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/lr", "eval/loss", "eval/accuracy", "eval/f1"} <= tags
    assert [s.step for s in acc.Scalars("train/loss")] == [1, 2, 3]
    assert acc.Scalars("eval/accuracy")[0].value == pytest.approx(0.9)


@pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed"
)
def test_tensorboard_drops_the_interrupted_runs_points_after_the_resume_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    write_run(tmp_path, steps=3, status="interrupted", tensorboard=None)
    with EventLog(tmp_path) as log:
        log.write("start", total_steps=4, resumed_from_step=2)
        log.write("train", step=3, loss=0.123)
        log.write("train", step=4, loss=0.1)
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    points = [(s.step, round(s.value, 3)) for s in acc.Scalars("train/loss")]
    assert points == [(1, 1.0), (2, 0.5), (3, 0.123), (4, 0.1)]


def test_follow_sees_events_from_a_writer_thread_and_stops_at_end(tmp_path):
    log = EventLog(tmp_path, tensorboard=False)
    log.write("start", total_steps=5)

    def train():
        for step in range(1, 6):
            time.sleep(0.02)
            log.write("train", step=step, loss=1.0 / step)
        log.write("end", status="completed", step=5, metrics={})
        log.close()

    writer = threading.Thread(target=train)
    writer.start()
    events = list(follow(tmp_path, poll_s=0.01))
    writer.join()
    assert [e["kind"] for e in events] == ["start"] + ["train"] * 5 + ["end"]
    assert [e["step"] for e in events if e["kind"] == "train"] == [1, 2, 3, 4, 5]


def test_follow_waits_for_a_line_being_written(tmp_path):
    path = events_path(tmp_path)
    path.write_text('{"kind": "start", "time": 1}\n{"kind": "end", "st')
    stream = follow(tmp_path, poll_s=0.01, stop_when_writer_exits=False)
    assert next(stream)["kind"] == "start"
    with path.open("a") as f:
        f.write('atus": "completed", "time": 2}\n')
    assert next(stream) == {"kind": "end", "status": "completed", "time": 2}
    assert list(stream) == []  # stopped at end


def test_follow_does_not_stop_at_an_end_that_a_resume_followed(tmp_path):
    write_run(tmp_path, steps=1, status="interrupted")
    with EventLog(tmp_path, tensorboard=False) as log:
        log.write("start", total_steps=2)
        log.write("train", step=2, loss=0.1)
        log.write("end", status="completed", step=2, metrics={})
    kinds = [e["kind"] for e in follow(tmp_path, poll_s=0.01)]
    assert kinds == ["start", "train", "eval", "end", "start", "train", "end"]


def test_follow_stops_when_the_writer_died_without_end(tmp_path):
    # A real process writes start and exits without "end", as a crash would.
    code = (
        "import sys; from workbench.engine.events import EventLog; "
        "EventLog(sys.argv[1], tensorboard=False).write('start', total_steps=9)"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=60)
    start = read_events(tmp_path)[0]
    assert writer_alive(start) is False
    events = list(follow(tmp_path, poll_s=0.5, sleep=lambda s: None))
    assert [e["kind"] for e in events] == ["start"]


def test_follow_missing_folder_or_log_gives_a_clear_error(tmp_path):
    with pytest.raises(WorkbenchError, match="no run folder") as info:
        next(follow(tmp_path / "nope"))
    assert info.value.fix
    naps = []
    with pytest.raises(WorkbenchError, match="no event log") as info:
        next(follow(tmp_path, poll_s=1.0, wait_for_log_s=3, sleep=naps.append))
    assert "output_dir" in info.value.fix
    assert sum(naps) == 3


def test_follow_stops_for_a_killed_run_even_when_its_pid_lives_on(tmp_path):
    """kill -9 leaves the lock file naming the dead process; the PID may belong to another process
    by now (here: this one). The lock, held by nobody, says the writer is gone."""
    from workbench.engine import run_lock

    with EventLog(tmp_path, tensorboard=False) as log:
        log.write("start", total_steps=9)  # its pid: this live process
    start = read_events(tmp_path)[0]
    with run_lock.acquire(tmp_path):  # a live run holds it: alive
        assert writer_alive(start, tmp_path) is True
    (tmp_path / run_lock.LOCK_FILE).write_text(json.dumps({"pid": os.getpid(), "host": "here"}))  # as kill -9 leaves it
    assert writer_alive(start) is True and writer_alive(start, tmp_path) is False
    events = list(follow(tmp_path, poll_s=0.5, sleep=lambda s: None))
    assert [e["kind"] for e in events] == ["start"]
