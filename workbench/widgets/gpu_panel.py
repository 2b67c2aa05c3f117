"""A live GPU panel for notebooks: draws ``workbench.gpu`` snapshots with ipywidgets.

    from workbench import GPUPanel
    GPUPanel()          # displaying it starts sampling every second

This module never imports pynvml: it asks ``workbench.gpu`` for plain data and
draws it. It owns the sampling thread (``workbench.gpu.Sampler``), which
updates the widgets from the background. ipykernel 7.4 sends comm messages
from any thread: ``Comm.publish_msg`` goes through the IOPub thread's
``schedule`` (thread-safe) and ``get_parent()`` falls back to the shell
context, so widget updates from the sampler reach the front end while the
notebook runs other cells (tests/test_gpu_panel.py checks this against a real
kernel). The Output widget, in contrast, captures only from the thread that
enters it, so the chart is an SVG inside an HTML widget, not a matplotlib
figure in an Output; drawing it costs a string join, not a figure render.

The panel never raises into the notebook: errors are shown in its header and
kept in ``panel.errors``.

Why ~510 lines: the panel draws cards, host and processes from one snapshot and
owns the sampling thread; the drawing helpers are small functions beside it. The next
split: the formatting and drawing helpers (``fmt_bytes`` to ``_bar``, with ``_GpuCard``) into
``gpu_cards.py``, the panel and its thread staying here.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import html
import logging
import threading
import time
import weakref
from typing import Any

import ipywidgets as widgets

from workbench import gpu
from workbench.gpu import GIB, MIB, GpuSample, Snapshot, TorchMemory

log = logging.getLogger(__name__)

NA = "n/a"
_CHART_W, _CHART_H = 320, 60
_CHART_POINTS = 160


def _retrying(text: str, retry_in_s: float | None, running: bool) -> str:
    """The reader's promise to try again, said only while the panel samples (a stopped one retries nothing)."""
    return f"{text} (retrying in {retry_in_s:g} s)" if running and retry_in_s else text


# ---------------------------------------------------------------- formatting


def fmt_bytes(value: int | None) -> str:
    if value is None:
        return NA
    if value >= GIB:
        return f"{value / GIB:.1f} GiB"
    return f"{value / MIB:.0f} MiB"


def fmt_percent(value: float | None) -> str:
    return NA if value is None else f"{value:.0f}%"


def fmt_number(value: float | None, unit: str) -> str:
    return NA if value is None else f"{value:.0f} {unit}"


def _ratio(part: float | None, whole: float | None) -> float | None:
    if part is None or not whole:
        return None
    return 100.0 * part / whole


def describe_torch(t: TorchMemory) -> str:
    return (f"allocated {fmt_bytes(t.allocated_bytes)} · reserved {fmt_bytes(t.reserved_bytes)}"
            f" · peak {fmt_bytes(t.peak_allocated_bytes)} since reset")


def describe_process(p: gpu.GpuProcess) -> str:
    memory = fmt_bytes(p.used_memory_bytes)
    if p.is_this_kernel:
        return f"pid {p.pid} (this kernel) {memory}"
    if not p.visible:
        return f"host pid {p.pid} (not visible from this container) {memory}"
    return f"pid {p.pid} {html.escape(p.name or '?')} {memory}"


def sparkline_svg(series: list[tuple[str, list[float | None]]], title: str) -> str:
    """A small SVG chart: one polyline per series of 0..100 values; None leaves a gap."""
    parts = [f'<svg width="{_CHART_W}" height="{_CHART_H}" style="background:#fafafa;'
             'border:1px solid #ddd">']
    for color, values in series:
        n = len(values)
        if n < 2:
            continue
        segment: list[str] = []
        for i, v in enumerate([*values, None]):
            if v is not None:
                x = i * (_CHART_W - 1) / (n - 1)
                y = (_CHART_H - 2) * (1 - min(100.0, max(0.0, v)) / 100) + 1
                segment.append(f"{x:.1f},{y:.1f}")
            elif segment:
                parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                             f'points="{" ".join(segment)}"/>')
                segment = []
    parts.append("</svg>")
    return f'<div style="font-size:11px">{html.escape(title)}</div>' + "".join(parts)


# ---------------------------------------------------------------- one GPU


