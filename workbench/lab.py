"""`workbench lab`: start JupyterLab with the workbench's one secure server configuration.

The configuration ships inside the package, ``workbench/lab_config/jupyter_server_config.py``
(the image installs the same file as /etc/jupyter/jupyter_server_config.py); this module only finds it,
builds the command line and replaces itself with the server, so Ctrl-C and signals
go straight to Jupyter. The token is printed by the server once it is running.

Started by hand as root (common on cloud machines and CI), it warns and goes on: the
person who typed it already is root there, and the token still guards access. The
image, by contrast, runs the server as its own user and refuses root.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from workbench.errors import LabConfigError

DEFAULT_PORT = 8888
DEFAULT_IP = "127.0.0.1"  # loopback: reach it from elsewhere through an SSH tunnel
CONFIG_ENV = "WORKBENCH_SERVER_CONFIG"
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


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
    bundled = Path(str(resources.files("workbench.lab_config") / "jupyter_server_config.py"))
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
    """Build the JupyterLab command line; raises LabConfigError for a bad port or folder."""
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
    argv = [
        python, "-m", "jupyterlab",
        f"--config={config}",
        f"--ServerApp.ip={ip}",
        f"--ServerApp.port={int(port)}",
        f"--ServerApp.root_dir={root}",
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
    argv += list(extra_args)
    return LabCommand(argv=argv, env=env, warnings=warnings)


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
        help="after --: extra JupyterLab options (unsafe ones are refused at start)",
    )


def run_cli(args: argparse.Namespace) -> int:
    extra = list(args.jupyter_args or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    return launch(args.port, args.ip, args.notebook_dir, extra, print_only=args.print_command)
