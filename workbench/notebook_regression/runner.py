"""Running one notebook in a worker process, under a deadline the parent owns.

Each notebook runs in its own worker (``python -m workbench.notebook_regression --worker
SPEC``, see worker.py) that calls papermill. When the per-notebook deadline
passes, the worker and its kernel (the whole process tree) are killed, so a hung
cell or a wedged kernel can never hang CI.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from contextlib import suppress

from workbench.notebook_regression.baselines import Baseline
from workbench.notebook_regression.console import Log
from workbench.notebook_regression.outcome import notebook_result
from workbench.notebook_regression.report import NotebookResult
from workbench.notebook_regression.task import Task
from workbench.server.processes import safe_module_argv

KILL_GRACE_S = 5.0  # after SIGTERM, how long the worker gets to save before SIGKILL


class Runner:
    """Runs one notebook per worker process and turns what happened into a NotebookResult.

    ``run`` is called from several threads at once (``--jobs N``); ``kill_all``
    from the main thread when the run is interrupted.
    """

    def __init__(
        self,
        *,
        kernel: str,
        cell_timeout_s: float,
        notebook_timeout_s: float,
        env: Mapping[str, str],
        baselines: Mapping[str, Mapping[str, Baseline]],
        log: Log,
    ):
        self.kernel = kernel
        self.cell_timeout_s = cell_timeout_s
        self.notebook_timeout_s = notebook_timeout_s
        self.env = env
        self.baselines = baselines
        self.log = log
        self._live: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._stopping = False  # set by kill_all: start no further notebook

    def run(self, task: Task) -> NotebookResult:
        # A previous run's scratch folder could be resumed from (checkpoints): start clean.
        shutil.rmtree(task.scratch_dir, ignore_errors=True)
        task.scratch_dir.mkdir(parents=True)
        task.log_path.parent.mkdir(parents=True, exist_ok=True)
        task.executed_path.parent.mkdir(parents=True, exist_ok=True)
        for stale in (task.executed_path, task.result_path):
            stale.unlink(missing_ok=True)
        spec = {
            "input_path": str(task.input_path),
            "output_path": str(task.executed_path),
            "parameters": task.parameters,
            "kernel_name": self.kernel,
            "cell_timeout_s": self.cell_timeout_s,
            # The notebook's folder, as in JupyterLab: a relative path means the same in both.
            "cwd": str(task.input_path.parent),
            "result_path": str(task.result_path),
        }
        task.spec_path.write_text(json.dumps(spec, indent=1), encoding="utf-8")
        self.log(f"[regress] {task.notebook}: started")
        t0 = time.monotonic()
        timed_out = False
        with open(task.log_path, "wb") as log_file:
            proc = subprocess.Popen(
                # -P: the current folder (often the notebooks' folder) is not on the worker's sys.path.
                [*safe_module_argv(sys.executable, "workbench.notebook_regression"), "--worker",
                 str(task.spec_path)],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,  # Ctrl-C goes to us; we clean up
            )
            with self._lock:
                self._live.add(proc)
                if self._stopping:
                    proc.kill()
            try:
                proc.wait(timeout=self.notebook_timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                kill_tree(proc)
            finally:
                with self._lock:
                    self._live.discard(proc)
        wall = round(time.monotonic() - t0, 2)
        result = notebook_result(
            task,
            proc.returncode,
            timed_out,
            wall,
            kernel=self.kernel,
            cell_timeout_s=self.cell_timeout_s,
            notebook_timeout_s=self.notebook_timeout_s,
            baselines=self.baselines.get(task.notebook, {}),
        )
        if result.status == "failed":
            self.log(f"[regress] {task.notebook}: FAILED in {wall:.1f} s: {result.failure.message}")
        else:
            bad = [m.name for m in result.metrics if m.failed]
            extra = f" ({', '.join(bad)} regressed/missing)" if bad else ""
            self.log(f"[regress] {task.notebook}: {result.status} in {wall:.1f} s{extra}")
        return result

    def kill_all(self) -> None:
        with self._lock:
            self._stopping = True
            live = list(self._live)
        for proc in live:
            kill_tree(proc, grace_s=1.0)


def kill_tree(proc: subprocess.Popen, grace_s: float = KILL_GRACE_S) -> None:
    """Stop a worker and everything it started (its kernel is in a session of its own).

    SIGTERM first: nbclient then shuts the kernel down and papermill saves the
    notebook. Whatever still runs after ``grace_s`` is killed.
    """
    import psutil

    try:
        tree = [psutil.Process(proc.pid)]
        tree += tree[0].children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    with suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    with suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    for p in tree:  # kernels, and anything they started, are gone too
        with suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(tree, timeout=5)
    proc.wait()
