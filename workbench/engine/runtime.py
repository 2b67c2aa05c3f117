"""Where this Python process runs: a Jupyter kernel someone looks at, or headless.

One owner for the question, asked by the progress views (a live chart or plain
lines) and by ``record`` (store a value in the executed notebook or not).
papermill and nbconvert run an ordinary kernel and set nothing in it, so a kernel
whose parent process is one of them counts as headless, as does any process with
``WORKBENCH_HEADLESS=1`` (``workbench regress`` sets it).
"""

from __future__ import annotations

import os
import sys

# Parent processes that run notebooks with nobody watching the output.
HEADLESS_RUNNERS = ("papermill", "nbconvert", "nbclient", "workbench regress")


def in_jupyter_kernel() -> bool:
    """True inside an IPython kernel (JupyterLab, VS Code, papermill...), not a terminal."""
    if "IPython" not in sys.modules:  # never import IPython just to ask
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def headless_runner() -> str | None:
    """The name of the tool running this kernel headless, or None."""
    if os.environ.get("WORKBENCH_HEADLESS", "").strip() not in ("", "0"):
        return "WORKBENCH_HEADLESS"
    try:
        import psutil

        cmdline = " ".join(psutil.Process(os.getppid()).cmdline()).lower()
    except Exception:  # no psutil, or the parent is gone or hidden: assume a person
        return None
    return next((name for name in HEADLESS_RUNNERS if name in cmdline), None)


def someone_watching() -> bool:
    """A kernel with a person at the notebook (not papermill, not a terminal)."""
    return in_jupyter_kernel() and headless_runner() is None
