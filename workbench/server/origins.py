"""Which web origins may talk to the server: the server's own, or one exact configured origin.

Shared by the security floor (``server/floor.py``, which checks ``ServerApp.allow_origin``)
and the identity provider (``server/identity.py``, which refuses every other origin).
"""

from __future__ import annotations

import re

from workbench.errors import LabConfigError

# An exact origin: scheme://host[:port], nothing else (no path, no "null", no wildcard).
_ORIGIN = re.compile(r"https?://(\[[0-9a-f:.]+\]|[a-z0-9]([a-z0-9.-]*[a-z0-9])?)(:[0-9]{1,5})?")


def check_allow_origin(value: str) -> None:
    """ServerApp.allow_origin may be empty (same origin only) or one exact origin."""
    if not value:
        return
    if value == "*":
        raise LabConfigError(
            "ServerApp.allow_origin='*' lets every web site call the server's API.",
            "remove allow_origin, or name the one origin that needs access "
            "(e.g. --ServerApp.allow_origin=https://tools.example.org).",
        )
    if not _ORIGIN.fullmatch(value):
        raise LabConfigError(
            f"ServerApp.allow_origin={value!r} is not one exact origin: 'null' is what sandboxed "
            "frames and files send, and anything but scheme://host[:port] is a pattern.",
            "remove allow_origin, or set it to one lower-case origin such as https://tools.example.org:8443.",
        )


def origin_allowed(origin: str, host: str, allow_origin: str = "") -> bool:
    """Whether a request's Origin is the server's own (its Host) or the configured exact origin."""
    origin = origin.strip().lower()
    if allow_origin and origin == allow_origin.lower():
        return True
    scheme, sep, netloc = origin.partition("://")
    return bool(sep) and scheme in ("http", "https") and netloc == host.lower() and "/" not in netloc
