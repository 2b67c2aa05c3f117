"""Where files really live: /proc/self/mountinfo parsed into mounts, and whether we run in a
container (a checkpoint written to a container's own filesystem is deleted with it)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

CONTAINER_MARKERS = ("/.dockerenv", "/run/.containerenv")
CONTAINER_CGROUP_WORDS = ("docker", "kubepods", "containerd", "libpod", "lxc")


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


@dataclass(frozen=True)
class MountEntry:
    """One line of /proc/self/mountinfo (proc(5)); paths already unescaped."""

    mount_id: int
    parent_id: int
    root: str  # the directory of the source filesystem mounted here ("/" for a whole fs)
    mount_point: str
    fstype: str
    source: str


def _unescape_mount(text: str) -> str:
    # The kernel writes space, tab, newline and backslash in paths as octal: \040 \011 \012 \134.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def parse_mountinfo(text: str) -> list[MountEntry]:
    """Parse /proc/self/mountinfo text; malformed lines are skipped."""
    entries = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)  # optional fields (shared:N ...) end at a lone "-"
            entries.append(
                MountEntry(
                    mount_id=int(fields[0]),
                    parent_id=int(fields[1]),
                    root=_unescape_mount(fields[3]),
                    mount_point=_unescape_mount(fields[4]),
                    fstype=fields[sep + 1],
                    source=_unescape_mount(fields[sep + 2]) if len(fields) > sep + 2 else "",
                )
            )
        except (ValueError, IndexError):
            continue
    return entries


def find_mount(path: str, entries: Sequence[MountEntry]) -> MountEntry | None:
    """The mount that holds ``path`` (absolute, symlinks resolved): the longest matching
    mount point; of equal ones the last listed, which is mounted on top."""
    best = None
    for entry in entries:
        mp = entry.mount_point
        inside = mp == "/" or path == mp or path.startswith(mp.rstrip("/") + "/")
        if inside and (best is None or len(mp) >= len(best.mount_point)):
            best = entry
    return best


def detect_container(markers_present: Iterable[str], cgroup_text: str, root_fstype: str | None) -> str | None:
    """Why we believe we run in a container, or None."""
    present = list(markers_present)
    if present:
        return f"{present[0]} exists"
    for line in cgroup_text.splitlines():
        for word in CONTAINER_CGROUP_WORDS:
            if word in line:
                return f"/proc/1/cgroup names {word}"
    if root_fstype == "overlay":
        return "the root filesystem is an overlay"
    return None


def gather_container(mounts: Sequence[MountEntry]) -> str | None:
    root = find_mount("/", mounts)
    return detect_container(
        [m for m in CONTAINER_MARKERS if os.path.exists(m)],
        _read_text("/proc/1/cgroup"),
        root.fstype if root else None,
    )
