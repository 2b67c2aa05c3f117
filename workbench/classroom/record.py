"""One check result as it travels from a student's kernel to the class service.

What a result holds is decided here, once, for both ends: the kernel builds a
:class:`CheckRecord` (``client.py``) and the service re-validates every field of what
arrives (``service.py``), because the body of a POST is whatever the sender chose to send.

A result says *which* exercise was checked and *whether* it passed, when, at which attempt,
with which workbench version. Never the student's code, data or the check's message (that
may quote the student's error or data). Never the student's name either: the service takes
the name from the hub for the token that came with the request.

Standard library only: this module runs in every kernel.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

# Names a teacher reads in a table header: letters, digits, spaces and a little punctuation,
# at most 100 characters. No control characters, no markup (the page shows them as text
# anyway; the limit keeps a typo or a prank from blowing up the table).
_NAME = re.compile(r"^[\w][\w .,:;()+\-/>#']{0,99}$")
_ID = re.compile(r"^[0-9a-f]{32}$")
FIELDS = ("id", "course", "notebook", "exercise", "passed", "attempt", "at", "version")
# The clock format stored everywhere: fixed width, UTC, so strings sort like times.
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


class RecordError(ValueError):
    """A result that cannot be stored: ``field`` names what is wrong."""

    def __init__(self, field: str, problem: str):
        self.field = field
        super().__init__(f"{field}: {problem}")


@dataclass(frozen=True)
class CheckRecord:
    id: str  # 32 hex characters chosen by the kernel: a result sent twice is stored once
    course: str  # e.g. "bert-course"
    notebook: str  # e.g. "02_bert_course"
    exercise: str  # e.g. "1. tokenized batch"
    passed: bool
    attempt: int  # this student's count for the exercise, from the kernel's local record (1 = first)
    at: str  # when the check ran, UTC (TIME_FORMAT)
    version: str  # the workbench version that ran the check

    def to_json(self) -> dict:
        return asdict(self)


def now() -> str:
    return datetime.now(timezone.utc).strftime(TIME_FORMAT)


def new_record(course: str, notebook: str, exercise: str, passed: bool, attempt: int,
               version: str) -> CheckRecord:
    """A fresh result; raises RecordError for a name the service would refuse."""
    return from_json({"id": uuid.uuid4().hex, "course": course, "notebook": notebook,
                      "exercise": exercise, "passed": passed, "attempt": attempt, "at": now(),
                      "version": version})


def clean_name(text: str) -> str:
    """A teacher's notebook or exercise name made acceptable: outer spaces and markup gone."""
    kept = re.sub(r"\s+", " ", re.sub(r"[^\w .,:;()+\-/>#']", "", str(text))).strip()
    return kept[:100] or "unnamed"


def _name(obj: dict, field: str) -> str:
    value = obj.get(field)
    if not isinstance(value, str) or not _NAME.match(value):
        raise RecordError(field, f"{value!r} is not a name (1-100 letters, digits, spaces, .,:;()+-/>#')")
    return value


def parse_time(value: object, field: str = "at") -> datetime:
    if not isinstance(value, str):
        raise RecordError(field, f"{value!r} is not a time")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise RecordError(field, f"{value!r} is not an ISO 8601 time") from None
    if parsed.tzinfo is None:
        raise RecordError(field, f"{value!r} has no time zone")
    return parsed.astimezone(timezone.utc)


def from_json(obj: object) -> CheckRecord:
    """A CheckRecord from decoded JSON, every field checked; other keys are ignored
    (a ``student`` or ``user`` key in particular: the name comes from the hub)."""
    if not isinstance(obj, dict):
        raise RecordError("result", f"expected an object, got {type(obj).__name__}")
    record_id = obj.get("id")
    if not isinstance(record_id, str) or not _ID.match(record_id):
        raise RecordError("id", f"{record_id!r} is not 32 lowercase hex characters")
    passed = obj.get("passed")
    if not isinstance(passed, bool):
        raise RecordError("passed", f"{passed!r} is not true or false")
    attempt = obj.get("attempt")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or not 1 <= attempt <= 1_000_000:
        raise RecordError("attempt", f"{attempt!r} is not a count from 1")
    version = obj.get("version")
    if not isinstance(version, str) or not 0 < len(version) <= 40 or not version.isprintable():
        raise RecordError("version", f"{version!r} is not a version")
    return CheckRecord(id=record_id, course=_name(obj, "course"), notebook=_name(obj, "notebook"),
                       exercise=_name(obj, "exercise"), passed=passed, attempt=attempt,
                       at=parse_time(obj.get("at")).strftime(TIME_FORMAT), version=version)
