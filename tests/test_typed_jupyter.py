"""A `jupyter lab` typed in the image's terminal runs no user config file (security round 4, item 7).

Two real servers and two real refusals, outside the image (tests/image/ repeats them inside):

* the image's ``jupyter-lab`` (docker/jupyter-start.sh, installed over pip's console script):
  with a backdoor in the user's config folder -- a ``jupyter_config.py`` that deletes itself
  (so the guard's check of config files finds nothing) and makes every request authenticated
  (a jupyter_server attribute the guard's integrity check does not cover) -- the server it
  starts never runs that file: no marker, and 403 without the token;
* /etc/jupyter/jupyter_config.py (workbench/server/jupyter_config/jupyter_config.py), modelled
  by a config folder that is read before the user's as /etc/jupyter is: a ``python -P -m
  jupyterlab`` typed by hand with a planted config file stops before that file runs, and
  without one it serves, guarded.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from lab_helpers import REPO, LabServer, free_port, http, isolated_env, new_token, run_to_exit

JUPYTER_START = REPO / "docker" / "jupyter-start.sh"
WORKBENCH_CONFIGS = REPO / "workbench" / "server" / "jupyter_config"

# The backdoor of the issue: it runs, hides, and lets anyone in.
BACKDOOR = """
import os
open({marker!r}, "w").write("ran")
os.remove(__file__)
from jupyter_server.auth.identity import User
from jupyter_server.base import handlers

_real = handlers.JupyterHandler.identity_provider


class _Open:
    def __init__(self, provider):
        self._provider = provider

    def __getattr__(self, name):
        return getattr(self._provider, name)

    def get_user(self, handler):
        return User("intruder")


handlers.JupyterHandler.identity_provider = property(lambda self: _Open(_real.fget(self)))
"""


def plant_backdoor(folder: Path, marker: Path, name: str = "jupyter_config.py") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(BACKDOOR.format(marker=str(marker)))
    return folder / name


def image_bin(tmp: Path) -> Path:
    """A scripts folder laid out as the image's: jupyter-lab is docker/jupyter-start.sh."""
    bindir = tmp / "bin"
    bindir.mkdir()
    shutil.copy(JUPYTER_START, bindir / "jupyter-lab")
    (bindir / "workbench").symlink_to(Path(sys.executable).with_name("workbench"))
    (bindir / "python3").symlink_to(sys.executable)
    return bindir


def test_typed_jupyter_lab_runs_no_user_config_file(tmp_path):
    bindir = image_bin(tmp_path)
    marker = tmp_path / "BACKDOOR-RAN"
    port, token = free_port(), new_token()
    env = isolated_env(tmp_path, JUPYTER_TOKEN=token)
    plant_backdoor(Path(env["JUPYTER_CONFIG_DIR"]), marker)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    argv = [str(bindir / "jupyter-lab"), f"--port={port}", "--no-browser"]
    server = LabServer(argv, env, port, token, tmp_path / "server.log", cwd=workspace).wait_ready()
    try:
        assert not marker.exists(), "the user's config file ran in the server"
        assert http().get(f"{server.url}/api/contents").status_code == 403
        assert http().post(f"{server.url}/api/kernels", json={"name": "python3"}).status_code == 403
        assert http().get(f"{server.url}/api/contents", headers={"Authorization": f"token {token}"}).status_code == 200
        assert "workbench lab:" in server.log(), "it started through `workbench lab`"
    finally:
        server.stop()


@pytest.fixture
def system_config(tmp_path) -> dict[str, str]:
    """The environment of a server whose config path reads a copy of /etc/jupyter's workbench files
    before the user's folder (JUPYTER_CONFIG_PATH=user:system loads system first, as jupyter_core
    loads /etc/jupyter before ~/.jupyter)."""
    system, user = tmp_path / "etc-jupyter", tmp_path / "user-config"
    system.mkdir()
    user.mkdir()
    for name in ("jupyter_config.py", "jupyter_server_config.py"):
        shutil.copy(WORKBENCH_CONFIGS / name, system / name)
    return isolated_env(tmp_path, JUPYTER_TOKEN=new_token(), JUPYTER_CONFIG_PATH=f"{user}{os.pathsep}{system}",
                        WORKBENCH_ALLOW_ROOT="1" if os.geteuid() == 0 else None)


def typed(port: int, *extra: str) -> list[str]:
    """`python3 -P -m jupyterlab` as typed in the image's terminal (the config comes from /etc/jupyter)."""
    return [sys.executable, "-P", "-m", "jupyterlab", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
            "--no-browser", *(["--allow-root"] if os.geteuid() == 0 else []), *extra]


@pytest.mark.parametrize("where", ["user_folder", "config_option"])
def test_the_image_config_stops_a_server_before_a_planted_config_file_runs(tmp_path, system_config, where):
    marker = tmp_path / "BACKDOOR-RAN"
    if where == "user_folder":
        planted = plant_backdoor(Path(system_config["JUPYTER_CONFIG_PATH"].split(os.pathsep)[0]), marker)
        argv = typed(free_port())
    else:
        planted = plant_backdoor(tmp_path / "elsewhere", marker, "evil_config.py")
        argv = typed(free_port(), f"--config={planted}")
    code, output = run_to_exit(argv, system_config)
    assert code != 0 and not marker.exists(), output[-2000:]
    assert f"would run the Python config file {planted}" in output and "Fix:" in output, output[-2000:]


def test_the_image_config_lets_a_clean_typed_start_serve_guarded(tmp_path, system_config):
    port = free_port()
    token = system_config["JUPYTER_TOKEN"]
    server = LabServer(typed(port), system_config, port, token, tmp_path / "server.log",
                       cwd=tmp_path).wait_ready()
    try:
        assert "workbench.server.guard | extension was successfully loaded" in server.log()
        assert http().get(f"{server.url}/api/contents").status_code == 403
    finally:
        server.stop()


def test_workbench_lab_looks_at_the_config_folders_before_it_starts_the_server(tmp_path):
    """`workbench lab` and hub mode check every folder the server will read (with the server's
    environment) before starting it: here a folder from JUPYTER_CONFIG_DIR, as ~/.local/etc/jupyter
    or the environment's etc/jupyter would be."""
    from workbench.errors import LabConfigError
    from workbench.server import lab

    folder = tmp_path / "config"
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(folder)}
    env.pop("JUPYTER_CONFIG_PATH", None)
    folder.mkdir()
    (folder / "jupyter_server_config.json").write_text("{}")  # JSON only sets traits: fine
    shutil.copy(WORKBENCH_CONFIGS / "jupyter_config.py", folder / "jupyter_config.py")  # a copy of ours: fine
    lab.check_config_path(env)
    plant_backdoor(folder, tmp_path / "RAN", "jupyter_lab_config.py")
    with pytest.raises(LabConfigError, match=r"jupyter_lab_config\.py.*Fix: remove or rename"):
        lab.check_config_path(env)
    assert not (tmp_path / "RAN").exists()
