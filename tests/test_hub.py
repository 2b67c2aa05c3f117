"""A class on a real JupyterHub: two students, their own servers, doctor in a kernel, culling;
then the class service: two more students' check cells report, their teacher sees who passed.

Everything is real except the Docker image: `jupyterhub` (PyPI) with `configurable-http-proxy`
(npm, installed by scripts/setup_hub_proxy.sh), the DummyAuthenticator with a shared password,
SimpleLocalProcessSpawner starting each user's server through docker/entrypoint.sh (its
JupyterHub branch: workbench.server.hub_singleuser and the workbench server configuration),
jupyterhub-idle-culler as a hub-managed service, as in environment/hub/z2jh-values.yaml, and the
class service (workbench/classroom/) added by the same `hub_config.configure` as
environment/hub/jupyterhub_config.py. One hub serves the whole module: about 2 minutes on an
idle 2-core machine (the first test 75 s, the class service's three 45-60 s), 3 on a busy one.
It runs as root here (WORKBENCH_ALLOW_ROOT=1).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests
from lab_helpers import free_port, http

# More than 30 s on 2 cores (real processes); CI runs them (scripts/test.sh selects no marker).
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
ENTRYPOINT = REPO / "docker" / "entrypoint.sh"
SERVER_CONFIG = REPO / "workbench" / "server" / "jupyter_config" / "jupyter_server_config.py"
PROXY = REPO / ".venv" / "hub-proxy" / "node_modules" / ".bin" / "configurable-http-proxy"
PASSWORD = "class-of-2026-shared-password"  # DummyAuthenticator: one password for every user
# jupyterhub-idle-culler --timeout: short, so the test sees a cull, yet longer than the quiet
# moments of a busy 2-core machine (a server is "idle" when no request or kernel message came).
CULL_TIMEOUT_S = 40
USERS = ("alice", "bob")
# The class of the class-service tests: two students in two groups and their teacher.
GROUPS = {"carol": "section-a", "dave": "section-b"}
TEACHER = "teacher"
TEACHER_GROUP = "teachers"

HUB_CONFIG = """
# Written by tests/test_hub.py: a throw-away hub on 127.0.0.1.
import sys
c = get_config()  # noqa: F821
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.command = [{proxy!r}]
c.JupyterHub.db_url = "sqlite:///{tmp}/hub.sqlite"
c.JupyterHub.cookie_secret_file = "{tmp}/cookie_secret"
c.JupyterHub.pid_file = "{tmp}/hub.pid"
# Poll the proxy for activity often, so the culler sees a fresh last_activity.
c.JupyterHub.last_activity_interval = 3

c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = {password!r}
c.Authenticator.allowed_users = {users!r}
c.JupyterHub.load_groups = {groups!r}

# Every user's server through the image's entrypoint, as KubeSpawner would start it, but
# as a local process (no Docker here) in its own home folder.
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = "{tmp}/homes/{{username}}"
c.Spawner.cmd = ["bash", {entrypoint!r}]
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.Spawner.environment = {{
    "WORKBENCH_PYTHON": sys.executable,
    "WORKBENCH_SERVER_CONFIG": {server_config!r},
    "WORKBENCH_NOTEBOOKS_SOURCE": {notebooks!r},
    "WORKBENCH_NOTEBOOK_DIR": lambda spawner: spawner.home_dir,
    "WORKBENCH_ALLOW_ROOT": "1",  # the tests run as root; the image runs as uid 1000
    "JUPYTERHUB_ACTIVITY_INTERVAL": "2",  # the server tells the hub of activity every 2 s
    "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
    "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
}}

# Idle culling as Zero to JupyterHub does it: jupyterhub-idle-culler as a hub service.
c.JupyterHub.services = [{{
    "name": "idle-culler",
    "command": [sys.executable, "-m", "jupyterhub_idle_culler",
                "--timeout={cull_timeout}", "--cull-every=3"],
}}]
c.JupyterHub.load_roles = [{{
    "name": "idle-culler",
    "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
    "services": ["idle-culler"],
}}]

# The class service, added as environment/hub/jupyterhub_config.py adds it; the kernels
# reach it through the hub's proxy.
from workbench.classroom.hub_config import configure
c.Spawner.environment.update(configure(
    c, url="http://127.0.0.1:{service_port}", kernel_url="http://127.0.0.1:{port}/services/classroom/",
    db="{tmp}/classroom.sqlite"))
