"""Follow any run from its event log into a view: ``workbench watch DIR`` in a terminal,
``workbench.watch(output_dir)`` in a notebook (the front end picks the view there).

A run started with ``workbench train`` or torchrun in a terminal, or one whose
browser tab was closed, keeps writing ``<output_dir>/events.jsonl``; watching it
replays what is there, then shows new events as they arrive, with the same bar,
chart and lines as ``fit(..., progress=...)``. It stops at the run's ``end`` event,
when the run's process is gone without one, or quietly on Ctrl-C / the notebook's
stop button (the run itself carries on).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from workbench.engine import events
from workbench.engine.progress import ConsoleProgress, Progress, RunHistory
from workbench.errors import NoEventLogError, WorkbenchError


def watch(
    output_dir: str | os.PathLike,
    display: Progress,
    *,
    follow: bool = True,
    poll_s: float = 1.0,
    wait_for_log_s: float = 30.0,
) -> RunHistory:
    """Show a run's progress from its event log in ``display``; returns what was seen.

    ``display``: a view (``workbench.engine.progress.ConsoleProgress``, the notebook view...).
    ``follow=False`` shows the events written so far and returns at once.
    ``wait_for_log_s``: how long to wait for a run that has not written its log yet.
    Raises WorkbenchError when ``output_dir`` is not a folder, or holds no log
    (after that wait when following).
    """
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        raise WorkbenchError(
            f"There is no run folder at {output_dir.resolve()}.",
            "pass the output_dir of a run (the folder that holds events.jsonl); "
            "check the path against the current directory " + repr(os.getcwd()) + ".",
        )
    log_path = events.events_path(output_dir)
    # exists(), not is_file(): a FIFO or a device in its place is reported as such by the reader.
    if not follow and not log_path.exists():
        raise NoEventLogError(output_dir)

    try:
        if not follow:
            display.replay(events.read_events(output_dir))
        else:
            if not log_path.exists():
                display.print(f"waiting up to {wait_for_log_s:.0f} s for {log_path} to appear...")
            for event in events.follow(output_dir, poll_s=poll_s, wait_for_log_s=wait_for_log_s):
                display(event)
    except KeyboardInterrupt:
        display.close()
        display.print("stopped watching; the run itself is not affected.")
        return display.history
    except WorkbenchError:
        display.close()
        raise
    display.close()

    history = display.history
    if history.end is None and history.start is not None:
        if follow:
            display.print(
                f"the run stopped at step {history.step} without an 'end' event: its process "
                "exited (crashed or was killed). Check its log; fit(..., resume='auto') "
                "continues from the last checkpoint."
            )
        else:
            display.print(f"the run is still going (or stopped without an 'end' event) at step {history.step}.")
    return history


# -- CLI: `workbench watch DIR` -------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output_dir", metavar="DIR", help="the run's output folder (holds events.jsonl)")
    parser.add_argument(
        "--no-follow", action="store_true", help="print the events so far and exit instead of following"
    )
    parser.add_argument(
        "--poll", type=float, default=1.0, metavar="S", help="seconds between checks for new events (default 1)"
    )
    parser.add_argument(
        "--wait", type=float, default=30.0, metavar="S",
        help="seconds to wait for a run that has not written its log yet (default 30)",
    )


def run_cli(args: argparse.Namespace) -> int:
    """Exit status 0 when the run completed (or is still going with --no-follow), 1 otherwise."""
    history = watch(
        args.output_dir, ConsoleProgress(save_chart=False), follow=not args.no_follow, poll_s=args.poll,
        wait_for_log_s=args.wait,
    )
    if history.end is None:
        return 0 if args.no_follow else 1
    return 0 if history.status == "completed" else 1
