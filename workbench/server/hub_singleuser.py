"""The workbench as a JupyterHub single-user server, or standalone: decided from the environment.

The same image (and the same ``docker/entrypoint.sh``) starts in one of two modes:

* **standalone** (``workbench lab``, ``docker compose up``): the token guard of
  ``workbench.server.guard`` is the only thing between the network and code execution.
* **spawned by JupyterHub** (KubeSpawner, DockerSpawner, a local spawner): the hub has put
  its variables in the environment (``Spawner.get_env`` in jupyterhub/spawner.py) and
  ``jupyterhub-singleuser`` authenticates every request with the hub's OAuth. A workbench
  token would be a second door around the hub's per-user access rules, so it is refused;
  the rest of the floor stays (non-root, XSRF on, no wildcard CORS origin, no origin
  pattern, the CSP sandbox on exported notebooks, the security floors of the packages).

A half-configured mix (some hub variables but not the others, or hub variables plus a
standalone token) is refused with what is missing and how to fix it: a server started
that way either fails later with an obscure OAuth error or, worse, runs with the wrong guard.

As standalone: extra options pass the same allow-list (``server/lab.py``), the server
starts with ``python -P`` and a config folder of its own, a missing configuration file is
refused, and a request from another web site is refused even with a valid hub token
(the hub's identity provider gets the workbench's origin rule, ``server/identity.py``).

Three entry points use this module:

* ``python -m workbench.server.hub_singleuser [server options]`` (the entrypoint's hub branch):
  check the environment, print the command, ``exec`` ``jupyterhub-singleuser`` (JupyterLab).
* :func:`configure` at the end of ``workbench/server/jupyter_config/jupyter_server_config.py``: in hub
  mode, swap the standalone guard extension for this module's.
* the server extension below, which re-checks the *effective* settings after every config
  source has been applied (jupyterhub's own extension runs before it and sets its values).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from workbench.errors import LabConfigError
from workbench.server import floor, integrity
from workbench.server.identity import refuse_foreign_origins
from workbench.server.lab import (
    check_config_path,
    check_server_options,
    find_server_config,
    isolate_environment,
    private_config_dir,
    safe_module_argv,
)

# What jupyterhub (Spawner.get_env, 2.x to 6.x) always sets and the single-user server
# cannot work without: the API token and URL to talk to the hub, the OAuth client and
# callback for browser logins, the URL prefix and bind URL of this server, and whose it is.
REQUIRED = (
    "JUPYTERHUB_API_TOKEN",
    "JUPYTERHUB_API_URL",
    "JUPYTERHUB_CLIENT_ID",
    "JUPYTERHUB_OAUTH_CALLBACK_URL",
    "JUPYTERHUB_SERVICE_PREFIX",
    "JUPYTERHUB_SERVICE_URL",
    "JUPYTERHUB_USER",
)
# Standalone credentials: in hub mode each would let someone in without the hub.
STANDALONE_CREDENTIALS = ("JUPYTER_TOKEN", "JUPYTER_TOKEN_FILE", "WORKBENCH_PASSWORD_HASH", "WORKBENCH_TOKEN_FD")

_REFUSAL = "workbench: the JupyterHub single-user server refuses to start: "


@dataclass(frozen=True)
class HubEnv:
    """The hub's description of this server (never log ``JUPYTERHUB_API_TOKEN``)."""

    user: str
    service_prefix: str  # e.g. /user/alice/
    service_url: str  # where this server listens, e.g. http://0.0.0.0:8888/user/alice/
    api_url: str  # the hub's API, e.g. http://hub:8081/hub/api


