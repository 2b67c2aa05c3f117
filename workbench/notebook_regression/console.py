"""Where the harness's progress lines go: a callable, so tests and callers can capture them."""

from __future__ import annotations

from collections.abc import Callable

Log = Callable[[str], None]


def print_line(line: str) -> None:
    # Flushed: CI shows the log live, and a killed run still has its last lines.
    print(line, flush=True)
