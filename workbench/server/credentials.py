"""The server's credentials: where the token comes from, and whether it is strong enough.

``resolve_token`` reads ``JUPYTER_TOKEN`` (or the pipe ``workbench lab`` passes it through),
``JUPYTER_TOKEN_FILE`` or ``WORKBENCH_PASSWORD_HASH``
(or generates a token once per process); ``token_problem`` says why a token is too weak.
Used by the server configuration (``server/jupyter_config``), the security floor
(``server/floor.py``) and ``workbench doctor``.
"""

from __future__ import annotations

import math
import os
import secrets
import stat
import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from workbench.errors import LabConfigError

# secrets.token_urlsafe(32) gives 43 characters (256 bits). Shorter tokens are refused:
# they get guessed or reused. Length alone is not enough (32 x "a" is 32 characters), so
# a token must also use 16+ different characters, or carry an estimated 128 bits. The
# estimate is length x log2(alphabet), the smallest usual alphabet the token is written in
# (hex 16, letters and digits 62, URL-safe 64, printable 94), once it uses 10+ different
# characters: a random 32-character hex token (`openssl rand -hex 16`, JupyterHub's API
# tokens) shows only ~14 of the 16 digits, yet holds 128 bits. With fewer than 10 different
# characters the estimate is length x log2(distinct), so 32 x "a" holds 0.
MIN_TOKEN_LENGTH = 32
MIN_TOKEN_BITS = 128
MIN_TOKEN_DISTINCT = 16
MAKE_TOKEN = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"

PASSWORD_HASH_ENV = "WORKBENCH_PASSWORD_HASH"
TOKEN_FD_ENV = "WORKBENCH_TOKEN_FD"  # a pipe `workbench lab` passes the token through
_PASSWORD_HASH_PREFIXES = ("argon2:", "sha1:", "sha256:", "sha512:")

# The token generated for this process (config files can be loaded more than once:
# the same token must come back, and be printed once).
_generated_token: str | None = None
# The credentials resolved from os.environ, kept because resolve_token() removes the
# token from the environment (scrub_server_environment) and may be called again.
_resolved: TokenChoice | None = None


@dataclass(frozen=True)
class TokenChoice:
    """The server's credentials and where they came from (never log ``token`` itself)."""

    token: str  # "" only when a password hash is used instead
    source: str  # "JUPYTER_TOKEN" | "JUPYTER_TOKEN_FILE" | "generated" | "password"
    hashed_password: str = ""


_ALPHABETS = (
    (frozenset("0123456789abcdef"), 16), (frozenset("0123456789ABCDEF"), 16),
    (frozenset(string.ascii_letters + string.digits), 62),
    (frozenset(string.ascii_letters + string.digits + "-_"), 64),
)
_MIN_DISTINCT_FOR_ALPHABET = 10


def token_strength(token: str) -> tuple[float, int]:
    """(estimated bits, distinct characters) of a token (see MIN_TOKEN_BITS)."""
    used = set(token)
    distinct = len(used)
    if distinct < _MIN_DISTINCT_FOR_ALPHABET:
        return (len(token) * math.log2(distinct) if distinct > 1 else 0.0), distinct
    alphabet = next((size for chars, size in _ALPHABETS if used <= chars), 94)
    return len(token) * math.log2(alphabet), distinct


def token_problem(token: str) -> str | None:
    """Why a token (already stripped) is too weak, or None: empty, short, or predictable."""
    if not token:
        return "is empty: an empty token turns authentication off."
    if len(token) < MIN_TOKEN_LENGTH:
        return f"is {len(token)} characters long; at least {MIN_TOKEN_LENGTH} are required."
    bits, distinct = token_strength(token)
    if distinct < MIN_TOKEN_DISTINCT and bits < MIN_TOKEN_BITS:
        return (
            f"is too predictable: {len(token)} characters but only {distinct} different ones "
            f"(about {bits:.0f} bits; at least {MIN_TOKEN_BITS} bits or {MIN_TOKEN_DISTINCT} "
            "different characters are required)."
        )
    return None


def check_token(token: str, where: str) -> str:
    """The token without surrounding whitespace, or LabConfigError saying how to make a good one."""
    token = token.strip()  # "  " must count as empty, and a newline from `echo > file` as nothing
    problem = token_problem(token)
    if problem:
        raise LabConfigError(
            f"{where} {problem}",
            f"make a random token with `{MAKE_TOKEN}` (or `openssl rand -hex 32`) and put it in "
            f"{where}, or unset it to have one generated.",
        )
    return token


