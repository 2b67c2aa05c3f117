"""`workbench lab`: start JupyterLab with the workbench's one secure server configuration.

The configuration ships inside the package, ``workbench/server/jupyter_config/jupyter_server_config.py``
(the image installs the same file as /etc/jupyter/jupyter_server_config.py); this module only finds it,
builds the command line and replaces itself with the server, so Ctrl-C and signals
go straight to Jupyter. The token is printed by the server once it is running.

The server it starts imports nothing from the current folder (``python -P``), runs no
Jupyter config file but the workbench's (a config folder of its own, emptied at every
start) and gets ``JUPYTER_TOKEN`` through a pipe instead of its environment
(docs/security.md says why each matters).

Started by hand as root (common on cloud machines and CI), it warns and goes on: the
person who typed it already is root there, and the token still guards access. The
image, by contrast, runs the server as its own user and refuses root.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from workbench.errors import LabConfigError
from workbench.server import integrity
from workbench.server.credentials import TOKEN_FD_ENV
from workbench.server.floor import absolute_path_entries
from workbench.server.processes import safe_module_argv  # `python -m` without the current folder

DEFAULT_PORT = 8888
DEFAULT_IP = "127.0.0.1"  # loopback: reach it from elsewhere through an SSH tunnel
CONFIG_ENV = "WORKBENCH_SERVER_CONFIG"
# The server's Jupyter config folder: emptied at every start (see private_config_dir).
CONFIG_SUBDIR = "workbench-config"
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}

# --- extra JupyterLab options: an allow-list ------------------------------------------------
# `workbench lab -- OPTIONS` and the image's entry point pass only these on. A deny-list
# loses to the next trait name (identity_provider_class, jpserver_extensions, --config,
# tornado_settings...); everything about credentials, extensions, config files, origins,
# XSRF, the Host check, headers or CSP comes from the workbench configuration instead.
# Each option maps to a check of its value that returns what is wrong, or None.


def _number(low: float, high: float, kind: type = int) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        try:
            number = kind(value)
        except ValueError:
            return f"is not a {'whole ' if kind is int else ''}number"
        return None if low <= number <= high else f"is not between {low:g} and {high:g}"
    return check


def _boolean(value: str) -> str | None:
    return None if value.lower() in ("true", "false", "1", "0") else "is not True or False"


def _text(value: str) -> str | None:
    # No line breaks (the entry point passes options one per line) and no @file expansion.
    if re.search(r"[\r\n\0]", value) or value.startswith("@"):
        return "contains a line break or starts with @"
    return None


def _url_path(value: str) -> str | None:
    # A path on this server: "//evil.example" would make the redirect from / go elsewhere.
    if not re.fullmatch(r"/([A-Za-z0-9._~-]+/?)*", value) or value.startswith("//"):
        return "is not a path on this server such as /lab or /user/me/"
    return None


def _host(value: str) -> str | None:
    return None if re.fullmatch(r"[A-Za-z0-9.:\[\]-]+", value) else "is not an IP address or host name"


_LOG_LEVEL = {"DEBUG", "INFO", "WARN", "WARNING", "ERROR", "CRITICAL", "10", "20", "30", "40", "50"}


def _log_level(value: str) -> str | None:
    return None if value.upper() in _LOG_LEVEL else f"is not one of {', '.join(sorted(_LOG_LEVEL))}"


_PORT = _number(1, 65535)
_RATE = _number(0, 1e15, float)
SERVER_OPTIONS: dict[str, Callable[[str], str | None]] = {
    "port": _PORT, "ServerApp.port": _PORT,
    "ip": _host, "ServerApp.ip": _host,
    "notebook-dir": _text, "ServerApp.root_dir": _text, "ServerApp.notebook_dir": _text,
    "preferred-dir": _text, "ServerApp.preferred_dir": _text,
    "ServerApp.base_url": _url_path, "ServerApp.default_url": _url_path, "LabApp.default_url": _url_path,
    "browser": _text, "ServerApp.browser": _text, "ServerApp.open_browser": _boolean,
    "log-level": _log_level, "ServerApp.log_level": _log_level, "Application.log_level": _log_level,
    "LabApp.log_level": _log_level,
    "ServerApp.shutdown_no_activity_timeout": _number(0, 10**9),
    "ServerApp.terminals_enabled": _boolean,
    "ServerApp.max_body_size": _number(0, 2**63), "ServerApp.max_buffer_size": _number(0, 2**63),
    "ServerApp.iopub_data_rate_limit": _RATE, "ServerApp.iopub_msg_rate_limit": _RATE,
    "ServerApp.rate_limit_window": _RATE,
    "ZMQChannelsWebsocketConnection.iopub_data_rate_limit": _RATE,
    "ZMQChannelsWebsocketConnection.iopub_msg_rate_limit": _RATE,
    "ZMQChannelsWebsocketConnection.rate_limit_window": _RATE,
    "ContentsManager.allow_hidden": _boolean, "FileContentsManager.allow_hidden": _boolean,
}
SERVER_FLAGS = frozenset({"no-browser", "debug", "no-mathjax"})
# Options that set what `workbench lab` sets itself from --ip, --port and --notebook-dir.
_SAME_SETTING = {"ip": "ip", "ServerApp.ip": "ip", "port": "port", "ServerApp.port": "port",
                 "notebook-dir": "root_dir", "ServerApp.root_dir": "root_dir", "ServerApp.notebook_dir": "root_dir"}


def check_server_options(args: Sequence[str]) -> list[str]:
    """Check extra JupyterLab options against the allow-list; return them as ``--name=value``.

    The canonical form means nothing after the check is parsed differently by Jupyter
    (a value that looks like an option, an ``@file``). Raises LabConfigError naming the
    first option that is not allowed, with what to do instead.
    """
    checked: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        name, has_value, value = arg[2:].partition("=") if arg.startswith("--") else ("", False, "")
        if not name:
            raise LabConfigError(
                f"{arg!r} is not an option (only --name=value options are passed to JupyterLab).",
                "give the folder with --notebook-dir, and options as --ServerApp.port=8899.",
            )
        if name in SERVER_FLAGS and not has_value:
            checked.append(arg)
            index += 1
            continue
        check = SERVER_OPTIONS.get(name)
        if check is None:
            raise LabConfigError(
                f"--{name} is not among the JupyterLab options the workbench passes on. Credentials, "
                "extensions, config files, identity provider, authorizer, origins, XSRF, the Host "
                "check, headers and CSP come from the workbench configuration only.",
                "remove it. Allowed: " + ", ".join(f"--{n}" for n in sorted(SERVER_FLAGS | set(SERVER_OPTIONS)))
                + ". Tokens come from JUPYTER_TOKEN / JUPYTER_TOKEN_FILE, host names from "
                "WORKBENCH_LOCAL_HOSTNAMES.",
            )
        if not has_value:
            if index + 1 >= len(args) or args[index + 1].startswith("-"):
                raise LabConfigError(f"--{name} needs a value.", f"write it as --{name}=VALUE.")
            index += 1
            value = args[index]
        problem = check(value)
        if problem:
            raise LabConfigError(f"--{name}={value!r}: the value {problem}.", f"give --{name} a valid value.")
        checked.append(f"--{name}={value}")
        index += 1
    return checked


@dataclass
class LabCommand:
    """What `workbench lab` runs: the argv, its environment, and warnings to show first."""

    argv: list[str]
    env: dict[str, str]
    warnings: list[str] = field(default_factory=list)

    def shell(self) -> str:
        return shlex.join(self.argv)


def find_server_config(environ: Mapping[str, str] | None = None) -> Path:
    """The server configuration: $WORKBENCH_SERVER_CONFIG, else the copy shipped in the package."""
    env = os.environ if environ is None else environ
    if env.get(CONFIG_ENV):
        path = Path(env[CONFIG_ENV]).expanduser()
        if not path.is_file():
            raise LabConfigError(
                f"{CONFIG_ENV}={env[CONFIG_ENV]!r} is not a file.",
                f"point {CONFIG_ENV} at a jupyter_server_config.py, or unset it to use the workbench's own.",
            )
        return path.resolve()
    bundled = Path(str(resources.files("workbench.server.jupyter_config") / "jupyter_server_config.py"))
    if bundled.is_file():
        return bundled
    raise LabConfigError(
        f"cannot find the workbench Jupyter server configuration ({bundled}): the package is incomplete.",
        "reinstall the workbench (pip install --force-reinstall workbench), or set "
        f"{CONFIG_ENV}=/path/to/jupyter_server_config.py.",
    )


def build_command(
    port: int = DEFAULT_PORT,
    ip: str = DEFAULT_IP,
    notebook_dir: str | os.PathLike[str] | None = None,
    extra_args: Sequence[str] = (),
    *,
    environ: Mapping[str, str] | None = None,
    euid: int | None = None,
    python: str = sys.executable,
) -> LabCommand:
    """Build the JupyterLab command line; raises LabConfigError for a bad port, folder or option."""
    env = dict(os.environ if environ is None else environ)
    euid = os.geteuid() if euid is None else euid
    if not 1 <= int(port) <= 65535:
        raise LabConfigError(f"--port {port} is not a TCP port.", "use a port from 1 to 65535, e.g. 8888.")
    root = Path(notebook_dir if notebook_dir is not None else os.getcwd()).expanduser().resolve()
    if not root.is_dir():
        raise LabConfigError(
            f"--notebook-dir {str(root)!r} is not a folder.",
            "give an existing folder (the file browser shows it), e.g. --notebook-dir .",
        )
    config = find_server_config(env)
    isolate_environment(env)
    extra = check_server_options(extra_args)
    # An option after -- that names the same setting wins (traitlets refuses two values): the
    # image's `jupyter lab --port=9999` is `workbench lab -- --port=9999` (docker/jupyter-start.sh).
    given = {_SAME_SETTING.get(option[2:].partition("=")[0]) for option in extra}
    argv = [
        *safe_module_argv(python, "jupyterlab"),
        f"--config={config}",
        *([f"--ServerApp.ip={ip}"] if "ip" not in given else []),
        *([f"--ServerApp.port={int(port)}"] if "port" not in given else []),
        *([f"--ServerApp.root_dir={root}"] if "root_dir" not in given else []),
    ]
    warnings = []
    if euid == 0:
        # The configuration refuses root unless this says it is meant; here it is.
        env["WORKBENCH_ALLOW_ROOT"] = "1"
        argv.append("--allow-root")
        warnings.append(
            "the Jupyter server will run as root: notebooks and terminals get root's powers on "
            "this machine. The token still guards access. Run as an ordinary user where you can."
        )
    if ip not in _LOOPBACK:
        warnings.append(
            f"listening on {ip}, not only on this machine. The token guards access and the "
            "Host-header check accepts only loopback addresses and WORKBENCH_LOCAL_HOSTNAMES; "
            "prefer `ssh -L 8888:127.0.0.1:8888 host` to opening the port."
        )
    argv += extra
    return LabCommand(argv=argv, env=env, warnings=warnings)


def isolate_environment(env: dict[str, str]) -> None:
    """What the server imports and which config files it runs come from the workbench only.

    * PYTHONPATH and PATH: empty or relative entries mean the current folder (a planted module,
      or a program named like a command); they are dropped.
    * Jupyter config files are Python: ``jupyter_config.py`` / ``jupyter_lab_config.py`` in
      ~/.jupyter, $JUPYTER_CONFIG_DIR or $JUPYTER_CONFIG_PATH could patch the guard before it
      runs. The server gets a config folder of its own, emptied at every start
      (:func:`private_config_dir`), and no JUPYTER_CONFIG_PATH; JupyterLab's settings and
      workspaces stay where they were. (The guard refuses any other Python config file.)
    """
    for name in ("PYTHONPATH", "PATH"):
        if env.get(name):
            kept = absolute_path_entries(env[name])
            if kept:
                env[name] = kept
            else:
                env.pop(name)
    user_config = env.get("JUPYTER_CONFIG_DIR") or os.path.join(os.path.expanduser("~"), ".jupyter")
    env.setdefault("JUPYTERLAB_SETTINGS_DIR", os.path.join(user_config, "lab", "user-settings"))
    env.setdefault("JUPYTERLAB_WORKSPACES_DIR", os.path.join(user_config, "lab", "workspaces"))
    env.pop("JUPYTER_CONFIG_PATH", None)
    env["JUPYTER_CONFIG_DIR"] = str(Path(_runtime_dir(env)) / CONFIG_SUBDIR)


def _runtime_dir(env: Mapping[str, str]) -> str:
    if env.get("JUPYTER_RUNTIME_DIR"):
        return env["JUPYTER_RUNTIME_DIR"]
    from jupyter_core.paths import jupyter_data_dir

    data = env.get("JUPYTER_DATA_DIR") or jupyter_data_dir()
    return os.path.join(data, "runtime")


def check_config_path(env: Mapping[str, str]) -> None:
    """Refuse to start a server whose config folders hold a Python config file that is not ours.

    The folders the server will read with ``env`` (its own config folder, the system ones,
    ``~/.local/etc/jupyter`` where user site-packages are on): checked here, before the server
    runs any of them; the guard checks again after the fact.
    """
    from jupyter_core import paths

    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env)
        folders = paths.jupyter_config_path()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    foreign = integrity.foreign_config_files(integrity.config_files_in(folders))
    if foreign:
        raise integrity.foreign_config_error(foreign[0])


def private_config_dir(path: str | os.PathLike[str]) -> Path:
    """Empty the server's config folder (mode 700): nothing written there survives a restart.

    A ``migrated`` marker keeps jupyter_core from copying IPython profile files into it.
    """
    import shutil

    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)
    path.mkdir(mode=0o700)
    (path / "migrated").write_text("workbench\n")
    return path


def pass_token_by_pipe(env: dict[str, str]) -> int | None:
    """Move JUPYTER_TOKEN out of the server's environment into an inherited pipe.

    A process's initial environment stays readable in /proc/PID/environ for its whole life
    (a kernel reads its parent's), whatever the server removes from os.environ later. The
    server configuration reads the token from the pipe (WORKBENCH_TOKEN_FD) and closes it.
    Returns the read end's descriptor, or None when there is no JUPYTER_TOKEN.
    """
    token = env.pop("JUPYTER_TOKEN", None)
    if token is None:
        return None
    data = token.encode()
    read_fd, write_fd = os.pipe()
    if len(data) >= 65536:  # a pipe buffer; a token is ~43 bytes
        raise LabConfigError("JUPYTER_TOKEN is longer than 64 KiB.", "use a token of 32 to 100 characters.")
    os.write(write_fd, data)
    os.close(write_fd)
    os.set_inheritable(read_fd, True)
    env[TOKEN_FD_ENV] = str(read_fd)
    return read_fd


def launch(
    port: int = DEFAULT_PORT,
    ip: str = DEFAULT_IP,
    notebook_dir: str | os.PathLike[str] | None = None,
    extra_args: Sequence[str] = (),
    *,
    print_only: bool = False,
) -> int:
    """Start JupyterLab in place of this process (returns only with ``print_only``)."""
    command = build_command(port, ip, notebook_dir, extra_args)
    for warning in command.warnings:
        print(f"workbench lab: warning: {warning}", file=sys.stderr)
    print(f"workbench lab: {command.shell()}", file=sys.stderr, flush=True)
    if print_only:
        return 0
    private_config_dir(command.env["JUPYTER_CONFIG_DIR"])
    check_config_path(command.env)
    pass_token_by_pipe(command.env)
    os.execve(command.argv[0], command.argv, command.env)
    return 0  # not reached


# --- CLI ---------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port (default 8888)")
    parser.add_argument(
        "--ip", default=DEFAULT_IP,
        help="address to listen on (default 127.0.0.1; 0.0.0.0 opens it to the network)",
    )
    parser.add_argument(
        "--notebook-dir", default=None,
        help="folder the file browser shows (default: the current folder)",
    )
    parser.add_argument(
        "--print-command", action="store_true",
        help="print the JupyterLab command line and exit without starting it",
    )
    parser.add_argument(
        "jupyter_args", nargs=argparse.REMAINDER,
        help="after --: extra JupyterLab options from an allow-list (port, folders, base URL, "
        "browser, log level, rate limits); others are refused",
    )


def run_cli(args: argparse.Namespace) -> int:
    extra = list(args.jupyter_args or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    return launch(args.port, args.ip, args.notebook_dir, extra, print_only=args.print_command)


def main(argv: Sequence[str]) -> int:
    """``python -m workbench.server.lab --check-options -- OPTIONS``: the entry point's allow-list.

    Prints the checked options one per line (exit 0), or the reason and the fix (exit 2).
    """
    args = list(argv)
    if args[:1] != ["--check-options"]:
        print("usage: python -m workbench.server.lab --check-options -- [OPTIONS...]", file=sys.stderr)
        return 2
    args = args[2:] if args[1:2] == ["--"] else args[1:]
    try:
        checked = check_server_options(args)
    except LabConfigError as exc:
        print(f"workbench: refusing the server options: {exc}", file=sys.stderr)
        return 2
    for option in checked:
        print(option)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
