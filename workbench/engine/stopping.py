"""Stopping a run cleanly: Ctrl-C (a notebook's stop button) and SIGTERM pause it.

The first signal asks the loop to stop after the step it is in; the loop then
saves a checkpoint and returns ``status="interrupted"``, and running the same call
again resumes exactly. A second Ctrl-C while that step finishes is only noted:
raising in the middle of a step would leave half-updated state (gradients
accumulated, random numbers drawn) that a checkpoint must not capture. A third
one stops at once without saving (the newest checkpoint stays as it was).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

HARD_STOP_AFTER = 3  # Ctrl-C presses until the run stops without saving


class StopRequest:
    """Set by SIGINT or SIGTERM; the loop checks ``reason`` after each step."""

    def __init__(self):
        self.reason: str | None = None
        self.presses = 0

    def __call__(self, signum, frame):
        if signum == signal.SIGINT:
            self.presses += 1
            if self.presses >= HARD_STOP_AFTER:
                raise KeyboardInterrupt  # asked three times: stop now, save nothing
            if self.presses == 2:
                print("workbench: stopping after this step and saving a checkpoint; "
                      f"press {HARD_STOP_AFTER - self.presses} more time to stop without saving.",
                      file=sys.stderr, flush=True)
        if self.reason is None:
            self.reason = signal.Signals(signum).name


@contextlib.contextmanager
def stop_on_signals():
    """Install a StopRequest for SIGINT/SIGTERM while the block runs (main thread only)."""
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop  # signal handlers can only be installed from the main thread
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in previous:
        signal.signal(s, stop)
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
