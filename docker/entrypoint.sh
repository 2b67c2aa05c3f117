#!/usr/bin/env bash
# Start script of the workbench image; tini (PID 1) runs it, it `exec`s the server.
#
#   (no arguments) or options only   start JupyterLab on $WORKBENCH_NOTEBOOK_DIR with the
#                                    workbench configuration; the options are appended if
#                                    the allow-list lets them through (check_server_options)
#                                    (e.g. `docker run ... workbench --ServerApp.log_level=DEBUG`)
#   any other command                run it instead (e.g. `workbench doctor`, `bash`)
#
# WORKBENCH_DRY_RUN=1 prints the command instead of running it (the tests use it).
# The security checks are not here but in the server configuration, which refuses to
# start unsafely whatever started it.
set -euo pipefail

: "${WORKBENCH_NOTEBOOK_DIR:=/workspace}"
: "${WORKBENCH_IP:=0.0.0.0}"           # inside the container; compose publishes it on 127.0.0.1
: "${WORKBENCH_PORT:=8888}"
: "${WORKBENCH_PYTHON:=python3}"
: "${WORKBENCH_NOTEBOOKS_SOURCE:=/opt/workbench/notebooks}"

say() { echo "[workbench-entrypoint] $*" >&2; }

# The root filesystem may be read-only: Jupyter, IPython and matplotlib write to
# these (tmpfs or volume) folders, which must exist before the server starts.
prepare_dirs() {
    local dir
    for dir in "${JUPYTER_RUNTIME_DIR:-}" "${JUPYTER_CONFIG_DIR:-}" "${JUPYTER_DATA_DIR:-}" "${IPYTHONDIR:-}" \
               "${MPLCONFIGDIR:-}" "${JUPYTERLAB_SETTINGS_DIR:-}" "${JUPYTERLAB_WORKSPACES_DIR:-}"; do
        [ -n "$dir" ] || continue
        { mkdir -p "$dir" && chmod 700 "$dir"; } 2>/dev/null \
            || say "warning: cannot create $dir; the server may fail to write there"
    done
}

# Copy the notebooks shipped in the image into the workspace, never over a file that
# is already there (the user's edits win; notebooks added by a newer image appear).
seed_notebooks() {
    local target="$WORKBENCH_NOTEBOOK_DIR/notebooks" item
    [ -d "$WORKBENCH_NOTEBOOKS_SOURCE" ] || return 0
    if ! mkdir -p "$target" 2>/dev/null || [ ! -w "$target" ]; then
        say "warning: $target is not writable by uid $(id -u); the bundled notebooks stay in $WORKBENCH_NOTEBOOKS_SOURCE"
        return 0
    fi
    for item in "$WORKBENCH_NOTEBOOKS_SOURCE"/*; do
        [ -e "$item" ] || continue
        case "$(basename "$item")" in
            __init__.py|__pycache__) continue ;;  # package plumbing (the wheel's workbench._notebooks)
        esac
        [ -e "$target/$(basename "$item")" ] || cp -R "$item" "$target/"
    done
}

# Extra server options go through the same allow-list as `workbench lab -- ...`
# (workbench/server/lab.py: port, folders, base URL, browser, log level, rate limits). One list
# in one place: anything about credentials, extensions, config files, origins, XSRF, the
# Host check, headers or CSP stops the container here with the reason and the fix.
# Sets server_options to the checked options, one --name=value each.
server_options=()
check_server_options() {
    local checked
    [ "$#" -gt 0 ] || return 0
    checked=$("$WORKBENCH_PYTHON" -m workbench.server.lab --check-options -- "$@") || exit 2
    if [ -n "$checked" ]; then
        mapfile -t server_options <<< "$checked"
    fi
}

run() {
    say "running: $*"
    if [ "${WORKBENCH_DRY_RUN:-0}" = 1 ]; then
        return 0
    fi
    exec "$@"
}

# --- JupyterHub single-user mode (workbench/server/hub_singleuser.py) -------------------------------
# Spawned by a hub (its spawner sets JUPYTERHUB_API_TOKEN, JUPYTERHUB_SERVICE_URL, ...) with no
# command, server options, or KubeSpawner's default `jupyterhub-singleuser`: seed the notebooks
# into the user's workspace and exec the hub-authenticated server. The module refuses a
# half-configured mix (some hub variables, or hub variables plus a JUPYTER_TOKEN).
hub_vars="${JUPYTERHUB_API_TOKEN:-}${JUPYTERHUB_API_URL:-}${JUPYTERHUB_CLIENT_ID:-}${JUPYTERHUB_SERVICE_URL:-}${JUPYTERHUB_SERVICE_PREFIX:-}${JUPYTERHUB_USER:-}"
if [ -n "$hub_vars" ] && { [ "$#" = 0 ] || [ "${1#-}" != "$1" ] || [ "$(basename "$1")" = jupyterhub-singleuser ]; }; then
    prepare_dirs
    seed_notebooks
    run "$WORKBENCH_PYTHON" -m workbench.server.hub_singleuser "$@"
    exit 0  # reached only with WORKBENCH_DRY_RUN=1
fi

if [ "$#" -gt 0 ] && [ "${1#-}" = "$1" ]; then
    prepare_dirs
    run "$@"
fi

check_server_options "$@"
prepare_dirs
seed_notebooks
cmd=("$WORKBENCH_PYTHON" -m jupyterlab)
if [ -n "${WORKBENCH_SERVER_CONFIG:-}" ]; then
    cmd+=("--config=$WORKBENCH_SERVER_CONFIG")
fi
cmd+=("--ServerApp.ip=$WORKBENCH_IP" "--ServerApp.port=$WORKBENCH_PORT"
      "--ServerApp.root_dir=$WORKBENCH_NOTEBOOK_DIR")
if [ "$(id -u)" = 0 ] && [ "${WORKBENCH_ALLOW_ROOT:-0}" = 1 ]; then
    # Root was asked for explicitly; jupyter's own root check must agree.
    cmd+=(--allow-root)
fi
run "${cmd[@]}" "${server_options[@]}"
