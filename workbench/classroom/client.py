"""In the student's kernel: keep every check result, and under a hub send it to the teacher.

Every result is appended to a local file (``results.jsonl`` in :func:`results_dir`), the
student's own record on their server. Where to send it is decided once per result
(:func:`destination`):

* **standalone** (``workbench lab``), **headless** (papermill, ``workbench regress``,
  nbconvert) or **CI** (``CI`` set): nowhere. No socket is opened, the local file is all.
* **a JupyterHub class**: the hub gave the server its token (``JUPYTERHUB_API_TOKEN``, which
  kernels inherit) and the hub's config gave the service's address
  (``WORKBENCH_CLASSROOM_URL``). The result goes to the outbox (``unsent.jsonl``), then a
  background thread posts the whole outbox to the service with the kernel's hub token, and
  removes what the service acknowledged.

The student's cell waits for that thread at most :data:`WAIT_S` seconds and never sees an
exception: a service that is down, slow or misconfigured costs that wait at most, and the
result stays in the outbox until a later check (in this kernel or the next) sends it. Each
result carries its own id, so one that is sent twice (the answer was lost, not the result)
is counted once.

Standard library only (and ``engine/runtime.py``, which says whether a kernel is headless):
this runs in every kernel, next to the student's code.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from workbench.classroom.record import CheckRecord, RecordError, from_json, new_record

URL_VARIABLE = "WORKBENCH_CLASSROOM_URL"
DIR_VARIABLE = "WORKBENCH_COURSE_DIR"
WAIT_S = 1.0  # the longest a check cell waits for the service (a local service answers in ms)
SEND_TIMEOUT_S = 10.0  # per request, in the background thread
BATCH = 100  # results per POST (the service takes up to 200)
MAX_UNSENT = 2000  # a service that refuses for weeks must not grow the outbox without end
RESULTS_PATH = "api/results"  # under the service's prefix

RECORDED = "   ↳ recorded for your teacher"
KEPT = "   ↳ saved on your server; it reaches your teacher with a later check"
REFUSED = "   ↳ the class service refused this result: tell your teacher (workbench versions differ?)"

# One sender at a time per kernel; a second check waits for the first send in the background.
_send_lock = threading.Lock()


@dataclass(frozen=True)
class Destination:
    url: str  # the service's results endpoint
    token: str  # the kernel's hub token (never logged, never written to a file)


def results_dir(environ=None) -> Path:
    """``$WORKBENCH_COURSE_DIR``, else ``$XDG_DATA_HOME/workbench/course``, else
    ``~/.local/share/workbench/course`` (the image sets it under /workspace)."""
    env = os.environ if environ is None else environ
    if env.get(DIR_VARIABLE):
        return Path(env[DIR_VARIABLE])
    base = env.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "workbench" / "course"


def destination(environ=None) -> Destination | None:
    """Where results go from this process: the class service, or None (local file only)."""
    env = os.environ if environ is None else environ
    url, token = env.get(URL_VARIABLE, "").strip(), env.get("JUPYTERHUB_API_TOKEN", "")
    if not url or not token or not env.get("JUPYTERHUB_USER"):
        return None  # standalone, or a hub without the class service
    if env.get("CI", "").strip().lower() not in ("", "0", "false"):
        return None  # CI runs notebooks as tests: nobody's results
    from workbench.engine.runtime import headless_runner

    if headless_runner() is not None:
        return None  # papermill, regress, nbconvert: a run nobody is sitting at
    return Destination(url=url.rstrip("/") + "/" + RESULTS_PATH, token=token)


def report(course: str, notebook: str, exercise: str, passed: bool, *,
           environ=None, wait_s: float = WAIT_S) -> str | None:
    """Keep one result, and send it where :func:`destination` says. Never raises.

    Returns the line to show under the check (None standalone: the student sees nothing new).
    """
    try:
        return _report(course, notebook, exercise, passed, environ, wait_s)
    except Exception:  # a result that cannot be kept must never fail the student's cell
        return None


def _report(course, notebook, exercise, passed, environ, wait_s) -> str | None:
    from workbench import __version__

    folder = results_dir(environ)
    record = new_record(course, notebook, exercise, passed,
                        _attempts_so_far(folder, course, notebook, exercise) + 1, __version__)
    _append(folder / "results.jsonl", [record])
    where = destination(environ)
    if where is None:
        return None
    queued = _append(folder / "unsent.jsonl", [record], limit=MAX_UNSENT)
    extra = [] if queued else [record]  # a disk that refused the outbox: send from memory
    outcome: list[str] = []

    def send() -> None:
        with suppress(Exception):  # a thread's traceback would land in the student's cell
            outcome.append(send_unsent(folder, where, extra))

    sender = threading.Thread(target=send, name="workbench-classroom-send", daemon=True)
    sender.start()
    sender.join(wait_s)
    return {"sent": RECORDED, "refused": REFUSED}.get(outcome[0] if outcome else "kept", KEPT)


def send_unsent(folder: Path, where: Destination, extra: list[CheckRecord] = ()) -> str:
    """Post the outbox (plus ``extra``, results that could not be queued) to the service and
    drop what it answered. Returns "sent" (nothing left), "kept" (some wait for a later try)
    or "refused" (the service will never take them: dropped, and the student is told)."""
    with _send_lock:
        pending = _read(folder / "unsent.jsonl") + list(extra)
        done: set[str] = set()
        outcome = "sent"
        for start in range(0, len(pending), BATCH):
            batch = pending[start:start + BATCH]
            answer = _post(where, batch)
            if answer == "kept":
                outcome = "kept"
                break
            done.update(r.id for r in batch)
            if answer == "refused":
                outcome = "refused"
        if done:
            _remove(folder / "unsent.jsonl", done)
    return outcome


def _post(where: Destination, batch: list[CheckRecord]) -> str:
    body = json.dumps({"results": [r.to_json() for r in batch]}).encode()
    request = urllib.request.Request(where.url, data=body, method="POST", headers={
        "Authorization": f"token {where.token}", "Content-Type": "application/json"})
    try:
        with _opener().open(request, timeout=SEND_TIMEOUT_S) as response:
            return "sent" if 200 <= response.status < 300 else "kept"
    except urllib.error.HTTPError as error:
        # 400: a body the service will never take (a client and a service that disagree),
        # resending it would fail forever. 401/403/5xx: the hub's config or the service: keep.
        return "refused" if error.code == 400 else "kept"
    except (OSError, ValueError):
        return "kept"


def _opener() -> urllib.request.OpenerDirector:
    # No proxy from the environment (the service is inside the hub's network, and a proxy
    # would see the hub token) and no redirects (a redirect means a wrong URL, not a result).
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    return urllib.request.build_opener(urllib.request.ProxyHandler({}), NoRedirect)


# --- the two files ------------------------------------------------------------------


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path``'s lock file: two kernels of one student share the files."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _append(path: Path, records: list[CheckRecord], limit: int | None = None) -> bool:
    try:
        with _locked(path):
            with open(path, "a", encoding="utf-8") as out:
                for record in records:
                    out.write(json.dumps(record.to_json()) + "\n")
            if limit is not None:
                kept = _read(path)
                if len(kept) > limit:
                    _write(path, kept[-limit:])
        return True
    except OSError:
        return False  # a read-only or full disk: the result still goes out in memory


def _read(path: Path) -> list[CheckRecord]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            records.append(from_json(json.loads(line)))
        except (ValueError, RecordError):
            continue  # a torn last line after a crash, or a hand edit: skip it
    return records


def _write(path: Path, records: list[CheckRecord]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r.to_json()) + "\n" for r in records), encoding="utf-8")
    tmp.replace(path)


def _remove(path: Path, ids: set[str]) -> None:
    try:
        with _locked(path):
            _write(path, [r for r in _read(path) if r.id not in ids])
    except OSError:
        pass


def _attempts_so_far(folder: Path, course: str, notebook: str, exercise: str) -> int:
    return sum(1 for r in _read(folder / "results.jsonl")
               if (r.course, r.notebook, r.exercise) == (course, notebook, exercise))
