"""An attacker's probes against one real `workbench lab` server: each must be refused.

One server (module scope, started through the real CLI at DEBUG log level so that every
log line is produced) answers every probe; each probe is one test case asserting the
exact status. Then what the server leaves behind: no token in its log, none in a
kernel's or a terminal's environment, SameSite=Strict cookies, no world-readable files.
"""

from __future__ import annotations

import http.client as httpclient
import json
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from urllib.parse import quote, unquote, urljoin, urlsplit

import pytest
from lab_helpers import LabServer, http, new_token, plant_modules, start_lab, websocket

WRONG = "W" * 43  # a well-formed token that is not the server's
SECRET_CONTENT = "TOP-SECRET-CONTENT\n"
HOSTILE_USER_CONFIG = {
    "ServerApp": {
        "jpserver_extensions": {"workbench.server.guard": False},
        "allow_origin": "*", "allow_remote_access": True, "disable_check_xsrf": True,
        "allow_unauthenticated_access": True, "open_browser": True,
        "identity_provider_class": "jupyter_server.auth.identity.PasswordIdentityProvider",
    },
    "IdentityProvider": {"token": "", "cookie_options": {"samesite": "None"}},
    "PasswordIdentityProvider": {"allow_password_change": True},
}


PATCHING_CONFIG = """
open({marker!r}, "w").write("ran")
from workbench.server import floor, identity
floor.check_settings = lambda settings: None
identity.WorkbenchIdentityProvider.get_user = lambda self, handler: {{"username": "anyone"}}
c.ServerApp.disable_check_xsrf = True
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("probes")
    root = tmp / "workspace"
    root.mkdir()
    (root / "hello.txt").write_text("hello\n")
    # CVE-2026-35397: a sibling folder whose name starts with the root's name.
    (tmp / "workspace-secret").mkdir()
    (tmp / "workspace-secret" / "key.txt").write_text(SECRET_CONTENT)
    # A hostile user config folder: every setting here is one the workbench configuration
    # sets itself, so it must have no effect (the --config file is loaded last, and the
    # guard is re-enabled). The probes below run against this server.
    (tmp / "jupyter-config").mkdir()
    (tmp / "jupyter-config" / "jupyter_config.json").write_text(json.dumps(HOSTILE_USER_CONFIG))
    # Config files are Python: these would switch the checks off from inside the server.
    # `workbench lab` must not run them at all (its server has a config folder of its own).
    (tmp / "jupyter-config" / "jupyter_config.py").write_text(PATCHING_CONFIG.format(marker=tmp / "CONFIG-PY-RAN"))
    (tmp / "config-path").mkdir()
    (tmp / "config-path" / "jupyter_lab_config.py").write_text(PATCHING_CONFIG.format(marker=tmp / "CONFIG-PATH-RAN"))
    # Modules planted in the notebook folder, which is also the current folder of `workbench lab`.
    markers = plant_modules(root)
    (root / "wb_helper_mod.py").write_text("VALUE = 42\n")  # a notebook's own helper module
    server = start_lab(tmp, root, ["--ServerApp.log_level=DEBUG"], cwd=root,
                       JUPYTER_CONFIG_PATH=str(tmp / "config-path"))
    server.root = root
    server.markers = markers + [tmp / "CONFIG-PY-RAN", tmp / "CONFIG-PATH-RAN"]
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser_session(lab):
    """A logged-in browser session: the login cookie and the _xsrf cookie, as JupyterLab has them."""
    session = http()
    assert session.get(f"{lab.url}/lab?token={lab.token}").status_code == 200
    assert "_xsrf" in session.cookies
    return session


@dataclass
class Probe:
    method: str
    path: str  # "{T}" is the right token, "{port}" the server's port
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: str | None = None
    cookie_session: bool = False  # send the logged-in browser session's cookies
    redirect: str | None = None  # a redirect must stay on this server; "/login": go there

    def fill(self, text: str, lab: LabServer) -> str:
        return text.replace("{T}", lab.token).replace("{port}", str(lab.port))


def _swapcase_first_letter(token: str) -> str:
    index = next(i for i, ch in enumerate(token) if ch.isalpha())
    return token[:index] + token[index].swapcase() + token[index + 1:]


EVIL = "http://evil.example"
PROBES: dict[str, Probe] = {
    # --- credentials ---------------------------------------------------------------------
    "no_token": Probe("GET", "/api/contents", 403),
    "wrong_token_header": Probe("GET", "/api/contents", 403, {"Authorization": f"token {WRONG}"}),
    "wrong_token_query": Probe("GET", f"/api/contents?token={WRONG}", 403),
    "empty_token_query": Probe("GET", "/api/contents?token=", 403),
    "prefix_of_token": Probe("GET", "/api/contents", 403, {"Authorization": "token {T[:-1]}"}),
    "token_plus_one_char": Probe("GET", "/api/contents?token={T}x", 403),
    "case_changed_token": Probe("GET", "/api/contents", 403, {"Authorization": "token {T.swap}"}),
    "token_as_basic_auth": Probe("GET", "/api/contents", 403, {"Authorization": "Basic {T}"}),
    "kernels_list_no_token": Probe("GET", "/api/kernels", 403),
    "kernel_start_no_token": Probe("POST", "/api/kernels", 403, body='{"name": "python3"}'),
    "terminal_start_no_token": Probe("POST", "/api/terminals", 403),
    "sessions_no_token": Probe("GET", "/api/sessions", 403),
    "me_no_token": Probe("GET", "/api/me", 403),
    "status_no_token": Probe("GET", "/api/status", 403),
    "lab_page_no_token": Probe("GET", "/lab", 302, redirect="/login"),
    "files_no_token": Probe("GET", "/files/hello.txt", 302, redirect="/login"),
    "forged_plain_cookie": Probe("GET", "/api/contents", 403,
                                 {"Cookie": "username-127-0-0-1-{port}=" + quote(json.dumps({"username": "a"}))}),
    "forged_signed_cookie": Probe("GET", "/api/contents", 403,
                                  {"Cookie": "username-127-0-0-1-{port}=2|1:0|10:1700000000|4:name|8:YWRtaW4=|"
                                             + "0" * 64}),
    # --- a browser session without the XSRF token -------------------------------------------
    "cookie_post_without_xsrf": Probe("POST", "/api/contents", 403, body='{"type": "file"}', cookie_session=True),
    "cookie_post_wrong_xsrf": Probe("POST", "/api/contents", 403, {"X-XSRFToken": "2|00|00|00"},
                                    body='{"type": "file"}', cookie_session=True),
    "cookie_delete_without_xsrf": Probe("DELETE", "/api/contents/hello.txt", 403, cookie_session=True),
    # --- the Host check (DNS rebinding) -------------------------------------------------------
    "host_evil": Probe("GET", "/api/contents?token={T}", 403, {"Host": "evil.example"}),
    "host_localhost_suffix": Probe("GET", "/api/contents?token={T}", 403, {"Host": "localhost.evil.example"}),
    "host_loopback_suffix": Probe("GET", "/api/contents?token={T}", 403, {"Host": "127.0.0.1.nip.io:{port}"}),
    "host_private_ip": Probe("GET", "/api/contents?token={T}", 403, {"Host": "10.1.2.3:{port}"}),
    "host_mapped_ipv6": Probe("GET", "/api/contents?token={T}", 403, {"Host": "[::ffff:7f00:1]:{port}"}),
    # --- cross-origin use of the right token --------------------------------------------------
    "cross_origin_get_with_token": Probe("GET", "/api/contents?token={T}", 403, {"Origin": EVIL}),
    "cross_origin_post_with_token": Probe("POST", "/api/contents?token={T}", 403, {"Origin": EVIL},
                                          body='{"type": "file"}'),
    "cross_origin_header_token": Probe("POST", "/api/contents", 403,
                                       {"Origin": EVIL, "Authorization": "token {T}"}, body='{"type": "file"}'),
    "cross_origin_kernel_start": Probe("POST", "/api/kernels?token={T}", 403, {"Origin": EVIL},
                                       body='{"name": "python3"}'),
    "cross_origin_delete": Probe("DELETE", "/api/contents/hello.txt?token={T}", 403, {"Origin": EVIL}),
    "cross_origin_files": Probe("GET", "/files/hello.txt?token={T}", 403, {"Origin": EVIL}),
    "cross_origin_preflight": Probe("OPTIONS", "/api/contents", 403,
                                    {"Origin": EVIL, "Access-Control-Request-Method": "POST",
                                     "Access-Control-Request-Headers": "authorization"}),
    "origin_null_with_token": Probe("POST", "/api/contents?token={T}", 403, {"Origin": "null"},
                                    body='{"type": "file"}'),
    "origin_null_cookie": Probe("GET", "/api/contents", 403, {"Origin": "null"}, cookie_session=True),
    "origin_host_suffix": Probe("GET", "/api/contents?token={T}", 403,
                                {"Origin": "http://127.0.0.1:{port}.evil.example"}),
    "origin_with_path": Probe("GET", "/api/contents?token={T}", 403, {"Origin": "http://127.0.0.1:{port}/x"}),
    "origin_other_port": Probe("GET", "/api/contents?token={T}", 403, {"Origin": "http://127.0.0.1:1"}),
    "origin_unauthenticated_api": Probe("GET", "/api", 403, {"Origin": EVIL}),
    # --- TensorBoard through jupyter-server-proxy (server/tensorboard.py) ---------------------------
    # Only the named TensorBoard route exists: no tunnel to other local ports, even with the token
    # (here it would reach this very server's API; elsewhere a database or a metadata endpoint).
    "open_proxy_local_port": Probe("GET", "/proxy/{port}/api/contents?token={T}", 404),
    "open_proxy_absolute_port": Probe("GET", "/proxy/absolute/{port}/api/contents?token={T}", 404),
    "open_proxy_host_port": Probe("GET", "/proxy/127.0.0.1:{port}/api/contents?token={T}", 404),
    "open_proxy_localhost_port": Probe("GET", "/proxy/localhost:{port}/api/contents?token={T}", 404),
    "tensorboard_no_token": Probe("GET", "/tensorboard/", 302, redirect="/login"),
    "tensorboard_wrong_token": Probe("GET", f"/tensorboard/?token={WRONG}", 302, redirect="/login"),
    "tensorboard_api_no_token": Probe("GET", "/tensorboard/data/runs", 302, redirect="/login"),
    "tensorboard_post_no_token": Probe("POST", "/tensorboard/data/plugin/scalars/scalars_multirun", 403,
                                       body="{}"),
    "tensorboard_cross_origin_with_token": Probe("GET", "/tensorboard/?token={T}", 403, {"Origin": EVIL}),
    "tensorboard_cross_origin_cookie": Probe("POST", "/tensorboard/data/plugin/scalars/scalars_multirun", 403,
                                             {"Origin": EVIL}, body="{}", cookie_session=True),
    "tensorboard_servers_info_no_token": Probe("GET", "/server-proxy/servers-info", 302, redirect="/login"),
    # --- open redirects after login -----------------------------------------------------------
    "next_protocol_relative": Probe("GET", "/login?next=//evil.example&token={T}", 302, redirect="same server"),
    "next_absolute": Probe("GET", "/login?next=https://evil.example/&token={T}", 302, redirect="same server"),
    "next_backslash": Probe("GET", "/login?next=/%5Cevil.example&token={T}", 302, redirect="same server"),
    "next_encoded_slashes": Probe("GET", "/login?next=%2F%2Fevil.example&token={T}", 302, redirect="same server"),
    "next_tab_trick": Probe("GET", "/login?next=/%09/evil.example&token={T}", 302, redirect="same server"),
    # --- path traversal with the token --------------------------------------------------------
    "traversal_contents": Probe("GET", "/api/contents/..%2F..%2F..%2Fetc%2Fpasswd?token={T}", 404),
    "traversal_files": Probe("GET", "/files/../../../etc/passwd?token={T}", 403),
    "traversal_files_encoded": Probe("GET", "/files/%2e%2e/%2e%2e/%2e%2e/etc/passwd?token={T}", 403),
    "traversal_sibling_prefix": Probe("GET", "/api/contents/..%2Fworkspace-secret%2Fkey.txt?token={T}", 404),
    "traversal_nbconvert": Probe("GET", "/nbconvert/html/..%2F..%2F..%2Fetc%2Fpasswd?token={T}", 404),
}
_TOKEN_FORMS = {"{T[:-1]}": lambda t: t[:-1], "{T.swap}": _swapcase_first_letter}


def _send(lab: LabServer, probe: Probe, cookies: str = "", xsrf: str | None = None) -> httpclient.HTTPResponse:
    """Send exactly this request line and these headers (no client-side path normalisation)."""
    path = probe.fill(probe.path, lab)
    headers = {"Host": f"127.0.0.1:{lab.port}"}
    for name, value in probe.headers.items():
        for form, make in _TOKEN_FORMS.items():
            value = value.replace(form, make(lab.token))
        headers[name] = probe.fill(value, lab)
    if cookies:
        headers["Cookie"] = "; ".join(filter(None, [cookies, headers.get("Cookie", "")]))
    if xsrf is not None and "X-XSRFToken" not in headers:
        headers["X-XSRFToken"] = xsrf
    body = probe.body.encode() if probe.body is not None else None
    if body is not None:
        headers["Content-Type"] = "application/json"
    conn = httpclient.HTTPConnection("127.0.0.1", lab.port, timeout=15)
    conn.putrequest(probe.method, path, skip_host=True, skip_accept_encoding=True)
    for name, value in headers.items():
        conn.putheader(name, value)
    if body is not None:
        conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body)
    response = conn.getresponse()
    response.body = response.read()
    conn.close()
    return response


@pytest.mark.parametrize("name", sorted(PROBES))
def test_probe_is_refused(name, lab, browser_session):
    probe = PROBES[name]
    cookies = ""
    if probe.cookie_session:
        cookies = "; ".join(f"{c.name}={c.value}" for c in browser_session.cookies)
    response = _send(lab, probe, cookies)
    assert response.status == probe.status, (name, response.status, response.body[:300])
    assert response.getheader("Access-Control-Allow-Origin") in (None, ""), "no CORS grant on a refusal"
    if probe.redirect:
        # Where a browser would go: this server (and its login page when asked for).
        location = response.getheader("Location") or ""
        resolved = urlsplit(urljoin(lab.url + "/", location))
        assert resolved.scheme == "http" and resolved.netloc == f"127.0.0.1:{lab.port}", location
        if probe.redirect.startswith("/"):
            assert resolved.path == probe.redirect, location
    if name.startswith("traversal"):
        assert b"root:" not in response.body and SECRET_CONTENT.encode() not in response.body


def test_hostile_user_config_had_no_effect(lab):
    """The server started despite HOSTILE_USER_CONFIG, with none of it in force (the probes show the rest)."""
    log = lab.log()
    # (jpserver_extensions from this file is already overridden by the --config file; the
    # command line and .d folders, which win over it, are in test_lab_misconfig.py.)
    assert "workbench.server.guard | extension was successfully loaded" in log
    response = http().get(f"{lab.url}/api/contents")
    assert response.status_code == 403, "allow_unauthenticated_access / the empty token had no effect"


# --- the same requests from the server's own origin work (the refusals are about the probe) --


def test_same_origin_and_token_requests_work(lab, browser_session):
    own = f"http://127.0.0.1:{lab.port}"
    session = http()
    assert session.get(f"{lab.url}/api/contents", headers={"Authorization": f"token {lab.token}"}).status_code == 200
    created = session.post(f"{lab.url}/api/contents?token={lab.token}", json={"type": "file"},
                           headers={"Origin": own})
    assert created.status_code == 201, created.text
    assert created.headers.get("Access-Control-Allow-Origin") in (None, own)
    cookie_post = browser_session.post(f"{lab.url}/api/contents", json={"type": "file"},
                                       headers={"Origin": own, "X-XSRFToken": browser_session.cookies["_xsrf"]})
    assert cookie_post.status_code == 201, cookie_post.text
    login = session.get(f"{lab.url}/login?next=/lab/tree&token={lab.token}", allow_redirects=False)
    assert login.status_code == 302 and login.headers["Location"] == "/lab/tree"


# --- websockets -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kernel_and_terminal(lab):
    session = http()
    auth = {"Authorization": f"token {lab.token}"}
    kernel = session.post(f"{lab.url}/api/kernels", json={"name": "python3"}, headers=auth)
    terminal = session.post(f"{lab.url}/api/terminals", headers=auth)
    assert kernel.status_code == 201 and terminal.status_code == 200
    yield kernel.json()["id"], terminal.json()["name"]
    session.delete(f"{lab.url}/api/kernels/{kernel.json()['id']}", headers=auth)
    session.delete(f"{lab.url}/api/terminals/{terminal.json()['name']}", headers=auth)


WS_PROBES = {
    "kernel_ws_no_token": ("kernel", "", {}),
    "kernel_ws_wrong_token": ("kernel", f"?token={WRONG}", {}),
    "kernel_ws_token_foreign_origin": ("kernel", "?token={T}", {"Origin": EVIL}),
    "kernel_ws_token_null_origin": ("kernel", "?token={T}", {"Origin": "null"}),
    "kernel_ws_cookie_null_origin": ("kernel", "", {"Origin": "null", "Cookie": "<session>"}),
    "kernel_ws_token_foreign_origin_v8": ("kernel", "?token={T}", {"Sec-WebSocket-Origin": EVIL}),
    "terminal_ws_no_token": ("terminal", "", {}),
    "terminal_ws_token_foreign_origin": ("terminal", "?token={T}", {"Origin": EVIL}),
}


@pytest.mark.parametrize("name", sorted(WS_PROBES))
def test_websocket_probe_is_refused(name, lab, kernel_and_terminal, browser_session):
    kind, query, headers = WS_PROBES[name]
    kernel_id, terminal = kernel_and_terminal
    path = f"/api/kernels/{kernel_id}/channels" if kind == "kernel" else f"/terminals/websocket/{terminal}"
    headers = dict(headers)
    if headers.get("Cookie") == "<session>":
        headers["Cookie"] = "; ".join(f"{c.name}={c.value}" for c in browser_session.cookies)
    result = websocket(f"ws://127.0.0.1:{lab.port}{path}{query.replace('{T}', lab.token)}", headers)
    assert result.startswith("refused: HTTP 403"), result


def test_same_origin_websocket_with_token_works(lab, kernel_and_terminal):
    _, terminal = kernel_and_terminal
    headers = {"Origin": f"http://127.0.0.1:{lab.port}"}
    typed = '["stdin", "echo ws-$((6*7))\\r"]'
    url = f"ws://127.0.0.1:{lab.port}/terminals/websocket/{terminal}?token={lab.token}"
    assert websocket(url, headers, typed, "ws-42") == "ok"


# --- what the server leaves behind --------------------------------------------------------------


def test_kernel_environment_has_no_token(lab):
    """A kernel started the way JupyterLab starts one (a session) runs `os.environ` and saves it."""
    from jupyter_client import BlockingKernelClient

    session = http()
    auth = {"Authorization": f"token {lab.token}"}
    created = session.post(f"{lab.url}/api/sessions", headers=auth, json={
        "path": "probe.ipynb", "name": "probe.ipynb", "type": "notebook", "kernel": {"name": "python3"}})
    assert created.status_code == 201, created.text
    kernel_id = created.json()["kernel"]["id"]
    try:
        runtime = lab.env["JUPYTER_RUNTIME_DIR"]
        client = BlockingKernelClient(connection_file=os.path.join(runtime, f"kernel-{kernel_id}.json"))
        client.load_connection_file()
        # No heartbeat: on a loaded machine it misses beats and the client declares the
        # kernel dead; execute_interactive waits for the reply itself.
        client.start_channels(hb=False)
        # The output channel is a subscription that goes live some time after start_channels:
        # output published before then is lost for good (under load, the whole print). wait_for_ready
        # returns once a kernel_info reply came back *and* a message arrived on that channel.
        client.wait_for_ready(timeout=120)
        seen = []
        # Its own environment, and its parent's (the server) as `!cat /proc/$PPID/environ`
        # shows it; and a helper module next to the notebook still imports.
        client.execute_interactive(
            "import os, json, wb_helper_mod\n"
            "parent = open(f'/proc/{os.getppid()}/environ', 'rb').read().decode(errors='replace')\n"
            "print('ENV=' + json.dumps({'own': dict(os.environ), 'parent': parent, 'cwd': os.getcwd(),"
            " 'helper': wb_helper_mod.VALUE}))",
            output_hook=lambda msg: seen.append(msg["content"].get("text", "")), timeout=60,
        )
        client.stop_channels()
        result = json.loads("".join(seen).split("ENV=", 1)[1])
    finally:
        session.delete(f"{lab.url}/api/sessions/{created.json()['id']}", headers=auth)
    env, parent = result["own"], result["parent"]
    assert "JPY_SESSION_NAME" in env, "the kernel's environment was read"
    assert "JUPYTER_TOKEN" not in env and "JUPYTER_TOKEN_FILE" not in env and "WORKBENCH_TOKEN_FD" not in env
    assert not any(lab.token in value for value in env.values())
    assert "JUPYTER_TOKEN=" not in parent and lab.token not in parent, "the server was started with the token"
    assert "PYTHONUNBUFFERED=1" in parent, "the parent's environment was read"
    # The kernel ran in the notebook's folder, where an ipykernel_launcher.py was planted: not run.
    assert result["cwd"] == str(lab.root) and result["helper"] == 42
    assert not (lab.root / "PLANTED-ipykernel_launcher.py-RAN").exists()


def test_terminal_environment_has_no_token(lab, kernel_and_terminal):
    _, terminal = kernel_and_terminal
    url = f"ws://127.0.0.1:{lab.port}/terminals/websocket/{terminal}"
    typed = '["stdin", "echo tok=${JUPYTER_TOKEN:-unset}-$(env | grep -c ' + lab.token[:12] + ')\\r"]'
    assert websocket(url, {"Authorization": f"token {lab.token}"}, typed, "tok=unset-0") == "ok"


def test_login_and_xsrf_cookies_are_samesite_strict(lab):
    response = http().get(f"{lab.url}/lab?token={lab.token}", allow_redirects=False)
    assert response.status_code == 200
    cookies = response.raw.headers.getlist("Set-Cookie")
    login = [c for c in cookies if c.startswith("username-")]
    xsrf = [c for c in cookies if c.startswith("_xsrf=")]
    assert login and xsrf, cookies
    for cookie in login + xsrf:
        assert re.search(r";\s*SameSite=Strict", cookie, re.IGNORECASE), cookie
    assert all("HttpOnly" in c for c in login)
    # The login cookie lasts a day at most (tornado's default is 30 days).
    from email.utils import parsedate_to_datetime

    expires = parsedate_to_datetime(re.search(r"expires=([^;]+)", login[0], re.IGNORECASE).group(1))
    assert expires.timestamp() - time.time() < 86400 + 60, login[0]


def test_runtime_files_are_private(lab):
    runtime = lab.env["JUPYTER_RUNTIME_DIR"]
    assert os.stat(runtime).st_mode & 0o077 == 0
    names = os.listdir(runtime)
    assert any(n.startswith("jpserver-") and n.endswith(".json") for n in names), names
    assert not [n for n in names if n.endswith("-open.html")], "the open.html (token) must not be written"
    for name in names:
        assert os.stat(os.path.join(runtime, name)).st_mode & 0o077 == 0, name


def test_token_is_in_no_log_line(lab):
    """Real failing requests that carry the token, a wrong token, a Referer and Authorization headers."""
    marker = uuid.uuid4().hex[:8]
    near_miss = lab.token[:-4] + "zzzz"
    auth = {"Authorization": f"token {lab.token}"}

    class Fresh:  # a new client per request: a login cookie from one must not authenticate the next
        def __getattr__(self, method):
            return getattr(http(), method)

    session = Fresh()
    requests_made = [
        session.get(f"{lab.url}/api/contents/missing-{marker}.ipynb?token={lab.token}"),
        session.get(f"{lab.url}/api/contents/missing-{marker}.ipynb", headers=auth),
        session.get(f"{lab.url}/files/missing-{marker}.txt?token={lab.token}"),
        session.get(f"{lab.url}/nonexistent-{marker}?token={lab.token}"),
        session.get(f"{lab.url}/api/contents?token={near_miss}&m={marker}"),
        session.get(f"{lab.url}/api/contents?m={marker}", headers={"Authorization": f"token {near_miss}"}),
        session.post(f"{lab.url}/api/contents/x-{marker}?token={lab.token}", data="{not json"),
        session.get(f"{lab.url}/api/contents/missing-{marker}?token={lab.token}",
                    headers={"Referer": f"http://127.0.0.1:{lab.port}/lab?token={lab.token}"}),
        session.get(f"{lab.url}/api/contents?token={lab.token}&m={marker}", headers={"Origin": EVIL}),
        session.get(f"{lab.url}/api/kernels/nope-{marker}?token={lab.token}"),
    ]
    assert all(r.status_code >= 400 for r in requests_made), [r.status_code for r in requests_made]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and lab.log().count(marker) < 10:
        time.sleep(0.2)
    log = lab.log()
    lines = [line for line in log.splitlines() if marker in line]
    assert len(lines) >= 10, "the failing requests were logged"
    assert any("token=[secret]" in line for line in lines)
    for secret in (lab.token, near_miss, lab.token[:24], quote(lab.token, safe="")):
        assert secret not in log, f"a token is in the log: {[ln for ln in log.splitlines() if secret in ln][:3]}"


def _percent_all(text: str) -> str:
    return "".join(f"%{ord(ch):02X}" for ch in text)


def test_encoded_token_is_in_no_log_line(lab):
    """`?%74oken=%65...` authenticates like `?token=e...`: the log redacts what the request decodes to."""
    marker = uuid.uuid4().hex[:8]
    forms = {
        "name_and_value_encoded": f"{_percent_all('token')}={_percent_all(lab.token)}",
        "value_encoded": f"token={_percent_all(lab.token)}",
        "name_encoded": f"%74oken={lab.token}",
        "half_encoded": f"token={lab.token[:20]}{_percent_all(lab.token[20:])}",
        "double_encoded": "token=" + _percent_all(lab.token).replace("%", "%25"),
    }
    # Sent as written (requests would decode %74 back to "t"). It does authenticate, so it
    # matters what the log shows; then the 404 lines are logged.
    assert _send(lab, Probe("GET", f"/api/contents?{forms['name_and_value_encoded']}", 200)).status == 200
    for name, query in forms.items():
        # (the double-encoded form decodes to a wrong token once: 403, logged all the same)
        assert _send(lab, Probe("GET", f"/api/contents/missing-{marker}-{name}?{query}", 404)).status in (403, 404)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and lab.log().count(marker) < len(forms):
        time.sleep(0.2)
    lines = [line for line in lab.log().splitlines() if marker in line]
    assert len(lines) >= len(forms), "the requests were logged"
    tail = lab.token[-12:]
    for line in lines:
        decoded = line
        for _ in range(3):
            decoded = unquote(decoded)
        assert tail not in decoded, f"a form of the token is in the log: {line}"


# --- a new token ends the old sessions ---------------------------------------------------------


def test_new_token_ends_sessions_made_with_the_old_one(tmp_path):
    """Same runtime folder (same persisted cookie secret); restarted with another token."""
    root = tmp_path / "workspace"
    root.mkdir()
    first = start_lab(tmp_path, root)
    try:
        session = http()
        assert session.get(f"{first.url}/lab?token={first.token}").status_code == 200
        cookies = "; ".join(f"{c.name}={c.value}" for c in session.cookies)
        assert http().get(f"{first.url}/api/contents", headers={"Cookie": cookies}).status_code == 200
    finally:
        first.stop()
    # The same port too: the login cookie's name holds it, and tornado signs the name.
    second = start_lab(tmp_path, root, token=new_token(), port=first.port)
    try:
        headers = {"Cookie": cookies, "X-XSRFToken": session.cookies["_xsrf"]}
        assert http().get(f"{second.url}/api/contents", headers=headers).status_code == 403
        assert http().post(f"{second.url}/api/kernels", json={"name": "python3"}, headers=headers).status_code == 403
    finally:
        second.stop()


def test_planted_modules_and_config_files_did_not_run(lab):
    """Last in the module: after the server, a kernel and a terminal have all run."""
    ran = [marker.name for marker in lab.markers if marker.exists()]
    assert ran == [], f"planted code ran inside the server or a kernel: {ran}"
