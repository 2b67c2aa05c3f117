"""Every process a real lab starts is one ``server/processes.py`` lists, and none runs planted code.

Two real servers -- `workbench lab` and the image's entry point run directly -- each started in a
notebook folder full of planted modules (the server's own imports, and what kernels and
TensorBoard import while starting or later on their own: psutil, debugpy, packaging, a
``tensorboard/`` package...). Each then runs what a student's session runs: a notebook's
kernel in a sub-folder that has planted modules *and* a helper module of its own, a cell,
an interrupt and a restart (ipykernel imports psutil then), a terminal, and the TensorBoard tab.
Then every process under the server is checked against the list (tests/process_tree.py) and no
planted module may have run. JupyterHub mode: tests/test_hub_singleuser.py.

The list itself: docs/security.md's table names every process ``PROCESSES`` holds.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import stat
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
    new_token,
    plant_modules,
    start_lab,
)
from process_tree import check_process_tree, plant_late_imports

from workbench.server.processes import PROCESSES

ENTRYPOINT = REPO / "docker" / "entrypoint.sh"
NOTEBOOK = {"cells": [], "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                     "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}


def _prepare(tmp: Path) -> tuple[Path, list[Path]]:
    root = tmp / "workspace"
    course = root / "course"
    course.mkdir(parents=True)
    (course / "lesson.ipynb").write_text(json.dumps(NOTEBOOK))
    (course / "helpers.py").write_text("VALUE = 42\n")  # a notebook's own helper module
    markers = plant_modules(root) + plant_late_imports(root) + plant_late_imports(course)
    return root, markers


def _start_entrypoint(tmp: Path, root: Path) -> LabServer:
    port, token = free_port(), new_token()
    env = isolated_env(tmp, JUPYTER_TOKEN=token, WORKBENCH_PORT=str(port), WORKBENCH_IP="127.0.0.1",
                       WORKBENCH_NOTEBOOK_DIR=str(root), WORKBENCH_NOTEBOOKS_SOURCE=str(tmp / "none"),
                       WORKBENCH_SERVER_CONFIG=str(SERVER_CONFIG), WORKBENCH_PYTHON=sys.executable,
                       WORKBENCH_ALLOW_ROOT="1" if os.geteuid() == 0 else None,
                       # An empty and a relative entry: both mean the working folder.
                       PATH=f"{os.environ['PATH']}::bin")
    return LabServer(["bash", str(ENTRYPOINT)], env, port, token, tmp / "server.log", cwd=root).wait_ready()


@pytest.fixture(scope="module", params=["workbench lab", "entry point"])
def session(request, tmp_path_factory):
    """A server after a student's session: kernel, cell, interrupt, restart, terminal, TensorBoard."""
    tmp = tmp_path_factory.mktemp("processes")
    root, markers = _prepare(tmp)
    if request.param == "workbench lab":
        server = start_lab(tmp, root, cwd=root, PATH=f"{os.environ['PATH']}::bin")
    else:
        server = _start_entrypoint(tmp, root)
    server.root, server.markers = root, markers
    auth = {"Authorization": f"token {server.token}"}
    try:
        created = http().post(f"{server.url}/api/sessions", headers=auth, json={
            "path": "course/lesson.ipynb", "name": "lesson.ipynb", "type": "notebook", "kernel": {"name": "python3"}})
        assert created.status_code == 201, created.text
        kernel = created.json()["kernel"]["id"]
        server.cell = run_cell(server, kernel, "import sys, helpers\n"
                                               "print(json.dumps({'helper': helpers.VALUE, 'path': sys.path}))")
        terminal = http().post(f"{server.url}/api/terminals", headers=auth)
        assert terminal.status_code == 200
        board = http().get(f"{server.url}/tensorboard/", headers=auth, timeout=150)
        assert board.status_code == 200 and b"TensorBoard" in board.content, board.text[:300]
        server.tree = check_process_tree(server.process.pid, server.token)
        # What ipykernel imports on its own later: psutil when interrupted, and when shut down
        # (a restart shuts the old kernel down).
        assert http().post(f"{server.url}/api/kernels/{kernel}/interrupt", headers=auth).status_code == 204
        assert http().post(f"{server.url}/api/kernels/{kernel}/restart", headers=auth,
                           timeout=120).status_code == 200
        server.restarted = run_cell(server, kernel, "print(json.dumps({'helper': __import__('helpers').VALUE}))")
        yield server
    finally:
        server.stop()