def detect(environ: Mapping[str, str] | None = None) -> HubEnv | None:
    """``HubEnv`` when JupyterHub spawned this process, None when standalone.

    Raises LabConfigError for a half-configured mix: some of :data:`REQUIRED` set but not
    all, or the hub's variables together with a standalone token or password.
    """
    env = os.environ if environ is None else environ
    present = [name for name in REQUIRED if env.get(name)]
    if not present:
        return None
    missing = [name for name in REQUIRED if not env.get(name)]
    if missing:
        raise LabConfigError(
            f"the environment has some of JupyterHub's variables ({', '.join(present)}) but not "
            f"{', '.join(missing)}: the server was neither spawned by a hub nor started standalone.",
            "to run under JupyterHub, let the hub's spawner start the image (it sets all of them: "
            "do not copy them into the spawner's environment by hand); to run standalone, unset "
            + ", ".join(present) + ".",
        )
    mixed = [name for name in STANDALONE_CREDENTIALS if name in env]
    if mixed:
        raise LabConfigError(
            f"JupyterHub spawned this server, but {', '.join(mixed)} is set too: a standalone "
            "token or password would let anyone who learns it past the hub's per-user login.",
            f"remove {', '.join(mixed)} from the spawner's environment (c.Spawner.environment, "
            "singleuser.extraEnv in Zero to JupyterHub, or the image); the hub authenticates users.",
        )
    return HubEnv(user=env["JUPYTERHUB_USER"], service_prefix=env["JUPYTERHUB_SERVICE_PREFIX"],
                  service_url=env["JUPYTERHUB_SERVICE_URL"], api_url=env["JUPYTERHUB_API_URL"])


def singleuser_command(argv: list[str], environ: Mapping[str, str] | None = None,
                       python: str | None = None) -> list[str]:
    """The command that serves JupyterLab under the hub, with the workbench configuration.

    ``argv``: extra server options. A leading ``jupyterhub-singleuser`` (what KubeSpawner and
    Zero to JupyterHub put in the container's command by default) is dropped: that is the
    program this command runs anyway.
    """
    env = os.environ if environ is None else environ
    args = list(argv)
    if args and os.path.basename(args[0]) in ("jupyterhub-singleuser",):
        args = args[1:]
    bad = [a for a in args if not a.startswith("-")]
    if bad:
        raise LabConfigError(
            f"unexpected arguments for the single-user server: {' '.join(bad)}.",
            "pass only server options (e.g. --ServerApp.log_level=DEBUG); to run another program, "
            "start it without JupyterHub's variables in its environment.",
        )
    # The same allow-list as standalone: the hub's variables do not make
    # --ServerApp.allow_origin=... or --config=... acceptable.
    args = check_server_options(args)
    # `python -m jupyterhub.singleuser` is `jupyterhub-singleuser`: with jupyter_server 2 it
    # runs the hub's authentication as a server extension (JupyterHubIdentityProvider) and
    # opens JupyterLab by default. Not jupyterlab.labhubapp: that is the older handler-patching
    # app, whose authentication the guard below cannot see. -P: not from the current folder.
    # The configuration: $WORKBENCH_SERVER_CONFIG, or the package's copy; a missing file is
    # refused (without it no guard would run).
    cmd = [*safe_module_argv(python or sys.executable, "jupyterhub.singleuser"),
           f"--config={find_server_config(env)}"]
    # The hub's Spawner.notebook_dir (JUPYTERHUB_ROOT_DIR) wins; otherwise the workspace.
    if env.get("WORKBENCH_NOTEBOOK_DIR") and not env.get("JUPYTERHUB_ROOT_DIR"):
        cmd.append(f"--ServerApp.root_dir={env['WORKBENCH_NOTEBOOK_DIR']}")
    if os.geteuid() == 0 and env.get("WORKBENCH_ALLOW_ROOT") == "1":
        cmd.append("--allow-root")  # root was asked for explicitly; jupyter's own check must agree
    return cmd + args


def configure(c, environ: Mapping[str, str] | None = None) -> HubEnv | None:
    """Called at the end of the workbench server configuration; changes nothing standalone.

    In hub mode: this module's guard extension replaces ``workbench.server.guard``'s, whose
    token rule and Host check are the hub's job here (see :func:`check_settings`), and no
    workbench token is set (the hub's OAuth is the only way in). The other extensions stay as
    the configuration set them (TensorBoard on, the open proxy and jupyter-lsp off).
    """
    hub = detect(environ)
    if hub is None:
        return None
    # Added to the configuration's extensions, not in place of them: TensorBoard stays served and
    # jupyter-server-proxy's open /proxy/<port> and jupyter-lsp stay off, as standalone.
    c.ServerApp.jpserver_extensions = {**c.ServerApp.get("jpserver_extensions", {}),
                                       "workbench.server.guard": False, "workbench.server.hub_singleuser": True}
    c.IdentityProvider.token = ""
    return hub


