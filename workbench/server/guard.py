"""The guard: the server extension that stops a Jupyter server configured unsafely.

Two layers keep the server safe:

* ``workbench/server/jupyter_config/jupyter_server_config.py`` (the one server configuration,
  used by ``workbench lab`` and by the image) resolves the token (``server/credentials.py``) and
  sets secure values.
* A tiny server extension (this module, enabled by that configuration) runs when
  jupyter_server loads its extensions, *after* every config file and the command
  line have been applied, and checks the effective settings with
  ``floor.check_settings``. That is what catches ``--ServerApp.disable_check_xsrf=True``
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
  (``workbench.server.identity.WorkbenchIdentityProvider``, checked by the floor);
* tokens in the log: :func:`install_log_redaction` rewrites every log record;
* the token in kernels and terminals: ``floor.scrub_server_environment`` removes it from
  the server's environment, which kernels and terminals copy.

And what it checks at start (security round 3): no folder a notebook can write on the
server's import path, no Python config file but the workbench's own, and the guard's own
modules and the identity provider are the installed code, unpatched (``server/integrity.py``).
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import types
from collections.abc import Iterable, Iterator
from urllib.parse import unquote

from workbench.errors import LabConfigError
from workbench.server import floor, hub_singleuser, integrity, tensorboard
from workbench.server.credentials import generated_token

GUARD_EXTENSION = "workbench.server.guard"
_url_printed = False  # the generated token's URL is printed once per process
_REFUSAL = "workbench: the Jupyter server refuses to start: "


# --- what no configuration can switch off ---------------------------------------------------


def pin_guard_extension() -> None:
    """Keep this extension enabled whatever the config files and the command line say.

    Config files and ``--ServerApp.jpserver_extensions=workbench.server.guard=False`` all
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
        open_routes = tensorboard.open_proxy_routes(self.web_app)
        if open_routes:  # standalone and under JupyterHub alike, whatever turned them on
            raise refuse(LabConfigError(
                f"jupyter-server-proxy's open routes ({', '.join(open_routes)}) are being served: they "
                "tunnel to any port on this machine for whoever holds the token.",
                f"set ServerApp.jpserver_extensions.{tensorboard.PROXY_EXTENSION} = False (the workbench "
                "configuration does); TensorBoard is served at /tensorboard/ without them.",
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


def _redact_literal(text: str) -> str:
    for secret in _secrets:
        text = text.replace(secret, "[secret]")
    text = _SECRET_PARAM.sub(r"\1[secret]", text)
    text = _SECRET_HEADER.sub(r"\1[secret]", text)
    return _SECRET_JSON.sub(r"\1[secret]", text)


def redact(text: str) -> str:
    """The text with tokens, Authorization / Cookie values and the server's own token replaced.

    Judged on what the request decodes to, not only the literal text: ``?%74oken=%65...``
    authenticates like ``?token=e...``. A line whose percent-decoded form (up to three rounds)
    holds a secret is written decoded, with the secrets replaced.
    """
    clean = _redact_literal(text)
    decoded = text
    for _ in range(3):
        step = unquote(decoded)
        if step == decoded:
            break
        decoded = step
        redacted = _redact_literal(decoded)
        if redacted != decoded:
            return redacted
    return clean


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
            "workbench/server/jupyter_config/jupyter_server_config.py and the WORKBENCH_* / JUPYTER_* variables."
        ) from exc


def _print_url(serverapp) -> None:
    """Print the generated token once, inside the URL to open."""
    global _url_printed
    token = serverapp.identity_provider.token
    if _url_printed or not token or token != generated_token():
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
    return [{"module": "workbench.server.guard"}]


def check_pinned() -> None:
    """The two ServerApp methods :func:`pin_guard_extension` wraps are still its wrappers."""
    from jupyter_server.serverapp import ServerApp

    nested = [c for c in integrity.fresh_namespace(sys.modules[__name__])["pin_guard_extension"].__code__.co_consts
              if isinstance(c, types.CodeType)]
    for method in ("init_server_extensions", "load_server_extensions"):
        if getattr(getattr(ServerApp, method), "__code__", None) not in nested:
            raise integrity.replaced(f"ServerApp.{method}")


def _load_jupyter_server_extension(serverapp) -> None:
    """Check the effective settings once every config source has been applied."""
    try:
        integrity.check_startup(serverapp)
        check_pinned()
        floor.check_versions()
        if hub_singleuser.detect() is not None:
            # Spawned by JupyterHub: the hub's OAuth authenticates; the rest of the floor applies.
            hub_singleuser.check_settings(hub_singleuser.effective_settings(serverapp))
        else:
            floor.check_settings(floor.effective_settings(serverapp))
    except LabConfigError as exc:
        raise refuse(exc) from None
    serverapp._workbench_guard_ran = True
    # Whatever set the token (env, file, a config), it never reaches the log or a kernel.
    install_log_redaction([serverapp.identity_provider.token])
    floor.scrub_server_environment()
    # jpserver-<pid>-open.html holds the token and is written with the umask (often 0644);
    # the browser is never opened from here, so it is not written at all.
    serverapp.no_browser_open_file = True
    # Cookies are only sent by pages of this server, never on requests other sites start.
    settings = serverapp.web_app.settings
    settings["xsrf_cookie_kwargs"] = {**settings.get("xsrf_cookie_kwargs", {}), "samesite": "Strict"}
    _print_url(serverapp)
