"""The worker: executes one notebook with papermill, inside its own process.

The parent (runner.py) starts it as ``python -m workbench.notebook_regression --worker SPEC``
and reads the outcome from the spec's ``result_path``. A cell error is never
retried (notebooks are deterministic enough that a retry hides bugs); only a
kernel that fails to start is retried, once.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

KERNEL_START_TIMEOUT_S = 120  # two busy cores can take a while to import ipykernel


def literal_path(path: str) -> str:
    """``path`` as papermill must be given it to open exactly that file.

    papermill formats its paths with the parameters (``"{seed}.ipynb"`` -> ``"1.ipynb"``), so a
    notebook whose name holds braces -- from a folder others can write -- would open another file,
    fail, or (``{seed:>999999999}``) fill the memory. Doubled braces format to themselves.
    """
    return str(path).replace("{", "{{").replace("}", "}}")


def execute_one(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Execute one notebook with papermill; return what happened as plain data.

    Runs in the worker process. Only a kernel that never came up is retried (once).
    """
    import papermill as pm
    from jupyter_client.kernelspec import NoSuchKernel
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from papermill.exceptions import PapermillExecutionError

    from workbench.server.kernels import SafePathKernelManager

    outcome: dict[str, Any] = {}
    for attempt in (1, 2):
        state: dict[str, Any] = {"kernel_started": False, "cell_index": None}

        def on_notebook_start(state=state, **_):
            state["kernel_started"] = True

        def on_cell_start(state=state, cell_index=None, **_):
            state["cell_index"] = cell_index

        try:
            pm.execute_notebook(
                literal_path(spec["input_path"]),
                literal_path(spec["output_path"]),
                parameters=spec.get("parameters") or {},
                kernel_name=spec["kernel_name"],
                language="python",  # lets papermill parameterize notebooks without kernel metadata
                progress_bar=False,
                log_output=True,
                cwd=spec["cwd"],
                # The kernel runs in the notebook's folder: nothing planted there runs as it starts.
                kernel_manager_class=SafePathKernelManager,
                start_timeout=KERNEL_START_TIMEOUT_S,
                execution_timeout=spec["cell_timeout_s"],
                on_notebook_start=on_notebook_start,
                on_cell_start=on_cell_start,
            )
            return {"outcome": "ok", "attempts": attempt}
        except PapermillExecutionError as exc:
            return {
                "outcome": "cell_error",
                "attempts": attempt,
                "cell_index": exc.cell_index,
                "execution_count": exc.exec_count,
                "ename": exc.ename,
                "evalue": exc.evalue,
            }
        except CellTimeoutError:
            return {
                "outcome": "cell_timeout",
                "attempts": attempt,
                "cell_index": state["cell_index"],
            }
        except DeadKernelError:
            return {
                "outcome": "kernel_died",
                "attempts": attempt,
                "cell_index": state["cell_index"],
            }
        except NoSuchKernel as exc:
            return {
                "outcome": "kernel_start",
                "attempts": attempt,
                "message": f"no such kernel: {exc}",
            }
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"
            if state["kernel_started"]:
                return {
                    "outcome": "error",
                    "attempts": attempt,
                    "cell_index": state["cell_index"],
                    "message": message,
                }
            outcome = {"outcome": "kernel_start", "attempts": attempt, "message": message}
            logging.getLogger("workbench.notebook_regression").warning(
                "kernel failed to start (%s)%s", message, "; retrying once" if attempt == 1 else ""
            )
    return outcome


def worker_main(argv: list[str]) -> int:
    """Run the notebook described by the spec file ``argv[0]``; write its outcome file."""
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stdout,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    outcome = execute_one(spec)
    result_path = Path(spec["result_path"])
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(outcome, default=str), encoding="utf-8")
    tmp.replace(result_path)  # the parent never reads half a result
    return 0
