"""Values written into files that another program later runs: quoted for that program, or refused.

The workbench writes files that a shell or another program runs after it: ``sweep.slurm``
(bash, and Slurm reads its ``#SBATCH`` lines), the parameters cell papermill injects into a
sweep's notebooks (Python), and more as exports are added. Their values -- a notebook's file
name, a folder, a sweep name, a grid value -- come from folders others can write (a course
folder, an unpacked archive), so a file name holding a line break or ``$(...)`` must not become
a command. Every value goes through one of these on its way into such a file:

    shell_word(field, value)       a word of a bash line (a single-quoted string)
    comment_text(value)            the rest of a ``#`` comment line: unprintable characters escaped
    directive_value(field, value)  a value on a ``#SBATCH`` line: a plain word, or refused
    check_printable(field, value)  refuse line breaks and other control characters

Refusals are ``ConfigError`` naming the field, what is allowed and the fix. The list of such
files and the hostile values each must survive: ``tests/test_generated_files.py``.
"""

from __future__ import annotations

import re
import shlex

from workbench.errors import ConfigError

# Words a #SBATCH line can carry without quoting (Slurm splits directives on white space and
# expands % patterns in file names): letters and digits (any script), and these.
_DIRECTIVE_WORD = re.compile(r"[\w.+,:/=@-]+")


def unprintable(value: str) -> list[str]:
    """The characters of ``value`` that a line cannot hold safely (line breaks, escapes, NUL...)."""
    return sorted({ch for ch in value if not ch.isprintable() and ch != " "}, key=ord)


def check_printable(field: str, value: str) -> str:
    """``value`` when it has no control characters (line breaks included); ConfigError otherwise."""
    bad = unprintable(value)
    if bad:
        raise ConfigError(field, value, "printable characters (no line breaks, tabs or control characters)",
                          fix=f"rename it without {', '.join(ascii(ch) for ch in bad)}.")
    return value


def shell_word(field: str, value: str) -> str:
    """``value`` as one bash word (single-quoted when needed); control characters are refused.

    A quoted line break would be safe for bash, but such a value is never meant, and the same
    value often also appears on a comment or directive line, where it is not.
    """
    return shlex.quote(check_printable(field, str(value)))


def comment_text(value: str) -> str:
    """``value`` for the rest of a ``#`` comment line: every unprintable character as an escape."""
    return "".join(ch if ch.isprintable() or ch == " " else ascii(ch)[1:-1] for ch in str(value))


def directive_value(field: str, value: str) -> str:
    """``value`` on a ``#SBATCH`` line: letters, digits and ``_.+,:/=@-`` only; ConfigError otherwise."""
    value = str(value)
    if not _DIRECTIVE_WORD.fullmatch(value):
        bad = sorted({ch for ch in value if not _DIRECTIVE_WORD.fullmatch(ch)}, key=ord) or ["(empty)"]
        raise ConfigError(field, value, "letters, digits and _ . + , : / = @ - (it is written on a #SBATCH line)",
                          fix=f"use a name or path without {', '.join(ascii(ch) for ch in bad)}.")
    return value
