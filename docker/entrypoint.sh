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
# The security checks are in the server configuration, which refuses to start unsafely
# whatever started it; this script only fails closed before that: a missing configuration,
# options outside the allow-list (hub mode too), and it starts Python with -P (the current
# folder, /workspace, is not on sys.path), a config folder of its own, and JUPYTER_TOKEN in
# a pipe rather than in the server's environment.
set -euo pipefail

# Empty or relative PATH entries mean the current folder (/workspace, which every notebook can
# write): a planted `mkdir` or `python3` there would run in place of the real one, here and in
# the server's kernels and terminals. Only absolute folders stay (as in `workbench lab`).
path_entries=()
absolute_path=""
IFS=: read -ra path_entries <<< "${PATH:-}"
for entry in "${path_entries[@]}"; do
    case "$entry" in /*) absolute_path="${absolute_path:+$absolute_path:}$entry" ;; esac
done
export PATH="$absolute_path"

: "${WORKBENCH_NOTEBOOK_DIR:=/workspace}"
: "${WORKBENCH_IP:=0.0.0.0}"           # inside the container; compose publishes it on 127.0.0.1
: "${WORKBENCH_PORT:=8888}"
: "${WORKBENCH_PYTHON:=python3}"
: "${WORKBENCH_NOTEBOOKS_SOURCE:=/opt/workbench/notebooks}"

say() { echo "[workbench-entrypoint] $*" >&2; }

# `python -m` would put the current folder (WORKDIR /workspace, writable by every notebook)
# first on sys.path: a planted jupyterlab.py or workbench/ there would run instead. -P: never.
py() { "$WORKBENCH_PYTHON" -P "$@"; }

# No configuration, no guard: refuse rather than start a plain Jupyter server.
require_server_config() {
    if [ -z "${WORKBENCH_SERVER_CONFIG:-}" ] || [ ! -f "$WORKBENCH_SERVER_CONFIG" ]; then
        say "refusing to start: WORKBENCH_SERVER_CONFIG='${WORKBENCH_SERVER_CONFIG:-}' is not a file, and without the workbench configuration no guard would run. Fix: set WORKBENCH_SERVER_CONFIG=/etc/jupyter/jupyter_server_config.py (the image's default) or to the workbench/server/jupyter_config/jupyter_server_config.py of the installed package."
        exit 2
    fi
}

# Jupyter config files are Python: the server gets a config folder of its own, emptied at
# every start, so that nothing a notebook writes into one runs in the next server
# (workbench/server/lab.py: isolate_environment, private_config_dir). Lab settings and
# workspaces keep their own variables.
isolate_config() {
    local runtime="${JUPYTER_RUNTIME_DIR:-${JUPYTER_DATA_DIR:-${HOME:-/tmp}/.local/share/jupyter}/runtime}"
    local user_config="${JUPYTER_CONFIG_DIR:-${HOME:-/tmp}/.jupyter}"
    export JUPYTERLAB_SETTINGS_DIR="${JUPYTERLAB_SETTINGS_DIR:-$user_config/lab/user-settings}"
    export JUPYTERLAB_WORKSPACES_DIR="${JUPYTERLAB_WORKSPACES_DIR:-$user_config/lab/workspaces}"
    unset JUPYTER_CONFIG_PATH
    export JUPYTER_CONFIG_DIR="$runtime/workbench-config"
    [ "${WORKBENCH_DRY_RUN:-0}" = 1 ] && return 0
    mkdir -p "$runtime"
    rm -rf "$JUPYTER_CONFIG_DIR"
    mkdir -m 700 "$JUPYTER_CONFIG_DIR"
    echo workbench > "$JUPYTER_CONFIG_DIR/migrated"
}

# The token through a pipe (WORKBENCH_TOKEN_FD), not the server's environment: a process's
# initial environment stays readable in /proc/PID/environ, and kernels read their parent's.
token_by_pipe() {
    [ -n "${JUPYTER_TOKEN+set}" ] || return 0
    [ "${WORKBENCH_DRY_RUN:-0}" = 1 ] && return 0
    exec 3< <(printf '%s' "$JUPYTER_TOKEN")
    unset JUPYTER_TOKEN
    export WORKBENCH_TOKEN_FD=3
}

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
    checked=$(py -m workbench.server.lab --check-options -- "$@") || exit 2
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
# half-configured mix (some hub variables, or hub variables plus a JUPYTER_TOKEN), and passes
# the options through the same allow-list as standalone.
hub_vars="${JUPYTERHUB_API_TOKEN:-}${JUPYTERHUB_API_URL:-}${JUPYTERHUB_CLIENT_ID:-}${JUPYTERHUB_SERVICE_URL:-}${JUPYTERHUB_SERVICE_PREFIX:-}${JUPYTERHUB_USER:-}"
if [ -n "$hub_vars" ] && { [ "$#" = 0 ] || [ "${1#-}" != "$1" ] || [ "$(basename "$1")" = jupyterhub-singleuser ]; }; then
    require_server_config
    prepare_dirs
    seed_notebooks
    run "$WORKBENCH_PYTHON" -P -m workbench.server.hub_singleuser "$@"
    exit 0  # reached only with WORKBENCH_DRY_RUN=1
fi

if [ "$#" -gt 0 ] && [ "${1#-}" = "$1" ]; then
    prepare_dirs
    run "$@"
fi

require_server_config
check_server_options "$@"
prepare_dirs
seed_notebooks
isolate_config
token_by_pipe
cmd=("$WORKBENCH_PYTHON" -P -m jupyterlab "--config=$WORKBENCH_SERVER_CONFIG")
cmd+=("--ServerApp.ip=$WORKBENCH_IP" "--ServerApp.port=$WORKBENCH_PORT"
      "--ServerApp.root_dir=$WORKBENCH_NOTEBOOK_DIR")
if [ "$(id -u)" = 0 ] && [ "${WORKBENCH_ALLOW_ROOT:-0}" = 1 ]; then
    # Root was asked for explicitly; jupyter's own root check must agree.
    cmd+=(--allow-root)
fi
run "${cmd[@]}" "${server_options[@]}"
