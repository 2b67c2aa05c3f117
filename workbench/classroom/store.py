"""The class's results in SQLite, next to the hub: one row per student × exercise.

Tables (``SCHEMA``):

* ``progress``: one row per student × course × notebook × exercise: attempts, the first and
  the last attempt, whether the last one passed, the first pass. This is what the teacher sees.
* ``received``: the id of every result taken, so a result the kernel sends twice (its answer
  was lost, not the result) counts once.
* ``students``: each student's groups as the hub gave them with their last result, and when
  that was (the teacher's "last activity").

Concurrency: the database is in WAL mode (readers never block the writer) and every write
is one ``BEGIN IMMEDIATE`` transaction (a writer takes the lock before reading, so two
writers never both read the old row and lose an attempt), with a busy timeout for a second
process (``workbench classroom export`` while the service runs). The service itself is one
process and one thread: its writes come one after the other anyway.

Nothing here is the student's code or data: names, counts and times.
"""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from workbench.classroom.record import TIME_FORMAT, CheckRecord

SCHEMA = """
CREATE TABLE IF NOT EXISTS progress (
    student TEXT NOT NULL, course TEXT NOT NULL, notebook TEXT NOT NULL, exercise TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    first_attempt_at TEXT NOT NULL,
    last_attempt_at TEXT NOT NULL,
    last_passed INTEGER NOT NULL,
    first_pass_at TEXT,
    version TEXT NOT NULL,
    PRIMARY KEY (student, course, notebook, exercise)
);
CREATE TABLE IF NOT EXISTS received (
    id TEXT PRIMARY KEY, student TEXT NOT NULL, received_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS students (
    student TEXT PRIMARY KEY, groups TEXT NOT NULL, last_seen TEXT NOT NULL
);
"""
# The times in a row are the student's clock (a result queued during a network problem
# arrives later than it ran); one from the future is taken as "now".
_UPSERT = """
INSERT INTO progress VALUES (:student, :course, :notebook, :exercise, 1, :at, :at, :passed,
                             :pass_at, :version)
ON CONFLICT (student, course, notebook, exercise) DO UPDATE SET
    attempts = attempts + 1,
    first_attempt_at = min(first_attempt_at, excluded.first_attempt_at),
    last_passed = CASE WHEN excluded.last_attempt_at >= last_attempt_at
                       THEN excluded.last_passed ELSE last_passed END,
    version = CASE WHEN excluded.last_attempt_at >= last_attempt_at
                   THEN excluded.version ELSE version END,
    last_attempt_at = max(last_attempt_at, excluded.last_attempt_at),
    first_pass_at = CASE WHEN excluded.first_pass_at IS NULL THEN first_pass_at
                         WHEN first_pass_at IS NULL THEN excluded.first_pass_at
                         ELSE min(first_pass_at, excluded.first_pass_at) END
"""
# A student's own exercises are capped: a loop posting made-up exercise names must not
# turn the teacher's table into thousands of columns.
MAX_ROWS_PER_STUDENT = 500
CSV_COLUMNS = ("student", "groups", "course", "notebook", "exercise", "status", "attempts",
               "first_attempt_at", "first_pass_at", "last_attempt_at", "last_passed")


@dataclass
class Stored:
    """What one POST changed: results stored, already seen, refused (index, reason)."""

    stored: int = 0
    duplicates: int = 0
    refused: list[tuple[int, str]] = field(default_factory=list)


