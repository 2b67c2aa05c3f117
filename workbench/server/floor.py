"""The security floor of the Jupyter server: the settings it refuses to start with.

``check_settings`` judges the *effective* settings of a running server (``effective_settings``
collects them after every config file and the command line have been applied): a token or
password, XSRF on, no wildcard or pattern origins, the workbench's identity provider, no
tornado settings that switch a protection off, the Host check, the CSP sandbox, the security
floors of the packages, a private runtime folder, no root unless asked for. Every refusal is
a ``LabConfigError`` that names the setting and the fix. The guard extension
(``server/guard.py``) and JupyterHub single-user mode (``server/hub_singleuser.py``) both
apply it.

Why one module of ~400 lines: it is every refusal and its fix in one file, so that a
reviewer reads what the server accepts in one place.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from workbench.errors import LabConfigError
from workbench.server.credentials import MIN_TOKEN_LENGTH, PASSWORD_HASH_ENV, check_token
from workbench.server.origins import check_allow_origin

IDENTITY_PROVIDER = "workbench.server.identity.WorkbenchIdentityProvider"
# Starts Python kernels with -P (server/kernels.py): no planted ipykernel_launcher.py runs as the kernel.
KERNEL_SPEC_MANAGER = "workbench.server.kernels.SafePathKernelSpecManager"
# Removed from the server's environment once read, so that kernels and terminals (which
# copy it) never see them: `!env` in a notebook would save them into the .ipynb.
SCRUBBED_ENV = ("JUPYTER_TOKEN", "WORKBENCH_PASSWORD_HASH", "WORKBENCH_TOKEN_FD", "JUPYTER_TOKEN_FILE")
# tornado_settings keys a config may set. Everything else there can switch a protection
# off behind the server's back (xsrf_cookies, allow_origin, local_hostnames, cookie
# kwargs, log_function...), so it is refused; `headers` is checked header by header.
ALLOWED_TORNADO_SETTINGS = frozenset({
    "headers", "compress_response", "static_hash_cache", "websocket_max_message_size",
    "websocket_ping_interval", "websocket_ping_timeout", "ws_ping_interval", "ws_ping_timeout",
})

ALLOW_ROOT_ENV = "WORKBENCH_ALLOW_ROOT"
LOCAL_HOSTNAMES_ENV = "WORKBENCH_LOCAL_HOSTNAMES"
CULL_IDLE_ENV = "WORKBENCH_CULL_IDLE_S"
DEFAULT_CULL_IDLE_S = 3600

# Oldest releases with the published security fixes (environment/README.md says which
# advisories): an older server refuses to start. pyproject.toml carries the same floors.
SECURITY_FLOORS = {
    "jupyter_server": "2.21.0",  # GHSA-c3mw-737p-c7g2; 2.20.0: CVE-2026-44727; 2.18.0: CVE-2026-40110...
    "jupyterlab": "4.6.4",  # GHSA-6966-vjj6-99xv, GHSA-3jqq-pw4j-pqcj, GHSA-3325-v43h-43rv; 4.6.2: ...
    "tornado": "6.5.9",  # GHSA-c2m8-h5v5-343r, GHSA-chx6-46f5-w4vp, GHSA-3hv7-mjh2-fv65
}



def local_hostnames(environ: Mapping[str, str] | None = None, hostname: str | None = None) -> list[str]:
    """Host names the Host-header check accepts: localhost, this machine's name, and any listed."""
    import socket

    env = os.environ if environ is None else environ
    names = ["localhost", hostname if hostname is not None else socket.gethostname()]
    names += [n.strip() for n in env.get(LOCAL_HOSTNAMES_ENV, "").split(",") if n.strip()]
    return list(dict.fromkeys(n for n in names if n))


def cull_idle_seconds(environ: Mapping[str, str] | None = None) -> int:
    """Idle-kernel timeout from WORKBENCH_CULL_IDLE_S (0 turns culling off)."""
    env = os.environ if environ is None else environ
    raw = env.get(CULL_IDLE_ENV, str(DEFAULT_CULL_IDLE_S)).strip()
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise LabConfigError(
            f"{CULL_IDLE_ENV}={raw!r} is not a whole number of seconds >= 0.",
            f"set {CULL_IDLE_ENV} to e.g. 3600 (one hour), or 0 to never cull idle kernels.",
        )
    return value


