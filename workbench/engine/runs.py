"""Every run under a folder, side by side: ``runs("outputs")`` -> a RunsTable; ``workbench runs DIR``.

Read from the run folders only (no server, no database): the folders are found by a walk
(``_walk``: a folder is a run when it holds ``events.jsonl``, the lock of a run or
``checkpoints/``), and each is read into a row by ``run_folder.read_run`` (its status,
verdict, metrics and settings: that module says how). A folder that cannot be read, or holds
half a log, is a row that says so (status ``broken``, ``problem`` says why); it never breaks
the table. Folders someone else made -- a FIFO or ``/dev/zero`` in place of a file, links
that loop -- are read in bounded time and memory (``safe_read.py``, ``_walk``) and are broken
rows too.

Fast on purpose: a table of 200 runs of 1,000 events each is read in well under a second
(``benchmarks/runs_table.py``): ``read_run`` decodes few of a log's lines.

The table shows the settings that differ between its runs. No torch here, and no view:
``workbench.widgets.runs`` is the notebook table. ``Run``, ``read_run`` and ``LOST_AFTER_S``
are importable from here too, where they were before ``run_folder.py`` was split off.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.engine.events import EVENTS_FILE
from workbench.engine.progress import format_bytes, format_duration
from workbench.engine.run_folder import (  # LOST_AFTER_S, RUN_RECORD: re-exported (the docstring)
    CHECKPOINTS,
    LOST_AFTER_S,  # noqa: F401
    RUN_RECORD,  # noqa: F401
    STATUSES,
    Run,
    read_run,
)
from workbench.engine.run_lock import LOCK_FILE
from workbench.errors import WorkbenchError

# A run's own sub-folders: never searched for more runs.
_RUN_PARTS = {CHECKPOINTS, "model", "best", "model_merged", "tensorboard", "evaluation"}

# -- finding runs ----------------------------------------------------------------------


# The walk stops after this many folders (links to a large tree, such as `/`, would otherwise
# take minutes): far more than any outputs folder holds.
MAX_FOLDERS = 50_000


@dataclass
class _Walk:
    """What :func:`_walk` found: run folders, link loops, and where it stopped, if it did."""

    runs: list[Path] = field(default_factory=list)
    loops: list[tuple[Path, Path]] = field(default_factory=list)  # (link, the folder it leads back to)
    stopped_at: Path | None = None


def _walk(root: Path, max_folders: int = MAX_FOLDERS) -> _Walk:
    """Every run folder under ``root``; a run's own sub-folders (checkpoints, model, best,
    tensorboard) are not searched. Links to folders are followed, except one that leads back
    to a folder it is inside of (a loop: two links to ``.`` would make the walk endless)."""
    walk = _Walk()
    try:
        top = os.stat(root)
    except OSError:
        return walk
    # Each folder still to search, with the folders it is inside of: (device, inode) -> path.
    stack = [(root, {(top.st_dev, top.st_ino): root})]
    scanned = 0
    while stack:
        folder, inside = stack.pop()
        scanned += 1
        if scanned > max_folders:
            walk.stopped_at = folder
            break
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        is_run = any(e.name in (EVENTS_FILE, LOCK_FILE, CHECKPOINTS) for e in entries)
        if is_run:
            walk.runs.append(folder)
        for entry in entries:
            if entry.name.startswith(".") or (is_run and entry.name in _RUN_PARTS):
                continue
            try:
                if not entry.is_dir():
                    continue
                info = entry.stat()  # follows a link: the folder it leads to
            except OSError:
                continue
            key = (info.st_dev, info.st_ino)
            if key in inside:
                walk.loops.append((Path(entry.path), inside[key]))
                continue
            stack.append((Path(entry.path), {**inside, key: Path(entry.path)}))
    walk.runs.sort()
    return walk


def find_run_folders(root: str | os.PathLike) -> list[Path]:
    """Every run folder under ``root`` (``root`` itself included), sorted; a run's own
    sub-folders (checkpoints, model, best, tensorboard) are not searched."""
    return _walk(Path(root)).runs


def runs(root: str | os.PathLike = "outputs") -> RunsTable:
    """The table of every run under ``root`` (recursively), read from the run folders."""
    root = Path(root)
    if not root.is_dir():
        raise WorkbenchError(f"There is no folder {root} to look for runs in.",
                             "pass the folder your runs' output_dir are in (e.g. 'outputs'); "
                             f"the current directory is {os.getcwd()}.")

    def name_of(folder: Path) -> str:
        return folder.relative_to(root).as_posix() if folder != root else folder.name

    walk = _walk(root)
    rows = []
    for folder in walk.runs:
        name = name_of(folder)
        try:
            rows.append(read_run(folder, name))
        except Exception as exc:  # noqa: BLE001 — one odd folder must never break the table
            rows.append(Run(path=folder, name=name, problem=f"unreadable: {type(exc).__name__}: {exc}"))
    for link, target in walk.loops:
        rows.append(Run(path=link, name=name_of(link), problem=f"a link back to {name_of(target)!r}, a folder it "
                        "is inside of (a loop): not searched"))
    if walk.stopped_at is not None:
        rows.append(Run(path=walk.stopped_at, name=name_of(walk.stopped_at), problem=(
            f"the search for runs stopped here, after {MAX_FOLDERS:,} folders (a link to a large tree?); "
            "pass a smaller folder")))
    return RunsTable(root, rows)


# -- the table -------------------------------------------------------------------------

COLUMNS = ("name", "status", "verdict", "task", "model", "precision", "step", "total_steps", "best_metric",
           "best_value", "best_step", "duration_s", "samples_per_s", "peak_gpu_mem_bytes", "precision_reason",
           "problem")
# Long sentences: in rows(), the DataFrame and CSV, not in the aligned text (problems follow it as notes).
_NOT_IN_TEXT = ("precision_reason", "problem")


class RunsTable:
    """The runs under a folder: ``rows()``, ``to_frame()`` (pandas), ``str()`` a text table."""

    def __init__(self, root: Path, runs: list[Run]):
        self.root = Path(root)
        self.runs = list(runs)

    def __len__(self) -> int:
        return len(self.runs)

    def __iter__(self):
        return iter(self.runs)

    def __getitem__(self, name: str) -> Run:
        for run in self.runs:
            if run.name == name:
                return run
        raise KeyError(f"no run named {name!r} under {self.root}: the names are {[r.name for r in self.runs]}")

    def differing_settings(self, runs: Iterable[Run] | None = None) -> list[str]:
        """The settings whose values are not the same in every (readable) run: the ones worth a column."""
        shown = [r for r in (self.runs if runs is None else runs) if r.settings]
        keys = sorted({k for r in shown for k in r.settings})
        # The precision column shows what ran ("bf16 (auto)"); the setting ("auto") would overwrite it.
        return [k for k in keys if k != "precision" and len({json.dumps(r.settings.get(k), sort_keys=True,
                                                                        default=str) for r in shown}) > 1]

    def rows(self, runs: Iterable[Run] | None = None) -> list[dict[str, Any]]:
        """One dict per run: the fixed columns, the final eval metrics, the benchmark scores
        (``arc_easy/acc``...), then the differing settings."""
        chosen = list(self.runs if runs is None else runs)
        settings = self.differing_settings(chosen)
        metric_names = sorted({k for r in chosen for k in r.metrics})
        benchmark_names = sorted({k for r in chosen for k in r.benchmarks})
        rows = []
        for run in chosen:
            row = {name: getattr(run, name) for name in COLUMNS}
            row.update({name: run.metrics.get(name) for name in metric_names})
            row.update({name: run.benchmarks.get(name) for name in benchmark_names})
            row.update({name: _cell(run.settings.get(name)) for name in settings})
            rows.append(row)
        return rows

    def to_frame(self):
        """A pandas DataFrame, one row per run, indexed by name."""
        import pandas as pd

        rows = self.rows()
        frame = pd.DataFrame(rows, columns=list(rows[0]) if rows else list(COLUMNS))
        return frame.set_index("name")

    def format(self, sort: str | None = None) -> str:
        """The table as aligned text (what ``workbench runs`` prints)."""
        rows = self.rows()
        if not rows:
            return f"no runs under {self.root}"
        if sort:
            if sort not in rows[0]:
                raise WorkbenchError(f"Cannot sort by {sort!r}: there is no such column.",
                                     "use one of: " + ", ".join(rows[0]))
            rows.sort(key=lambda r: (r[sort] is None, r[sort] if r[sort] is not None else 0))
        columns = [c for c in rows[0] if c not in _NOT_IN_TEXT and any(r[c] is not None for r in rows)]
        cells = [[format_cell(c, r[c]) for c in columns] for r in rows]
        widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(columns)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(columns, widths, strict=True))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
        notes = [f"{r['name']}: {r['problem']}" for r in rows if r["problem"]]
        if notes:
            lines += ["", *notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()

    def __repr__(self) -> str:
        counts = {s: sum(r.status == s for r in self.runs) for s in STATUSES}
        shown = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        return f"RunsTable({str(self.root)!r}: {len(self.runs)} runs{': ' + shown if shown else ''})"

    def _repr_html_(self) -> str:  # a papermill notebook, or a kernel without widgets
        try:
            return self.to_frame()._repr_html_()
        except ImportError:
            return f"<pre>{self.format()}</pre>"


def _cell(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, (list, dict)) else value


def format_cell(column: str, value: Any) -> str:
    if value is None:
        return "-"
    if column == "duration_s":
        return format_duration(value)
    if column == "peak_gpu_mem_bytes":
        return format_bytes(value)
    if column == "samples_per_s":
        return f"{value:.1f}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


# -- CLI: `workbench runs DIR` ---------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("root", metavar="DIR", nargs="?", default="outputs",
                        help="the folder to look for runs in, recursively (default: outputs)")
    parser.add_argument("--sort", metavar="COLUMN", help="sort by this column (e.g. eval_accuracy, best_value)")
    parser.add_argument("--csv", action="store_true", help="print CSV (every column) instead of the aligned table")


def run_cli(args: argparse.Namespace) -> int:
    table = runs(args.root)
    if args.csv:
        frame = table.to_frame()
        if args.sort:
            frame = frame.sort_values(args.sort)
        print(frame.to_csv(), end="")
    else:
        print(table.format(sort=args.sort))
    return 0