def run_cell(server: LabServer, kernel_id: str, code: str) -> dict:
    """Run ``code`` in the kernel (``json`` is imported first); its last printed JSON line."""
    from jupyter_client import BlockingKernelClient

    client = BlockingKernelClient(connection_file=os.path.join(server.env["JUPYTER_RUNTIME_DIR"],
                                                               f"kernel-{kernel_id}.json"))
    client.load_connection_file()
    client.start_channels(hb=False)
    try:
        client.wait_for_ready(timeout=120)
        seen: list[str] = []
        reply = client.execute_interactive("import json\n" + code, timeout=60,
                                           output_hook=lambda msg: seen.append(msg["content"].get("text", "")))
    finally:
        client.stop_channels()
    assert reply["content"]["status"] == "ok", reply["content"]
    return json.loads("".join(seen).strip().splitlines()[-1])


def test_every_process_is_one_the_list_names(session):
    kinds = {seen.kind for seen in session.tree}
    assert {"a Python kernel", "a terminal", "TensorBoard"} <= kinds, kinds


def test_a_kernel_runs_in_its_notebooks_folder_and_imports_its_helpers(session):
    kernel = next(s for s in session.tree if s.kind == "a Python kernel")
    assert kernel.cwd == str(session.root / "course")
    assert session.cell["helper"] == 42 and session.restarted["helper"] == 42
    # Once a cell runs the folder is importable, after everything installed: never ahead of it.
    path = session.cell["path"]
    assert path.index("") == len(path) - 1, path


def test_no_planted_module_ran(session):
    """Planted beside the notebook and in the server's folder: the server, the kernel (starting,
    interrupted, restarted) and TensorBoard imported none of them."""
    assert [m.name for m in session.markers if m.exists()] == []


def test_tensorboard_listens_on_a_private_unix_socket_only(session):
    """TensorBoard itself has no login: no TCP port anyone on the machine could reach, a socket in a
    folder only this user can open, and not the notebook folder as its working folder."""
    board = next(s for s in session.tree if s.kind == "TensorBoard")
    inodes = {os.readlink(f"/proc/{board.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{board.pid}/fd")}
    inodes = {int(m.group(1)) for link in inodes if (m := re.fullmatch(r"socket:\[(\d+)\]", link))}
    listening_tcp = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[9]) in inodes:  # 0A: LISTEN
                listening_tcp.append(fields[1])
    assert listening_tcp == [], f"TensorBoard listens on TCP {listening_tcp}"
    unix = [line.split()[-1] for line in Path("/proc/net/unix").read_text().splitlines()[1:]
            if len(line.split()) == 8 and int(line.split()[6]) in inodes]
    assert len(unix) == 1, unix
    assert board.cwd == str(Path(unix[0]).parent) != str(session.root)
    folder = Path(unix[0]).parent
    info = folder.stat()
    assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.geteuid(), oct(info.st_mode)
    if os.geteuid() == 0:  # another user of the machine cannot connect to it
        assert connect_as(65534, unix[0]) == errno.EACCES
    # The lab itself still reaches it (with the token).
    auth = {"Authorization": f"token {session.token}"}
    assert http().get(f"{session.url}/tensorboard/data/runs", headers=auth).status_code == 200


def connect_as(uid: int, path: str) -> int:
    """Connect to the Unix socket ``path`` as user ``uid`` (a forked child); 0 or the errno."""
    pid = os.fork()
    if pid == 0:  # the child: drop to uid, connect, report through the exit status
        code = 1
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX) as sock:
                sock.connect(path)
            code = 0
        except OSError as exc:
            code = exc.errno or 1
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_kernels_and_terminals_inherit_absolute_path_entries(session):
    """The server was started with an empty and a relative PATH entry (the working folder)."""
    for seen in session.tree:
        assert "" not in seen.env["PATH"].split(":") and "bin" not in seen.env["PATH"].split(":"), seen.kind


def test_the_security_page_lists_every_process():
    page = (REPO / "docs" / "security.md").read_text()
    table = page.split("## Every process the lab starts", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    named = [row.split("|")[1].strip() for row in rows[1:]]
    assert named == [p.name for p in PROCESSES], "docs/security.md's process table and PROCESSES differ"


def test_sweep_and_regress_kernels_start_like_the_servers():
    """papermill's kernels (workbench sweep, workbench regress) run in the notebook's folder too."""
    from workbench.server.kernels import SafePathKernelManager
    from workbench.server.processes import KERNEL_LAUNCHER, classify

    argv = SafePathKernelManager(kernel_name="python3").format_kernel_cmd()
    assert KERNEL_LAUNCHER in argv and classify(argv).name == "a Python kernel"
