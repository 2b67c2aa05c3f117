"""The security floor of the Jupyter server: token resolution and refusal to start unsafely.

Two layers use this module:

* ``workbench/lab_config/jupyter_server_config.py`` (the one server configuration, used by
  ``workbench lab`` and by the image) calls :func:`resolve_token` and sets secure values.
* A tiny server extension (this module, enabled by that configuration) runs when
  jupyter_server loads its extensions, *after* every config file and the command
  line have been applied, and checks the effective settings with
  :func:`check_settings`. That is what catches ``--ServerApp.disable_check_xsrf=True``
  typed on the command line or an insecure ``~/.jupyter`` config file.

Why ``SystemExit`` and not an exception: jupyter_server swallows exceptions raised
by a config file (logged, then it starts anyway) and by an extension loader (unless
``reraise_server_extension_failures``). ``SystemExit`` is not an ``Exception``, so
it stops the server in both places; its message is the ``LabConfigError`` text.

What a configuration cannot switch off (security round 2):

* the guard itself: :func:`pin_guard_extension` (called by the configuration file)
  re-enables this extension after every config file and the command line, and stops
  the server if it did not run;
* the origin check, also for token-authenticated requests
  (``workbench.lab_identity.WorkbenchIdentityProvider``, checked here);
* tokens in the log: :func:`install_log_redaction` rewrites every log record;
* the token in kernels and terminals: :func:`scrub_server_environment` removes it from
  the server's environment, which kernels and terminals copy.

Why one module of ~700 lines: it is the whole security floor of the server, every
refusal and its fix, so that a reviewer reads what the server accepts in one file.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import secrets
import stat
import string
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from workbench.errors import LabConfigError

# secrets.token_urlsafe(32) gives 43 characters (256 bits). Shorter tokens are refused:
# they get guessed or reused. Length alone is not enough (32 x "a" is 32 characters), so
# a token must also use 16+ different characters, or carry an estimated 128 bits. The
# estimate is length x log2(alphabet), the smallest usual alphabet the token is written in
# (hex 16, letters and digits 62, URL-safe 64, printable 94), once it uses 10+ different
# characters: a random 32-character hex token (`openssl rand -hex 16`, JupyterHub's API
# tokens) shows only ~14 of the 16 digits, yet holds 128 bits. With fewer than 10 different
# characters the estimate is length x log2(distinct), so 32 x "a" holds 0.
MIN_TOKEN_LENGTH = 32
MIN_TOKEN_BITS = 128
MIN_TOKEN_DISTINCT = 16
MAKE_TOKEN = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"

GUARD_EXTENSION = "workbench.lab_guard"
IDENTITY_PROVIDER = "workbench.lab_identity.WorkbenchIdentityProvider"
# Removed from the server's environment once read, so that kernels and terminals (which
# copy it) never see them: `!env` in a notebook would save them into the .ipynb.
SCRUBBED_ENV = ("JUPYTER_TOKEN", "WORKBENCH_PASSWORD_HASH")
# tornado_settings keys a config may set. Everything else there can switch a protection
# off behind the server's back (xsrf_cookies, allow_origin, local_hostnames, cookie
# kwargs, log_function...), so it is refused; `headers` is checked header by header.
ALLOWED_TORNADO_SETTINGS = frozenset({
    "headers", "compress_response", "static_hash_cache", "websocket_max_message_size",
    "websocket_ping_interval", "websocket_ping_timeout", "ws_ping_interval", "ws_ping_timeout",
})

ALLOW_ROOT_ENV = "WORKBENCH_ALLOW_ROOT"
PASSWORD_HASH_ENV = "WORKBENCH_PASSWORD_HASH"
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

_PASSWORD_HASH_PREFIXES = ("argon2:", "sha1:", "sha256:", "sha512:")
_REFUSAL = "workbench: the Jupyter server refuses to start: "

# The token generated for this process (config files can be loaded more than once:
# the same token must come back, and be printed once).
_generated_token: str | None = None
_url_printed = False
# The credentials resolved from os.environ, kept because resolve_token() removes the
# token from the environment (scrub_server_environment) and may be called again.
_resolved: TokenChoice | None = None


@dataclass(frozen=True)
class TokenChoice:
    """The server's credentials and where they came from (never log ``token`` itself)."""

    token: str  # "" only when a password hash is used instead
    source: str  # "JUPYTER_TOKEN" | "JUPYTER_TOKEN_FILE" | "generated" | "password"
    hashed_password: str = ""


_ALPHABETS = (
    (frozenset("0123456789abcdef"), 16), (frozenset("0123456789ABCDEF"), 16),
    (frozenset(string.ascii_letters + string.digits), 62),
    (frozenset(string.ascii_letters + string.digits + "-_"), 64),
)
_MIN_DISTINCT_FOR_ALPHABET = 10


def token_strength(token: str) -> tuple[float, int]:
    """(estimated bits, distinct characters) of a token (see MIN_TOKEN_BITS)."""
    used = set(token)
    distinct = len(used)
    if distinct < _MIN_DISTINCT_FOR_ALPHABET:
        return (len(token) * math.log2(distinct) if distinct > 1 else 0.0), distinct
    alphabet = next((size for chars, size in _ALPHABETS if used <= chars), 94)
    return len(token) * math.log2(alphabet), distinct


def token_problem(token: str) -> str | None:
    """Why a token (already stripped) is too weak, or None: empty, short, or predictable."""
    if not token:
        return "is empty: an empty token turns authentication off."
    if len(token) < MIN_TOKEN_LENGTH:
        return f"is {len(token)} characters long; at least {MIN_TOKEN_LENGTH} are required."
    bits, distinct = token_strength(token)
    if distinct < MIN_TOKEN_DISTINCT and bits < MIN_TOKEN_BITS:
        return (
            f"is too predictable: {len(token)} characters but only {distinct} different ones "
            f"(about {bits:.0f} bits; at least {MIN_TOKEN_BITS} bits or {MIN_TOKEN_DISTINCT} "
            "different characters are required)."
        )
    return None


def _check_token(token: str, where: str) -> str:
    """The token without surrounding whitespace, or LabConfigError saying how to make a good one."""
    token = token.strip()  # "  " must count as empty, and a newline from `echo > file` as nothing
    problem = token_problem(token)
    if problem:
        raise LabConfigError(
            f"{where} {problem}",
            f"make a random token with `{MAKE_TOKEN}` (or `openssl rand -hex 32`) and put it in "
            f"{where}, or unset it to have one generated.",
        )
    return token


def read_token_file(path: str | os.PathLike[str]) -> str:
    """Read a token file that only its owner can read; refuse anything looser."""
    path = Path(path)
    try:
        info = path.stat()
    except OSError as exc:
        raise LabConfigError(
            f"JUPYTER_TOKEN_FILE={str(path)!r} cannot be read ({exc.strerror}).",
            "point JUPYTER_TOKEN_FILE at an existing file that holds the token.",
        ) from exc
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise LabConfigError(
            f"JUPYTER_TOKEN_FILE={str(path)!r} has mode {stat.S_IMODE(info.st_mode):o}: "
            "other users can read or change the token.",
            f"run `chmod 600 {path}` so that only its owner can read it.",
        )
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        # A compose secret is the host file as it is: it must belong to the image's user.
        raise LabConfigError(
            f"JUPYTER_TOKEN_FILE={str(path)!r} (owner uid {info.st_uid}) cannot be read by uid "
            f"{os.geteuid()} ({exc.strerror}).",
            f"give the file to the server's user (`chown {os.geteuid()} {path}`, or build the image "
            "with your uid: WORKBENCH_UID), keeping `chmod 600`.",
        ) from exc
    return _check_token(text, f"JUPYTER_TOKEN_FILE ({path})")


def resolve_token(environ: Mapping[str, str] | None = None) -> TokenChoice:
    """Pick the server's credentials: JUPYTER_TOKEN, JUPYTER_TOKEN_FILE, a password hash, or a new token.

    Raises LabConfigError for an empty, short or predictable token, a token file others
    can read, or a password that is not a hash. From os.environ (``environ`` None) the
    answer is kept for the process: the configuration removes the token from the
    environment afterwards, and Jupyter may load the configuration twice.
    """
    global _resolved
    if environ is None and _resolved is not None:
        return _resolved
    choice = _resolve_token(os.environ if environ is None else environ)
    if environ is None:
        _resolved = choice
    return choice


def _resolve_token(env: Mapping[str, str]) -> TokenChoice:
    global _generated_token
    hashed_password = env.get(PASSWORD_HASH_ENV, "").strip()
    if hashed_password and not hashed_password.startswith(_PASSWORD_HASH_PREFIXES):
        raise LabConfigError(
            f"{PASSWORD_HASH_ENV} does not look like a password hash (it should start with "
            "'argon2:'); a plain-text password is never accepted.",
            "make the hash with `python -c 'from jupyter_server.auth import passwd; print(passwd())'`.",
        )
    if "JUPYTER_TOKEN" in env:
        return TokenChoice(_check_token(env["JUPYTER_TOKEN"], "JUPYTER_TOKEN"), "JUPYTER_TOKEN",
                           hashed_password)
    if "JUPYTER_TOKEN_FILE" in env:
        return TokenChoice(read_token_file(env["JUPYTER_TOKEN_FILE"]), "JUPYTER_TOKEN_FILE",
                           hashed_password)
    if hashed_password:
        # Password login only: no token, so the login form asks for the password.
        return TokenChoice("", "password", hashed_password)
    if _generated_token is None:
        _generated_token = secrets.token_urlsafe(32)
    return TokenChoice(_generated_token, "generated")


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
    insecure_writes, gateway_url, websocket_url.
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
        _check_token(token, "the server token (IdentityProvider.token)")
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
    if settings.get("runtime_dir"):
        check_runtime_dir(str(settings["runtime_dir"]))
    euid = settings.get("euid")
    check_root(euid if isinstance(euid, int) else None)


_DEFAULT_AUTH_HANDLERS = ["jupyter_server.auth.login.LoginFormHandler", "jupyter_server.auth.logout.LogoutHandler"]

# An exact origin: scheme://host[:port], nothing else (no path, no "null", no wildcard).
_ORIGIN = re.compile(r"https?://(\[[0-9a-f:.]+\]|[a-z0-9]([a-z0-9.-]*[a-z0-9])?)(:[0-9]{1,5})?")


def check_allow_origin(value: str) -> None:
    """ServerApp.allow_origin may be empty (same origin only) or one exact origin."""
    if not value:
        return
    if value == "*":
        raise LabConfigError(
            "ServerApp.allow_origin='*' lets every web site call the server's API.",
            "remove allow_origin, or name the one origin that needs access "
            "(e.g. --ServerApp.allow_origin=https://tools.example.org).",
        )
    if not _ORIGIN.fullmatch(value):
        raise LabConfigError(
            f"ServerApp.allow_origin={value!r} is not one exact origin: 'null' is what sandboxed "
            "frames and files send, and anything but scheme://host[:port] is a pattern.",
            "remove allow_origin, or set it to one lower-case origin such as https://tools.example.org:8443.",
        )


def origin_allowed(origin: str, host: str, allow_origin: str = "") -> bool:
    """Whether a request's Origin is the server's own (its Host) or the configured exact origin."""
    origin = origin.strip().lower()
    if allow_origin and origin == allow_origin.lower():
        return True
    scheme, sep, netloc = origin.partition("://")
    return bool(sep) and scheme in ("http", "https") and netloc == host.lower() and "/" not in netloc


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


def scrub_server_environment() -> None:
    """Remove the credentials from os.environ: kernels and terminals copy it when they start."""
    for name in SCRUBBED_ENV:
        os.environ.pop(name, None)


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
        from workbench.lab_identity import WorkbenchIdentityProvider

        identity_ok = isinstance(identity, WorkbenchIdentityProvider)
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
    }


# --- what no configuration can switch off ---------------------------------------------------


def pin_guard_extension() -> None:
    """Keep this extension enabled whatever the config files and the command line say.

    Config files and ``--ServerApp.jpserver_extensions=workbench.lab_guard=False`` all
    land in the ``jpserver_extensions`` trait before ``init_server_extensions`` reads it;
    re-asserting it there is the last word. After the extensions are loaded, a server
    whose guard did not run (switched off, failed to import, shadowed) is stopped.
    """
    from jupyter_server.serverapp import ServerApp

    if getattr(ServerApp, "_workbench_guard_pinned", False):
        return  # the configuration may be loaded more than once
    init_server_extensions = ServerApp.init_server_extensions
    load_server_extensions = ServerApp.load_server_extensions

    def init_with_guard(self) -> None:
        if self.jpserver_extensions.get(GUARD_EXTENSION) is not True:
            self.log.warning("workbench: %s was disabled by configuration; enabling it again.",
                             GUARD_EXTENSION)
        self.jpserver_extensions = {**self.jpserver_extensions, GUARD_EXTENSION: True}
        init_server_extensions(self)

    def load_and_verify(self) -> None:
        load_server_extensions(self)
        if getattr(self, "_workbench_guard_ran", False) is not True:
            raise refuse(LabConfigError(
                f"the {GUARD_EXTENSION} server extension did not run, so the server's settings "
                "were not checked.",
                "look for an import error above (a module named `workbench` earlier on the "
                "Python path?) and reinstall the workbench (`bash scripts/setup.sh`).",
            ))

    ServerApp.init_server_extensions = init_with_guard
    ServerApp.load_server_extensions = load_and_verify
    ServerApp._workbench_guard_pinned = True


