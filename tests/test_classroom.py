"""The class service's two ends without a hub: what a check cell keeps and sends, what the
database keeps. The whole path through a real JupyterHub (tokens, scopes, OAuth, the page,
403s, 30 posts at once through the proxy) is tests/test_hub.py.

The kernel side is checked against a small HTTP server of the test's own that records what
arrives: what is under test here is the client's side of the wire (when it opens a socket,
what it sends, what it keeps), and that it never fails or holds up a cell.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import nbformat
import pytest
import yaml

from workbench.classroom import client, hub_config
from workbench.classroom.record import FIELDS, RecordError, from_json, new_record
from workbench.classroom.store import ClassStore, class_table, table_csv
from workbench.course import checks as course_checks

REPO = Path(__file__).resolve().parents[1]
HUB_VARIABLES = {"JUPYTERHUB_API_TOKEN": "kernel-token-abc", "JUPYTERHUB_USER": "carol",
                 "JUPYTERHUB_API_URL": "http://127.0.0.1:9/hub/api"}


@pytest.fixture
def course_dir(tmp_path, monkeypatch) -> Path:
    """A fresh local record, and none of the hub's or CI's variables."""
    folder = tmp_path / "course"
    monkeypatch.setenv(client.DIR_VARIABLE, str(folder))
    for name in (*HUB_VARIABLES, client.URL_VARIABLE, "CI", "WORKBENCH_HEADLESS"):
        monkeypatch.delenv(name, raising=False)
    return folder


@pytest.fixture
def no_network(monkeypatch) -> list:
    """Every socket connection or name lookup from Python fails, and is noted."""
    tried: list = []

    def refuse(*args, **kwargs):
        tried.append(args[1:] or args)
        raise OSError("the test forbids network access here")

    monkeypatch.setattr(socket.socket, "connect", lambda self, address: refuse(self, address))
    monkeypatch.setattr(socket.socket, "connect_ex", lambda self, address: refuse(self, address))
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: refuse(None, *a))
    return tried


class Service:
    """A stand-in for the class service's endpoint: answers ``status`` and keeps each request."""

    def __init__(self, status: int = 200):
        self.requests: list[dict] = []
        self.status = status
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "auth": self.headers.get("Authorization"),
                                       "body": body})
                answer = json.dumps({"stored": len(body["results"])}).encode()
                self.send_response(outer.status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/services/classroom/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def results(self) -> list[dict]:
        return [r for request in self.requests for r in request["body"]["results"]]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def service():
    running = Service()
    yield running
    running.close()


def _under_hub(monkeypatch, url: str) -> None:
    for name, value in HUB_VARIABLES.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(client.URL_VARIABLE, url)


def _kept(folder: Path, name: str = "results.jsonl") -> list[dict]:
    path = folder / name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# --- the kernel side --------------------------------------------------------------------------


def test_standalone_a_check_keeps_its_result_here_and_opens_no_socket(course_dir, no_network, monkeypatch,
                                                                     capsys):
    # The service's address alone (an image built for a class, run with `workbench lab`) is
    # not a hub: without the hub's token and user nothing goes out.
    monkeypatch.setenv(client.URL_VARIABLE, "http://127.0.0.1:9/services/classroom/")
    assert not course_checks.check_probabilities(lambda x: x * 0)
    assert course_checks.check_probabilities(lambda x: x.softmax(dim=-1))
    out = capsys.readouterr().out.splitlines()
    assert [line[0] for line in out] == [course_checks.FAIL_MARK, course_checks.PASS_MARK]  # nothing new shown
    kept = _kept(course_dir)
    assert [(r["exercise"], r["passed"], r["attempt"]) for r in kept] == [
        (course_checks.EXERCISE_2, False, 1), (course_checks.EXERCISE_2, True, 2)]
    # Names, a verdict, a count, a time, a version: no code, data, message or student name.
    assert all(tuple(r) == FIELDS for r in kept)
    assert kept[0]["course"] == "bert-course" and kept[0]["notebook"] == "02_bert_course"
    assert not (course_dir / "unsent.jsonl").exists()
    assert no_network == []


@pytest.mark.parametrize("runner", [{"CI": "true"}, {"WORKBENCH_HEADLESS": "1"}], ids=["CI", "headless"])
def test_ci_and_headless_runs_send_nothing_even_under_a_hub(course_dir, no_network, monkeypatch, capsys, runner):
    _under_hub(monkeypatch, "http://127.0.0.1:9/services/classroom/")
    for name, value in runner.items():
        monkeypatch.setenv(name, value)
    result = course_checks.verdict("warm-up", True, "fine", notebook="week1", course="intro")
    assert result.passed and capsys.readouterr().out.count("\n") == 1  # the verdict only
    assert [r["exercise"] for r in _kept(course_dir)] == ["warm-up"]
    assert no_network == [] and not (course_dir / "unsent.jsonl").exists()


PAPERMILL_CELLS = [
    # Any socket the kernel's Python opens from here on is noted and refused (the kernel's
    # own channels are ZeroMQ, in C, and unaffected).
    "import socket\ntried = []\n"
    "def refuse(self, address):\n    tried.append(address)\n    raise OSError('no network in this test')\n"
    "socket.socket.connect = refuse\nsocket.socket.connect_ex = refuse",
    "from workbench.course.checks import verdict\n"
    "verdict('warm-up', True, 'fine', notebook='week1', course='intro')\n"
    "verdict('warm-up', False, 'again', notebook='week1', course='intro')",
    "print('TRIED', tried)",
]


def test_a_papermill_run_under_a_hub_sends_nothing(course_dir, monkeypatch, tmp_path):
    """papermill, as a student would run it in a hub terminal: the hub's variables and the
    service's address are all there, and still no connection is made."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    _under_hub(monkeypatch, f"http://127.0.0.1:{listener.getsockname()[1]}/services/classroom/")
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in PAPERMILL_CELLS])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, tmp_path / "checks.ipynb")
    papermill = Path(sys.executable).with_name("papermill")
    run = subprocess.run([str(papermill), str(tmp_path / "checks.ipynb"), str(tmp_path / "out.ipynb"),
                          "--kernel", "python3", "--log-output"], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    with pytest.raises(TimeoutError):
        listener.accept()  # nobody knocked
    listener.close()
    outputs = nbformat.read(tmp_path / "out.ipynb", as_version=4).cells
    printed = "".join(o.get("text", "") for cell in outputs for o in cell.get("outputs", []))
    assert "TRIED []" in printed, printed
    assert "teacher" not in printed  # no "recorded for your teacher" / "saved" line
    assert [r["passed"] for r in _kept(course_dir)] == [True, False]


def test_under_a_hub_the_result_goes_to_the_service_with_the_kernels_token(course_dir, monkeypatch,
                                                                          capsys, service):
    _under_hub(monkeypatch, service.url)
    course_checks.check_tokenized_batch(None, ["a sentence"], None, 8)
    assert capsys.readouterr().out.splitlines()[-1] == client.RECORDED
    [request] = service.requests
    assert request["path"] == "/services/classroom/api/results"
    assert request["auth"] == "token kernel-token-abc"
    assert [(r["exercise"], r["passed"]) for r in request["body"]["results"]] == [(course_checks.EXERCISE_1, False)]
    assert tuple(request["body"]["results"][0]) == FIELDS
    assert _kept(course_dir, "unsent.jsonl") == []
    assert len(_kept(course_dir)) == 1  # the local record is kept under a hub too


def test_a_hanging_service_holds_the_cell_at_most_the_wait_and_the_result_goes_later(
        course_dir, monkeypatch, service):
    hanging = socket.create_server(("127.0.0.1", 0))  # accepts, never answers
    _under_hub(monkeypatch, f"http://127.0.0.1:{hanging.getsockname()[1]}/services/classroom/")
    started = time.monotonic()
    line = client.report("intro", "week1", "warm-up", False, wait_s=0.5)
    waited = time.monotonic() - started
    assert line == client.KEPT
    assert waited < 5, f"the cell waited {waited:.1f} s for a service that never answers"
    assert [r["exercise"] for r in _kept(course_dir, "unsent.jsonl")] == ["warm-up"]
    hanging.close()  # the service "restarts" elsewhere: the stuck send fails, the next one goes
    monkeypatch.setenv(client.URL_VARIABLE, service.url)
    assert client.report("intro", "week1", "second", True, wait_s=15) == client.RECORDED
    assert [r["exercise"] for r in service.results()] == ["warm-up", "second"]
    assert _kept(course_dir, "unsent.jsonl") == []


@pytest.mark.parametrize("status, line, kept", [(403, client.KEPT, 1), (500, client.KEPT, 1),
                                               (400, client.REFUSED, 0)])
def test_what_the_service_refuses_is_kept_unless_it_can_never_be_taken(course_dir, monkeypatch, status, line, kept):
    refusing = Service(status)
    try:
        _under_hub(monkeypatch, refusing.url)
        assert client.report("intro", "week1", "warm-up", True) == line
        assert len(_kept(course_dir, "unsent.jsonl")) == kept  # 400: a malformed body, resending won't help
    finally:
        refusing.close()


def test_a_disk_that_refuses_the_files_never_fails_the_check(tmp_path, course_dir, monkeypatch, capsys, service):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(client.DIR_VARIABLE, str(blocker / "course"))  # cannot be a folder
    assert course_checks.verdict("warm-up", True, "fine", notebook="week1").passed
    _under_hub(monkeypatch, service.url)
    assert course_checks.verdict("warm-up", True, "fine", notebook="week1").passed
    assert capsys.readouterr().out.splitlines()[-1] == client.RECORDED  # sent from memory
    assert [r["exercise"] for r in service.results()] == ["warm-up"]


def test_a_teachers_check_is_named_after_its_notebook(course_dir, monkeypatch):
    monkeypatch.setenv("JPY_SESSION_NAME", "week 1/Lists & loops.ipynb")
    course_checks.verdict("loops", True, "fine")
    assert {k: _kept(course_dir)[0][k] for k in ("course", "notebook", "exercise")} == {
        "course": "workbench", "notebook": "Lists loops", "exercise": "loops"}


def test_a_teachers_odd_names_are_cleaned_and_nothing_ever_raises_into_the_cell(course_dir, monkeypatch):
    course_checks.verdict("<b>Loops</b>!", True, "fine", notebook="week 1", course="intro")
    assert _kept(course_dir)[0]["exercise"] == "b>Loops/b>"  # no "<", no "!"

    def broken(*args, **kwargs):
        raise RuntimeError("an unforeseen failure")

    monkeypatch.setattr(client, "_append", broken)
    assert course_checks.verdict("loops", False, "again", notebook="week 1").passed is False


def test_every_check_cell_of_the_course_reports_its_exercise():
    """Each check cell of notebooks/02 calls a check of checks.py, and each check records one
    of the course's exercises under the course's notebook (the calls are in the source)."""
    import ast
    import inspect

    nb = nbformat.read(REPO / "notebooks" / "02_bert_course.ipynb", as_version=4)
    called = [node.func.attr for cell in nb.cells if cell.cell_type == "code"
              for node in ast.walk(ast.parse(cell.source))
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and getattr(node.func.value, "id", "") == "course_checks"]
    assert called == ["check_tokenized_batch", "check_probabilities", "check_train_step"]
    for name, exercise in zip(called, ("EXERCISE_1", "EXERCISE_2", "EXERCISE_3"), strict=True):
        source = inspect.getsource(getattr(course_checks, name))
        verdicts = source.count("return _verdict(")
        assert verdicts >= 2 and source.count(f"return _verdict({exercise}, ") == verdicts, name
        assert "print(" not in source  # every verdict goes through _verdict (printed and recorded)


# --- what travels -----------------------------------------------------------------------------


def test_a_result_is_checked_field_by_field():
    good = new_record("intro", "week1", "2. logits -> probabilities", True, 3, "0.1.0").to_json()
    assert from_json({**good, "student": "someone-else", "user": "x"}).exercise == good["exercise"]
    for field, bad in [("id", "x" * 32), ("passed", "yes"), ("attempt", 0), ("attempt", True),
                       ("exercise", "<script>"), ("exercise", ""), ("notebook", "a" * 101),
                       ("at", "yesterday"), ("at", "2026-01-05T09:00:00"), ("version", "")]:
        with pytest.raises(RecordError) as error:
            from_json({**good, field: bad})
        assert error.value.field == field


# --- the database -----------------------------------------------------------------------------


def _rec(exercise: str, passed: bool, at: str, course: str = "intro", notebook: str = "week1"):
    record = new_record(course, notebook, exercise, passed, 1, "0.1.0")
    return from_json({**record.to_json(), "at": at})


def test_thirty_writers_at_once_lose_nothing(tmp_path):
    """30 connections (as 30 service processes would be) write the same rows at once."""
    path = tmp_path / "class.sqlite"
    ClassStore(path).close()
    records = [_rec("ex", i % 2 == 0, f"2026-01-05T09:00:{i:02d}.000000Z") for i in range(30)]
    start = threading.Barrier(30)
    failures: list[BaseException] = []

    def write(i: int) -> None:
        store = ClassStore(path)
        try:
            start.wait()
            store.add(f"student{i % 3}", ["section-a"], [records[i]])
        except BaseException as error:  # noqa: BLE001 -- reported below
            failures.append(error)
        finally:
            store.close()

    threads = [threading.Thread(target=write, args=(i,)) for i in range(30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    store = ClassStore(path)
    assert sorted((r["student"], r["attempts"]) for r in store.progress()) == [
        ("student0", 10), ("student1", 10), ("student2", 10)]
    # The same 30 again: already received, counted once.
    assert sum(store.add(f"student{i % 3}", [], [records[i]]).duplicates for i in range(30)) == 30
    assert sum(r["attempts"] for r in store.progress()) == 30


def test_a_row_keeps_first_pass_last_attempt_and_attempts_whatever_order_they_arrive(tmp_path):
    store = ClassStore(tmp_path / "class.sqlite")
    store.add("carol", [], [_rec("ex", True, "2026-01-05T09:10:00.000000Z")])
    store.add("carol", [], [_rec("ex", False, "2026-01-05T09:05:00.000000Z")])  # queued, arrives late
    [row] = store.progress()
    assert (row["attempts"], row["last_passed"], row["first_attempt_at"][11:16], row["first_pass_at"][11:16],
            row["last_attempt_at"][11:16]) == (2, 1, "09:05", "09:10", "09:10")
    store.add("carol", [], [_rec("ex", False, "2026-01-05T09:20:00.000000Z")])
    [row] = store.progress()
    assert (row["attempts"], row["last_passed"], row["first_pass_at"][11:16]) == (3, 0, "09:10")
    cell = class_table(store, None, "teachers")["students"][0]["cells"]
    assert [c["status"] for c in cell.values()] == ["passed"]  # passed once: passed


def test_one_student_cannot_flood_the_table(tmp_path, monkeypatch):
    from workbench.classroom import store as store_module

    monkeypatch.setattr(store_module, "MAX_ROWS_PER_STUDENT", 3)
    store = ClassStore(tmp_path / "class.sqlite")
    outcome = store.add("mallory", [], [_rec(f"ex{i}", True, "2026-01-05T09:00:00.000000Z") for i in range(5)])
    assert outcome.stored == 3 and [i for i, _ in outcome.refused] == [3, 4]
    assert store.add("mallory", [], [_rec("ex0", False, "2026-01-05T09:01:00.000000Z")]).stored == 1  # old rows: fine


def test_the_table_lists_the_class_without_teachers_and_the_csv_runs_no_formula(tmp_path):
    store = ClassStore(tmp_path / "class.sqlite")
    store.add("carol", ["section-a"], [_rec("ex", True, "2026-01-05T09:00:00.000000Z")])
    store.add("tom", ["teachers"], [_rec("ex", True, "2026-01-05T09:00:00.000000Z")])
    roster = {"carol": ["section-a"], "=HYPERLINK(1)": ["section-b"], "tom": ["teachers"]}
    table = class_table(store, roster, "teachers")
    assert [s["name"] for s in table["students"]] == ["=HYPERLINK(1)", "carol"]
    assert table["groups"] == ["section-a", "section-b"]
    lines = table_csv(table).splitlines()
    assert lines[1].startswith("'=HYPERLINK(1),section-b,intro,week1,ex,not yet,0,")
    assert lines[2].startswith("carol,section-a,intro,week1,ex,passed,1,")
    assert len(table_csv(table, group="section-a").splitlines()) == 2


def test_export_and_reset_from_the_command_line(tmp_path, capsys):
    from workbench.cli import main

    db = tmp_path / "class.sqlite"
    ClassStore(db).add("carol", ["section-a"], [_rec("ex", True, "2026-01-05T09:00:00.000000Z")])
    assert main(["classroom", "export", "--db", str(db), "--out", str(tmp_path / "class.csv")]) == 0
    assert (tmp_path / "class.csv").read_text().splitlines()[1].startswith("carol,section-a,intro,week1,ex,passed")
    assert main(["classroom", "reset", "--db", str(db)]) == 1  # says what would go, deletes nothing
    assert "1 student × exercise rows" in capsys.readouterr().out and len(ClassStore(db).progress()) == 1
    assert main(["classroom", "reset", "--db", str(db), "--yes"]) == 0
    assert ClassStore(db).progress() == []
    assert main(["classroom", "export", "--db", str(tmp_path / "missing.sqlite")]) == 2


def test_the_service_refuses_to_start_outside_a_hub(capsys):
    from workbench.cli import main

    assert main(["classroom", "serve", "--db", "/tmp/x.sqlite"]) == 2
    error = capsys.readouterr().err
    assert "JUPYTERHUB_API_TOKEN" in error and "c.JupyterHub.services" in error


# --- the hub's configuration ----------------------------------------------------------------


def test_the_hub_configs_give_the_service_and_the_students_only_the_scopes_needed(tmp_path, monkeypatch):
    from traitlets.config.loader import PyFileConfigLoader

    monkeypatch.setenv("WORKBENCH_HUB_STATE", str(tmp_path))
    config = PyFileConfigLoader("jupyterhub_config.py", str(REPO / "environment" / "hub")).load_config()
    service = next(s for s in config.JupyterHub.services if s["name"] == "classroom")
    assert service["command"][1:5] == ["-m", "workbench", "classroom", "serve"]
    assert f"--db={tmp_path / 'classroom.sqlite'}" in service["command"]
    roles = {r["name"]: r for r in config.JupyterHub.load_roles}
    assert roles["classroom"]["scopes"] == ["list:users", "read:users:groups"]
    assert roles["user"]["scopes"] == ["self", "access:services!service=classroom"]
    assert config.Spawner.server_token_scopes == [
        "users:activity!user", "access:servers!server", "access:services!service=classroom"]
    assert config.DockerSpawner.environment["WORKBENCH_CLASSROOM_URL"].endswith("/services/classroom/")
    assert "teachers" in config.JupyterHub.load_groups

    # Zero to JupyterHub: the same service, roles and scopes in the chart's keys.
    hub = yaml.safe_load((REPO / "environment" / "hub" / "z2jh-values.yaml").read_text())["hub"]
    z2jh_service = hub["services"]["classroom"]
    assert z2jh_service["command"][1:5] == ["-m", "workbench", "classroom", "serve"]
    assert z2jh_service["url"].endswith(":10101") and "--ip=0.0.0.0" in z2jh_service["command"]
    assert hub["loadRoles"]["classroom"] == {"scopes": hub_config.SERVICE_SCOPES, "services": ["classroom"]}
    assert hub["loadRoles"]["user"]["scopes"] == ["self", hub_config.ACCESS_SCOPE]
    assert hub["config"]["KubeSpawner"]["server_token_scopes"] == hub_config.SERVER_TOKEN_SCOPES
    assert 10101 in [p["port"] for p in hub["service"]["extraPorts"]]
    assert 10101 in [p["port"] for rule in hub["networkPolicy"]["ingress"] for p in rule["ports"]]
