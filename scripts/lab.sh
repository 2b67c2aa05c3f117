#!/usr/bin/env bash
# The main job: JupyterLab with the workbench and its notebooks, token-protected.
# Extra arguments go to `workbench lab` (e.g. --port 8899).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/workbench lab --notebook-dir . "$@"
