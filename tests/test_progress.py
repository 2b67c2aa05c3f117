"""Progress views: console lines and the output choice (workbench.engine.progress, headless),
the view each place gets (workbench.frontend.make_view), and the notebook view's
throttled redraws (workbench.widgets.progress)."""

from __future__ import annotations

import io
import os
import sys
import types

import pytest

from workbench.engine import progress
from workbench.engine.progress import (
    ConsoleProgress,
    RunHistory,
    choose_mode,
    format_duration,
    format_start_line,
    format_train_line,
)
from workbench.errors import ConfigError
from workbench.frontend import make_view as make_progress
from workbench.widgets.progress import NotebookProgress, Throttle


def run_events(output_dir=None, steps=4, status="completed"):
    config = {"output_dir": str(output_dir)} if output_dir else {}
    yield {"kind": "start", "time": 1000.0, "total_steps": steps, "num_epochs": 2, "config": config,
           "world_size": 1, "precision": "fp32", "device": "cpu"}
    for step in range(1, steps + 1):
        yield {"kind": "train", "time": 1000.0 + step, "step": step, "epoch": step / 2,
               "loss": 1.0 / step, "lr": 1e-4, "samples_per_s": 50.0, "gpu_mem_bytes": None,
               "eta_s": float(steps - step), "skipped_steps": 0}
        if step % 2 == 0:
            yield {"kind": "eval", "time": 1000.5 + step, "step": step, "epoch": step / 2,
                   "eval_loss": 0.5 / step, "eval_accuracy": 0.5 + step / 10, "eval_f1": 0.5}
    yield {"kind": "end", "time": 1075.0, "status": status, "step": steps,
           "metrics": {"eval_accuracy": 0.9, "eval_f1": 0.5}}


def test_train_line_has_the_documented_format():
    event = {"kind": "train", "step": 120, "epoch": 1.2, "loss": 0.43121, "lr": 1.8e-5,
             "samples_per_s": 412.3, "gpu_mem_bytes": None, "eta_s": 63.0, "skipped_steps": 0}
    assert format_train_line(event, 500) == (
        "step 120/500 | epoch 1.20 | loss 0.4312 | lr 1.8e-05 | 412 samples/s | ETA 1m03s"
    )
    event.update(gpu_mem_bytes=3 * 2**30, skipped_steps=2, loss=float("nan"))
    line = format_train_line(event)
    assert line.startswith("step 120 | ") and "loss nan" in line
    assert "gpu 3.00 GiB" in line and "skipped 2" in line


def test_start_line_says_which_precision_ran_and_why():
    event = {"kind": "start", "total_steps": 40, "num_epochs": 1.0, "precision": "bf16", "device": "cpu",
             "precision_reason": "auto: bf16, this CPU computes it natively (AVX512-BF16)"}
    assert format_start_line(event) == (
        "start | 40 steps over 1.0 epochs | bf16 on cpu | auto: bf16, this CPU computes it natively (AVX512-BF16)")


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0s"), (45.4, "45s"), (63, "1m03s"), (7500, "2h05m"), (None, "?")]
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_console_prints_one_plain_line_per_event_and_saves_the_chart(tmp_path):
    out = io.StringIO()
    display = make_progress("console", stream=out)
    assert isinstance(display, ConsoleProgress)
    display.replay(run_events(tmp_path))
    display.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()  # no bar redraws in logs / papermill
    assert lines[0] == "start | 4 steps over 2 epochs | fp32 on cpu"
    assert lines[1].startswith("step 1/4 | epoch 0.50 | loss 1.0000 | lr 1.0e-04 | 50 samples/s")
    assert lines[3].startswith("eval step 2/4 | epoch 1.00 | eval_loss 0.2500 | eval_accuracy 0.7000")
    assert lines[-2] == "end: completed at step 4 | took 1m15s | eval_accuracy 0.9000 | eval_f1 0.5000"
    assert lines[-1] == f"loss curve saved to {tmp_path / 'loss_curve.png'}"
    assert (tmp_path / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_none_mode_prints_nothing_but_keeps_the_history(capsys):
    display = make_progress("none")
    display.replay(run_events())
    assert capsys.readouterr().out == ""
    assert display.history.status == "completed" and display.history.step == 4


def test_history_rewinds_repeated_steps_after_a_resume():
    history = RunHistory()
    for event in run_events(steps=4, status="interrupted"):
        history.add(event)
    history.add({"kind": "start", "total_steps": 4})
    assert history.status == "running"
    history.add({"kind": "train", "step": 3, "loss": 0.2})  # resumed from checkpoint 2
    assert history.train_steps == [1, 2, 3]
    assert history.train_loss[-1] == 0.2
    assert [e["step"] for e in history.evals] == [2]


def test_unknown_mode_is_a_config_error():
    with pytest.raises(ConfigError, match="progress='bar'"):
        choose_mode("bar")


def test_auto_is_console_outside_a_kernel(monkeypatch):
    monkeypatch.delenv("WORKBENCH_PROGRESS", raising=False)
    assert choose_mode("auto") == "console"
    monkeypatch.setenv("WORKBENCH_PROGRESS", "none")
    assert choose_mode("auto") == "none"
    assert choose_mode("console") == "console"  # an explicit choice wins


def fake_kernel(monkeypatch, parent_cmdline):
    """Pretend to run inside an IPython kernel whose parent has ``parent_cmdline``."""
    import IPython
    import psutil

    shell = types.SimpleNamespace(kernel=object())
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)

    class Parent:
        def __init__(self, pid):
            assert pid == os.getppid()

        def cmdline(self):
            return parent_cmdline

    monkeypatch.setattr(psutil, "Process", Parent)
    monkeypatch.delenv("WORKBENCH_PROGRESS", raising=False)
    monkeypatch.delenv("WORKBENCH_HEADLESS", raising=False)


