"""Follow any run from its event log: ``watch(output_dir)`` or ``workbench watch DIR``.

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
import sys
import types
from pathlib import Path

from workbench import events
from workbench.errors import WorkbenchError
from workbench.widgets.progress import RunHistory, make_progress


def watch(
    output_dir: str | os.PathLike,
    mode: str = "auto",
    *,
    follow: bool = True,
    poll_s: float = 1.0,
    wait_for_log_s: float = 30.0,
    stream=None,
) -> RunHistory:
    """Show a run's progress from its event log; returns what was seen.

    ``mode``: "auto" | "notebook" | "console" | "none", as for ``fit``.
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
    if not follow and not log_path.is_file():
        raise _no_log_error(output_dir)

    display = make_progress(mode, save_chart=False, stream=stream)
    try:
        if not follow:
            display.replay(events.read_events(output_dir))
        else:
            if not log_path.is_file():
                display.print(f"waiting up to {wait_for_log_s:.0f} s for {log_path} to appear...")
            for event in events.follow(output_dir, poll_s=poll_s, wait_for_log_s=wait_for_log_s):
                display(event)
    except KeyboardInterrupt:
        display.close()
        display.print("stopped watching; the run itself is not affected.")
        return display.history
    except WorkbenchError as exc:
        display.close()
        if "no event log" in exc.message:
            raise _no_log_error(output_dir, waited_s=wait_for_log_s) from None
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


def _no_log_error(output_dir: Path, waited_s: float | None = None) -> WorkbenchError:
    waited = f" after waiting {waited_s:.0f} s" if waited_s else ""
    return WorkbenchError(
        f"{output_dir} has no event log ({events.EVENTS_FILE}){waited}.",
        "start the run with this output_dir first (fit(...) or `workbench train`), "
        "or point watch at the run's output folder.",
    )


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
        args.output_dir, mode="console", follow=not args.no_follow, poll_s=args.poll,
        wait_for_log_s=args.wait,
    )
    if history.end is None:
        return 0 if args.no_follow else 1
    return 0 if history.status == "completed" else 1


class _CallableModule(types.ModuleType):
    """Importing ``workbench.watch`` (the CLI does) makes Python set the package
    attribute ``workbench.watch`` to this module, hiding the function of the same
    name; calling the module calls the function, so ``workbench.watch(dir)`` always works."""

    def __call__(self, *args, **kwargs):
        return watch(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
