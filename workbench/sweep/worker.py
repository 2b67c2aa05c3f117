"""The process that executes one combination: ``python -m workbench.sweep.worker SPEC``.

It is the notebook-regression worker (papermill, one retry if the kernel fails to start)
plus one promise: it dies with the sweep. Linux's ``PR_SET_PDEATHSIG`` sends it SIGTERM
when the sweep process ends in any way (``kill -9`` included), and the kernel it started
exits when its parent is gone (ipykernel's parent poller), which frees the run folder's lock:
running the sweep again can resume that combination at once instead of finding it in use.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the kernel's own parent poller still applies
        return
    if os.getppid() != expected_parent:  # the parent died before prctl took effect
        os._exit(1)


def main(argv: list[str]) -> int:
    parent = int(os.environ.get("WORKBENCH_SWEEP_PARENT", os.getppid()))
    die_with_parent(parent)
    from workbench.notebook_regression.worker import worker_main

    return worker_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
