"""The GPU panel as Python objects (no browser), and its thread inside a real ipykernel."""

from __future__ import annotations

import queue
import re
import time
from pathlib import Path

import pytest
from fake_nvml import NVML_ERROR_LIBRARY_NOT_FOUND, FakeNVML, scenario

from workbench.widgets.gpu_panel import GPUPanel, sparkline_svg

TESTS = Path(__file__).resolve().parent


@pytest.fixture
def make_panel():
    made = []

    def make(nvml, **kwargs):
        panel = GPUPanel(nvml=nvml, **kwargs)
        made.append(panel)
        return panel

    yield make
    for panel in made:
        panel.close()


def _wait(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.005)


def titles(panel):
    return [c.title.value for c in panel._cards.values()]


# ---------------------------------------------------------------- what it draws


def test_no_gpu_fallback_shows_reason_and_cpu_ram(make_panel):
    panel = make_panel(FakeNVML(fail_init=NVML_ERROR_LIBRARY_NOT_FOUND))
    panel.refresh()
    panel.refresh()
    assert "No GPU monitoring" in panel.header.value
    assert "libnvidia-ml.so.1" in panel.header.value
    assert "Showing CPU and RAM instead" in panel.header.value
    assert panel._cards == {} and panel.gpu_box.children == ()
    assert "CPU" in panel.host_text.value and "RAM" in panel.host_text.value
    assert panel.ram.layout.visibility == "visible" and 0 < panel.ram.value < 100
    assert "<svg" in panel.chart.value and "CPU %" in panel.chart.value


def test_stopped_no_gpu_panel_shows_its_samples_and_no_retry(make_panel):
    # What notebooks/00 does: display, sample a few seconds, stop. The chart was throttled
    # to its first point; stopping draws all of them, and nothing is "retrying" any more.
    panel = make_panel(FakeNVML(fail_init=NVML_ERROR_LIBRARY_NOT_FOUND), interval=0.01,
                       chart_interval=60.0)
    panel.start()
    _wait(lambda: panel.sampler.samples_taken >= 5)
    assert "retrying" in panel.header.value  # while sampling, the reader does retry
    panel.stop()
    assert "stopped" in panel.header.value and "libnvidia-ml.so.1" in panel.header.value
    assert "retrying" not in panel.header.value
    points = re.search(r'points="([^"]*)"', panel.chart.value)
    assert points and len(points.group(1).split()) >= 5, panel.chart.value


def test_real_no_gpu_path_renders_fallback(make_panel):
    from workbench.gpu import nvml_status

    if nvml_status().available:
        pytest.skip("this machine has a working NVIDIA driver")
    panel = make_panel(None)
    panel.refresh()
    assert "No GPU monitoring" in panel.header.value
    assert "RAM" in panel.host_text.value


def test_values_and_bars_with_fake_gpus(make_panel):
    panel = make_panel(scenario("two_gpus"))
    panel.refresh()
    assert "2 GPU(s)" in panel.header.value and "driver 550.54.15" in panel.header.value
    assert "CUDA 12.4" in panel.header.value
    card0, card1 = panel._cards.values()
    assert "GPU 0" in card0.title.value and "A100" in card0.title.value
    assert card0.util.value == 37.0
    assert card0.memory.value == 5.0  # 2 of 40 GiB
    assert card0.power.value == pytest.approx(30.8, abs=0.1)
    assert "2.0 GiB / 40.0 GiB" in card0.values.value
    assert "123 W / 400 W" in card0.values.value and "45 °C" in card0.values.value
    assert "(this kernel)" in card0.processes.value
    assert card0.warnings.value == ""
    assert card1.util.value == 0.0 and card1.util.layout.visibility == "visible"
    assert "processes: none" in card1.processes.value
    assert len(panel.gpu_box.children) == 2


def test_mig_and_unsupported_metrics_read_na(make_panel):
    panel = make_panel(scenario("mig"))
    panel.refresh()
    mig_cards = [c for c in panel._cards.values() if "[MIG]" in c.title.value]
    assert len(mig_cards) == 2
    for card in mig_cards:
        assert "util n/a" in card.values.value and "0%" not in card.values.value
        assert card.util.layout.visibility == "hidden"
        assert card.memory.layout.visibility == "visible" and card.memory.value > 0
    assert "3g.20gb" in mig_cards[0].title.value and "20.0 GiB" in mig_cards[0].values.value