"""


def _hub_groups() -> dict:
    groups = {TEACHER_GROUP: {"users": [TEACHER]}}
    for name, group in GROUPS.items():
        groups.setdefault(group, {"users": []})["users"].append(name)
    return groups


class Hub:
    def __init__(self, tmp: Path):
        if not PROXY.exists():
            message = f"{PROXY} is missing: run `bash scripts/setup_hub_proxy.sh` (scripts/test.sh does)"
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message)
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = tmp / "jupyterhub_config.py"
        config.write_text(HUB_CONFIG.format(
            port=self.port, hub_port=free_port(), proxy_api_port=free_port(), proxy=str(PROXY), tmp=tmp,
            password=PASSWORD, users={*USERS, *GROUPS, TEACHER}, entrypoint=str(ENTRYPOINT),
            server_config=str(SERVER_CONFIG), notebooks=str(REPO / "notebooks"), cull_timeout=CULL_TIMEOUT_S,
            service_port=free_port(), groups=_hub_groups()))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "WORKBENCH_"))}
        # `workbench` (the CLI students type in a kernel) and node for the proxy on PATH.
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
        env["CONFIGPROXY_AUTH_TOKEN"] = uuid.uuid4().hex
        self.log_path = tmp / "hub.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 -- closed in stop()
        self.process = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(config)], cwd=tmp,
                                        env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        self._wait_up()

    def log(self, tail: int | None = 6000) -> str:
        text = self.log_path.read_text(errors="replace")
        return text[-tail:] if tail else text

    def _wait_up(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"jupyterhub exited with {self.process.returncode}:\n{self.log()}")
            try:
                if http().get(f"{self.url}/hub/api", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise AssertionError(f"jupyterhub did not answer within {timeout} s:\n{self.log()}")

    def stop(self) -> None:
        import psutil

        try:
            # The users' servers run in their own sessions (LocalProcessSpawner), so a signal to
            # the hub's group does not reach them: remember them to end any the hub leaves.
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.Error:
            children = []
        self.process.send_signal(signal.SIGTERM)  # the hub stops its servers and proxy on exit
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        for child in children:
            if child.is_running():
                child.kill()
        self._log.close()


class Student:
    """One user's browser session (login cookie) and API token."""

    def __init__(self, hub: Hub, name: str):
        self.hub, self.name = hub, name
        self.session = http()
        self.token = ""

    def login(self, password: str = PASSWORD) -> requests.Response:
        self.session.get(f"{self.hub.url}/hub/login", timeout=10)
        xsrf = self.session.cookies.get("_xsrf")
        return self.session.post(f"{self.hub.url}/hub/login", allow_redirects=False, timeout=30,
                                 data={"username": self.name, "password": password, "_xsrf": xsrf})

    def make_token(self) -> None:
        """A token for the API, made with the login cookie (what the hub's token page does)."""
        r = self.session.post(f"{self.hub.url}/hub/api/users/{self.name}/tokens", timeout=10,
                              headers={"X-XSRFToken": self.session.cookies.get("_xsrf")},
                              json={"note": "test_hub", "expires_in": 600})
        assert r.status_code == 201, r.text
        self.token = r.json()["token"]

    def api(self, method: str, path: str, **kwargs) -> requests.Response:
        headers = {"Authorization": f"token {self.token}"}
        return http().request(method, f"{self.hub.url}{path}", headers=headers, timeout=30, **kwargs)

    def server(self) -> dict | None:
        r = self.api("GET", f"/hub/api/users/{self.name}")
        assert r.status_code == 200, r.text
        return r.json()["servers"].get("")


