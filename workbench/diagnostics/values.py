"""Plain values the facts and the checks share: version strings and byte sizes."""

from __future__ import annotations

import re

GiB = 1024**3
MiB = 1024**2


def _version_tuple(text: str | None) -> tuple[int, ...]:
    """"12.4" -> (12, 4); "2.13.0+cpu" -> (2, 13, 0); junk -> ()."""
    if not text:
        return ()
    numbers = []
    for part in str(text).split("+")[0].split("."):
        match = re.match(r"\d+", part)
        if not match:
            break
        numbers.append(int(match.group()))
    return tuple(numbers)


def format_bytes(n: int | None) -> str:
    if n is None:
        return "unknown"
    if n >= GiB:
        return f"{n / GiB:.1f} GiB"
    return f"{n / MiB:.0f} MiB"