def test_host_pids_and_foreign_use_are_shown(make_panel):
    panel = make_panel(scenario("host_pids"))
    panel.refresh()
    (card,) = panel._cards.values()
    assert card.processes.value.count("not visible from this container") == 2
    assert "host pid" in card.processes.value and "6.0 GiB" in card.processes.value
    assert "no process of this container" in card.warnings.value


def test_failing_gpu_shows_reason_while_other_displays(make_panel):
    panel = make_panel(scenario("gpu_lost"))
    panel.refresh()
    first, second = titles(panel)
    assert "GPU is lost" in second and "GPU is lost" not in first
    assert "37%" in list(panel._cards.values())[0].values.value


def test_panel_never_raises_for_a_broken_binding(make_panel):
    panel = make_panel(object())  # no NVML functions at all
    panel.refresh()
    assert "No GPU monitoring" in panel.header.value and "AttributeError" in panel.header.value


def test_free_memory_button_reports_before_and_after(make_panel):
    panel = make_panel(scenario("one_gpu"))
    panel.free_button.click()
    assert "nothing to free" in panel.action.value
    panel.peak_button.click()
    assert "Peak memory reset" in panel.action.value


def test_sparkline_breaks_lines_at_missing_values():
    svg = sparkline_svg([("#000", [10.0, 20.0, None, 30.0, 40.0])], "t")
    assert svg.count("<polyline") == 2
    assert sparkline_svg([("#000", [None, None])], "t").count("<polyline") == 0


# ---------------------------------------------------------------- thread lifecycle


def test_start_stop_close_thread_lifecycle(make_panel):
    panel = make_panel(scenario("two_gpus"), interval=0.01)
    assert not panel.running
    panel.start()
    thread = panel.sampler._thread
    _wait(lambda: panel.sampler.samples_taken >= 3)
    assert thread.is_alive() and panel.toggle.description == "Stop"
    panel.stop()
    assert not thread.is_alive() and not panel.running
    assert panel.toggle.description == "Start" and "stopped" in panel.header.value
    taken = panel.sampler.samples_taken
    time.sleep(0.05)
    assert panel.sampler.samples_taken == taken

    panel.toggle.click()  # the Start button
    _wait(lambda: panel.sampler.samples_taken > taken)
    thread = panel.sampler._thread
    panel.close()
    assert not thread.is_alive() and not panel.running
    assert panel.widget.comm is None  # widgets closed: removed from the notebook
    panel.start()  # a closed panel stays closed, without raising
    assert not panel.running