def wait_for(predicate, timeout: float, what: str, hub: Hub, interval: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{what} did not happen within {timeout} s; hub log:\n{hub.log()}")


async def execute(student: Student, kernel_id: str, code: str, timeout: float = 180) -> str:
    """Run ``code`` in the kernel over the websocket (Jupyter messaging protocol); return stdout."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    url = f"ws://127.0.0.1:{student.hub.port}/user/{student.name}/api/kernels/{kernel_id}/channels"
    ws = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {student.token}"}))
    msg_id = uuid.uuid4().hex
    ws.write_message(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": student.name,
                   "session": uuid.uuid4().hex, "version": "5.3", "date": ""},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True},
    }))
    out, error = [], None
    deadline = time.monotonic() + timeout
    try:
        while True:
            raw = await asyncio.wait_for(ws.read_message(), max(1.0, deadline - time.monotonic()))
            assert raw is not None, "the kernel websocket closed"
            msg = json.loads(raw)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg["header"]["msg_type"]
            if kind == "stream" and msg["content"]["name"] == "stdout":
                out.append(msg["content"]["text"])
            elif kind == "error":
                error = "\n".join(msg["content"]["traceback"])
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                break
    finally:
        ws.close()
    assert error is None, error
    return "".join(out)


# Students type `!workbench doctor`; the test keeps the JSON and the facts that show whose
# server it ran on (the hub sets JUPYTERHUB_USER; the kernel starts in the user's folder).
# The cell prints a dot every 2 s like any long cell with progress: a silent cell longer than
# the cull timeout would look idle to the culler (it sees requests and kernel messages only).
DOCTOR_CELL = """
import json, os, shutil, subprocess
p = subprocess.Popen(["workbench", "doctor", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
while True:
    try:
        out, err = p.communicate(timeout=2)
        break
    except subprocess.TimeoutExpired:
        print(".", end="", flush=True)
print()
print(json.dumps({"rc": p.returncode, "exe": shutil.which("workbench"), "user": os.environ.get("JUPYTERHUB_USER"),
                  "cwd": os.getcwd(), "stderr": err[-2000:], "doctor": json.loads(out or "null")}))
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    running = Hub(tmp_path_factory.mktemp("hub"))
    yield running
    running.stop()


def test_a_class_on_jupyterhub(hub):
    started = time.monotonic()
    # --- log in over HTTP (a wrong password is refused) -------------------------------------
    intruder = Student(hub, "alice")
    assert intruder.login("not-the-password").status_code == 403
    students = {name: Student(hub, name) for name in USERS}
    for s in students.values():
        r = s.login()
        assert r.status_code == 302, (r.status_code, r.text[-500:])
        assert "jupyterhub-session-id" in s.session.cookies or any(
            c.name.startswith("jupyterhub") for c in s.session.cookies), s.session.cookies
        s.make_token()

    # --- each gets their own server (started through docker/entrypoint.sh) ----------------------
    for s in students.values():
        r = s.api("POST", f"/hub/api/users/{s.name}/server")
        assert r.status_code in (201, 202), r.text
    for s in students.values():
        wait_for(lambda s=s: (s.server() or {}).get("ready"), 120, f"{s.name}'s server start", hub)
    alice, bob = students["alice"], students["bob"]

    # --- a user cannot reach another user's server --------------------------------------------
    r = alice.api("GET", "/user/bob/api/kernels", allow_redirects=False)
    assert r.status_code == 403, (r.status_code, r.text[:300])
    r = bob.api("GET", "/user/alice/api/status", allow_redirects=False)
    assert r.status_code == 403, (r.status_code, r.text[:300])
    # ... nor can anyone without credentials (redirected to the hub's login, or refused).
    r = http().get(f"{hub.url}/user/alice/api/kernels", allow_redirects=False, timeout=10)
    assert r.status_code in (302, 403), r.status_code
    assert r.status_code == 403 or "/hub/" in r.headers["Location"]

    # --- in the browser: the hub's OAuth logs alice into her server; XSRF is still checked ------
    r = alice.session.get(f"{hub.url}/user/alice/lab", timeout=60)
    assert r.status_code == 200 and r.url.endswith("/user/alice/lab"), (r.status_code, r.url)
    assert any(c.name == "jupyterhub-user-alice" for c in alice.session.cookies)
    r = alice.session.post(f"{hub.url}/user/alice/api/kernels", json={"name": "python3"}, timeout=30)
    assert r.status_code == 403, (r.status_code, r.text[:300])  # a cookie alone: a cross-site post
    xsrf = next(c.value for c in alice.session.cookies if c.name == "_xsrf" and c.path.startswith("/user/alice"))
    r = alice.session.post(f"{hub.url}/user/alice/api/kernels", json={"name": "python3"}, timeout=60,
                           headers={"X-XSRFToken": xsrf})
    assert r.status_code == 201, (r.status_code, r.text[:300])
    assert alice.session.delete(f"{hub.url}/user/alice/api/kernels/{r.json()['id']}", timeout=30,
                                headers={"X-XSRFToken": xsrf}).status_code == 204
    # ... and her browser session does not open bob's server.
    r = alice.session.get(f"{hub.url}/user/bob/lab", timeout=60)
    assert r.status_code == 403, (r.status_code, r.url)

    # --- the workbench's own server: notebooks seeded, hub mode, doctor in a kernel ---------------
    for s in students.values():
        home = hub.tmp / "homes" / s.name
        assert (home / "notebooks" / "01_quickstart.ipynb").is_file(), list(home.glob("*"))
        r = s.api("GET", f"/user/{s.name}/api/contents/notebooks")
        assert r.status_code == 200, r.text
        assert "00_environment_check.ipynb" in {item["name"] for item in r.json()["content"]}
    # Both servers ran the workbench's hub guard (and so not the standalone token guard).
    assert hub.log(tail=None).count("workbench: JupyterHub single-user mode") == 2

    kernels = {}
    for s in students.values():
        r = s.api("POST", f"/user/{s.name}/api/kernels", json={"name": "python3"})
        assert r.status_code == 201, r.text
        kernels[s.name] = r.json()["id"]

    async def both():
        return await asyncio.gather(*(execute(s, kernels[s.name], DOCTOR_CELL) for s in students.values()))

    outputs = asyncio.run(both())
    for s, text in zip(students.values(), outputs, strict=True):
        result = json.loads(text.strip().splitlines()[-1])
        report = result["doctor"]
        assert report is not None, result["stderr"]
        assert result["user"] == s.name
        assert Path(result["cwd"]) == hub.tmp / "homes" / s.name
        assert result["rc"] == (0 if report["ok"] else 1)
        assert report["counts"]["error"] == 0, [c for c in report["results"] if c["level"] == "error"]
        assert {c["name"] for c in report["results"]} >= {"torch", "shared memory", "jupyter auth"}

    # --- an idle server is culled; an active one is not -----------------------------------------
    # alice keeps working (a cell every 2 s); bob stops. The culler removes bob's server once it
    # has been idle CULL_TIMEOUT_S seconds.
    async def alice_works_until_bob_is_culled(limit: float):
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            await execute(alice, kernels["alice"], "1 + 1", timeout=30)
            if await asyncio.to_thread(bob.server) is None:
                return True
            await asyncio.sleep(2)
        return False

    idle_since = time.monotonic()
    assert asyncio.run(alice_works_until_bob_is_culled(CULL_TIMEOUT_S + 60)), \
        f"bob's idle server was not culled; hub log:\n{hub.log()}"
    culled_after = time.monotonic() - idle_since
    assert "idle-culler" in hub.log(tail=None)
    server = alice.server()
    assert server is not None and server["ready"], "alice's active server was culled too"
    r = alice.api("GET", f"/user/alice/api/kernels/{kernels['alice']}")
    assert r.status_code == 200
    print(f"hub test: {time.monotonic() - started:.0f} s in all; bob culled {culled_after:.0f} s after going idle")


# --- the class service: check cells report, the teacher sees who passed ---------------------
# Three steps on one class session (the fixture below runs the students' kernels once): what
# the service stores and who may see it; the teacher's page in a browser; a burst of posts.
# They run in this order (pytest keeps a module's order); each also runs alone.

WELCOME = ("bert-course", "00_welcome", "warm-up")  # a check a teacher writes with verdict()
EX1 = ("bert-course", "02_bert_course", "1. tokenized batch")
EX2 = ("bert-course", "02_bert_course", "2. logits -> probabilities")
IMPORTS = "import os, torch\nfrom workbench.course import checks as course_checks\n"
# Each student's check cells, as they would type them, in order (passing and failing).
CHECK_CELLS = {
    "carol": [
        "course_checks.check_probabilities(lambda logits: torch.softmax(logits, dim=0));",  # wrong dim
        "course_checks.check_probabilities(lambda logits: torch.softmax(logits, dim=-1));",
        "course_checks.verdict('warm-up', 6 * 7 == 42, 'the answer is 42', notebook='00_welcome', course='bert-course');",
    ],
    "dave": [
        "course_checks.check_probabilities(torch.sigmoid);",
        # The service is down (here: a port nobody listens on): the result waits on his server...
        "url = os.environ['WORKBENCH_CLASSROOM_URL']\n"
        "os.environ['WORKBENCH_CLASSROOM_URL'] = 'http://127.0.0.1:{closed_port}/services/classroom/'\n"
        "course_checks.verdict('warm-up', False, 'not yet', notebook='00_welcome', course='bert-course');\n"
        "os.environ['WORKBENCH_CLASSROOM_URL'] = url",
        # ... and goes out with his next check, once the service answers again.
        "course_checks.check_tokenized_batch(None, ['a sentence'], None, 8);",
    ],
}
# What the teacher must see: student -> exercise -> (status, attempts).
EXPECTED = {
    "carol": {EX2: ("passed", 2), WELCOME: ("passed", 1)},
    "dave": {EX2: ("tried", 1), WELCOME: ("tried", 1), EX1: ("tried", 1)},
}


def _key(exercise: tuple[str, str, str]) -> str:
    return "\x1f".join(exercise)


def _record(exercise: tuple[str, str, str], passed: bool, **extra) -> dict:
    course, notebook, name = exercise
    return {"id": uuid.uuid4().hex, "course": course, "notebook": notebook, "exercise": name,
            "passed": passed, "attempt": 1, "at": "2026-01-05T09:00:00.000000Z", "version": "test",
            **extra}


def _post(token: str, hub: Hub, results: list[dict]) -> requests.Response:
    return http().post(f"{hub.url}/services/classroom/api/results", json={"results": results},
                       headers={"Authorization": f"token {token}"}, timeout=30)


def _open_service(person: Student) -> requests.Response:
    """The service's page in ``person``'s browser session: the hub's OAuth, then the page."""
    return person.session.get(f"{person.hub.url}/services/classroom/", timeout=60)


def _progress(teacher: Student) -> dict:
    r = teacher.session.get(f"{teacher.hub.url}/services/classroom/api/progress", timeout=30)
    assert r.status_code == 200, (r.status_code, r.text[:300])
    return r.json()


def _cells(table: dict) -> dict[str, dict[tuple, tuple[str, int]]]:
    exercises = {e["key"]: (e["course"], e["notebook"], e["exercise"]) for e in table["exercises"]}
    return {s["name"]: {exercises[k]: (c["status"], c["attempts"]) for k, c in s["cells"].items()}
            for s in table["students"]}


@pytest.fixture(scope="module")
def class_results(hub):
    """Carol and Dave log in, get their servers, and run their check cells in real kernels;
    the teacher logs in. Returns the people and each cell's output."""
    people = {name: Student(hub, name) for name in (*GROUPS, TEACHER)}
    for person in people.values():
        assert person.login().status_code == 302
        person.make_token()
    students = [people[name] for name in GROUPS]
    for s in students:
        assert s.api("POST", f"/hub/api/users/{s.name}/server").status_code in (201, 202)
    for s in students:
        wait_for(lambda s=s: (s.server() or {}).get("ready"), 120, f"{s.name}'s server start", hub)
    kernels = {}
    for s in students:
        r = s.api("POST", f"/user/{s.name}/api/kernels", json={"name": "python3"})
        assert r.status_code == 201, r.text
        kernels[s.name] = r.json()["id"]

    async def run_cells(s: Student) -> list[str]:
        await execute(s, kernels[s.name], IMPORTS)
        cells = [c.replace("{closed_port}", str(free_port())) for c in CHECK_CELLS[s.name]]
        return [await execute(s, kernels[s.name], cell) for cell in cells]

    async def everyone():
        return await asyncio.gather(*(run_cells(s) for s in students))

    outputs = dict(zip(GROUPS, asyncio.run(everyone()), strict=True))
    assert _open_service(people[TEACHER]).status_code == 200  # the teacher's OAuth login to the service
    return people, outputs


def test_check_cells_report_to_the_teacher(hub, class_results):
    people, outputs = class_results
    carol, dave, teacher = people["carol"], people["dave"], people[TEACHER]

    # --- in the kernels: the verdict, then one line saying where the result went -------------
    for name, cells in outputs.items():
        for text in cells:
            assert text.startswith(("✅", "❌")), (name, text)
    assert all(text.rstrip().endswith("recorded for your teacher") for text in outputs["carol"])
    # dave's second check ran while the service was unreachable: kept, sent with the third.
    assert outputs["dave"][1].rstrip().endswith("it reaches your teacher with a later check")
    assert outputs["dave"][2].rstrip().endswith("recorded for your teacher")

    # --- the teacher's page: the hub's OAuth login, then exactly the two students' results ---
    r = http().get(f"{hub.url}/services/classroom/", allow_redirects=False, timeout=30)
    assert r.status_code == 302 and "/hub/api/oauth2/authorize" in r.headers["Location"], r.status_code
    r = _open_service(teacher)
    assert r.status_code == 200 and "Class progress" in r.text, (r.status_code, r.url, r.text[:300])
    assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]  # its own tab, never a frame
    table = _progress(teacher)
    cells = _cells(table)
    assert {n: c for n, c in cells.items() if c} == EXPECTED, cells
    # The class list comes from the hub: students with no result yet are rows too; no teacher.
    assert set(cells) == {*GROUPS, *USERS} and table["roster_from_hub"]
    assert {s["name"]: s["groups"] for s in table["students"]}["carol"] == ["section-a"]
    assert sorted(table["groups"]) == ["section-a", "section-b"]
    csv_text = teacher.session.get(f"{hub.url}/services/classroom/progress.csv?group=section-a", timeout=30).text
    lines = csv_text.strip().splitlines()
    assert lines[0].startswith("student,groups,course,notebook,exercise,status,attempts")
    assert len(lines) == 1 + 3 and all(line.startswith("carol,section-a,") for line in lines[1:]), lines
    assert "carol,section-a,bert-course,02_bert_course,2. logits -> probabilities,passed,2," in csv_text

    # --- students do not see the class: 403 on the page, with a browser login or a token -----
    r = _open_service(carol)
    assert r.status_code == 403 and "teachers" in r.text, (r.status_code, r.text[:300])
    r = carol.api("GET", "/services/classroom/api/progress")
    assert r.status_code == 403, r.status_code

    # --- the name comes from the hub, never from the body ------------------------------------
    r = _post(carol.token, hub, [_record(WELCOME, False, student="dave", user="dave", name="dave")])
    assert r.status_code == 200 and r.json()["student"] == "carol" and r.json()["stored"] == 1, r.text
    cells = _cells(_progress(teacher))
    assert cells["carol"][WELCOME] == ("passed", 2) and cells["dave"][WELCOME] == ("tried", 1)

    # --- no valid token, or one without the service's scope: 403, nothing stored -------------
    r = _post("0" * 32, hub, [_record(WELCOME, True)])
    assert r.status_code == 403, r.status_code
    hub_xsrf = next(c.value for c in carol.session.cookies if c.name == "_xsrf" and c.path.startswith("/hub"))
    r = carol.session.post(f"{hub.url}/hub/api/users/carol/tokens", timeout=10, headers={"X-XSRFToken": hub_xsrf},
                           json={"note": "no classroom scope", "scopes": ["read:users:name!user=carol"]})
    assert r.status_code == 201, r.text
    assert _post(r.json()["token"], hub, [_record(WELCOME, True)]).status_code == 403
    r = http().post(f"{hub.url}/services/classroom/api/results", json={"results": "not a list"},
                    headers={"Authorization": f"token {dave.token}"}, timeout=30)
    assert r.status_code == 400 and "results" in r.json()["message"], r.text
    # A result that is not one is refused by name, and the rest of the batch is kept.
    r = _post(dave.token, hub, [_record(EX1, True), {**_record(EX1, True), "exercise": "<script>x"}])
    assert r.status_code == 200 and r.json()["stored"] == 1, r.text
    assert r.json()["refused"][0]["index"] == 1 and "exercise" in r.json()["refused"][0]["error"]
    assert _cells(_progress(teacher)) == {**cells, "dave": {**cells["dave"], EX1: ("passed", 2)}}


@pytest.fixture(scope="module")
def chromium():
    from test_browser import CHROMIUM, CHROMIUM_ARGS, _unavailable

    if not CHROMIUM.exists():
        _unavailable(f"{CHROMIUM} is missing: `apt-get install chromium`")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright (Python) is not installed")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.mark.browser
def test_the_teacher_page_in_a_browser(hub, class_results, chromium):
    """The teacher logs in to the hub, opens the service in a tab of its own, and sees the
    table the service holds; a group filter; a new result appears without a reload."""
    from test_browser import ARTIFACTS, TIMEOUT_MS

    people, _ = class_results
    teacher, dave = people[TEACHER], people["dave"]
    context = chromium.new_context(viewport={"width": 1300, "height": 700})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(f"{hub.url}/hub/login", timeout=TIMEOUT_MS)
        page.fill("#username_input", TEACHER)
        page.fill("#password_input", PASSWORD)
        page.click("#login_submit")
        page.wait_for_url("**/hub/**", timeout=TIMEOUT_MS)
        page.goto(f"{hub.url}/services/classroom/", timeout=TIMEOUT_MS)  # the hub's OAuth, then back
        assert page.url.startswith(f"{hub.url}/services/classroom/"), page.url
        cell = 'tr[data-student="{}"] td[data-exercise="{}"]'
        page.wait_for_selector(cell.format("carol", EX2[2]) + '[data-status="passed"]', timeout=TIMEOUT_MS)

        # The page shows exactly what the service holds (the API the first test checked).
        table = _progress(teacher)
        shown = {row.get_attribute("data-student"): {
            td.get_attribute("data-exercise"): td.get_attribute("data-status")
            for td in row.query_selector_all("td[data-exercise]")} for row in page.query_selector_all("tbody tr")}
        held = {s["name"]: {e["exercise"]: s["cells"].get(e["key"], {}).get("status", "notyet")
                            for e in table["exercises"]} for s in table["students"]}
        assert shown == held
        assert page.locator("thead th.notebook", has_text="bert-course · 02_bert_course").count() == 1
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "teacher_page.png"), full_page=True)

        # Filter by group: only that group's students; the CSV link follows the filter.
        page.select_option("#group", "section-b")
        assert [r.get_attribute("data-student") for r in page.query_selector_all("tbody tr")] == ["dave"]
        assert page.get_attribute("#csv", "href") == "progress.csv?group=section-b"
        assert "group=section-b" in page.url

        # Live: dave passes exercise 2 in his kernel; the open page shows it within seconds.
        assert page.get_attribute(cell.format("dave", EX2[2]), "data-status") == "tried"
        assert _post(dave.token, hub, [_record(EX2, True, at=_now())]).json()["stored"] == 1
        page.wait_for_selector(cell.format("dave", EX2[2]) + '[data-status="passed"]', timeout=30_000)
        assert not errors, errors
    finally:
        page.close()
        context.close()


