"""watch(): replays a finished run, follows a live one to its end, explains a missing one."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
import time

import pytest

from workbench import cli
from workbench.engine import events
from workbench.engine.events import EventLog
from workbench.errors import WorkbenchError
from workbench.frontend import watch


def write_finished_run(output_dir, steps=3, status="completed"):
    with EventLog(output_dir, tensorboard=False) as log:
        log.write("start", total_steps=steps, num_epochs=1, config={"output_dir": str(output_dir)},
                  world_size=1, precision="fp32", device="cpu")
        for step in range(1, steps + 1):
            log.write("train", step=step, epoch=step / steps, loss=1.0 / step, lr=1e-3,
                      samples_per_s=10.0, gpu_mem_bytes=None, eta_s=0.0, skipped_steps=0)
        log.write("eval", step=steps, epoch=1.0, eval_loss=0.2, eval_accuracy=0.95, eval_f1=0.94)
        log.write("end", status=status, step=steps, metrics={"eval_accuracy": 0.95})


def test_finished_run_renders_its_whole_history_at_once(tmp_path):
    write_finished_run(tmp_path, steps=3)
    out = io.StringIO()
    started = time.monotonic()
    history = watch(tmp_path, mode="console", stream=out, poll_s=5.0)
    assert time.monotonic() - started < 2.0  # no waiting for more
    lines = out.getvalue().splitlines()
    assert [line.split(" ")[0] for line in lines] == ["start", "step", "step", "step", "eval", "end:"]
    assert lines[-1].startswith("end: completed at step 3")
    assert history.status == "completed" and history.train_steps == [1, 2, 3]
    assert "eval_accuracy 0.9500" in repr(history)
    assert not (tmp_path / "loss_curve.png").exists()  # watching never writes into the run


def test_follows_a_run_written_by_another_process_and_returns_at_end(tmp_path):
    writer = textwrap.dedent("""
        import sys, time
        from workbench.engine.events import EventLog
        log = EventLog(sys.argv[1], tensorboard=False)
        log.write("start", total_steps=5, num_epochs=1, config={}, world_size=1)
        for step in range(1, 6):
            time.sleep(0.1)
            log.write("train", step=step, epoch=step / 5, loss=1.0 / step, lr=1e-3)
        log.write("end", status="completed", step=5, metrics={})
    """)
    proc = subprocess.Popen([sys.executable, "-c", writer, str(tmp_path)])
    try:
        out = io.StringIO()
        history = watch(tmp_path, mode="console", stream=out, poll_s=0.05, wait_for_log_s=30)
    finally:
        proc.wait(timeout=60)
    assert history.status == "completed"
    assert history.train_steps == [1, 2, 3, 4, 5]
    assert out.getvalue().splitlines()[-1].startswith("end: completed at step 5")


def test_follows_a_writer_thread_that_starts_after_watch(tmp_path):
    import threading

    def late_run():
        time.sleep(0.2)
        write_finished_run(tmp_path, steps=2)

    thread = threading.Thread(target=late_run)
    thread.start()
    out = io.StringIO()
    history = watch(tmp_path, mode="console", stream=out, poll_s=0.05, wait_for_log_s=30)
    thread.join()
    assert out.getvalue().startswith("waiting up to 30 s for")
    assert history.status == "completed" and history.step == 2


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(WorkbenchError, match="no run folder") as info:
        watch(tmp_path / "runs" / "typo", mode="none")
    assert "output_dir" in info.value.fix


def test_folder_without_log_does_not_block_forever(tmp_path):
    with pytest.raises(WorkbenchError, match="no event log") as info:
        watch(tmp_path, mode="none", follow=False)
    assert "fit(" in info.value.fix
    started = time.monotonic()
    with pytest.raises(WorkbenchError, match=r"no event log .* after waiting"):
        watch(tmp_path, mode="none", poll_s=0.05, wait_for_log_s=0.2, stream=io.StringIO())
    assert time.monotonic() - started < 5


def test_ctrl_c_stops_watching_quietly(tmp_path, monkeypatch):
    write_finished_run(tmp_path, steps=2)

    def interrupted_follow(output_dir, **kwargs):
        yield from events.read_events(output_dir)[:2]
        raise KeyboardInterrupt

    monkeypatch.setattr(events, "follow", interrupted_follow)
    out = io.StringIO()
    history = watch(tmp_path, mode="console", stream=out)
    assert history.step == 1 and history.end is None
    assert out.getvalue().splitlines()[-1] == "stopped watching; the run itself is not affected."


def test_cli_no_follow_prints_history_and_exit_status(tmp_path, capsys):
    write_finished_run(tmp_path / "ok", steps=2)
    assert cli.main(["watch", str(tmp_path / "ok"), "--no-follow"]) == 0
    assert "end: completed at step 2" in capsys.readouterr().out

    write_finished_run(tmp_path / "bad", steps=2, status="failed")
    assert cli.main(["watch", str(tmp_path / "bad")]) == 1

    assert cli.main(["watch", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "workbench watch: error: There is no run folder" in err and "Fix:" in err


def test_workbench_watch_is_the_function_even_after_the_cli_module_was_imported(tmp_path):
    import workbench
    import workbench.engine.watcher  # noqa: F401  (the CLI imports it; no name clash with the function)

    write_finished_run(tmp_path, steps=1)
    history = workbench.watch(tmp_path, mode="none", follow=False)
    assert history.status == "completed"
