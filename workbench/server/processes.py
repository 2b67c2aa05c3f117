"""Every process the lab starts, and how each is kept from running code a notebook planted.

The notebook folder is the default working folder of the server and of everything it starts,
and every notebook (and, on a shared machine, everyone who can write that folder) can write
files there. ``python -m X`` and ``python -c`` put the working folder first on ``sys.path``, so
a ``X.py`` (or ``psutil.py``, ``tensorboard/``...) planted there would run in that process.
This module holds the two ways the workbench starts Python without that, and
:data:`PROCESSES`, the list of every process the lab, the image's entry point and JupyterHub
mode start, with the folder each starts in and what keeps it clean (docs/security.md shows the
same list; ``tests/test_processes.py`` checks it against the process tree of real servers).

Imports: the standard library only (the sweep and ``workbench regress`` start their workers
and kernels the same way).
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass

# --- Python without the working folder on sys.path ------------------------------------------

# `python -c MODULE_LAUNCHER MODULE ARGS` is `python -m MODULE ARGS` without the '' that -c adds
# (dropped before anything is imported): for Pythons without -P (3.10, a cluster's nodes).
MODULE_LAUNCHER = ("import runpy, sys; sys.path[:] = [p for p in sys.path if p != '']; "
                   "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)")


def safe_module_argv(python: str, module: str) -> list[str]:
    """Run ``python -m module`` without the current folder on sys.path."""
    if sys.version_info >= (3, 11):
        return [python, "-P", "-m", module]
    return [python, "-c", MODULE_LAUNCHER, module]


# A Python kernel runs in its notebook's folder. Nothing from that folder may be imported while
# the kernel starts -- ipykernel and IPython import modules lazily (psutil when the kernel is
# interrupted or shut down, debugpy when the debugger asks, jedi at the first completion), so
# "after ipykernel is imported" is not late enough. The folder goes back on sys.path when the
# first cell runs ('pre_execute', silent executions too), and *after* site-packages: a file
# next to a notebook can then add a module (`import helpers`) but never replace the standard
# library or an installed package, which is what a planted psutil.py or json.py would need.
# The -c code first drops the '' that -c itself adds on 3.10 (3.11+ also gets -P).
# sys.argv[1:] is what follows -c (the "-f {connection_file}" of the kernel spec).
KERNEL_LAUNCHER = """\
import sys
sys.path[:] = [p for p in sys.path if p != '']
from ipykernel.kernelapp import IPKernelApp

def notebook_folder_last(*args):
    if '' not in sys.path:
        sys.path.append('')
    app.shell.events.unregister('pre_execute', notebook_folder_last)

app = IPKernelApp.instance()
app.ignore_cwd = True
app.initialize()
app.shell.events.register('pre_execute', notebook_folder_last)
app.start()
"""


def is_this_python(executable: str) -> bool:
    """Whether a kernel spec's ``argv[0]`` runs this interpreter."""
    # jupyter_client runs a spec's "python", "python3" or "python3.X" with sys.executable.
    if executable in {"python", f"python{sys.version_info[0]}", "python{}.{}".format(*sys.version_info[:2])}:
        return True
    found = shutil.which(executable) if not os.path.isabs(executable) else executable
    return bool(found) and os.path.realpath(found) == os.path.realpath(sys.executable)


def safe_kernel_argv(argv: list[str]) -> list[str]:
    """``python -m ipykernel_launcher ARGS`` -> ``python [-P] -c KERNEL_LAUNCHER ARGS``; others unchanged.

    Only kernels whose Python is this one: another interpreter may lack the IPython this
    launcher needs, and its kernel spec is its owner's choice.
    """
    if len(argv) >= 3 and argv[1:3] == ["-m", "ipykernel_launcher"] and is_this_python(argv[0]):
        safe = ["-P"] if sys.version_info >= (3, 11) else []
        return [argv[0], *safe, "-c", KERNEL_LAUNCHER, *argv[3:]]
    return list(argv)


# --- the list ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Process:
    """One kind of process the lab, the image's entry point or JupyterHub mode starts."""

    name: str  # as docs/security.md's table names it
    started_by: str
    folder: str  # the folder it starts in
    kept_clean: str  # what keeps it from importing (or running) anything from a folder a notebook can write
    # argv words that identify it, in this order with nothing between them ("{shell}": the user's
    # shell, alone or with -l); () for kinds that do not run under a default lab.
    argv: tuple[str, ...] = ()

    def matches(self, argv: list[str]) -> bool:
        if self.argv == ("{shell}",):  # jupyter-server-terminals adds -l when the server has no terminal
            return os.path.basename(argv[0]) in _SHELLS and argv[1:] in ([], ["-l"])
        n = len(self.argv)
        return n > 0 and any(argv[i:i + n] == list(self.argv) for i in range(len(argv) - n + 1))


