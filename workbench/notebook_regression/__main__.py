"""``python -m workbench.notebook_regression --worker SPEC.json``: the worker process runner.py starts.

People run `workbench regress`; this entry exists so the worker is a fresh
interpreter whose papermill, kernel and memory die with it.
"""

import sys

from workbench.notebook_regression.worker import worker_main

if sys.argv[1:2] == ["--worker"]:
    sys.exit(worker_main(sys.argv[2:]))
sys.exit("usage: python -m workbench.notebook_regression --worker SPEC.json (use `workbench regress`)")