def check_settings(settings: Mapping[str, object]) -> None:
    """The standalone floor (``floor.check_settings``) less what the hub does instead.

    * authentication: the identity provider must be JupyterHub's (checked here, by class name);
      the standalone token and identity-provider rules do not apply (the hub's API token is 32
      hex characters chosen by the hub, not a token a user types).
    * XSRF: checked per request by the hub's code instead of tornado's (see below).
    * the Host check: jupyterhub-singleuser turns it off (``allow_remote_access=True``)
      because the hub's proxy forwards the browser's Host header (the hub's public name,
      unknown here). DNS rebinding gains nothing: a rebound page has no hub cookie for
      this user, and every request needs one.
    """
    provider = str(settings.get("identity_provider", ""))
    if provider != "JupyterHubIdentityProvider":  # jupyterhub.singleuser.extension's
        raise LabConfigError(
            f"JupyterHub's variables are set but the server authenticates with {provider or 'nothing'}, "
            "not with the hub's identity provider: the hub's login may not guard it.",
            "start the server with `python -m workbench.server.hub_singleuser` (docker/entrypoint.sh does "
            "when the hub's variables are set) or `jupyterhub-singleuser`, not `jupyter lab` or "
            "`jupyter labhub`; unset JUPYTERHUB_SINGLEUSER_EXTENSION=0 and JUPYTERHUB_SINGLEUSER_APP, "
            "which select the older app.",
        )
    floor.check_settings({**settings, **_HUB_DOES_THIS})


# The standalone guard's settings that describe what the hub does instead, set to values the
# floor accepts, so that floor.check_settings applies everything else unchanged:
_HUB_DOES_THIS = {
    # Authentication is the hub's OAuth (checked above), not a workbench token or password:
    # the hub's API token (32 hex characters) is the hub's secret, not one a user types.
    "token": "",
    "hashed_password": "authenticated by JupyterHub",
    "auth_enabled": True,
    "identity_provider_ok": True,
    "auth_handlers": None,
    # The Host check (see the docstring).
    "allow_remote_access": False,
    "local_hostnames": None,
    # XSRF: jupyterhub-singleuser turns tornado's early check off (xsrf_cookies=False) and
    # checks each cookie-authenticated request itself (HubOAuth._patch_xsrf); turning XSRF
    # off (disable_check_xsrf) is still refused by the floor.
    "xsrf_cookies": True,
}


def effective_settings(serverapp) -> dict[str, object]:
    settings = floor.effective_settings(serverapp)
    settings["identity_provider"] = type(serverapp.identity_provider).__name__
    return settings


# --- the server extension -----------------------------------------------------------


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "workbench.server.hub_singleuser"}]


def _load_jupyter_server_extension(serverapp) -> None:
    try:
        detect()
        integrity.check_startup(serverapp)
        floor.check_versions()
        check_settings(effective_settings(serverapp))
    except LabConfigError as exc:
        raise SystemExit(_REFUSAL + str(exc)) from None
    # A valid hub token from another web site: refused, as standalone (jupyter_server would
    # skip the origin check for token-authenticated requests and echo the Origin in CORS).
    refuse_foreign_origins(serverapp.identity_provider)
    serverapp.log.info("workbench: JupyterHub single-user mode (the hub authenticates users)")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if detect() is None:
            raise LabConfigError(
                "JupyterHub's variables (" + ", ".join(REQUIRED) + ") are not set: this is not a "
                "server spawned by a hub.",
                "start the standalone server with `workbench lab` (or the image without the hub's "
                "variables); under JupyterHub the spawner sets them.",
            )
        cmd = singleuser_command(argv)
        env = dict(os.environ)
        isolate_environment(env)  # a config folder of its own; no relative PYTHONPATH entries
    except LabConfigError as exc:
        print(_REFUSAL + str(exc), file=sys.stderr)
        return 2
    print("[workbench-hub] running: " + shlex.join(cmd), file=sys.stderr, flush=True)
    if os.environ.get("WORKBENCH_DRY_RUN") == "1":
        return 0
    private_config_dir(env["JUPYTER_CONFIG_DIR"])
    try:
        check_config_path(env)
    except LabConfigError as exc:
        print(_REFUSAL + str(exc), file=sys.stderr)
        return 2
    os.execve(cmd[0], cmd, env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
