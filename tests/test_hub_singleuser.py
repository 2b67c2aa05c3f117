"""Standalone or spawned by JupyterHub: workbench.server.hub_singleuser and the entrypoint's hub branch.

tests/test_hub.py runs the whole thing under a real hub; these are the decisions and the
refusals, each in well under a second (the entrypoint ones run bash and Python).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from traitlets.config import Config

from workbench.errors import LabConfigError
from workbench.server import hub_singleuser

REPO = Path(__file__).resolve().parents[1]
ENTRYPOINT = REPO / "docker" / "entrypoint.sh"
# The tree under test when it is not the installed one (a worktree run with PYTHONPATH).
PASS_PYTHONPATH = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
SERVER_CONFIG = REPO / "workbench" / "server" / "jupyter_config" / "jupyter_server_config.py"

# What a hub's spawner puts in the environment (jupyterhub Spawner.get_env), values made up.
HUB_ENV = {
    "JUPYTERHUB_API_TOKEN": "0123456789abcdef0123456789abcdef",
    "JUPYTERHUB_API_URL": "http://hub:8081/hub/api",
    "JUPYTERHUB_CLIENT_ID": "jupyterhub-user-alice",
    "JUPYTERHUB_OAUTH_CALLBACK_URL": "/user/alice/oauth_callback",
    "JUPYTERHUB_SERVICE_PREFIX": "/user/alice/",
    "JUPYTERHUB_SERVICE_URL": "http://0.0.0.0:8888/user/alice/",
    "JUPYTERHUB_USER": "alice",
    "JUPYTERHUB_BASE_URL": "/",
    "JUPYTERHUB_HOST": "",
}


def test_standalone_when_no_hub_variable_is_set():
    assert hub_singleuser.detect({"JUPYTER_TOKEN": "x" * 40, "JUPYTERHUB_SINGLEUSER_APP": ""}) is None


def test_spawned_when_the_hub_set_everything():
    hub = hub_singleuser.detect(HUB_ENV)
    assert hub == hub_singleuser.HubEnv(user="alice", service_prefix="/user/alice/",
                                        service_url="http://0.0.0.0:8888/user/alice/",
                                        api_url="http://hub:8081/hub/api")


def test_half_configured_is_refused_naming_what_is_missing():
    env = {k: v for k, v in HUB_ENV.items() if k not in ("JUPYTERHUB_CLIENT_ID", "JUPYTERHUB_SERVICE_URL")}
    with pytest.raises(LabConfigError) as info:
        hub_singleuser.detect(env)
    message = str(info.value)
    assert "JUPYTERHUB_CLIENT_ID, JUPYTERHUB_SERVICE_URL" in message
    assert "Fix:" in message and "unset" in message


@pytest.mark.parametrize("name", ["JUPYTER_TOKEN", "JUPYTER_TOKEN_FILE", "WORKBENCH_PASSWORD_HASH"])
def test_a_standalone_credential_under_the_hub_is_refused(name):
    with pytest.raises(LabConfigError, match=f"{name} is set too.*Fix: remove {name}"):
        hub_singleuser.detect({**HUB_ENV, name: "y" * 40})


def test_command_is_jupyterhub_singleuser_with_the_workbench_configuration(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    env = {**HUB_ENV, "WORKBENCH_SERVER_CONFIG": str(SERVER_CONFIG), "WORKBENCH_NOTEBOOK_DIR": "/workspace"}
    cmd = hub_singleuser.singleuser_command(["jupyterhub-singleuser", "--debug"], env, python="python3")
    assert cmd == ["python3", "-P", "-m", "jupyterhub.singleuser", f"--config={SERVER_CONFIG}",
                   "--ServerApp.root_dir=/workspace", "--debug"]
    # The hub's Spawner.notebook_dir (JUPYTERHUB_ROOT_DIR) wins over the workspace default.
    cmd = hub_singleuser.singleuser_command([], {**env, "JUPYTERHUB_ROOT_DIR": "/home/alice"}, python="python3")
    assert not any(a.startswith("--ServerApp.root_dir") for a in cmd)


def test_root_needs_the_explicit_allow(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert "--allow-root" not in hub_singleuser.singleuser_command([], HUB_ENV)
    assert "--allow-root" in hub_singleuser.singleuser_command([], {**HUB_ENV, "WORKBENCH_ALLOW_ROOT": "1"})


def test_a_program_instead_of_server_options_is_refused():
    with pytest.raises(LabConfigError, match="unexpected arguments.*bash"):
        hub_singleuser.singleuser_command(["bash"], HUB_ENV)


def test_configure_changes_nothing_standalone_and_swaps_the_guard_under_the_hub():
    c = Config()
    assert hub_singleuser.configure(c, {}) is None
    assert "jpserver_extensions" not in c.ServerApp
    c.ServerApp.jpserver_extensions = {"workbench.server.guard": True, "workbench.server.tensorboard": True,
                                       "jupyter_server_proxy": False}
    assert hub_singleuser.configure(c, HUB_ENV).user == "alice"
    # The guard is swapped; what the configuration set besides stays (TensorBoard on, the open proxy off).
    assert c.ServerApp.jpserver_extensions == {"workbench.server.guard": False, "workbench.server.hub_singleuser": True,
                                               "workbench.server.tensorboard": True, "jupyter_server_proxy": False}
    assert c.IdentityProvider.token == ""


SAFE = {"token": "0123456789abcdef0123456789abcdef", "hashed_password": "", "auth_enabled": True,
        "disable_check_xsrf": False, "xsrf_cookies": False, "allow_origin": "", "allow_origin_pat": "",
        "allow_remote_access": True, "nbconvert_csp_sandbox": True, "euid": 1000,
        "identity_provider": "JupyterHubIdentityProvider"}


def test_the_settings_jupyterhub_singleuser_makes_are_accepted():
    # allow_remote_access=True and xsrf_cookies=False are what the hub's extension sets.
    hub_singleuser.check_settings(SAFE)


@pytest.mark.parametrize(("change", "words"), [
    ({"identity_provider": "IdentityProvider"}, "not with the hub's identity provider"),
    ({"identity_provider": "LegacyIdentityProvider"}, "jupyter labhub"),
    ({"disable_check_xsrf": True}, "XSRF protection is disabled"),
    ({"allow_origin": "*"}, "allow_origin='\\*'"),
    ({"allow_origin_pat": ".*"}, "allow_origin_pat"),
    ({"nbconvert_csp_sandbox": False}, "nbconvert_csp_sandbox"),
    ({"euid": 0}, "root"),
])
def test_the_rest_of_the_floor_still_applies(change, words, monkeypatch):
    monkeypatch.delenv("WORKBENCH_ALLOW_ROOT", raising=False)
    with pytest.raises(LabConfigError, match=words):
        hub_singleuser.check_settings({**SAFE, **change})


# --- the entrypoint's hub branch and `python -m workbench.server.hub_singleuser` --------------------
def run_entrypoint(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    shipped = tmp_path / "shipped"
    shipped.mkdir(exist_ok=True)
    (shipped / "01_quickstart.ipynb").write_text("shipped 01")
    base = {"PATH": os.environ["PATH"], "WORKBENCH_PYTHON": sys.executable, **PASS_PYTHONPATH,
            "WORKBENCH_NOTEBOOK_DIR": str(tmp_path / "workspace"), "WORKBENCH_NOTEBOOKS_SOURCE": str(shipped),
            "WORKBENCH_SERVER_CONFIG": str(SERVER_CONFIG)}
    return subprocess.run(["bash", str(ENTRYPOINT), *args], env={**base, **env}, capture_output=True, text=True,
                          timeout=60)


def test_entrypoint_seeds_the_workspace_and_runs_the_hub_server(tmp_path):
    done = run_entrypoint(tmp_path, **HUB_ENV, WORKBENCH_DRY_RUN="1")
    assert done.returncode == 0, done.stderr
    assert f"running: {sys.executable} -P -m workbench.server.hub_singleuser" in done.stderr
    assert (tmp_path / "workspace" / "notebooks" / "01_quickstart.ipynb").read_text() == "shipped 01"
    assert "jupyterlab" not in done.stderr  # not the standalone server


def test_entrypoint_accepts_kubespawners_default_command(tmp_path):
    done = run_entrypoint(tmp_path, "jupyterhub-singleuser", "--debug", **HUB_ENV, WORKBENCH_DRY_RUN="1")
    assert done.returncode == 0, done.stderr
    assert "-P -m workbench.server.hub_singleuser jupyterhub-singleuser --debug" in done.stderr


def test_entrypoint_still_runs_other_commands_under_the_hub(tmp_path):
    done = run_entrypoint(tmp_path, "echo", "hello", **HUB_ENV)
    assert done.returncode == 0 and done.stdout == "hello\n"


def test_entrypoint_refuses_a_half_configured_hub_with_the_fix(tmp_path):
    env = {k: v for k, v in HUB_ENV.items() if k != "JUPYTERHUB_API_TOKEN"}
    done = run_entrypoint(tmp_path, **env)  # no dry run: the module really checks and refuses
    assert done.returncode == 2
    assert "refuses to start" in done.stderr and "JUPYTERHUB_API_TOKEN" in done.stderr and "Fix:" in done.stderr


def test_module_prints_and_would_exec_jupyterhub_singleuser(tmp_path):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "WORKBENCH_"))},
           **HUB_ENV, "WORKBENCH_DRY_RUN": "1", "WORKBENCH_NOTEBOOK_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "workbench.server.hub_singleuser", "jupyterhub-singleuser"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"-P -m jupyterhub.singleuser --config={SERVER_CONFIG} --ServerApp.root_dir={tmp_path}" in done.stderr


@pytest.mark.parametrize("options", [
    ["--ServerApp.allow_origin=http://evil.example", "--ServerApp.allow_credentials=True"],
    ["--config=/tmp/other.py"],
    ["jupyterhub-singleuser", "--ServerApp.disable_check_xsrf=True"],
])
def test_entrypoint_under_the_hub_checks_options_against_the_allow_list(tmp_path, options):
    """Hub variables do not open a way around the allow-list (the module really runs: no dry run)."""
    done = run_entrypoint(tmp_path, *options, **HUB_ENV, WORKBENCH_SERVER_CONFIG=str(SERVER_CONFIG))
    assert done.returncode == 2, done.stderr
    assert "is not among the JupyterLab options" in done.stderr and "running: " not in done.stderr.split(
        "hub_singleuser")[-1]


def test_module_refuses_a_missing_configuration(tmp_path):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "WORKBENCH_"))},
           **HUB_ENV, "WORKBENCH_SERVER_CONFIG": str(tmp_path / "missing.py")}
    done = subprocess.run([sys.executable, "-m", "workbench.server.hub_singleuser"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "is not a file" in done.stderr, done.stderr


def test_module_refuses_to_run_without_a_hub(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTERHUB_")}
    done = subprocess.run([sys.executable, "-m", "workbench.server.hub_singleuser"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "workbench lab" in done.stderr


# --- a real single-user server against a stand-in hub API ------------------------------------
# jupyterhub-singleuser asks the hub who a token belongs to (GET {api}/user) and reports
# activity; this stand-in answers those for one user and one token, so the origin rule is
# tested on the real server without a hub, a proxy or a login. (tests/test_hub.py runs a hub.)

USER_TOKEN = "5d1c0f4e9a8b7c6d5e4f3a2b1c0d9e8f"  # what the hub would have issued to alice
SCOPES = ["access:servers!server=alice/", "access:servers!user=alice"]


def _stand_in_hub(port: int):
    """A tornado app on 127.0.0.1:port in a thread of its own; returns a function that stops it."""
    import asyncio
    import json
    import threading

    import jupyterhub
    from tornado import web

    class Api(web.RequestHandler):
        def prepare(self):
            self.set_header("X-JupyterHub-Version", jupyterhub.__version__)

        def get(self, path):
            if path.rstrip("/") == "user":
                if self.request.headers.get("Authorization") != f"token {USER_TOKEN}":
                    raise web.HTTPError(403)
                self.write(json.dumps({"kind": "user", "name": "alice", "admin": False, "groups": [],
                                       "scopes": SCOPES, "session_id": ""}))
            else:
                self.write("{}")

        def post(self, path):  # activity reports
            self.write("{}")

    started = threading.Event()
    state = {}

    def serve():
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        server = web.Application([(r"/hub/api/?(.*)", Api)]).listen(port, "127.0.0.1")
        state.update(loop=loop, server=server)
        started.set()
        loop.run_forever()

    threading.Thread(target=serve, daemon=True).start()
    started.wait(10)

    def stop():
        state["loop"].call_soon_threadsafe(state["server"].stop)
        state["loop"].call_soon_threadsafe(state["loop"].stop)

    return stop


@pytest.fixture(scope="module")
def hub_server(tmp_path_factory):
    from lab_helpers import LabServer, free_port, isolated_env, plant_modules

    tmp = tmp_path_factory.mktemp("hub")
    home = tmp / "alice"
    home.mkdir()
    markers = plant_modules(home)  # the notebook folder is also the server's current folder
    hub_port, port = free_port(), free_port()
    stop_hub = _stand_in_hub(hub_port)
    env = isolated_env(tmp, **{
        **HUB_ENV, **PASS_PYTHONPATH,
        "JUPYTERHUB_API_TOKEN": "0123456789abcdef0123456789abcdef",
        "JUPYTERHUB_API_URL": f"http://127.0.0.1:{hub_port}/hub/api",
        "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}/user/alice/",
        "JUPYTERHUB_OAUTH_ACCESS_SCOPES": json.dumps(SCOPES), "JUPYTERHUB_OAUTH_SCOPES": json.dumps(SCOPES),
        "JUPYTERHUB_ACTIVITY_URL": f"http://127.0.0.1:{hub_port}/hub/api/users/alice/activity",
        "WORKBENCH_SERVER_CONFIG": str(SERVER_CONFIG), "WORKBENCH_NOTEBOOK_DIR": str(home),
        "WORKBENCH_ALLOW_ROOT": "1" if os.geteuid() == 0 else None,
    })
    env["WORKBENCH_PYTHON"] = sys.executable
    # Through the image's entry point, as a spawner starts it (its hub branch).
    server = LabServer(["bash", str(ENTRYPOINT)], env, port, USER_TOKEN, tmp / "server.log", cwd=home)
    server.url = f"http://127.0.0.1:{port}/user/alice"
    try:
        server.wait_ready()
        server.markers = markers
        yield server
    finally:
        server.stop()
        stop_hub()


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://127.0.0.1:1"])
def test_hub_mode_refuses_the_token_from_another_site(hub_server, origin):
    from lab_helpers import http

    headers = {"Authorization": f"token {USER_TOKEN}", "Origin": origin}
    for method in ("GET", "POST"):
        response = http().request(method, f"{hub_server.url}/api/contents", headers=headers, json={"type": "file"})
        assert response.status_code == 403, (method, response.status_code, response.text[:300])
        assert response.headers.get("Access-Control-Allow-Origin") is None


def test_hub_mode_serves_tensorboard_and_keeps_the_open_proxy_closed(hub_server):
    """The configuration's extensions survive the swap to the hub's guard: TensorBoard is served
    at /user/<name>/tensorboard/, and /proxy/<port> (a tunnel to any local port) is not."""
    from lab_helpers import http
    from process_tree import check_process_tree

    auth = {"Authorization": f"token {USER_TOKEN}"}
    board = http().get(f"{hub_server.url}/tensorboard/", headers=auth, timeout=150)
    assert board.status_code == 200 and b"TensorBoard" in board.content, board.text[:300]
    for path in (f"/proxy/{hub_server.port}/api/contents", f"/proxy/absolute/{hub_server.port}/api/contents",
                 f"/proxy/127.0.0.1:{hub_server.port}/api/contents"):
        assert http().get(f"{hub_server.url}{path}", headers=auth).status_code == 404, path
    # Every process of the hub-mode server is one server/processes.py lists (tests/test_processes.py
    # does the same for `workbench lab` and the entry point).
    kinds = {seen.kind for seen in check_process_tree(hub_server.process.pid, USER_TOKEN)}
    assert "TensorBoard" in kinds, kinds


def test_hub_mode_serves_the_token_from_its_own_origin(hub_server):
    from lab_helpers import http

    own = f"http://127.0.0.1:{hub_server.port}"
    auth = {"Authorization": f"token {USER_TOKEN}"}
    assert http().get(f"{hub_server.url}/api/contents", headers=auth).status_code == 200
    assert http().get(f"{hub_server.url}/api/contents", headers={**auth, "Origin": own}).status_code == 200
    assert http().get(f"{hub_server.url}/api/contents",
                      headers={"Authorization": "token " + "f" * 32}).status_code in (302, 403)
    assert "JupyterHub single-user mode" in hub_server.log()
    assert [m.name for m in hub_server.markers if m.exists()] == [], "planted code ran in the hub server"