def read_token_file(path: str | os.PathLike[str]) -> str:
    """Read a token file that only its owner can read; refuse anything looser."""
    path = Path(path)
    try:
        info = path.stat()
    except OSError as exc:
        raise LabConfigError(
            f"JUPYTER_TOKEN_FILE={str(path)!r} cannot be read ({exc.strerror}).",
            "point JUPYTER_TOKEN_FILE at an existing file that holds the token.",
        ) from exc
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise LabConfigError(
            f"JUPYTER_TOKEN_FILE={str(path)!r} has mode {stat.S_IMODE(info.st_mode):o}: "
            "other users can read or change the token.",
            f"run `chmod 600 {path}` so that only its owner can read it.",
        )
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        # A compose secret is the host file as it is: it must belong to the image's user.
        raise LabConfigError(
            f"JUPYTER_TOKEN_FILE={str(path)!r} (owner uid {info.st_uid}) cannot be read by uid "
            f"{os.geteuid()} ({exc.strerror}).",
            f"give the file to the server's user (`chown {os.geteuid()} {path}`, or build the image "
            "with your uid: WORKBENCH_UID), keeping `chmod 600`.",
        ) from exc
    return check_token(text, f"JUPYTER_TOKEN_FILE ({path})")


def read_token_fd(value: str) -> str:
    """Read the token from the pipe `workbench lab` left open, and close it."""
    try:
        fd = int(value)
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        os.close(fd)
    except (ValueError, OSError) as exc:
        raise LabConfigError(
            f"{TOKEN_FD_ENV}={value!r} is not a readable pipe ({exc}).",
            f"unset {TOKEN_FD_ENV}: `workbench lab` sets it itself; give the token as JUPYTER_TOKEN.",
        ) from exc
    return b"".join(chunks).decode("utf-8")


def resolve_token(environ: Mapping[str, str] | None = None) -> TokenChoice:
    """Pick the server's credentials: JUPYTER_TOKEN, JUPYTER_TOKEN_FILE, a password hash, or a new token.

    Raises LabConfigError for an empty, short or predictable token, a token file others
    can read, or a password that is not a hash. From os.environ (``environ`` None) the
    answer is kept for the process: the configuration removes the token from the
    environment afterwards, and Jupyter may load the configuration twice.
    """
    global _resolved
    if environ is None and _resolved is not None:
        return _resolved
    choice = _resolve_token(os.environ if environ is None else environ)
    if environ is None:
        _resolved = choice
    return choice


def _resolve_token(env: Mapping[str, str]) -> TokenChoice:
    global _generated_token
    hashed_password = env.get(PASSWORD_HASH_ENV, "").strip()
    if hashed_password and not hashed_password.startswith(_PASSWORD_HASH_PREFIXES):
        raise LabConfigError(
            f"{PASSWORD_HASH_ENV} does not look like a password hash (it should start with "
            "'argon2:'); a plain-text password is never accepted.",
            "make the hash with `python -c 'from jupyter_server.auth import passwd; print(passwd())'`.",
        )
    if "JUPYTER_TOKEN" in env:
        return TokenChoice(check_token(env["JUPYTER_TOKEN"], "JUPYTER_TOKEN"), "JUPYTER_TOKEN",
                           hashed_password)
    if TOKEN_FD_ENV in env:
        # `workbench lab` moved JUPYTER_TOKEN into a pipe (server/lab.py: pass_token_by_pipe).
        return TokenChoice(check_token(read_token_fd(env[TOKEN_FD_ENV]), "JUPYTER_TOKEN"), "JUPYTER_TOKEN",
                           hashed_password)
    if "JUPYTER_TOKEN_FILE" in env:
        return TokenChoice(read_token_file(env["JUPYTER_TOKEN_FILE"]), "JUPYTER_TOKEN_FILE",
                           hashed_password)
    if hashed_password:
        # Password login only: no token, so the login form asks for the password.
        return TokenChoice("", "password", hashed_password)
    if _generated_token is None:
        _generated_token = secrets.token_urlsafe(32)
    return TokenChoice(_generated_token, "generated")


def generated_token() -> str | None:
    """The token this process generated (None when the token came from the environment)."""
    return _generated_token