class _GpuCard:
    """Widgets for one GPU or MIG slice; ``update`` sets only what changed."""

    def __init__(self, key: tuple[int, int | None]):
        self.key = key
        self.title = widgets.HTML()
        self.util = _progress("util")
        self.memory = _progress("memory")
        self.power = _progress("power")
        self.values = widgets.HTML()
        self.mine = widgets.HTML()
        self.processes = widgets.HTML()
        self.warnings = widgets.HTML()
        bars = widgets.VBox([self.util, self.memory, self.power])
        row = widgets.HBox([bars, self.values])
        self.box = widgets.VBox([self.title, row, self.mine, self.processes, self.warnings],
                                layout=widgets.Layout(border="1px solid #ddd", padding="4px",
                                                      margin="2px 0"))
        self.all = [self.title, self.util, self.memory, self.power, self.values, self.mine,
                    self.processes, self.warnings, bars, row, self.box]

    def update(self, s: GpuSample, running: bool = True) -> None:
        kind = " <b>[MIG]</b>" if s.is_mig else ""
        state = ""
        if s.error:
            tag = "stale, " if s.stale else ""
            error = _retrying(s.error, s.retry_in_s, running)
            state = f' <span style="color:#b00">({tag}{html.escape(error)})</span>'
        _set(self.title, f"<b>{s.label}</b>: {html.escape(s.name)}{kind}{state}")
        _bar(self.util, s.utilization_percent)
        _bar(self.memory, _ratio(s.memory_used_bytes, s.memory_total_bytes))
        _bar(self.power, _ratio(s.power_w, s.power_limit_w))
        _set(self.values, (
            f"util {fmt_percent(s.utilization_percent)}<br>"
            f"memory {fmt_bytes(s.memory_used_bytes)} / {fmt_bytes(s.memory_total_bytes)}<br>"
            f"power {fmt_number(s.power_w, 'W')} / {fmt_number(s.power_limit_w, 'W')}"
            f" · temp {fmt_number(s.temperature_c, '°C')}"))
        _set(self.mine, "" if s.torch is None else
             f"<b>this kernel (PyTorch)</b>: {describe_torch(s.torch)}")
        if s.processes is None:
            procs = f"processes: {NA}"
        elif not s.processes:
            procs = "processes: none"
        else:
            procs = "processes: " + "; ".join(describe_process(p) for p in s.processes)
        _set(self.processes, f'<span style="font-size:11px">{procs}</span>')
        _set(self.warnings, "".join(
            f'<div style="color:#a60">&#9888; {html.escape(w)}</div>' for w in s.warnings))


def _progress(label: str) -> widgets.FloatProgress:
    # Each bar needs a Layout of its own: hiding one ("n/a") must not hide the others.
    return widgets.FloatProgress(min=0, max=100, description=label,
                                 style={"description_width": "60px"},
                                 layout=widgets.Layout(width="320px"))


def _set(widget: Any, value: Any) -> None:
    # Each assignment is a comm message to the front end; skip the ones that change nothing.
    if widget.value != value:
        widget.value = value


def _bar(bar: widgets.FloatProgress, percent: float | None) -> None:
    """A value the GPU does not report hides the bar: "n/a", never an empty 0% bar."""
    visibility = "hidden" if percent is None else "visible"
    if bar.layout.visibility != visibility:
        bar.layout.visibility = visibility
    if percent is not None:
        _set(bar, round(min(100.0, max(0.0, percent)), 1))
        style = "danger" if percent >= 90 else ("warning" if percent >= 75 else "")
        if bar.bar_style != style:
            bar.bar_style = style


# ---------------------------------------------------------------- the panel