def test_displaying_starts_sampling(make_panel):
    panel = make_panel(scenario("one_gpu"), interval=0.01)
    bundle = panel._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"].startswith("GPUPanel(interval=0.01 s, sampling")
    assert panel.running
    _wait(lambda: panel.latest is not None)
    GPUPanel.stop_all()  # what atexit runs when the kernel shuts down
    assert not panel.running


def test_frontend_closing_the_widget_stops_the_panel(make_panel):
    panel = make_panel(scenario("one_gpu"), interval=0.01)
    panel._repr_mimebundle_()
    assert panel.running
    thread = panel.sampler._thread
    panel.widget.comm.handle_close({"content": {"data": {}}})  # as a comm_close would
    assert not thread.is_alive() and not panel.running
    assert "closed" in panel._repr_mimebundle_()["text/plain"]  # shown again: no error


def test_sampler_error_mid_run_marks_stale_and_recovers(make_panel):
    fake = scenario("two_gpus")
    panel = make_panel(fake, interval=0.01, backoff_initial=0.05, backoff_max=0.2)
    panel.start()
    _wait(lambda: len(panel._cards) == 2 and "37%" in titles(panel)[0] + str(
        list(panel._cards.values())[0].values.value))
    fake.devices[0].fail("GPU_IS_LOST")
    _wait(lambda: "stale" in titles(panel)[0])
    assert "GPU is lost" in titles(panel)[0] and "retrying" in titles(panel)[0]
    assert "stale" not in titles(panel)[1]
    assert panel.running
    fake.devices[0].heal()
    _wait(lambda: "stale" not in titles(panel)[0] and "lost" not in titles(panel)[0])

    # The whole read failing (a bug, not an NVML error): shown, and the thread keeps going.
    good_read = panel.sampler.read
    panel.sampler.read = lambda: (_ for _ in ()).throw(RuntimeError("sampler bug"))
    _wait(lambda: "sampler bug" in panel.header.value)
    assert panel.running and "stale" in panel.header.value
    panel.sampler.read = good_read
    _wait(lambda: "values are stale" not in panel.header.value)
    assert panel.running


def test_a_drawing_bug_is_shown_and_sampling_goes_on(make_panel, monkeypatch):
    panel = make_panel(scenario("one_gpu"), interval=0.01)

    def broken(_snapshot):
        raise KeyError("card")

    monkeypatch.setattr(panel, "_draw_gpus", broken)
    assert panel.refresh() is not None  # no exception into the notebook
    assert "drawing failed" in panel.action.value and "KeyError" in panel.errors[-1]
    panel.start()
    taken = panel.sampler.samples_taken
    _wait(lambda: panel.sampler.samples_taken > taken + 2)
    assert panel.running


# ---------------------------------------------------------------- a real kernel


def test_widget_updates_from_the_thread_reach_a_real_kernel_frontend():
    """ipykernel 7.4 sends comm messages from the sampler thread after the cell has finished."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=60)
    try:
        code = (
            f"import sys; sys.path.insert(0, {str(TESTS)!r})\n"
            "from fake_nvml import scenario\n"
            "from workbench.widgets.gpu_panel import GPUPanel\n"
            "fake = scenario('two_gpus')\n"
            "panel = GPUPanel(interval=0.05, nvml=fake)\n"
            "display(panel)\n"
        )
        reply = _run(kc, code)
        assert reply["content"]["status"] == "ok", reply["content"]
        _run(kc, "fake.devices[0].utilization_gpu = 81")

        updates, values = 0, []
        deadline = time.monotonic() + 30  # returns at the first match; generous for a loaded machine
        while time.monotonic() < deadline and not any(v == 81.0 for v in values):
            try:
                msg = kc.get_iopub_msg(timeout=0.5)
            except queue.Empty:
                continue
            data = msg["content"].get("data", {})
            if msg["msg_type"] == "comm_msg" and data.get("method") == "update":
                updates += 1
                values.append(data.get("state", {}).get("value"))
        assert updates > 0, "no widget update arrived from the sampler thread"
        assert 81.0 in values  # a bar redrawn by the thread after the cell had finished

        _run(kc, "panel.close(); print('running', panel.running)")
        out = ""
        deadline = time.monotonic() + 30  # returns at the first match; generous for a loaded machine
        while "running" not in out and time.monotonic() < deadline:
            try:
                msg = kc.get_iopub_msg(timeout=0.5)
            except queue.Empty:
                continue
            if msg["msg_type"] == "stream":
                out += msg["content"]["text"]
        assert "running False" in out
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_this_kernels_torch_memory_is_shown_apart(make_panel, monkeypatch):
    from workbench import gpu
    from workbench.gpu import reader as gpu_reader

    fake = scenario("two_gpus")
    uuid = gpu.list_devices(fake)[0].uuid
    mib = 1024**2
    on_gpu = gpu.TorchMemory(0, uuid[4:], 300 * mib, 512 * mib, 900 * mib, 1024 * mib)
    unmatched = gpu.TorchMemory(1, "ffffffff-0000", 0, 0, 0, 0)
    # Patched where the panel's reader looks it up, not the workbench.gpu re-export.
    monkeypatch.setattr(gpu_reader, "torch_memory", lambda: (on_gpu, unmatched))
    panel = make_panel(fake)
    panel.refresh()
    card0, card1 = panel._cards.values()
    assert "this kernel (PyTorch)" in card0.mine.value
    assert "allocated 300 MiB" in card0.mine.value and "reserved 512 MiB" in card0.mine.value
    assert "peak 900 MiB since reset" in card0.mine.value
    assert card1.mine.value == ""
    assert "cuda:1" in panel.torch_html.value and "cuda:0" not in panel.torch_html.value


def _run(kc, code):
    """Execute and return this request's reply (a late kernel_info reply may come first)."""
    msg_id = kc.execute(code)
    while True:
        reply = kc.get_shell_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply
