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
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from workbench.errors import LabConfigError

# 32 characters of a random token is >= 160 bits even for hex; secrets.token_urlsafe(32)
# gives 43 characters (256 bits). Shorter tokens are refused: they get guessed or reused.
MIN_TOKEN_LENGTH = 32

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


@dataclass(frozen=True)
class TokenChoice:
    """The server's credentials and where they came from (never log ``token`` itself)."""

    token: str  # "" only when a password hash is used instead
    source: str  # "JUPYTER_TOKEN" | "JUPYTER_TOKEN_FILE" | "generated" | "password"
    hashed_password: str = ""


def _check_token(token: str, where: str) -> str:
    if not token:
        raise LabConfigError(
            f"{where} is empty: an empty token turns authentication off.",
            f"put a random token of at least {MIN_TOKEN_LENGTH} characters in {where}, e.g. "
            "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`, or unset it to "
            "have one generated.",
        )
    if len(token) < MIN_TOKEN_LENGTH:
        raise LabConfigError(
            f"{where} is {len(token)} characters long; at least {MIN_TOKEN_LENGTH} are required.",
            "use `python -c 'import secrets; print(secrets.token_urlsafe(32))'` to make one.",
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
    return _check_token(path.read_text(encoding="utf-8").strip(), f"JUPYTER_TOKEN_FILE ({path})")


def resolve_token(environ: Mapping[str, str] | None = None) -> TokenChoice:
    """Pick the server's credentials: JUPYTER_TOKEN, JUPYTER_TOKEN_FILE, a password hash, or a new token.

    Raises LabConfigError for an empty or short token, a token file others can read,
    or a password that is not a hash.
    """
    global _generated_token
    env = os.environ if environ is None else environ
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

    ``settings`` keys (see :func:`effective_settings`): token, hashed_password,
    auth_enabled, disable_check_xsrf, xsrf_cookies, allow_origin, allow_origin_pat,
    allow_remote_access, nbconvert_csp_sandbox, euid.
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
        _check_token(token, "the server token (IdentityProvider.token)")
    if settings.get("disable_check_xsrf") or settings.get("xsrf_cookies") is False:
        raise LabConfigError(
            "XSRF protection is disabled (ServerApp.disable_check_xsrf=True): any web page you "
            "visit could post to the server with your cookie.",
            "remove disable_check_xsrf from the command line and the Jupyter config files.",
        )
    if settings.get("allow_origin") == "*":
        raise LabConfigError(
            "ServerApp.allow_origin='*' lets every web site call the server's API.",
            "remove allow_origin, or name the one origin that needs access "
            "(e.g. --ServerApp.allow_origin=https://tools.example.org).",
        )
    if settings.get("allow_origin_pat"):
        raise LabConfigError(
            "ServerApp.allow_origin_pat is set; origin patterns have had bypasses "
            "(CVE-2026-40110, PYSEC-2026-3472 is still unfixed).",
            "remove allow_origin_pat and set allow_origin to the exact origin instead.",
        )
    if settings.get("allow_remote_access"):
        raise LabConfigError(
            "the Host-header check is off (ServerApp.allow_remote_access=True), which opens the "
            "server to DNS-rebinding attacks.",
            f"remove allow_remote_access; list the name you browse to in {LOCAL_HOSTNAMES_ENV} "
            "(comma-separated), or reach the server through an SSH tunnel to 127.0.0.1.",
        )
    if settings.get("nbconvert_csp_sandbox") is False:
        raise LabConfigError(
            "ServerApp.nbconvert_csp_sandbox=False lets exported notebooks run script in the "
            "server's origin (CVE-2026-44727).",
            "remove nbconvert_csp_sandbox from the command line and the Jupyter config files.",
        )
    euid = settings.get("euid")
    check_root(euid if isinstance(euid, int) else None)


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

    return {
        "token": identity.token or "",
        "hashed_password": getattr(identity, "hashed_password", "") or "",
        "auth_enabled": bool(identity.auth_enabled),
        "disable_check_xsrf": pick("disable_check_xsrf", False),
        "xsrf_cookies": web_settings.get("xsrf_cookies", True),
        "allow_origin": pick("allow_origin", ""),
        "allow_origin_pat": serverapp.allow_origin_pat or web_settings.get("allow_origin_pat"),
        "allow_remote_access": pick("allow_remote_access", False),
        "nbconvert_csp_sandbox": pick("nbconvert_csp_sandbox", True),
        "euid": os.geteuid(),
    }


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
    try:
        check_versions()
        check_settings(effective_settings(serverapp))
    except LabConfigError as exc:
        raise refuse(exc) from None
    _print_url(serverapp)
