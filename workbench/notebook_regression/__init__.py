"""`workbench regress`: run the notebooks headless and compare what they record with baselines.

A run takes a named profile from ``profiles.yaml`` (which notebooks, with which
parameters, under which timeouts), executes each notebook with papermill, reads the
values the notebooks stored with ``workbench.record`` and compares them with
``baselines.yaml``. Both files and the notebooks ship inside the package (``bundled``),
so the command works from an installed wheel in any folder. It writes the
executed notebooks, a log per notebook and ``report.json`` / ``report.md`` to the
output folder, and fails (exit 1) on a failed notebook or a regressed metric.

Modules, in the order a run uses them:

* ``bundled``: where the shipped notebooks, profiles and baselines are, and whether
  ``--update-baselines`` may write a file;
* ``profiles`` and ``placeholders``: what to run, with ``{tiny_model}``-style values filled in;
* ``kernels``: the Jupyter kernel, made to run this venv's Python;
* ``task``: one notebook to run and where its files go;
* ``runner`` and ``worker``: one worker process per notebook (papermill inside),
  killed with its kernel when the notebook's deadline passes; ``--jobs N`` runs N at once;
* ``outcome``: the worker's result and the executed notebook turned into a ``NotebookResult``;
* ``baselines`` and ``update_baselines``: verdicts per metric, and ``--update-baselines``;
* ``report``: ``report.json`` and ``report.md``; ``run``: ``regress()``; ``cli``: its options;
* ``record``: ``workbench.record(name, value)``, what a notebook stores for the comparison.

Kernels see ``WORKBENCH_HEADLESS=1`` (progress prints lines, not bars),
``MPLBACKEND=Agg`` and the profile's ``env`` (``HF_HUB_OFFLINE=1`` for ci).

Import a name from the module that defines it; this package re-exports nothing. The
library entry is ``workbench.regress()`` (run.py).
"""