def root_allowed(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(ALLOW_ROOT_ENV, "") == "1"


def check_root(euid: int | None = None, environ: Mapping[str, str] | None = None) -> None:
    """Refuse to serve as root unless WORKBENCH_ALLOW_ROOT=1 says it is meant."""
    euid = os.geteuid() if euid is None else euid
    if euid == 0 and not root_allowed(environ):
        raise LabConfigError(
            "the server would run as root, so every notebook and terminal would have root's powers.",
            "run it as an ordinary user (the image's user is uid 1000), or set "
            f"{ALLOW_ROOT_ENV}=1 if root is really meant (`workbench lab` does this itself when "
            "you start it as root).",
        )


def check_versions(installed: Mapping[str, str | None] | None = None) -> None:
    """Refuse a jupyter_server / jupyterlab / tornado older than its security floor."""
    from importlib import metadata

    from packaging.version import Version

    for package, floor in SECURITY_FLOORS.items():
        if installed is not None:
            version = installed.get(package)
        else:
            try:
                version = metadata.version(package)
            except metadata.PackageNotFoundError:
                version = None
        if version is None:
            continue  # not installed: nothing of it is served
        if Version(version) < Version(floor):
            raise LabConfigError(
                f"{package} {version} is older than {floor}, the first release with the published "
                "security fixes (see environment/README.md).",
                "reinstall the pinned environment: `bash scripts/setup.sh`, or "
                f"`pip install -c environment/constraints-cpu.txt '{package}>={floor}'`.",
            )


def check_settings(settings: Mapping[str, object]) -> None:
    """Raise LabConfigError for the first unsafe value among the server's effective settings.

    ``settings`` keys (see :func:`effective_settings`; a missing key counts as safe):
    token, hashed_password, auth_enabled, disable_check_xsrf, xsrf_cookies, allow_origin,
    allow_origin_pat, allow_remote_access, nbconvert_csp_sandbox, euid,
    allow_unauthenticated_access, allow_password_change, tornado_settings, headers,
    local_hostnames, identity_provider_ok, identity_provider, auth_handlers, runtime_dir,
    insecure_writes, gateway_url, websocket_url, cookie_secret_set, kernel_spec_manager.
    """
    token = str(settings.get("token") or "")
    hashed_password = str(settings.get("hashed_password") or "")
    if not settings.get("auth_enabled", True) or (not token and not hashed_password):
        raise LabConfigError(
            "authentication is disabled (the token is empty and there is no password): anyone "
            "who can reach the port could run code.",
            "remove the empty IdentityProvider.token / --IdentityProvider.token='' setting; give "
            f"JUPYTER_TOKEN (>= {MIN_TOKEN_LENGTH} characters), JUPYTER_TOKEN_FILE or "
            f"{PASSWORD_HASH_ENV}, or let the server generate a token.",
        )
    if token:
        if token != token.strip():
            raise LabConfigError(
                "the server token (IdentityProvider.token) starts or ends with whitespace.",
                "remove the spaces or newline around the token in the setting that gives it.",
            )
        check_token(token, "the server token (IdentityProvider.token)")
    if settings.get("allow_unauthenticated_access"):
        raise LabConfigError(
            "ServerApp.allow_unauthenticated_access=True (or JUPYTER_SERVER_ALLOW_UNAUTHENTICATED_"
            "ACCESS) lets handlers that forget their authentication check answer anyone.",
            "remove allow_unauthenticated_access from the command line, the Jupyter config files "
            "and the environment.",
        )
    if not settings.get("identity_provider_ok", True):
        raise LabConfigError(
            f"the identity provider is {settings.get('identity_provider')}, not the workbench's "
            f"({IDENTITY_PROVIDER}), which refuses cross-origin requests even with the token.",
            "remove ServerApp.identity_provider_class (and ServerApp.login_handler_class) from "
            "the command line and the Jupyter config files.",
        )
    handlers = settings.get("auth_handlers")
    if handlers is not None and handlers != _DEFAULT_AUTH_HANDLERS:
        raise LabConfigError(
            f"the login/logout handlers are {', '.join(handlers)} (IdentityProvider.login_handler_class "  # type: ignore[arg-type]
            "or ServerApp.login_handler_class): a custom login handler decides who gets in.",
            "remove login_handler_class / logout_handler_class from the command line and the "
            "Jupyter config files.",
        )
    if settings.get("allow_password_change"):
        raise LabConfigError(
            "allow_password_change=True lets anyone with the token set a password that outlives it "
            "(written into the Jupyter config folder).",
            "remove PasswordIdentityProvider.allow_password_change / ServerApp.allow_password_change; "
            f"set {PASSWORD_HASH_ENV} to use a password.",
        )
    if settings.get("disable_check_xsrf") or settings.get("xsrf_cookies") is False:
        raise LabConfigError(
            "XSRF protection is disabled (ServerApp.disable_check_xsrf=True): any web page you "
            "visit could post to the server with your cookie.",
            "remove disable_check_xsrf from the command line and the Jupyter config files.",
        )
    check_allow_origin(str(settings.get("allow_origin") or ""))
    if settings.get("allow_origin_pat"):
        raise LabConfigError(
            "ServerApp.allow_origin_pat is set; origin patterns have had bypasses "
            "(CVE-2026-40110, PYSEC-2026-3472 is still unfixed).",
            "remove allow_origin_pat and set allow_origin to the exact origin instead.",
        )
    tornado_settings = settings.get("tornado_settings") or {}
    unknown = sorted(set(tornado_settings) - ALLOWED_TORNADO_SETTINGS)  # type: ignore[arg-type]
    if unknown:
        raise LabConfigError(
            f"ServerApp.tornado_settings sets {', '.join(map(repr, unknown))}: these bypass the "
            "server's own settings and the workbench's checks.",
            "remove them; tornado_settings may only hold "
            f"{', '.join(sorted(ALLOWED_TORNADO_SETTINGS))}.",
        )
    check_headers(settings.get("headers") or {})  # type: ignore[arg-type]
    if settings.get("allow_remote_access"):
        raise LabConfigError(
            "the Host-header check is off (ServerApp.allow_remote_access=True), which opens the "
            "server to DNS-rebinding attacks.",
            f"remove allow_remote_access; list the name you browse to in {LOCAL_HOSTNAMES_ENV} "
            "(comma-separated), or reach the server through an SSH tunnel to 127.0.0.1.",
        )
    hostnames = settings.get("local_hostnames")
    if hostnames is not None:
        extra = sorted(set(hostnames) - set(local_hostnames()))  # type: ignore[arg-type]
        if extra:
            raise LabConfigError(
                f"ServerApp.local_hostnames adds {', '.join(extra)} behind the Host-header check.",
                f"remove local_hostnames from the config files and list the names in "
                f"{LOCAL_HOSTNAMES_ENV} (comma-separated) instead.",
            )
    if settings.get("nbconvert_csp_sandbox") is False:
        raise LabConfigError(
            "ServerApp.nbconvert_csp_sandbox=False lets exported notebooks run script in the "
            "server's origin (CVE-2026-44727).",
            "remove nbconvert_csp_sandbox from the command line and the Jupyter config files.",
        )
    if settings.get("websocket_url"):
        raise LabConfigError(
            f"ServerApp.websocket_url={settings['websocket_url']!r} sends the browser's kernel and "
            "terminal connections, with their credentials, to another address.",
            "remove websocket_url; the browser then connects to this server itself.",
        )
    if settings.get("insecure_writes"):
        raise LabConfigError(
            "JUPYTER_ALLOW_INSECURE_WRITES is set: Jupyter would write its connection files and "
            "cookie secret readable by other users.",
            "unset JUPYTER_ALLOW_INSECURE_WRITES; give the runtime folder to the server's user instead.",
        )
    if settings.get("gateway_url"):
        raise LabConfigError(
            f"kernels would run on a remote gateway ({settings['gateway_url']}), which receives "
            "every cell and the gateway's credentials.",
            "unset JUPYTER_GATEWAY_URL / GatewayClient.url; the workbench runs its kernels locally.",
        )
    kernel_specs = settings.get("kernel_spec_manager")
    if kernel_specs is not None and kernel_specs != KERNEL_SPEC_MANAGER:
        raise LabConfigError(
            f"the kernel spec manager is {kernel_specs}, not the workbench's ({KERNEL_SPEC_MANAGER}): "
            "kernels would start with the notebook's folder first on sys.path, so an "
            "ipykernel_launcher.py planted next to a notebook would run as its kernel.",
            "remove ServerApp.kernel_spec_manager_class from the command line and the Jupyter config files.",
        )
    if settings.get("cookie_secret_set"):
        raise LabConfigError(
            "ServerApp.cookie_secret is set by a config file or the command line: login cookies "
            "would outlive a change of token.",
            "remove cookie_secret; the server derives it from its own secret and the token.",
        )
    if settings.get("runtime_dir"):
        check_runtime_dir(str(settings["runtime_dir"]))
    euid = settings.get("euid")
    check_root(euid if isinstance(euid, int) else None)



_DEFAULT_AUTH_HANDLERS = ["jupyter_server.auth.login.LoginFormHandler", "jupyter_server.auth.logout.LogoutHandler"]


def check_headers(headers: Mapping[str, str]) -> None:
    """Headers from tornado_settings: no CORS headers, and a CSP that keeps framing to this origin."""
    for name, value in headers.items():
        lname = name.lower()
        if lname.startswith("access-control-"):
            raise LabConfigError(
                f"tornado_settings sets the header {name}: {value}, which lets other web sites "
                "read the server's answers.",
                "remove it from ServerApp.tornado_settings['headers']; set ServerApp.allow_origin "
                "to one exact origin if a tool really needs access.",
            )
        if lname == "content-security-policy":
            directives = {
                part.split()[0].lower(): part.split()[1:]
                for part in str(value).split(";") if part.split()
            }
            ancestors = directives.get("frame-ancestors")
            if not ancestors or not set(ancestors) <= {"'self'", "'none'"}:
                raise LabConfigError(
                    f"tornado_settings sets Content-Security-Policy: {value!r}, which lets other "
                    "web sites frame the server (clickjacking) or drops the server's own policy.",
                    "remove the header, or keep frame-ancestors 'self' (or 'none') in it.",
                )


def check_runtime_dir(path: str, euid: int | None = None) -> None:
    """Jupyter's runtime folder holds the token (jpserver-*.json) and kernel keys: owner only."""
    try:
        info = os.stat(path)
    except OSError:
        return  # not there yet: Jupyter creates it with mode 700
    euid = os.geteuid() if euid is None else euid
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO) or info.st_uid != euid:
        raise LabConfigError(
            f"Jupyter's runtime folder {path} has mode {stat.S_IMODE(info.st_mode):o} and owner "
            f"uid {info.st_uid}: other users could read the server's token and kernel keys there.",
            f"run `chmod 700 {path}` as its owner (uid {euid}), or point JUPYTER_RUNTIME_DIR at "
            "a folder only you can open.",
        )


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Environment variables that weaken Jupyter whatever the configuration says."""
    env = os.environ if environ is None else environ
    check_settings({
        "token": "", "hashed_password": "argon2:", "auth_enabled": True,  # checked elsewhere
        "insecure_writes": env.get("JUPYTER_ALLOW_INSECURE_WRITES", "").lower() in ("1", "true"),
        "allow_unauthenticated_access": env.get(
            "JUPYTER_SERVER_ALLOW_UNAUTHENTICATED_ACCESS", "").lower() in ("true", "yes"),
        "gateway_url": env.get("JUPYTER_GATEWAY_URL", ""),
        "euid": 1000,  # root is checked by check_root, with its own allow
    })


def check_import_path(sys_path: list[str], cwd: str, safe_path: bool, pythonpath: str = "") -> None:
    """The server was not started with the current folder on its import path.

    ``python -m jupyterlab`` (or ``-c``) without ``-P`` puts the current folder first on
    sys.path, and the current folder is usually the notebook folder: a module planted there
    (jupyterlab.py, notebook_shim/, ...) runs inside the server. Empty or relative PYTHONPATH
    entries mean the current folder (or one below it) too. Folders PYTHONPATH names by
    absolute path are the user's explicit choice and are left alone.
    """
    def real(path: str) -> str:
        return os.path.realpath(path)

    entries = pythonpath.split(os.pathsep) if pythonpath else []
    named = {real(p) for p in entries if p and os.path.isabs(p)}
    relative = [p for p in entries if not p or not os.path.isabs(p)]
    first = sys_path[0] if sys_path else None
    if first is not None and not safe_path and (first == "" or real(first) == real(cwd)):
        where = f"{first!r}, put there by `python -m` or `-c` without -P"
    elif relative:
        where = f"PYTHONPATH entries {', '.join(map(repr, relative))}"
    elif any(not entry or (real(entry) == real(cwd) and real(entry) not in named) for entry in sys_path):
        where = "an empty entry"
    else:
        return
    raise LabConfigError(
        f"the server's Python import path holds the current folder {cwd} ({where}): a module "
        "planted there (e.g. a jupyterlab.py next to the notebooks) would run inside the server.",
        "start the server with `workbench lab` (or `python -P -m jupyterlab`, Python 3.11+), and "
        "remove empty or relative entries from PYTHONPATH.",
    )


def scrub_server_environment() -> None:
    """Remove the credentials from os.environ: kernels and terminals copy it when they start.

    And empty or relative PATH entries, which mean the working folder (the notebook folder
    for a kernel, a terminal, nbconvert's pandoc): a program planted there under the name of
    a command (``ls``, ``pandoc``, the terminal's shell) would run instead of it.
    """
    for name in SCRUBBED_ENV:
        os.environ.pop(name, None)
    if "PATH" in os.environ:
        os.environ["PATH"] = absolute_path_entries(os.environ["PATH"])


def absolute_path_entries(value: str) -> str:
    """A PATH (or PYTHONPATH) value without its empty and relative entries."""
    return os.pathsep.join(p for p in value.split(os.pathsep) if p and os.path.isabs(p))


def effective_settings(serverapp) -> dict[str, object]:
    """Collect the values :func:`check_settings` needs from a running ServerApp."""
    identity = serverapp.identity_provider
    web_settings = getattr(getattr(serverapp, "web_app", None), "settings", {}) or {}

    def pick(name: str, default: object = None) -> object:
        # The web application's settings are what handlers actually read (they
        # include ServerApp.tornado_settings overrides); fall back to the trait.
        if name in web_settings:
            return web_settings[name]
        return getattr(serverapp, name, default)

    try:
        from workbench.server.identity import WorkbenchIdentityProvider

        # Exactly the class: a subclass (from a config file) could override get_user.
        identity_ok = type(identity) is WorkbenchIdentityProvider
    except ImportError:
        identity_ok = False
    gateway = getattr(serverapp, "gateway_config", None)
    return {
        "token": identity.token or "",
        "hashed_password": getattr(identity, "hashed_password", "") or "",
        "auth_enabled": bool(identity.auth_enabled),
        "identity_provider_ok": identity_ok,
        "identity_provider": f"{type(identity).__module__}.{type(identity).__qualname__}",
        # ServerApp.allow_password_change (deprecated) is ignored when the provider's is set,
        # as ours is; asking for it anyway is refused rather than silently dropped.
        "allow_password_change": bool(getattr(identity, "allow_password_change", False))
        or bool(serverapp.config.get("ServerApp", {}).get("allow_password_change", False)),
        "auth_handlers": [
            f"{cls.__module__}.{cls.__qualname__}"
            for cls in (identity.login_handler_class, identity.logout_handler_class)
        ] + ([f"ServerApp.login_handler_class={serverapp.config.ServerApp.login_handler_class}"]
             if "login_handler_class" in serverapp.config.get("ServerApp", {}) else []),
        "allow_unauthenticated_access": pick("allow_unauthenticated_access", False),
        "disable_check_xsrf": pick("disable_check_xsrf", False),
        "xsrf_cookies": web_settings.get("xsrf_cookies", True),
        "allow_origin": pick("allow_origin", ""),
        "allow_origin_pat": serverapp.allow_origin_pat or web_settings.get("allow_origin_pat"),
        # What config files and the command line asked for: the trait itself also holds
        # what jupyter_server copies into it (token, cookie_options, allow_origin...).
        "tornado_settings": {
            **dict(serverapp.config.get("NotebookApp", {}).get("tornado_settings", {}) or {}),
            **dict(serverapp.config.get("ServerApp", {}).get("tornado_settings", {}) or {}),
        },
        "headers": dict(web_settings.get("headers") or {}),
        "allow_remote_access": pick("allow_remote_access", False),
        "local_hostnames": list(pick("local_hostnames", []) or []),
        "nbconvert_csp_sandbox": pick("nbconvert_csp_sandbox", True),
        "insecure_writes": os.environ.get("JUPYTER_ALLOW_INSECURE_WRITES", "").lower() in ("1", "true"),
        "gateway_url": (gateway.url or "") if gateway is not None and gateway.gateway_enabled else "",
        "websocket_url": serverapp.websocket_url or "",
        "runtime_dir": serverapp.runtime_dir,
        "euid": os.geteuid(),
        "cookie_secret_set": "cookie_secret" in serverapp.config.get("ServerApp", {}),
        "kernel_spec_manager": f"{type(serverapp.kernel_spec_manager).__module__}."
                               f"{type(serverapp.kernel_spec_manager).__qualname__}",
    }
