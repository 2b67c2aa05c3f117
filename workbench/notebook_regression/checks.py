"""Reading the YAML files and checking their values, with errors that name the key to fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from workbench.errors import RegressionError


def is_number(value: Any) -> bool:
    # bool is an int subclass, but True is no accuracy.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def positive(value: Any, where: str) -> float:
    if not is_number(value) or value <= 0:
        raise RegressionError(
            f"{where}={value!r} must be a positive number of seconds.", "Use e.g. 600."
        )
    return float(value)


def non_negative(value: Any, where: str) -> float:
    if not is_number(value) or value < 0:
        raise RegressionError(f"{where}={value!r} must be a number >= 0.", "Use e.g. 0.05.")
    return float(value)


def load_yaml(path: Path, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except FileNotFoundError:
        raise RegressionError(
            f"The {what} file {path} does not exist.",
            "Check the path given with --profiles-file / --baselines-file (relative paths start "
            "at the current folder); leave the option out to use the file shipped with workbench.",
        ) from None
    except yaml.YAMLError as exc:
        raise RegressionError(
            f"{path} is not valid YAML: {exc}", "Fix the syntax at the line shown."
        ) from None