_SHELLS = {"bash", "sh", "dash", "zsh", "fish", "ksh"}
_ABSOLUTE_PATH = "PATH holds absolute folders only"  # an empty or relative entry means the working folder

PROCESSES: tuple[Process, ...] = (
    Process(
        "the Jupyter server", "`workbench lab`; the image's entry point (`docker/entrypoint.sh`)",
        "where it is started: the current folder for `workbench lab`, /workspace in the image",
        "`python -P`; a Jupyter config folder of its own, emptied at every start; the launchers drop empty "
        "and relative PATH and PYTHONPATH entries; the guard refuses the current folder on sys.path and "
        "any other Python config file",
        ("-P", "-m", "jupyterlab")),
    Process(
        "the Jupyter server under JupyterHub", "the entry point's hub branch, through "
        "`python -P -m workbench.server.hub_singleuser`, which checks the hub's variables and `exec`s it",
        "the spawner's working folder (/workspace in the image)", "as the standalone server",
        ("-P", "-m", "jupyterhub.singleuser")),
    Process(
        "the entry point's option check", "the image's entry point, when options follow the image name",
        "/workspace", "`python -P`; it imports no server and exits",
        ("-P", "-m", "workbench.server.lab")),
    Process(
        "a Python kernel", "the server (`SafePathKernelSpecManager`), for every kernel spec whose Python is "
        "the server's", "the notebook's folder",
        "`python -P -c KERNEL_LAUNCHER`: nothing from that folder is importable until the first cell runs, "
        "then only after site-packages (a file there can add a module, never replace one); " + _ABSOLUTE_PATH,
        ("-P", "-c", KERNEL_LAUNCHER)),
    Process(
        "a kernel of another Python", "the server, for a kernel spec whose `argv[0]` is another interpreter",
        "the notebook's folder", "nothing from the workbench: that kernel spec is its installer's choice "
        "(the image installs none)"),
    Process(
        "a terminal", "the server (jupyter-server-terminals), when a terminal is opened",
        "the server's root folder", "the shell imports no Python; " + _ABSOLUTE_PATH + ", so a command typed "
        "there is never a program planted in the folder", ("{shell}",)),
    Process(
        "TensorBoard", "jupyter-server-proxy, for `<lab>/tensorboard/`, on first use (`server/tensorboard.py`)",
        "the server's working folder; it then moves to its socket's folder",
        "`python -P`; it listens on a Unix socket in a folder of mode 700, never on a TCP port",
        ("-P", "-m", "workbench.server.tensorboard_process")),
    Process(
        "other jupyter-server-proxy servers", "nobody: only TensorBoard is registered, and "
        "jupyter-server-proxy's own extension (which starts what other packages register) is off", "-",
        "not started"),
    Process(
        "language servers (jupyter-lsp)", "nobody: the jupyter_lsp extension is off (it would start an "
        "installed one, `python -m pylsp`, in the notebook folder); the workbench ships none", "-",
        "not started"),
    Process(
        "nbconvert's tools (pandoc, xelatex)", "the server, for an export to PDF or LaTeX (the image has neither)",
        "the server's working folder (LaTeX: a temporary one)", _ABSOLUTE_PATH),
    Process(
        "a sweep worker", "`workbench sweep`, `workbench.sweep()` in a notebook", "the notebook's folder",
        "`python -P`; its kernel starts as the server's do (`SafePathKernelManager`)",
        ("-P", "-m", "workbench.sweep.worker")),
    Process(
        "a regression worker", "`workbench regress`", "the folder it was typed in",
        "`python -P`; its kernel starts as the server's do (`SafePathKernelManager`)",
        ("-P", "-m", "workbench.notebook_regression")),
    Process(
        "a sweep's Slurm array task", "`sbatch sweep.slurm` (written by `workbench sweep --slurm`)",
        "the folder sbatch was run in", "`python -c MODULE_LAUNCHER`: it drops the working folder from "
        "sys.path before importing anything (the nodes' Python may lack -P)",
        ("-c", MODULE_LAUNCHER, "workbench.sweep.slurm")),
)


def classify(argv: list[str]) -> Process | None:
    """The kind of process ``argv`` is, or None when :data:`PROCESSES` does not list it."""
    return next((p for p in PROCESSES if p.matches(argv)), None)
