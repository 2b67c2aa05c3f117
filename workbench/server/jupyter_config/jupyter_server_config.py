# The one Jupyter server configuration of the workbench, used by `workbench lab`
# (passed with --config) and by the image (installed as /etc/jupyter/jupyter_server_config.py).
#
# It sets secure values, and enables the `workbench.server.guard` server extension, which
# re-checks the *effective* settings after every config file and the command line have
# been applied and stops the server on an unsafe one (weak token, XSRF off, an origin that
# is not one exact origin, Host check off, unsafe headers, root without
# WORKBENCH_ALLOW_ROOT=1...; environment/README.md lists them). That extension cannot be
# switched off by a config file or the command line: pin_guard_extension() below
# re-enables it at the last moment and stops a server whose guard did not run.
#
# Environment variables read here:
#   JUPYTER_TOKEN            the token (>= 32 characters, 16+ different ones); removed from the
#                            environment once read, so kernels and terminals never see it
#                            (`workbench lab` passes it through a pipe, WORKBENCH_TOKEN_FD, so
#                            that it is not in the server's /proc/PID/environ either)
#   JUPYTER_TOKEN_FILE       a file holding the token, readable only by its owner (chmod 600)
#   WORKBENCH_PASSWORD_HASH  a hashed password (jupyter_server.auth.passwd()) instead of / beside a token
#                            (none of the three: a token is generated and printed once with the URL)
#   WORKBENCH_NOTEBOOK_DIR   the folder the file browser shows (default: the current folder)
#   WORKBENCH_LOCAL_HOSTNAMES extra host names the browser may use, comma-separated
#   WORKBENCH_CULL_IDLE_S    shut down kernels idle this long (default 3600; 0 = never)
#   WORKBENCH_CULL_CONNECTED 1 to cull idle kernels even while a browser tab is connected
#   WORKBENCH_ALLOW_ROOT     1 to let the server run as root (refused otherwise)
import os

from workbench.server import credentials, floor, guard

c = get_config()  # noqa: F821 -- provided by traitlets when it runs this file

# First, so that the final check runs even if a later line fails and someone
# switches errors off. Listing it here (not in a jupyter_server_config.d file) keeps
# the whole configuration in this one file.
# TensorBoard at /tensorboard/ through this server (server/tensorboard.py); jupyter-server-proxy's
# own extension, which its package turns on, would also proxy /proxy/<port> to any local port.
# jupyter-lsp would start an installed language server (`python -m pylsp`) in the notebook
# folder; the workbench ships none, and JupyterLab's LSP features are off by default.
# (server/processes.py lists every process the server starts.)
c.ServerApp.jpserver_extensions = {guard.GUARD_EXTENSION: True, "workbench.server.tensorboard": True,
                                   "jupyter_server_proxy": False, "jupyter_lsp": False}

with guard.refuse_to_start_on_error():
    # Nothing later (a user config file, the command line, jupyter_server_config.d)
    # can disable the guard; a server whose guard did not run stops.
    guard.pin_guard_extension()
    # Every log record of the server, tornado's access and error lines included,
    # has tokens and Authorization headers replaced before it is written.
    guard.install_log_redaction()

    # --- who may connect ------------------------------------------------------------
    floor.check_root()
    floor.check_environment()
    # Root is refused above unless explicitly allowed; then jupyter's own check must agree.
    c.ServerApp.allow_root = floor.root_allowed()

    credentials = credentials.resolve_token()
    guard.install_log_redaction([credentials.token])
    # Kernels and terminals copy the server's environment: `!env` in a notebook would
    # save the token into the .ipynb. The token now lives in the configuration only.
    floor.scrub_server_environment()
    # Refuses cross-origin requests even when they carry the token (server/identity.py).
    c.ServerApp.identity_provider_class = floor.IDENTITY_PROVIDER
    c.IdentityProvider.token = credentials.token
    if credentials.hashed_password:
        c.PasswordIdentityProvider.hashed_password = credentials.hashed_password
    # Setting a password from the login page would write it into the config dir;
    # credentials come from the environment only.
    c.PasswordIdentityProvider.allow_password_change = False
    # SameSite=Strict: the login cookie is never sent on requests other sites start
    # (the identity provider enforces it too; the XSRF cookie is set by the guard).
    c.IdentityProvider.cookie_options = {"samesite": "Strict"}

    # --- cross-site protections -------------------------------------------------------
    c.ServerApp.disable_check_xsrf = False
    c.ServerApp.allow_origin = ""  # no CORS: only pages served by this server call the API
    c.ServerApp.allow_origin_pat = ""
    # Host-header check against DNS rebinding stays on even when listening on 0.0.0.0
    # (the container): loopback addresses and these names are accepted.
    c.ServerApp.allow_remote_access = False
    c.ServerApp.local_hostnames = floor.local_hostnames()
    # Every endpoint needs authentication unless it is explicitly public (login, static files).
    c.ServerApp.allow_unauthenticated_access = False

    # Kernels start with -P: an ipykernel_launcher.py planted next to a notebook does not run
    # as the kernel; the notebook's folder is put back on sys.path after the standard library
    # once the kernel is up, so notebooks still import their helper modules (server/kernels.py).
    c.ServerApp.kernel_spec_manager_class = "workbench.server.kernels.SafePathKernelSpecManager"

    # --- behaviour ----------------------------------------------------------------------
    c.ServerApp.open_browser = False
    # The port asked for or a clear error: a silent move to 8889 breaks port mappings and URLs.
    c.ServerApp.port_retries = 0
    if os.environ.get("WORKBENCH_NOTEBOOK_DIR"):
        c.ServerApp.root_dir = os.environ["WORKBENCH_NOTEBOOK_DIR"]
    # The image's root filesystem is read-only: no trash folder in $HOME.
    c.FileContentsManager.delete_to_trash = False

    # Idle kernels hold GPU memory; shut them down after a while (busy ones never).
    cull_s = floor.cull_idle_seconds()
    c.MappingKernelManager.cull_idle_timeout = cull_s
    c.MappingKernelManager.cull_interval = max(60, min(300, cull_s // 4 or 300))
    c.MappingKernelManager.cull_busy = False
    c.MappingKernelManager.cull_connected = os.environ.get("WORKBENCH_CULL_CONNECTED") == "1"
    c.TerminalManager.cull_inactive_timeout = cull_s
    c.TerminalManager.cull_interval = c.MappingKernelManager.cull_interval

    # --- JupyterLab -----------------------------------------------------------------------
    # No calls to the internet (news feed, update check): machines here may be offline,
    # and a training box should not phone home.
    c.LabApp.news_url = None
    c.LabApp.check_for_updates_class = "jupyterlab.handlers.announcements.NeverCheckForUpdate"
    # Extensions come from the pinned environment (environment/), not from pip in the browser;
    # it also keeps the extension manager's past allow-list bypasses out of reach.
    c.LabApp.extension_manager = "readonly"

# --- JupyterHub single-user mode (workbench/server/hub_singleuser.py) ------------------------------
# Spawned by a hub (its variables are in the environment), the hub's OAuth authenticates users:
# hub_singleuser swaps the token guard for its own (the same floor less the token and Host
# rules, which are the hub's job) and refuses a half-configured mix. Standalone: no change.
from workbench.server import hub_singleuser  # noqa: E402

with guard.refuse_to_start_on_error():
    hub_singleuser.configure(c)