class ClassStore:
    """The database at ``path`` (created on first use). One connection per instance."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: transactions are the explicit BEGIN IMMEDIATE below.
        self.db = sqlite3.connect(self.path, timeout=10.0, isolation_level=None,
                                  check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")  # with WAL: durable at each checkpoint, fast
        self.db.execute("PRAGMA busy_timeout=10000")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    def add(self, student: str, groups: Iterable[str], records: Iterable[CheckRecord],
            received_at: datetime | None = None) -> Stored:
        """Store ``records`` for ``student`` (the name the hub gave), in one transaction."""
        received = (received_at or datetime.now(timezone.utc)).strftime(TIME_FORMAT)
        outcome = Stored()
        cursor = self.db.cursor()
        cursor.execute("BEGIN IMMEDIATE")
        try:
            rows = cursor.execute("SELECT count(*) FROM progress WHERE student = ?",
                                  (student,)).fetchone()[0]
            for index, record in enumerate(records):
                key = (student, record.course, record.notebook, record.exercise)
                exists = cursor.execute(
                    "SELECT 1 FROM progress WHERE student=? AND course=? AND notebook=? AND exercise=?",
                    key).fetchone()
                if not exists and rows >= MAX_ROWS_PER_STUDENT:
                    outcome.refused.append((index, f"more than {MAX_ROWS_PER_STUDENT} exercises for one student"))
                    continue
                cursor.execute("INSERT OR IGNORE INTO received VALUES (?, ?, ?)",
                               (record.id, student, received))
                if cursor.rowcount == 0:
                    outcome.duplicates += 1
                    continue
                at = min(record.at, received)
                cursor.execute(_UPSERT, {
                    "student": student, "course": record.course, "notebook": record.notebook,
                    "exercise": record.exercise, "at": at, "passed": int(record.passed),
                    "pass_at": at if record.passed else None, "version": record.version})
                rows += 0 if exists else 1
                outcome.stored += 1
            cursor.execute(
                "INSERT INTO students VALUES (?, ?, ?) ON CONFLICT (student) DO UPDATE SET "
                "groups = excluded.groups, last_seen = max(last_seen, excluded.last_seen)",
                (student, json.dumps(sorted(groups)), received))
            cursor.execute("COMMIT")
        except BaseException:
            cursor.execute("ROLLBACK")
            raise
        return outcome

    def progress(self) -> list[dict]:
        """Every row of ``progress``, as dicts, in a stable order."""
        cursor = self.db.execute(
            "SELECT student, course, notebook, exercise, attempts, first_attempt_at, "
            "last_attempt_at, last_passed, first_pass_at FROM progress "
            "ORDER BY course, notebook, exercise, student")
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor]

    def students(self) -> dict[str, dict]:
        """student -> {"groups": [...], "last_seen": time of their last result}."""
        return {name: {"groups": json.loads(groups), "last_seen": last_seen}
                for name, groups, last_seen in self.db.execute("SELECT * FROM students")}

    def reset(self) -> int:
        """Forget every result (between two classes). Returns how many rows went."""
        cursor = self.db.cursor()
        cursor.execute("BEGIN IMMEDIATE")
        try:
            count = cursor.execute("SELECT count(*) FROM progress").fetchone()[0]
            for table in ("progress", "received", "students"):
                cursor.execute(f"DELETE FROM {table}")  # noqa: S608 -- fixed names
            cursor.execute("COMMIT")
        except BaseException:
            cursor.execute("ROLLBACK")
            raise
        self.db.execute("VACUUM")  # the deleted rows leave the file too
        return count


# --- the class table: what the teacher's page and the CSV show ---------------------------


def class_table(store: ClassStore, roster: dict[str, list[str]] | None,
                teachers_group: str) -> dict:
    """Students × exercises for the page: every student of the roster (from the hub; None
    when the hub could not be asked) and everyone with a result, less the teachers."""
    rows = store.progress()
    seen = store.students()
    groups = {name: info["groups"] for name, info in seen.items()}
    groups.update(roster or {})  # the hub's groups are current; stored ones are from the last post
    names = sorted(n for n in set(groups) | {r["student"] for r in rows}
                   if teachers_group not in groups.get(n, []))
    exercises = sorted({(r["course"], r["notebook"], r["exercise"]) for r in rows})
    cells: dict[str, dict] = {name: {} for name in names}
    for r in rows:
        if r["student"] in cells:
            status = "passed" if r["first_pass_at"] else "tried"
            cells[r["student"]]["\x1f".join((r["course"], r["notebook"], r["exercise"]))] = {
                "status": status, "attempts": r["attempts"], "first_attempt_at": r["first_attempt_at"],
                "first_pass_at": r["first_pass_at"],
                "last_attempt_at": r["last_attempt_at"], "last_passed": bool(r["last_passed"])}
    return {
        "exercises": [{"key": "\x1f".join(e), "course": e[0], "notebook": e[1], "exercise": e[2]}
                      for e in exercises],
        "students": [{"name": n, "groups": groups.get(n, []),
                      "last_activity": seen.get(n, {}).get("last_seen"), "cells": cells[n]}
                     for n in names],
        "groups": sorted({g for n in names for g in groups.get(n, [])}),
        "roster_from_hub": roster is not None,
    }


def table_csv(table: dict, group: str | None = None) -> str:
    """The table in long form (one line per student × exercise, "not yet" included), ready
    for a spreadsheet. Cells that start like a formula are quoted, so no spreadsheet runs one."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for student in table["students"]:
        if group and group not in student["groups"]:
            continue
        for ex in table["exercises"]:
            cell = student["cells"].get(ex["key"])
            values = [student["name"], " ".join(student["groups"]), ex["course"], ex["notebook"],
                      ex["exercise"], cell["status"] if cell else "not yet",
                      cell["attempts"] if cell else 0, cell["first_attempt_at"] if cell else "",
                      cell["first_pass_at"] if cell else "", cell["last_attempt_at"] if cell else "",
                      ("yes" if cell["last_passed"] else "no") if cell else ""]
            writer.writerow([_no_formula(v) for v in values])
    return out.getvalue()


def _no_formula(value: object) -> object:
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value

