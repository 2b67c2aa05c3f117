"""Start many JupyterLab servers cheaply: import Jupyter once, then fork one child per start.

A start of `python -m jupyterlab` spends seconds of CPU importing jupyter_server,
jupyterlab and their dependencies before it reads a single setting. The misconfiguration
matrix starts dozens of servers on a 2-core machine, so this helper imports them once
and forks: each child sets its environment and argv and runs ``jupyterlab.labapp.main()``,
the same function `python -m jupyterlab` runs (config files, command line, extensions,
the guard). tests/test_lab_misconfig.py also starts a few servers the ordinary way, to
show the two agree.

Protocol: a JSON list of jobs on stdin, each {"argv": [...after "-m jupyterlab"], "env":
{...}, "log": path}; the answer on stdout is a JSON list of {"code": int, "started": bool}.
A child that gets as far as listening ("is running at") is killed and reported started.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import traceback

import jupyter_server.serverapp  # noqa: F401  -- the expensive imports, done once
import jupyterlab.labapp

import workbench.server.guard  # noqa: F401

# An older workbench has none (the matrix is also run against one, to show it fails there).
with contextlib.suppress(ImportError):
    import workbench.server.identity  # noqa: F401

PARALLEL = 4
TIMEOUT_S = 60


def _child(job: dict) -> None:
    code = 1
    try:
        os.setsid()
        fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        os.environ.clear()
        os.environ.update(job["env"])
        sys.argv = ["jupyter-lab", *job["argv"]]
        jupyterlab.labapp.main()
        code = 0
    except SystemExit as exc:  # what the interpreter would print and return for it
        if isinstance(exc.code, int) or exc.code is None:
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> int:
    jobs = json.load(sys.stdin)
    results: list[dict | None] = [None] * len(jobs)
    running: dict[int, tuple[int, float]] = {}  # pid -> (job index, start time)
    pending = list(range(len(jobs)))
    while pending or running:
        while pending and len(running) < PARALLEL:
            index = pending.pop(0)
            pid = os.fork()
            if pid == 0:
                _child(jobs[index])
            running[pid] = (index, time.monotonic())
        time.sleep(0.1)
        for pid, (index, started) in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                results[index] = {"code": os.waitstatus_to_exitcode(status), "started": False}
                del running[pid]
                continue
            try:
                with open(jobs[index]["log"], "rb") as log:
                    listening = b"is running at" in log.read()
            except OSError:
                listening = False
            if listening or time.monotonic() - started > TIMEOUT_S:
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                results[index] = {"code": -1, "started": True}
                del running[pid]
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
