"""Reading parameter files: YAML or JSON text -> values, and the line that sets each field.

``RunSpec.load`` (``config.py``) parses a file here and, when a value is refused, asks
``line_of`` for the line to name in the error. A syntax error is a ConfigFileError that
says what the parser expected there and shows the line. ``yaml_loader`` is the one YAML
loader of the package (the sweep grid and ``workbench train`` read YAML through it too).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workbench.errors import ConfigFileError

SECTIONS = ("model", "data", "train")  # the sections of a parameter file (config.RunSpec)


def parse(path: Path, text: str) -> tuple[Any, dict[str, int]]:
    """(values, {"section" / "section.field": 1-based line}); ConfigFileError on a syntax error."""
    if path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            values = yaml.load(text, Loader=yaml_loader())  # a SafeLoader: no Python objects
            tree = yaml.compose(text, Loader=yaml_loader())
        except yaml.YAMLError as e:
            raise _yaml_error(path, text, e) from None
        return ({} if values is None else values), _yaml_lines(tree)
    try:
        values = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigFileError(path, e.lineno, f"not valid JSON at column {e.colno}: {e.msg}.",
                              "fix that line (JSON needs double quotes and commas between entries),"
                              " or write the file as YAML (.yaml).") from None
    return values, _json_lines(text, values)


def yaml_loader():
    """PyYAML's SafeLoader, reading ``2e-5`` as a number.

    PyYAML implements YAML 1.1, where a float needs a dot (``2.0e-5``), so the
    ``learning_rate: 2e-5`` everyone writes would arrive as the string "2e-5" and be
    refused. YAML 1.2 (and JSON) read it as a float; this adds that one rule.
    """
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"))
    return Loader


def _yaml_error(path: Path, text: str, error) -> ConfigFileError:
    mark = getattr(error, "problem_mark", None)
    line = mark.line + 1 if mark is not None else None
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    context = getattr(error, "context", None)
    context_mark = getattr(error, "context_mark", None)
    what = f"not valid YAML: {problem}"
    if context:
        what += f" ({context}" + (f" that starts at line {context_mark.line + 1})" if context_mark else ")")
    if line is not None and 0 < line <= len(text.splitlines()):
        shown = text.splitlines()[line - 1]
        what += f"\n    {shown}\n    {' ' * mark.column}^"
    if "\\t" in problem:  # pyyaml writes the tab as an escape: found character '\\t'
        fix = f"indent line {line} with spaces, not tabs."
    elif "mapping values are not allowed" in problem:
        fix = (f"check line {line}: indent each field under its section by the same number of spaces"
               " as the line above, and put values that contain ': ' in quotes.")
    elif "<stream end>" in problem:
        fix = "close the bracket or brace that the message names (']' or '}'), or quote the value."
    else:
        fix = (f"fix line {line}: a parameter file is 'section:' lines (model, data, train) with"
               " 'field: value' lines indented under them.")
    return ConfigFileError(path, line, what, fix)


def _yaml_lines(tree) -> dict[str, int]:
    """Where each section and field is set, from the composed YAML nodes."""
    lines: dict[str, int] = {}
    if tree is None or not hasattr(tree, "value") or not isinstance(tree.value, list):
        return lines
    for item in tree.value:
        if not isinstance(item, tuple):
            continue
        key, value = item
        section = str(key.value)
        lines[section] = key.start_mark.line + 1
        if isinstance(value.value, list):
            for sub in value.value:
                if isinstance(sub, tuple):
                    lines[f"{section}.{sub[0].value}"] = sub[0].start_mark.line + 1
    return lines


def _json_lines(text: str, values: Any) -> dict[str, int]:
    """Approximate lines for a JSON file: the first line that holds each quoted key."""
    lines: dict[str, int] = {}
    if not isinstance(values, Mapping):
        return lines
    rows = text.splitlines()

    def find(key: str, start: int = 0) -> int | None:
        for number in range(start, len(rows)):
            if f'"{key}"' in rows[number]:
                return number
        return None

    for section, content in values.items():
        at = find(section)
        if at is None:
            continue
        lines[section] = at + 1
        if isinstance(content, Mapping):
            for name in content:
                sub = find(name, at)
                if sub is not None:
                    lines[f"{section}.{name}"] = sub + 1
    return lines


def line_of(lines: dict[str, int], name: str) -> int | None:
    """The line of a section ("train"), a "section.field", or a bare field ("batch_size")."""
    if name in lines:
        return lines[name]
    name = name.split(".", 1)[-1] if name.split(".", 1)[0] in SECTIONS else name
    for key, line in lines.items():
        if key.endswith("." + name):
            return line
    return None
