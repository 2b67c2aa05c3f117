"""Is a string a local path or a hub id? One answer for data and models alike.

``fit(model, "data/train.csv")`` and ``fit("./my-bert", ...)`` get a string that may
name a local file or folder or a Hugging Face hub repository. When it exists locally
it is local. When it does not, guessing "hub" for everything sends a mistyped path to
the hub, whose error ("Repo id must be in the form...", "the hub is switched off")
says nothing about the missing file. So a string that cannot be a hub id, or that
has the marks of a path, is reported as a missing file or folder.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

# A hub repository id: "name" or "owner/name" of letters, digits, "-", "_" and ".".
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?$")


def looks_like_local_path(text: str, extensions: Iterable[str] = ()) -> bool:
    """True when ``text`` can only mean a local path (whether or not it exists).

    Path marks: a leading ``/``, ``./``, ``../`` or ``~``; a backslash or a drive colon;
    two or more ``/`` (hub ids have at most one); one of ``extensions`` (data files:
    no hub dataset id ends in ``.csv``); anything else a hub id cannot hold (spaces...).
    """
    text = str(text).strip()
    if text in (".", "..") or text.startswith(("/", "./", "../", "~")):
        return True
    if "\\" in text or ":" in text or text.count("/") >= 2:
        return True
    if Path(text).suffix.lower() in {e.lower() for e in extensions}:
        return True
    return not HUB_ID.match(text)


def nearby(path: str | os.PathLike, suffixes: Iterable[str] = (), limit: int = 8) -> str:
    """What is in the folder where ``path`` was expected, to spot a typo; "" if nothing useful."""
    parent = Path(path).expanduser().absolute().parent
    if not parent.is_dir():
        return f"the folder {parent} does not exist either"
    wanted = {s.lower() for s in suffixes}
    names = sorted(p.name for p in parent.iterdir()
                   if not p.name.startswith(".") and (not wanted or p.is_dir() or p.suffix.lower() in wanted))
    if not names:
        return f"{parent} holds no {'matching ' if wanted else ''}files"
    shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
    return f"{parent} holds: {shown}"
