#!/bin/sh
# The image's jupyter-lab, jupyter-server, jupyterhub-singleuser and jupyter-labhub: installed over
# the console scripts pip wrote (docker/Dockerfile), so that `jupyter lab` typed in a terminal --
# `jupyter` runs the jupyter-lab beside itself -- starts the way `workbench lab` does: the
# workbench configuration, a Jupyter config folder of its own (no ~/.jupyter or other user config
# file runs), `python -P`, the option allow-list, absolute PATH entries only. Under JupyterHub's
# variables, the hub branch of the entry point does the same. docs/security.md says why.
set -eu
bindir=$(dirname "$0")
case "$(basename "$0")" in
    jupyterhub-singleuser|jupyter-labhub)
        exec "$bindir/python3" -P -m workbench.server.hub_singleuser "$@" ;;
    *)
        exec "$bindir/workbench" lab -- "$@" ;;
esac
