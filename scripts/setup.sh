#!/usr/bin/env bash
# Create .venv and install the pinned CPU environment plus the workbench package.
# Idempotent: re-runs only when a requirement, constraint or pyproject file changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "workbench needs Python 3.10 or newer; set PYTHON=/path/to/python3.10+")'
if [ ! -x .venv/bin/python ]; then
    echo "[setup] creating .venv with $("$PYTHON" --version)"
    "$PYTHON" -m venv .venv
fi
stamp=".venv/.env-$(cat environment/*.txt pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    echo "[setup] installing the pinned CPU environment (environment/constraints-cpu.txt)"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -c environment/constraints-cpu.txt -r environment/requirements-cpu.txt
    .venv/bin/python -m pip install -q --no-deps -r environment/requirements-nodeps.txt
    .venv/bin/python -m pip install -q --no-deps -e .
    rm -f .venv/.env-*
    touch "$stamp"
fi
