"""The real Jupyter server with the project's configuration: who gets in, and what refuses to start.

One server (started with the real `workbench lab`) serves the access tests; each
misconfiguration is a separate start that must exit non-zero with its reason.
Runs as root here (CI too), so `workbench lab` sets the explicit root allow itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from lab_helpers import (
    REPO,
    SERVER_CONFIG,
    LabServer,
    free_port,
    http,
    isolated_env,
    lab_argv,
    new_token,
    plant_modules,
    start_lab,
    websocket,
)

HEALTHCHECK = REPO / "docker" / "healthcheck.py"
ENTRYPOINT = REPO / "docker" / "entrypoint.sh"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lab")
    notebooks = tmp / "workspace"
    notebooks.mkdir()
    (notebooks / "hello.txt").write_text("hello\n")
    server = start_lab(tmp, notebooks, WORKBENCH_CULL_IDLE_S="1234")
    yield server
    server.stop()


def auth(server: LabServer, token: str | None = None) -> dict[str, str]:
    return {"Authorization": f"token {server.token if token is None else token}"}


# --- who gets in ----------------------------------------------------------------------


def test_contents_api_needs_the_token(lab):
    session = http()
    assert session.get(f"{lab.url}/api/contents").status_code == 403
    assert session.get(f"{lab.url}/api/contents", headers=auth(lab, "x" * 43)).status_code == 403
    assert session.get(f"{lab.url}/api/contents?token={'y' * 43}").status_code == 403
    right = session.get(f"{lab.url}/api/contents", headers=auth(lab))
    assert right.status_code == 200
    assert "hello.txt" in {item["name"] for item in right.json()["content"]}


def test_lab_page_without_token_redirects_to_login(lab):
    response = http().get(f"{lab.url}/lab", allow_redirects=False)
    assert response.status_code == 302
    assert "/login" in response.headers["Location"]


def test_kernels_and_terminals_need_the_token(lab):
    session = http()
    assert session.post(f"{lab.url}/api/kernels", json={"name": "python3"}).status_code == 403
    assert session.post(f"{lab.url}/api/terminals").status_code == 403
    assert session.get(f"{lab.url}/api/kernels").status_code == 403
    # With the token both work (so the 403s above are about the token, not a broken server).
    terminal = session.post(f"{lab.url}/api/terminals", headers=auth(lab))
    assert terminal.status_code == 200, terminal.text
    assert session.delete(
        f"{lab.url}/api/terminals/{terminal.json()['name']}", headers=auth(lab)
    ).status_code == 204
    kernel = session.post(f"{lab.url}/api/kernels", json={"name": "python3"}, headers=auth(lab))
    assert kernel.status_code == 201, kernel.text
    assert session.delete(f"{lab.url}/api/kernels/{kernel.json()['id']}", headers=auth(lab)).status_code == 204


def test_open_terminal_and_kernel_sockets_need_the_token(lab):
    session = http()
    name = session.post(f"{lab.url}/api/terminals", headers=auth(lab)).json()["name"]
    kernel_id = session.post(f"{lab.url}/api/kernels", json={"name": "python3"}, headers=auth(lab)).json()["id"]
    ws = f"ws://127.0.0.1:{lab.port}"
    try:
        assert websocket(f"{ws}/terminals/websocket/{name}", {}).startswith("refused: HTTP 403")
        assert websocket(f"{ws}/api/kernels/{kernel_id}/channels", {}).startswith("refused: HTTP 403")
        # The same terminal with the token: a shell that runs what is typed.
        typed = '["stdin", "echo term-$((6*7))\\r"]'
        assert websocket(f"{ws}/terminals/websocket/{name}", auth(lab), typed, "term-42") == "ok"
    finally:
        session.delete(f"{lab.url}/api/terminals/{name}", headers=auth(lab))
        session.delete(f"{lab.url}/api/kernels/{kernel_id}", headers=auth(lab))


def test_cookie_session_post_needs_the_xsrf_token(lab):
    """Token-authenticated API calls skip XSRF (jupyter_server's rule); a browser session does not."""
    session = http()
    login = session.get(f"{lab.url}/lab?token={lab.token}")
    assert login.status_code == 200
    assert "_xsrf" in session.cookies, "the lab page sets the _xsrf cookie"
    assert session.get(f"{lab.url}/api/contents").status_code == 200, "the login cookie authenticates"

    no_xsrf = session.post(f"{lab.url}/api/contents", json={"type": "file", "ext": ".txt"})
    assert no_xsrf.status_code == 403
    assert "xsrf" in no_xsrf.text.lower()

    with_xsrf = session.post(
        f"{lab.url}/api/contents",
        json={"type": "file", "ext": ".txt"},
        headers={"X-XSRFToken": session.cookies["_xsrf"]},
    )
    assert with_xsrf.status_code == 201, with_xsrf.text


def test_foreign_host_header_is_refused(lab):
    session = http()
    evil = session.get(f"{lab.url}/api/contents", headers={**auth(lab), "Host": "evil.example.com"})
    assert evil.status_code == 403
    rebinding = session.get(f"{lab.url}/api/contents", headers={**auth(lab), "Host": f"10.1.2.3:{lab.port}"})
    assert rebinding.status_code == 403
    local = session.get(f"{lab.url}/api/contents", headers={**auth(lab), "Host": f"localhost:{lab.port}"})
    assert local.status_code == 200


def test_no_cross_origin_access(lab):
    response = http().get(
        f"{lab.url}/api/contents", headers={"Origin": "https://evil.example.com"}
    )
    assert response.status_code == 403
    assert "Access-Control-Allow-Origin" not in response.headers


def test_healthcheck_script(lab):
    env = {**os.environ, "WORKBENCH_PORT": str(lab.port)}
    ok = subprocess.run([sys.executable, str(HEALTHCHECK)], env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout
    assert "healthy: jupyter_server 2." in ok.stdout
    env["WORKBENCH_PORT"] = str(free_port())  # nothing listens there
    down = subprocess.run([sys.executable, str(HEALTHCHECK)], env=env, capture_output=True, text=True)
    assert down.returncode == 1
    assert "unhealthy" in down.stdout


def test_idle_kernels_are_culled_after_the_configured_time(lab):
    session = http()
    kernel = session.post(f"{lab.url}/api/kernels", json={"name": "python3"}, headers=auth(lab))
    assert kernel.status_code == 201, kernel.text
    try:
        # The culler starts with the first kernel and logs its settings (from WORKBENCH_CULL_IDLE_S).
        assert "Culling kernels with idle durations > 1234 seconds" in lab.log()
    finally:
        session.delete(f"{lab.url}/api/kernels/{kernel.json()['id']}", headers=auth(lab))


# --- what refuses to start: tests/test_lab_misconfig.py; the attacker's probes: test_lab_probes.py


def _start_args(port: int, notebook_dir: Path, *extra: str) -> list[str]:
    return lab_argv(port, notebook_dir, *extra)


def test_token_file_and_generated_token(tmp_path):
    """A 0600 token file is accepted; without any credentials a token is generated and printed once."""
    token = new_token()
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    port_a, port_b = free_port(), free_port()
    env_a = isolated_env(tmp_path / "a", JUPYTER_TOKEN=None, JUPYTER_TOKEN_FILE=str(token_file))
    env_b = isolated_env(tmp_path / "b", JUPYTER_TOKEN=None)
    # Both start at once: half the waiting.
    from_file = LabServer(_start_args(port_a, tmp_path), env_a, port_a, token, tmp_path / "a.log")
    generated = LabServer(_start_args(port_b, tmp_path), env_b, port_b, "", tmp_path / "b.log")
    try:
        from_file.wait_ready()
        headers = {"Authorization": f"token {token}"}
        assert http().get(f"{from_file.url}/api/contents", headers=headers).status_code == 200

        generated.wait_ready()
        # Printed once, by the workbench; Jupyter's own URL line has it redacted.
        lines = [ln for ln in generated.log().splitlines() if "/lab?token=" in ln and "[secret]" not in ln]
        assert len(lines) == 1, generated.log()
        new = lines[0].split("token=", 1)[1].strip()
        assert len(new) >= 32
        headers = {"Authorization": f"token {new}"}
        assert http().get(f"{generated.url}/api/contents", headers=headers).status_code == 200
        assert http().get(f"{generated.url}/api/contents").status_code == 403
    finally:
        from_file.stop()
        generated.stop()


# --- the image's start script, outside the image --------------------------------------


def test_entrypoint_starts_the_server(tmp_path):
    """docker/entrypoint.sh as the image runs it (real exec), on loopback, then the health check."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "01_demo.ipynb").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4,
                                                        "nbformat_minor": 5}))
    port = free_port()
    token = new_token()
    env = isolated_env(
        tmp_path, JUPYTER_TOKEN=token, WORKBENCH_PORT=str(port), WORKBENCH_IP="127.0.0.1",
        WORKBENCH_NOTEBOOK_DIR=str(workspace), WORKBENCH_NOTEBOOKS_SOURCE=str(shipped),
        WORKBENCH_SERVER_CONFIG=str(SERVER_CONFIG), WORKBENCH_PYTHON=sys.executable,
        WORKBENCH_ALLOW_ROOT="1" if os.geteuid() == 0 else None,
        JUPYTER_RUNTIME_DIR=str(tmp_path / "run" / "jupyter"),
    )
    # Modules a notebook could plant in /workspace (the image's WORKDIR): none may run.
    markers = plant_modules(workspace)
    (tmp_path / "jupyter-config" / "jupyter_config.py").write_text(f"open({str(tmp_path / 'CFG-RAN')!r}, 'w')\n")
    server = LabServer(["bash", str(ENTRYPOINT)], env, port, token, tmp_path / "entry.log", cwd=workspace)
    try:
        server.wait_ready()
        assert (tmp_path / "run" / "jupyter").is_dir()
        # The server (the entry point, exec'd) got the token through a pipe, not its environment.
        environ = Path(f"/proc/{server.process.pid}/environ").read_bytes()
        assert token.encode() not in environ and b"WORKBENCH_TOKEN_FD=" in environ
        assert [m.name for m in markers + [tmp_path / "CFG-RAN"] if m.exists()] == []
        listing = http().get(f"{server.url}/api/contents/notebooks", headers={"Authorization": f"token {token}"})
        assert listing.status_code == 200
        assert [item["name"] for item in listing.json()["content"]] == ["01_demo.ipynb"]
        health = subprocess.run([sys.executable, str(HEALTHCHECK)], env={**os.environ, "WORKBENCH_PORT": str(port)},
                                capture_output=True, text=True)
        assert health.returncode == 0, health.stdout
    finally:
        server.stop()
