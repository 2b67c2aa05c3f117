"""Run folders someone else made: the runs table, ``watch``, the sweep's wait and the runs widget
show them as broken, with the reason, in bounded time and memory (security round 4, item 6).

Each hostile folder is read in a child process with a time limit and a 1.5 GiB address-space
limit, so a reader that blocks on a FIFO or reads ``/dev/zero`` fails the test instead of
hanging it or exhausting the machine.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

READ_LIMIT_S = 60  # generous on two busy cores; a hang is forever
MEMORY_LIMIT = 3 << 29  # 1.5 GiB of address space for the child


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def in_child(code: str, *args: str) -> dict:
    """Run ``code`` (which prints one JSON line last) in a bounded child; its answer, or why it failed."""
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                              timeout=READ_LIMIT_S, preexec_fn=_limits)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still reading after {READ_LIMIT_S} s (blocked on a FIFO, or an endless walk)")
    assert done.returncode == 0, f"the reader failed (memory?):\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def good_log(folder: Path) -> None:
    from workbench.engine.events import EventLog

    log = EventLog(folder, tensorboard=False)
    log.write("start", model="m", total_steps=2, config={"task": "classification"})
    log.write("end", status="completed", step=2, metrics={})
    log.close()


def fifo(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)


# name -> (make the hostile folder under root/bad, words the broken row's problem must hold)
HOSTILE = {
    "events_fifo": (lambda bad: fifo(bad / "events.jsonl"), "named pipe"),
    "lock_fifo": (lambda bad: (good_log(bad), fifo(bad / ".workbench.lock")), "named pipe"),
    "run_json_fifo": (lambda bad: (fifo(bad / "checkpoints" / "step-000001" / "run.json"),
                                   (bad / "events.jsonl").write_text("")), "no start event"),
    "events_dev_zero": (lambda bad: (bad.mkdir(), (bad / "events.jsonl").symlink_to("/dev/zero")),
                        "character device"),
    "events_sparse_50_gb": (lambda bad: (bad.mkdir(), os.truncate(_touch(bad / "events.jsonl"), 50 << 30)),
                            "bytes, more than"),
    "two_links_to_dot": (lambda bad: (good_log(bad), (bad / "a").symlink_to("."), (bad / "b").symlink_to(".")),
                         "a loop"),
    "link_to_the_root": (lambda bad: (bad.mkdir(), (bad / "up").symlink_to(bad.parent)), "a loop"),
}


def _touch(path: Path) -> Path:
    path.touch()
    return path


@pytest.fixture(params=sorted(HOSTILE))
def hostile(request, tmp_path) -> tuple[Path, str]:
    make, words = HOSTILE[request.param]
    root = tmp_path / "outputs"
    good_log(root / "good")
    make(root / "bad")
    return root, words


TABLE = """
    import json, sys
    from workbench.engine.runs import runs
    table = runs(sys.argv[1])
    print(json.dumps({r.name: [r.status, r.problem] for r in table}))
"""


def test_the_runs_table_shows_a_hostile_folder_as_broken(hostile):
    root, words = hostile
    rows = in_child(TABLE, str(root))
    assert rows.pop("good") == ["completed", None], "a good run beside it still reads"
    broken = {name: problem for name, (status, problem) in rows.items() if status == "broken"}
    assert broken and all(problem for problem in broken.values()), rows
    assert any(words in problem for problem in broken.values()), (words, rows)


WATCH = """
    import json, sys
    from workbench.engine.progress import ConsoleProgress
    from workbench.engine.watcher import watch
    from workbench.errors import WorkbenchError
    said = {}
    for follow in (False, True):
        try:
            watch(sys.argv[1], ConsoleProgress(save_chart=False), follow=follow, poll_s=0.1, wait_for_log_s=1)
            said[str(follow)] = "returned"
        except WorkbenchError as exc:
            said[str(follow)] = str(exc)
    print(json.dumps(said))
"""


@pytest.mark.parametrize(("name", "words"), [("events_fifo", "named pipe"), ("events_dev_zero", "character device"),
                                             ("events_sparse_50_gb", "bytes")])  # following: a 16 MiB "line"
def test_watch_refuses_a_log_that_is_not_a_file(tmp_path, name, words):
    make, _ = HOSTILE[name]
    make(tmp_path / "bad")
    said = in_child(WATCH, str(tmp_path / "bad"))
    for follow, message in said.items():
        assert "cannot be read as a run's event log" in message and words in message and "Fix:" in message, \
            (follow, message)


WAIT_AND_WIDGET = """
    import json, sys, time
    from workbench.sweep.runner import _wait_until_free
    from workbench.widgets.runs import runs_browser
    started = time.monotonic()
    _wait_until_free(__import__("pathlib").Path(sys.argv[1]) / "bad", patience_s=5)
    waited = time.monotonic() - started
    browser = runs_browser(sys.argv[1], live_every_s=0.1)
    browser.select.value = tuple(browser.select.options[i][1] for i in range(len(browser.select.options)))
    browser.redraw()
    browser.close()
    print(json.dumps({"waited": waited, "rows": len(browser.table)}))
"""


@pytest.mark.parametrize("name", ["lock_fifo", "events_dev_zero"])
def test_the_sweeps_wait_and_the_runs_widget_do_not_hang(tmp_path, name):
    make, _ = HOSTILE[name]
    good_log(tmp_path / "good")
    make(tmp_path / "bad")
    answer = in_child(WAIT_AND_WIDGET, str(tmp_path))
    assert answer["rows"] == 2 and answer["waited"] < 10, answer


def test_a_run_refuses_a_lock_that_is_a_fifo(tmp_path):
    """The writer's side: fit() would block reading the record of a FIFO it took for its lock."""
    fifo(tmp_path / ".workbench.lock")
    answer = in_child("""
        import json, sys
        from workbench.engine import run_lock
        from workbench.errors import WorkbenchError
        try:
            run_lock.acquire(sys.argv[1])
            print(json.dumps("acquired"))
        except WorkbenchError as exc:
            print(json.dumps(str(exc)))
    """, str(tmp_path))
    assert "is not a file" in answer and "Fix: remove it" in answer, answer
