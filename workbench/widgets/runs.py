"""The runs table in a notebook: filter, sort, select runs -> their curves overlaid, live.

Everything it shows is read by ``workbench.engine.runs`` (headless, the same rows as
``workbench runs DIR``) and drawn by ``workbench.engine.progress.plot_runs`` (the look of
the live chart); this module only arranges widgets. State is plain attributes and
widget traits, so it is tested as a Python object without a browser.

Live: while a selected run is running, a daemon thread re-reads its log every
``live_every_s`` and redraws the chart (widget updates from a thread need
ipykernel >= 6, which the environment pins). It stops when no selected run is running,
and starts again when one is selected.
"""

from __future__ import annotations

import html
import threading
from pathlib import Path

import ipywidgets as widgets

from workbench.engine.progress import render_runs_png
from workbench.engine.run_folder import read_run
from workbench.engine.runs import RunsTable, format_cell, runs

# Columns of the on-screen table, before the metrics and the differing settings.
_SHOWN = ("name", "status", "verdict", "task", "model", "precision", "step", "best_metric", "best_value", "best_step",
          "duration_s", "samples_per_s", "peak_gpu_mem_bytes")


class RunsBrowser(widgets.VBox):
    """``workbench.runs(DIR)`` in a notebook. ``to_frame()`` gives the pandas DataFrame."""

    def __init__(self, table: RunsTable, *, live_every_s: float = 2.0):
        self.table = table
        self.live_every_s = live_every_s
        self._live: threading.Thread | None = None
        self._stop = threading.Event()
        self._drawing = threading.RLock()  # the live thread and the kernel's thread share the figure
        self._figure = None
        self.redraws = 0
        self._updating = False
        columns = list(table.rows()[0]) if len(table) else list(_SHOWN)
        self.filter = widgets.Text(placeholder="filter: words that must all appear in a row "
                                   "(e.g. completed lora)", layout=widgets.Layout(width="28em"))
        self.sort = widgets.Dropdown(options=[c for c in columns if c != "problem"], value="name",
                                     description="sort by", layout=widgets.Layout(width="20em"))
        self.descending = widgets.ToggleButton(value=False, description="descending", icon="sort")
        self.refresh_button = widgets.Button(description="re-read folder", icon="refresh")
        self.grid = widgets.HTML()
        self.select = widgets.SelectMultiple(description="runs", rows=8, layout=widgets.Layout(width="95%"))
        self.chart = widgets.Image(format="png")
        self.filter.observe(lambda _: self.update_rows(), "value")
        self.sort.observe(lambda _: self.update_rows(), "value")
        self.descending.observe(lambda _: self.update_rows(), "value")
        self.select.observe(lambda _: self.on_select(), "value")
        self.refresh_button.on_click(lambda _: self.reload())
        super().__init__([
            widgets.HBox([self.filter, self.sort, self.descending, self.refresh_button]),
            self.grid,
            widgets.HTML("<b>Select runs</b> (ctrl/shift-click) to overlay their curves:"),
            self.select,
            self.chart,
        ])
        self.update_rows()

    # -- the table ------------------------------------------------------------------

    def to_frame(self):
        return self.table.to_frame()

    def visible_rows(self) -> list[dict]:
        """The rows that pass the filter, in the chosen order."""
        rows = self.table.rows()
        words = self.filter.value.lower().split()
        if words:
            rows = [r for r in rows if all(w in " ".join(str(v) for v in r.values()).lower() for w in words)]
        key = self.sort.value
        present = [r for r in rows if r.get(key) is not None]
        missing = [r for r in rows if r.get(key) is None]
        present.sort(key=lambda r: _sort_key(r[key]), reverse=self.descending.value)
        return present + missing  # empty cells last, whichever the direction

    def update_rows(self) -> None:
        rows = self.visible_rows()
        self.grid.value = _html_table(rows, self.table.differing_settings())
        before = tuple(self.select.value)
        chosen = tuple(n for n in before if any(r["name"] == n for r in rows))
        self._updating = True  # new options reset the selection: one redraw at the end, not three
        try:
            self.select.options = [(_label(r), r["name"]) for r in rows]
            self.select.value = chosen
        finally:
            self._updating = False
        if chosen != before:
            self.on_select()

    def reload(self) -> None:
        """Read the folder again (new runs, finished ones)."""
        self.table = runs(self.table.root)
        self.update_rows()
        self.redraw()

    # -- the curves -----------------------------------------------------------------

    def on_select(self) -> None:
        if self._updating:
            return
        self.redraw()
        if self._running_selected() and (self._live is None or not self._live.is_alive()):
            self._stop.clear()
            self._live = threading.Thread(target=self._follow, name="workbench-runs-live", daemon=True)
            self._live.start()

    def redraw(self) -> None:
        """Draw the selected runs' curves now, from their logs as they are."""
        from matplotlib.figure import Figure

        with self._drawing:
            histories = {name: self.table[name].history() for name in self.select.value}
            self._figure = self._figure or Figure(figsize=(10, 3.6), layout="constrained")
            self.chart.value = render_runs_png(histories, self._figure)
            self.redraws += 1

    def refresh_running(self) -> bool:
        """Re-read the selected running runs, redraw; False when none of them is running any more."""
        with self._drawing:
            running = self._running_selected()
            if not running:
                return False
            for run in running:
                self.table.runs[self.table.runs.index(run)] = read_run(run.path, run.name)
            self.update_rows()
            self.redraw()
            return True

    def _running_selected(self):
        return [self.table[n] for n in self.select.value if self.table[n].status == "running"]

    def _follow(self) -> None:
        while not self._stop.wait(self.live_every_s):
            try:
                if not self.refresh_running():
                    return
            except Exception:  # noqa: BLE001 — a folder removed under us: stop following, keep the table
                return

    def close(self) -> None:
        self._stop.set()
        super().close()


def _sort_key(value):
    return (0, value) if isinstance(value, (int, float)) else (1, str(value))


def _label(row: dict) -> str:
    parts = [row["name"], row["status"] + (f" ({row['verdict']})" if row.get("verdict") else "")]
    if row.get("best_metric") and row.get("best_value") is not None:
        parts.append(f"{row['best_metric'][5:]} {row['best_value']:.4g} @ {row['best_step']}")
    return "  |  ".join(parts)


def _why(row: dict) -> str:
    """The precision cell's tooltip: why it ran in that precision."""
    return f' title="{html.escape(row["precision_reason"])}"' if row.get("precision_reason") else ""


def _html_table(rows: list[dict], settings: list[str]) -> str:
    if not rows:
        return "<i>no runs match</i>"
    metrics = [c for c in rows[0] if c.startswith("eval_")]
    benchmarks = [c for c in rows[0] if "/" in c]  # "arc_easy/acc": workbench.evaluate's scores
    columns = [*_SHOWN, *metrics, *benchmarks, *settings]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = []
    for row in rows:
        cells = "".join(f"<td{_why(row) if c == 'precision' else ''}>{html.escape(format_cell(c, row.get(c)))}</td>"
                        for c in columns)
        title = f' title="{html.escape(row["problem"])}"' if row.get("problem") else ""
        body.append(f"<tr{title}>{cells}</tr>")
    return ("<div style='max-height:22em;overflow:auto'><table class='workbench-runs' "
            "style='border-collapse:collapse;font-size:12px'>"
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>")




def runs_browser(root: str | Path = "outputs", **kwargs) -> RunsBrowser:
    return RunsBrowser(runs(root), **kwargs)
