"""Hostile values for files that a shell or another program runs later, and the check each must pass.

A value that goes into a generated script (a notebook's file name, a folder, a sweep name, a grid
value...) must come out of that program as the same value, or be refused with a ``Fix:``: it
must never become code. For each generated file, tests/test_generated_files.py gives a
``write(value)`` (the package writing the file with ``value`` in one field) and a
``run(path)`` (the program that reads the file, run harmlessly, returning what it saw of the
value); :func:`check` drives them with every value of :func:`hostile_values`.

Reuse it for a new kind of file (a Modelfile, a launcher script): add an entry to
``GENERATED`` in tests/test_generated_files.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from workbench.errors import WorkbenchError

MARKER = "INJECTED-BY-A-VALUE"  # created in the program's working folder when a value runs as code


def hostile_values() -> dict[str, str]:
    """name -> a value that runs ``touch MARKER`` (in the working folder) if written into a script unquoted."""
    touch = f"touch {MARKER}"
    return {
        "newline": f"x\n{touch}\n",
        "carriage_return": f"x\r{touch}\r",
        "line_separator": f"x\u2028{touch}",  # a line break to some programs, not to bash
        "command_substitution": f"$({touch})",
        "backticks": f"`{touch}`",
        "semicolon": f"x; {touch}",
        "single_quote": f"x'; {touch}; '",
        "double_quote": f'x"; {touch}; "',
        "backslash_newline": f"x\\\n{touch}",
        "variable": "$HOME${PATH}",
        "glob": "*",
        "leading_dashes": "--help",
        "space_and_tab": "a b\tc",
        "percent_pattern": "run-%j-%A",
        "escape_sequence": "\x1b[2J\x1b]0;title\x07",
        "nul": "a\x00b",
        "python_string_break": f'"""\nimport os; os.system({touch!r})\n"""',
        "unicode": "données-ü-漢字",
    }


def check(write: Callable[[str], Path], run: Callable[[Path], str], value: str, workdir: Path) -> str:
    """Write ``value``, run what was written in ``workdir``; returns "refused" or "quoted". Fails on code.

    ``write`` raises WorkbenchError (the package refused the value: the message must carry a
    fix); ``run`` returns what the program saw of the value, which must be the value itself.
    """
    marker = workdir / MARKER
    try:
        path = write(value)
    except WorkbenchError as exc:
        assert "Fix:" in str(exc) or "allowed" in str(exc), f"a refusal must say what to do: {exc}"
        return "refused"
    seen = run(path)
    assert not marker.exists(), f"the value {value!r} ran as code in {path.name}:\n{path.read_text(errors='replace')}"
    assert seen == value, f"{path.name} turned {value!r} into {seen!r}"
    return "quoted"


def file_name_values(values: dict[str, str]) -> dict[str, str]:
    """Those of ``values`` a file name can hold (no '/', no NUL; at most 255 bytes)."""
    return {k: v for k, v in values.items() if "/" not in v and "\0" not in v and len(v.encode()) < 200}
