"""Start the real Jupyter server for the tests: free port, throw-away dirs, a retrying wait.

Used by test_server.py and test_browser.py. The server is the tests' own subprocess,
started through the real `workbench lab` CLI (or docker/entrypoint.sh) and stopped at
the end; nothing listens anywhere but on 127.0.0.1.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
WORKBENCH = str(Path(sys.executable).with_name("workbench"))
SERVER_CONFIG = REPO / "workbench" / "server" / "jupyter_config" / "jupyter_server_config.py"
START_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def isolated_env(tmp: Path, **overrides: str | None) -> dict[str, str]:
    """Environment for a server that touches nothing outside ``tmp`` (no ~/.jupyter either)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "WORKBENCH_"))}
    dirs = {
        "HOME": "home",
        "JUPYTER_CONFIG_DIR": "jupyter-config",
        "JUPYTER_DATA_DIR": "jupyter-data",
        "JUPYTER_RUNTIME_DIR": "jupyter-runtime",
        "JUPYTERLAB_SETTINGS_DIR": "lab-settings",
        "JUPYTERLAB_WORKSPACES_DIR": "lab-workspaces",
        "IPYTHONDIR": "ipython",
        "MPLCONFIGDIR": "matplotlib",
    }
    for name, sub in dirs.items():
        path = tmp / sub
        path.mkdir(parents=True, exist_ok=True)
        env[name] = str(path)
    # The server refuses a runtime folder other users can open (it holds the token).
    (tmp / "jupyter-runtime").chmod(0o700)
    env["PYTHONUNBUFFERED"] = "1"
    for name, value in overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def new_token() -> str:
    return secrets.token_urlsafe(32)


def http() -> requests.Session:
    session = requests.Session()
    session.trust_env = False  # never send loopback requests through a proxy from the environment
    return session


class LabServer:
    """A running server: ``url``, ``token``, ``log()``; ``stop()`` ends it (and its kernels)."""

    def __init__(self, argv: list[str], env: dict[str, str], port: int, token: str, log_path: Path,
                 cwd: Path | None = None):
        self.port = port
        self.token = token
        self.env = env
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        # A file, not a pipe: a full pipe would block the server. Closed in stop().
        self._log_file = open(log_path, "wb")  # noqa: SIM115
        # Own process group, so stop() reaches kernels and terminals too.
        self.process = subprocess.Popen(
            argv, env=env, stdout=self._log_file, stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd
        )

    def log(self) -> str:
        self._log_file.flush()
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> LabServer:
        deadline = time.monotonic() + timeout
        session = http()
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log()}")
            try:
                if session.get(f"{self.url}/api", timeout=2).status_code == 200:
                    return self
            except requests.ConnectionError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"server not ready after {timeout} s:\n{self.log()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self._log_file.close()


def start_lab(tmp: Path, notebook_dir: Path, extra_args: list[str] = (), *, cwd: Path | None = None,
              token: str | None = None, port: int | None = None, **env_overrides) -> LabServer:
    """`workbench lab` on a free loopback port with a known token; waits until it answers."""
    port = port or free_port()
    token = token or new_token()
    env = isolated_env(tmp, JUPYTER_TOKEN=token, **env_overrides)
    argv = [WORKBENCH, "lab", "--port", str(port), "--notebook-dir", str(notebook_dir)]
    if extra_args:
        argv += ["--", *extra_args]
    return LabServer(argv, env, port, token, tmp / "server.log", cwd=cwd).wait_ready()


# Modules a notebook (or another user) could plant in the notebook folder or the current folder:
# each would run inside the server (or as the kernel) if that folder were on sys.path. Each
# writes a marker file next to itself when imported; plant_modules() returns the markers.
PLANTED = {
    "jupyterlab.py": "replaces JupyterLab itself (python -m jupyterlab)",
    "jupyterhub/__init__.py": "replaces jupyterhub-singleuser (python -m jupyterhub.singleuser)",
    "notebook_shim/__init__.py": "a server extension imported after start-up",
    "workbench/__init__.py": "the workbench's own package (python -m workbench.server...)",
    "ipykernel_launcher.py": "replaces the kernel (python -m ipykernel_launcher in the notebook's folder)",
    "psutil.py": "imported by ipykernel when a kernel is interrupted or shut down",
    "tensorboard/__init__.py": "replaces TensorBoard (started in the server's folder on first use)",
}


def plant_modules(folder: Path) -> list[Path]:
    markers = []
    for name in PLANTED:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        marker = folder / f"PLANTED-{name.replace('/', '_')}-RAN"
        path.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
        markers.append(marker)
    return markers


def lab_argv(port: int, notebook_dir: Path, *extra: str) -> list[str]:
    """`workbench lab` on loopback ``port``; ``extra`` goes after ``--``."""
    argv = [WORKBENCH, "lab", "--port", str(port), "--notebook-dir", str(notebook_dir)]
    return argv + (["--", *extra] if extra else [])


def jupyter_argv(port: int, *extra: str) -> list[str]:
    """JupyterLab with the workbench configuration but without `workbench lab`'s allow-list:
    what a user with a terminal (or a script) can start, so the guard alone must hold."""
    argv = [sys.executable, "-P", "-m", "jupyterlab", f"--config={SERVER_CONFIG}", "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}"]
    if os.geteuid() == 0:
        argv.append("--allow-root")
    return argv + list(extra)


def websocket(url: str, headers: dict[str, str], send: str | None = None, expect: str = "") -> str:
    """Open a websocket; returns "refused: ..." or "ok" once ``expect`` was read back."""
    import asyncio

    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    async def talk() -> str:
        try:
            conn = await websocket_connect(HTTPRequest(url, headers=headers, connect_timeout=10))
        except Exception as exc:  # tornado raises HTTPClientError for the refused upgrade
            return f"refused: {exc!r}"
        if send is not None:
            conn.write_message(send)
        seen = ""
        for _ in range(50):
            message = await asyncio.wait_for(conn.read_message(), 10)
            seen += message or ""
            if expect in seen.split("echo", 1)[-1]:
                break
        conn.close()
        return "ok" if expect in seen.split("echo", 1)[-1] else f"no {expect!r} in {seen[-300:]!r}"

    return asyncio.run(talk())


def run_to_exit(argv: list[str], env: dict[str, str], timeout: float = START_TIMEOUT_S):
    """Run a server start that must fail; returns (exit code, output). Kills it if it serves."""
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the server started instead of refusing:\n{exc.stdout}\n{exc.stderr}") from exc
    return done.returncode, done.stdout + done.stderr