# Query parameters and headers that carry credentials, wherever they appear in a log line.
_SECRET_PARAM = re.compile(r"((?:token|_xsrf|xsrf|password|auth)[\w-]*=)([^&\s\"'<>#;,)]+)", re.IGNORECASE)
_SECRET_HEADER = re.compile(
    r"((?:authorization|cookie|x-xsrftoken)[\"']?\s*[:=]\s*[\"']?)([^\"'\r\n,}]+)", re.IGNORECASE
)
_SECRET_JSON = re.compile(r"([\"'](?:token|password)[\"']\s*:\s*[\"'])([^\"']+)", re.IGNORECASE)
_secrets: set[str] = set()
_log_factory_installed = False


def redact(text: str) -> str:
    """The text with tokens, Authorization / Cookie values and the server's own token replaced."""
    for secret in _secrets:
        text = text.replace(secret, "[secret]")
    text = _SECRET_PARAM.sub(r"\1[secret]", text)
    text = _SECRET_HEADER.sub(r"\1[secret]", text)
    return _SECRET_JSON.sub(r"\1[secret]", text)


def install_log_redaction(secrets_: Iterable[str] = ()) -> None:
    """Redact every log record of this process, from any logger (tornado's included).

    A record factory, not a Filter: filters sit on one logger or handler, and tornado's
    loggers, the ServerApp's and the extensions' each have their own. The factory runs
    when a record is created, only for records whose level is enabled.
    """
    global _log_factory_installed
    _secrets.update(s for s in secrets_ if s and len(s) >= 8)
    if _log_factory_installed:
        return
    previous = logging.getLogRecordFactory()

    def factory(*args, **kwargs) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: leave it to the handler to report
            return record
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return record

    logging.setLogRecordFactory(factory)
    _log_factory_installed = True


def refuse(error: LabConfigError) -> SystemExit:
    """The SystemExit that stops the server with the error's message (see module docstring)."""
    return SystemExit(_REFUSAL + str(error))


@contextlib.contextmanager
def refuse_to_start_on_error() -> Iterator[None]:
    """Wrap a config file's body: any error stops the server instead of being logged and ignored."""
    try:
        yield
    except LabConfigError as exc:
        raise refuse(exc) from None
    except Exception as exc:  # a bug in the config must not leave the server half-secured
        raise SystemExit(
            f"{_REFUSAL}the workbench server configuration failed: {exc!r}. Fix: check "
            "workbench/lab_config/jupyter_server_config.py and the WORKBENCH_* / JUPYTER_* variables."
        ) from exc


def _print_url(serverapp) -> None:
    """Print the generated token once, inside the URL to open."""
    global _url_printed
    token = serverapp.identity_provider.token
    if _url_printed or not token or token != _generated_token:
        return
    _url_printed = True
    ip = serverapp.ip or "127.0.0.1"
    if ip in ("0.0.0.0", "::", "*"):
        ip = "127.0.0.1"
    host = f"[{ip}]" if ":" in ip else ip
    url = f"http://{host}:{serverapp.port}{serverapp.base_url}lab?token={token}"
    print(
        "\n    workbench: a token was generated for this session; open\n"
        f"        {url}\n"
        "    (set JUPYTER_TOKEN or JUPYTER_TOKEN_FILE to choose your own)\n",
        file=sys.stderr,
        flush=True,
    )


# --- the server extension -----------------------------------------------------------


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "workbench.lab_guard"}]


def _load_jupyter_server_extension(serverapp) -> None:
    """Check the effective settings once every config source has been applied."""
    from workbench import hub_singleuser

    try:
        check_versions()
        if hub_singleuser.detect() is not None:
            # Spawned by JupyterHub: the hub's OAuth authenticates; the rest of the floor applies.
            hub_singleuser.check_settings(hub_singleuser.effective_settings(serverapp))
        else:
            check_settings(effective_settings(serverapp))
    except LabConfigError as exc:
        raise refuse(exc) from None
    serverapp._workbench_guard_ran = True
    # Whatever set the token (env, file, a config), it never reaches the log or a kernel.
    install_log_redaction([serverapp.identity_provider.token])
    scrub_server_environment()
    # jpserver-<pid>-open.html holds the token and is written with the umask (often 0644);
    # the browser is never opened from here, so it is not written at all.
    serverapp.no_browser_open_file = True
    # Cookies are only sent by pages of this server, never on requests other sites start.
    settings = serverapp.web_app.settings
    settings["xsrf_cookie_kwargs"] = {**settings.get("xsrf_cookie_kwargs", {}), "samesite": "Strict"}
    _print_url(serverapp)