def _now() -> str:
    from workbench.classroom.record import now

    return now()


def test_thirty_posts_at_once_lose_nothing(hub, class_results):
    """A whole class presses Shift+Enter at once: 30 posts, all on one row each for two students."""
    from concurrent.futures import ThreadPoolExecutor

    people, _ = class_results
    carol, dave, teacher = people["carol"], people["dave"], people[TEACHER]
    burst = ("load-test", "concurrency", "same row")
    before = _cells(_progress(teacher))
    posts = [(s.token, [_record(burst, i % 3 == 0)]) for i in range(15) for s in (carol, dave)]
    with ThreadPoolExecutor(len(posts)) as pool:
        answers = list(pool.map(lambda p: _post(p[0], hub, p[1]), posts))
    assert [a.status_code for a in answers] == [200] * 30, [a.text[:200] for a in answers if a.status_code != 200]
    assert sum(a.json()["stored"] for a in answers) == 30
    # The same 30 again (answers lost, kernels resend): counted once.
    with ThreadPoolExecutor(len(posts)) as pool:
        again = list(pool.map(lambda p: _post(p[0], hub, p[1]), posts))
    assert sum(a.json()["duplicates"] for a in again) == 30
    after = _cells(_progress(teacher))
    assert after["carol"][burst] == ("passed", 15) and after["dave"][burst] == ("passed", 15)
    assert {n: {k: v for k, v in c.items() if k != burst} for n, c in after.items()} == before