class GPUPanel:
    """Live GPU (or, without one, CPU/RAM) monitor for a notebook.

    interval: seconds between samples. history_seconds: how far back the chart
    goes. nvml: a module with pynvml's interface (tests pass a fake).
    process_interval: seconds between the slower process-list queries;
    chart_interval: seconds between chart redraws (bars update every sample).
    Displaying the panel starts it; ``stop()`` pauses, ``close()`` ends it.
    """

    _live: weakref.WeakSet[GPUPanel] = weakref.WeakSet()

    def __init__(
        self,
        interval: float = 1.0,
        history_seconds: float = 300.0,
        *,
        nvml: Any = None,
        process_interval: float = 5.0,
        chart_interval: float = 5.0,
        backoff_initial: float = 1.0,
        backoff_max: float = 30.0,
    ):
        self.chart_interval = chart_interval
        self._chart_drawn_at = -float("inf")
        self.reader = gpu.GpuReader(nvml, process_interval=process_interval,
                                    backoff_initial=backoff_initial, backoff_max=backoff_max)
        self.sampler = gpu.Sampler(self.reader.read, interval=interval,
                                   history_seconds=history_seconds, on_sample=self._on_sample,
                                   backoff_max=backoff_max)
        self.errors: collections.deque[str] = collections.deque(maxlen=100)
        self._draw_lock = threading.Lock()
        self._closed = False
        self._cards: dict[tuple[int, int | None], _GpuCard] = {}

        self.header = widgets.HTML("<b>GPU panel</b>: starting…")
        self.toggle = widgets.Button(description="Stop", icon="pause",
                                     tooltip="Start or stop sampling")
        self.free_button = widgets.Button(description="Free cached memory", icon="recycle",
                                          tooltip="gc.collect() + torch.cuda.empty_cache()")
        self.peak_button = widgets.Button(description="Reset peak", icon="undo",
                                          tooltip="torch.cuda.reset_peak_memory_stats()")
        self.action = widgets.HTML()
        self.gpu_box = widgets.VBox()
        self.torch_html = widgets.HTML()
        self.cpu = _progress("CPU")
        self.ram = _progress("RAM")
        self.host_text = widgets.HTML()
        self.chart = widgets.HTML()
        self.toggle.on_click(lambda _: self._guard(self._toggle))
        self.free_button.on_click(lambda _: self._guard(self.free_memory))
        self.peak_button.on_click(lambda _: self._guard(self.reset_peak))
        buttons = widgets.HBox([self.toggle, self.free_button, self.peak_button])
        host_bars = widgets.VBox([self.cpu, self.ram])
        host = widgets.HBox([host_bars, self.host_text])
        self.widget = widgets.VBox([self.header, buttons, self.action, self.gpu_box,
                                    self.torch_html, host, self.chart])
        self._frame = [buttons, host_bars, host]
        GPUPanel._live.add(self)
        _register_atexit()

    # ---- display and lifecycle

    def _repr_mimebundle_(self, **kwargs):
        """Shown in a notebook: start sampling, then hand over the widget's view."""
        if self._closed:
            return {"text/plain": "GPUPanel (closed; create a new one to monitor again)"}
        self._guard(self.start)
        bundle = dict(self.widget._repr_mimebundle_(**kwargs) or {})
        # What a viewer without widget support (nbconvert, papermill output) shows instead.
        bundle["text/plain"] = repr(self)
        self._watch_comm_close()
        return bundle

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("sampling" if self.running else "stopped")
        latest = self.sampler.latest
        if latest is None:
            seen = "no sample yet"
        elif latest.status.available:
            seen = f"{latest.status.device_count} GPU(s)"
        else:
            seen = f"no GPU: {latest.status.reason}"
        return f"GPUPanel(interval={self.sampler.interval:g} s, {state}, {seen})"

    @property
    def running(self) -> bool:
        return self.sampler.running

    @property
    def latest(self) -> Snapshot | None:
        return self.sampler.latest

    def start(self) -> None:
        """Start sampling in the background; returns at once."""
        if self._closed:
            return
        self.sampler.start()
        self.toggle.description, self.toggle.icon = "Stop", "pause"

    def stop(self) -> None:
        """Stop sampling (the thread ends); the last values stay on screen."""
        self.sampler.stop(timeout=2.0)  # a hung NVML call must not hold the notebook long
        self.toggle.description, self.toggle.icon = "Start", "play"
        if not self._closed:
            with self._draw_lock:
                try:
                    self._draw_header(self.sampler.latest)
                    self._draw_chart(force=True)  # the samples since the last throttled draw
                except Exception as exc:  # never raised into the notebook
                    self._record(f"drawing failed: {gpu.describe_error(exc)}")

    def close(self) -> None:
        """Stop sampling and remove the panel's widgets from the notebook."""
        if self._closed:
            return
        self.sampler.stop(timeout=2.0)
        self._closed = True
        GPUPanel._live.discard(self)
        with self._draw_lock:
            for w in self._all_widgets():
                w.close()

    @classmethod
    def stop_all(cls) -> None:
        """Stop every panel of this kernel (also run at interpreter exit)."""
        for panel in list(cls._live):
            panel.sampler.stop(timeout=1.0)

    def refresh(self) -> Snapshot | None:
        """Sample once now, in this thread, and draw it (what the thread does each tick)."""
        try:
            snapshot = self.sampler.sample_once()
        except Exception as exc:
            self._record(f"sampling failed: {gpu.describe_error(exc)}")
            return None
        self._on_sample(snapshot)
        return snapshot

    # ---- actions

    def free_memory(self) -> gpu.FreeMemoryResult:
        """gc.collect() + torch.cuda.empty_cache(); shows this kernel's memory before and after."""
        result = gpu.free_cached_memory()
        rows = []
        before = {t.device: t for t in result.before}
        for after in result.after:
            b = before.get(after.device)
            if b is not None:
                rows.append(f"cuda:{after.device}: reserved {fmt_bytes(b.reserved_bytes)} → "
                            f"{fmt_bytes(after.reserved_bytes)}, allocated "
                            f"{fmt_bytes(b.allocated_bytes)} → {fmt_bytes(after.allocated_bytes)}")
        _set(self.action, html.escape(result.message) + "".join(f"<br>{r}" for r in rows))
        return result

    def reset_peak(self) -> None:
        gpu.reset_torch_peak()
        _set(self.action, "Peak memory reset: the next figures count from now.")

    # ---- drawing (runs in the sampler thread)

    def _on_sample(self, snapshot: Snapshot) -> None:
        if self._closed:
            return
        with self._draw_lock:
            try:
                self._draw(snapshot)
            except Exception as exc:  # a drawing bug is shown, never raised into the notebook
                message = f"drawing failed: {gpu.describe_error(exc)}"
                if message not in self.errors:  # one traceback per distinct error
                    log.warning("GPU panel: %s", message, exc_info=exc)
                self._record(message)

    def _draw(self, snapshot: Snapshot) -> None:
        self._draw_header(snapshot)
        self._draw_gpus(snapshot)
        # Torch memory of a device without a GPU card (NVML down, or unmatched) is listed here.
        on_cards = {g.torch.device for g in snapshot.gpus if g.torch is not None}
        torch_lines = [f"cuda:{t.device}: {describe_torch(t)}" for t in snapshot.torch
                       if t.device not in on_cards]
        _set(self.torch_html, "" if not torch_lines else
             "<b>this kernel (PyTorch)</b><br>" + "<br>".join(torch_lines))
        self._draw_host(snapshot)
        self._draw_chart()

    def _draw_header(self, snapshot: Snapshot | None) -> None:
        state = "sampling" if self.running else "stopped"
        if snapshot is None:
            text = f"<b>GPU panel</b> ({state})"
        elif snapshot.status.available:
            st = snapshot.status
            text = (f"<b>GPU panel</b> ({state}, every {self.sampler.interval:g} s) · "
                    f"{st.device_count} GPU(s) · driver {st.driver_version or NA} · "
                    f"CUDA {st.cuda_driver_version or NA}")
        else:
            reason = _retrying(snapshot.status.reason or "", snapshot.status.retry_in_s, self.running)
            text = (f"<b>No GPU monitoring</b> ({state}): {html.escape(reason)}"
                    "<br>Showing CPU and RAM instead.")
        problems = [e for e in (snapshot.error if snapshot else None,
                                self.sampler.last_error) if e]
        if snapshot is not None and snapshot.stale:
            problems.insert(0, "values are stale")
        if problems:
            text += ('<br><span style="color:#b00">'
                     + html.escape("; ".join(dict.fromkeys(problems))) + "</span>")
        _set(self.header, text)

    def _draw_gpus(self, snapshot: Snapshot) -> None:
        keys = [(g.index, g.mig_index) for g in snapshot.gpus]
        if keys != list(self._cards):
            old = self._cards
            self._cards = {k: old.get(k) or _GpuCard(k) for k in keys}
            for k, card in old.items():
                if k not in self._cards:
                    for w in card.all:
                        w.close()
            self.gpu_box.children = [c.box for c in self._cards.values()]
        for g in snapshot.gpus:
            self._cards[(g.index, g.mig_index)].update(g, self.running)

    def _draw_host(self, snapshot: Snapshot) -> None:
        h = snapshot.host
        if h is None:
            _set(self.host_text, f"CPU/RAM: {NA} (psutil missing)")
            return
        _bar(self.cpu, h.cpu_percent)
        _bar(self.ram, _ratio(h.ram_used_bytes, h.ram_total_bytes))
        _set(self.host_text, (
            f"CPU {fmt_percent(h.cpu_percent)} of {h.cpu_count} cores<br>"
            f"RAM {fmt_bytes(h.ram_used_bytes)} / {fmt_bytes(h.ram_total_bytes)}"
            f" · this kernel {fmt_bytes(h.process_rss_bytes)}"))

    def _draw_chart(self, force: bool = False) -> None:
        # The chart spans minutes: redrawing it every few seconds is enough, and keeps
        # both the CPU cost and the size of the comm messages down.
        now = time.monotonic()
        history = list(self.sampler.history)
        # Unthrottled until there are two points: one point draws no line, an empty chart.
        if not force and len(history) > 2 and now - self._chart_drawn_at < self.chart_interval:
            return
        self._chart_drawn_at = now
        if not history:
            return
        step = max(1, len(history) // _CHART_POINTS)  # at most ~_CHART_POINTS per line
        history = history[::-1][::step][::-1]
        latest = history[-1]
        charts = []
        if latest.gpus:
            by_key = [{(g.index, g.mig_index): g for g in snap.gpus} for snap in history]
            for g in latest.gpus:
                key = (g.index, g.mig_index)
                util, mem = [], []
                for snap in by_key:
                    s = snap.get(key)
                    fresh = s is not None and not s.stale
                    util.append(s.utilization_percent if fresh else None)
                    mem.append(_ratio(s.memory_used_bytes, s.memory_total_bytes) if fresh
                               else None)
                title = f"{g.label} util % (blue) and memory % (orange)"
                charts.append(sparkline_svg([("#1f77b4", util), ("#ff7f0e", mem)], title))
        else:
            cpu = [None if s.host is None else s.host.cpu_percent for s in history]
            ram = [None if s.host is None else _ratio(s.host.ram_used_bytes,
                                                        s.host.ram_total_bytes) for s in history]
            charts.append(sparkline_svg([("#2ca02c", cpu), ("#9467bd", ram)],
                                        "CPU % (green) and RAM % (purple)"))
        span = latest.time - history[0].time
        _set(self.chart, "".join(charts) + f'<div style="font-size:10px">last {span:.0f} s</div>')

    # ---- plumbing

    def _toggle(self) -> None:
        if self.running:
            self.stop()
        else:
            self.start()

    def _guard(self, fn) -> Any:
        """Run a user-triggered action; an error is shown in the panel, not raised."""
        try:
            return fn()
        except Exception as exc:
            log.exception("GPU panel: %s failed", getattr(fn, "__name__", "action"))
            self._record(gpu.describe_error(exc))
            return None

    def _record(self, message: str) -> None:
        self.errors.append(message)
        with contextlib.suppress(Exception):  # widgets already closed: the list keeps it
            _set(self.action, f'<span style="color:#b00">{html.escape(message)}</span>')

    def _watch_comm_close(self) -> None:
        # The front end closing the widget (or the kernel shutting down) stops sampling.
        comm = getattr(self.widget, "comm", None)
        if comm is not None and hasattr(comm, "on_close"):
            comm.on_close(lambda _msg: self.close())

    def _all_widgets(self) -> list[Any]:
        found = [self.header, self.toggle, self.free_button, self.peak_button, self.action,
                 self.gpu_box, self.torch_html, self.cpu, self.ram, self.host_text, self.chart]
        for card in self._cards.values():
            found.extend(card.all)
        return [*found, *self._frame, self.widget]


_atexit_registered = False


def _register_atexit() -> None:
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(GPUPanel.stop_all)
        _atexit_registered = True


__all__ = ["GPUPanel", "fmt_bytes", "fmt_percent", "sparkline_svg"]