def test_auto_is_notebook_in_a_kernel_a_person_watches(monkeypatch):
    fake_kernel(monkeypatch, ["/venv/bin/python", "/venv/bin/jupyter-lab", "--port=8888"])
    assert choose_mode("auto") == "notebook"
    monkeypatch.setenv("WORKBENCH_HEADLESS", "1")
    assert choose_mode("auto") == "console"


@pytest.mark.parametrize("runner", ["papermill", "jupyter-nbconvert"])
def test_auto_is_console_in_a_kernel_run_by_papermill_or_nbconvert(monkeypatch, runner):
    fake_kernel(monkeypatch, ["/venv/bin/python", f"/venv/bin/{runner}", "in.ipynb", "out.ipynb"])
    assert choose_mode("auto") == "console"


def test_real_papermill_kernel_gets_console_lines(tmp_path):
    """The real thing: papermill starts a kernel that sets nothing to say it is headless."""
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("papermill")
    import subprocess

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "from workbench.engine.progress import choose_mode\nprint('MODE', choose_mode('auto'))"
    )]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    src, dst = tmp_path / "in.ipynb", tmp_path / "out.ipynb"
    nbformat.write(nb, src)
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKBENCH_")}
    papermill = [sys.executable, "-m", "papermill", str(src), str(dst), "-k", "python3",
                 "--log-level", "ERROR"]
    subprocess.run(papermill, check=True, env=env, timeout=120, capture_output=True)
    outputs = nbformat.read(dst, as_version=4).cells[0].outputs
    assert "MODE console" in "".join(o.get("text", "") for o in outputs)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class FakeBar:
    def __init__(self, total=None, **kwargs):
        self.total, self.n, self.closed, self.postfix, self.written = total, 0, False, {}, []

    def update(self, n):
        self.n += n

    def set_postfix(self, postfix, refresh=True):
        self.postfix = postfix

    def write(self, text, file=None):
        self.written.append(text)

    def close(self):
        self.closed = True


class FakeHandle:
    def __init__(self):
        self.updates = 0

    def update(self, obj):
        assert obj.data[:4] == b"\x89PNG"
        self.updates += 1


def notebook_progress(clock):
    bars, handles = [], []

    def make_bar(**kwargs):
        bars.append(FakeBar(**kwargs))
        return bars[-1]

    def display(obj, display_id=False):
        assert display_id is True and obj.data[:4] == b"\x89PNG"
        handles.append(FakeHandle())
        return handles[-1]

    view = NotebookProgress(chart_every_s=3.0, clock=clock, display=display, make_bar=make_bar,
                            save_chart=False, stream=io.StringIO())
    return view, bars, handles


def test_notebook_chart_redraws_at_most_every_few_seconds():
    clock = FakeClock()
    view, bars, handles = notebook_progress(clock)
    view({"kind": "start", "total_steps": 100})
    # One train event per 0.5 s for 10 s: 20 events, but only redraws 3 s apart.
    for step in range(1, 21):
        clock.now = step * 0.5
        view({"kind": "train", "step": step, "loss": 1.0 / step, "lr": 1e-3, "samples_per_s": 9.0})
    # first event at 0.5 s, then 3.5 s, 6.5 s, 9.5 s
    assert view.redraws == 4
    assert len(handles) == 1 and handles[0].updates == 3  # one chart, updated in place
    bar = bars[0]
    assert (bar.total, bar.n) == (100, 20)
    assert bar.postfix == {"loss": "0.0500", "lr": "1.0e-03", "samples/s": "9"}
    view.close()  # the last 1 s of events is drawn once at the end
    assert view.redraws == 5 and bar.closed
    view.close()
    assert view.redraws == 5


def test_throttle_stretches_the_interval_when_drawing_is_slow():
    clock = FakeClock()
    throttle = Throttle(3.0, clock, budget=50)
    assert throttle.ready()
    clock.now = 1.0
    throttle.done(started=0.9)  # a 0.1 s redraw -> wait 5 s, keeping drawing at 2 %
    clock.now = 4.0
    assert not throttle.ready()
    clock.now = 5.9
    assert throttle.ready()


def test_notebook_view_of_a_finished_run_draws_once_and_writes_evals(tmp_path):
    clock = FakeClock()  # time stands still: everything arrives at once, like watch on history
    view, bars, handles = notebook_progress(clock)
    view.save_chart = True
    view.replay(run_events(tmp_path))
    assert view.redraws == 2  # the first event, and the final state at "end"
    assert bars[0].closed and bars[0].n == 4
    assert any(text.startswith("eval step 4/4") for text in bars[0].written)
    assert (tmp_path / "loss_curve.png").is_file()


def test_chart_shows_losses_and_metrics():
    pytest.importorskip("matplotlib")
    history = RunHistory()
    for event in run_events(steps=4):
        history.add(event)
    fig = progress.plot_history(history)
    loss_ax, metric_ax = fig.axes
    labels = [line.get_label() for line in loss_ax.lines]
    assert labels == ["train loss", "eval loss"]
    assert list(loss_ax.lines[0].get_xdata()) == [1, 2, 3, 4]
    assert [line.get_label() for line in metric_ax.lines] == ["accuracy", "f1"]
    assert list(metric_ax.lines[0].get_ydata()) == pytest.approx([0.7, 0.9])
    assert "completed" in fig._suptitle.get_text()
