"""The processes a real server started, read from /proc, checked against ``server/processes.py``.

``check_process_tree(server_pid, notebook_folders)`` walks every descendant of the server and
asserts, for each, what docs/security.md's process table promises: it is a kind
``PROCESSES`` lists (a process nobody listed fails the test: add it, with what keeps it
clean), a Python process started without the working folder on sys.path (``-P``), the folder
it runs in, PATH and PYTHONPATH with absolute entries only, and no token in its environment.
Used by tests/test_processes.py (`workbench lab`, the entry point) and
tests/test_hub_singleuser.py (JupyterHub mode).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from workbench.server.processes import classify

# Modules a notebook (or another user) could plant where these processes start: each writes a
# marker when imported. The server's own start (jupyterlab, jupyterhub, workbench...) is in
# lab_helpers.PLANTED; these are what a kernel or TensorBoard imports while starting, or later
# on its own (psutil: when a kernel is interrupted or shut down; debugpy: the debugger).
LATE_IMPORTS = ("psutil", "debugpy", "jedi", "packaging", "werkzeug", "absl", "six", "google_auth", "grpc",
                "numpy", "json", "tensorboard_data_server", "matplotlib_inline", "comm")


@dataclass
class Seen:
    pid: int
    argv: list[str]
    cwd: str
    env: dict[str, str]
    kind: str


def children(pid: int) -> list[int]:
    found = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        pass
    return found


def read_process(pid: int) -> tuple[list[str], str, dict[str, str]] | None:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode(errors="replace").split("\0")
        cwd = os.readlink(f"/proc/{pid}/cwd")
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:  # it exited meanwhile
        return None
    env = dict(item.partition("=")[::2] for item in raw.split("\0") if "=" in item)
    return argv, cwd, env


def check_process(pid: int, token: str) -> Seen | None:
    read = read_process(pid)
    if read is None or read[0] == [""]:  # exited, or a zombie
        return None
    argv, cwd, env = read
    kind = classify(argv)
    assert kind is not None, (f"pid {pid} runs {argv[:4]}..., which server/processes.py's PROCESSES does not list: "
                              "add it, with the folder it starts in and what keeps it clean")
    if os.path.basename(argv[0]).startswith("python"):
        assert "-P" in argv[1:3], f"{kind.name} (pid {pid}) runs Python without -P: {argv[:4]}"
    for name in ("PATH", "PYTHONPATH"):
        entries = env.get(name, "").split(os.pathsep) if env.get(name) else []
        relative = [e for e in entries if not os.path.isabs(e)]
        assert not relative, f"{kind.name} (pid {pid}) has {name} entries {relative} (the working folder)"
    assert not any(token in value for value in env.values()), f"{kind.name} (pid {pid}) has the token in its environment"
    return Seen(pid, argv, cwd, env, kind.name)


# What runs under these is the user's own doing (a command typed in a terminal, `!ls` in a cell).
USERS_OWN = {"a terminal", "a Python kernel"}


def check_process_tree(server_pid: int, token: str) -> list[Seen]:
    """Every live descendant of ``server_pid``, each checked (see the module docstring); the
    children of terminals and kernels are not walked (USERS_OWN)."""
    found, stack = [], children(server_pid)
    while stack:
        seen = check_process(stack.pop(), token)
        if seen is not None:
            found.append(seen)
            if seen.kind not in USERS_OWN:
                stack += children(seen.pid)
    return found


def plant_late_imports(folder: Path) -> list[Path]:
    """A module of each LATE_IMPORTS name in ``folder`` (a package for tensorboard); returns the markers."""
    markers = []
    for name in (*LATE_IMPORTS, "tensorboard"):
        marker = folder / f"PLANTED-{name}-RAN"
        path = folder / name / "__init__.py" if name == "tensorboard" else folder / f"{name}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
        markers.append(marker)
    return markers
