"""`workbench regress`: run the notebooks headless and compare what they record with baselines.

A run takes a named profile from ``environment/regress_profiles.yaml`` (which
notebooks, with which parameters, under which timeouts), executes each notebook
with papermill, reads the values the notebooks stored with ``workbench.record``
and compares them with ``environment/regress_baselines.yaml``. It writes the
executed notebooks, a log per notebook and ``report.json`` / ``report.md`` to the
output folder, and fails (exit 1) on a failed notebook or a regressed metric.

Modules, in the order a run uses them:

* ``profiles`` and ``placeholders``: what to run, with ``{tiny_model}``-style values filled in;
* ``kernels``: the Jupyter kernel, made to run this venv's Python;
* ``runner`` and ``worker``: one worker process per notebook (papermill inside),
  killed with its kernel when the notebook's deadline passes; ``--jobs N`` runs N at once;
* ``outcome``: the worker's result and the executed notebook turned into a ``NotebookResult``;
* ``baselines`` and ``update_baselines``: verdicts per metric, and ``--update-baselines``;
* ``report``: ``report.json`` and ``report.md``; ``run``: ``regress()``; ``cli``: its options.

Kernels see ``WORKBENCH_HEADLESS=1`` (progress prints lines, not bars),
``MPLBACKEND=Agg`` and the profile's ``env`` (``HF_HUB_OFFLINE=1`` for ci).
Everything a caller needs is importable from ``workbench.regress`` itself.
"""

from workbench.regress.baselines import (
    BASELINES_FILE,
    DIRECTIONS,
    FAILING_VERDICTS,
    Baseline,
    MetricResult,
    compare_metric,
    compare_metrics,
    load_baselines,
)
from workbench.regress.cli import add_arguments, run_cli
from workbench.regress.console import Log
from workbench.regress.kernels import KernelChoice, resolve_kernel
from workbench.regress.outcome import source_cell
from workbench.regress.placeholders import (
    PLACEHOLDERS,
    TINY_DATA_ROWS,
    fill_placeholders,
    placeholders_in,
    prepare_placeholders,
)
from workbench.regress.profiles import (
    DEFAULT_CELL_TIMEOUT_S,
    DEFAULT_NOTEBOOK_TIMEOUT_S,
    PROFILE_KEYS,
    PROFILES_FILE,
    Profile,
    load_profiles,
    notebook_parameters,
    select_notebooks,
)
from workbench.regress.report import NotebookFailure, NotebookResult, RegressReport
from workbench.regress.run import DEFAULT_OUTPUT_DIR, KERNEL_ENV, regress
from workbench.regress.runner import KILL_GRACE_S, kill_tree
from workbench.regress.update_baselines import write_updated_baselines
from workbench.regress.worker import KERNEL_START_TIMEOUT_S, execute_one

# The names these helpers had when regress was one module; tests/test_regress.py uses them.
_placeholders_in = placeholders_in
_source_cell = source_cell
_kill_tree = kill_tree

__all__ = [
    "BASELINES_FILE",
    "DEFAULT_CELL_TIMEOUT_S",
    "DEFAULT_NOTEBOOK_TIMEOUT_S",
    "DEFAULT_OUTPUT_DIR",
    "DIRECTIONS",
    "FAILING_VERDICTS",
    "KERNEL_ENV",
    "KERNEL_START_TIMEOUT_S",
    "KILL_GRACE_S",
    "PLACEHOLDERS",
    "PROFILES_FILE",
    "PROFILE_KEYS",
    "TINY_DATA_ROWS",
    "Baseline",
    "KernelChoice",
    "Log",
    "MetricResult",
    "NotebookFailure",
    "NotebookResult",
    "Profile",
    "RegressReport",
    "add_arguments",
    "compare_metric",
    "compare_metrics",
    "execute_one",
    "fill_placeholders",
    "load_baselines",
    "load_profiles",
    "notebook_parameters",
    "prepare_placeholders",
    "regress",
    "resolve_kernel",
    "run_cli",
    "select_notebooks",
    "write_updated_baselines",
]
