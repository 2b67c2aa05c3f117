"""Regression profiles: which notebooks run, with which parameters, under which timeouts.

The shipped file is ``profiles.yaml`` beside this module (``bundled.profiles_file()``);
its format is described in its header comment. Everything here is checked before any kernel starts, so a typo in
the file costs a second, not a CI run.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.errors import RegressionError
from workbench.notebook_regression.checks import load_yaml, positive

DEFAULT_CELL_TIMEOUT_S = 600.0
DEFAULT_NOTEBOOK_TIMEOUT_S = 3600.0
PROFILE_KEYS = ("description", "kernel", "cell_timeout_s", "notebook_timeout_s", "env", "notebooks")


@dataclass
class Profile:
    """One named set of notebooks and the parameters to run them with."""

    name: str
    notebooks: dict[str, dict[str, Any]]  # path relative to the notebooks folder -> parameters
    description: str = ""
    kernel: str = "python3"
    cell_timeout_s: float = DEFAULT_CELL_TIMEOUT_S
    notebook_timeout_s: float = DEFAULT_NOTEBOOK_TIMEOUT_S
    env: dict[str, str] = field(default_factory=dict)


def load_profiles(path: str | Path) -> dict[str, Profile]:
    """All profiles in a profiles file, validated; every problem names the key to fix."""
    path = Path(path)
    data = load_yaml(path, "regression profiles")
    raw = data.get("profiles") if isinstance(data, dict) else None
    if not isinstance(raw, dict) or not raw:
        raise RegressionError(
            f"{path} has no `profiles:` mapping.",
            "Start the file with `profiles:` and one entry per profile (see its header comment).",
        )
    profiles = {}
    for name, body in raw.items():
        where = f"{path}: profiles.{name}"
        body = body or {}
        if not isinstance(body, dict):
            raise RegressionError(
                f"{where} must be a mapping.", f"Use the keys {', '.join(PROFILE_KEYS)}."
            )
        unknown = sorted(set(body) - set(PROFILE_KEYS))
        if unknown:
            raise RegressionError(
                f"{where} has unknown key(s) {unknown}.",
                f"Allowed keys: {', '.join(PROFILE_KEYS)}.",
            )
        notebooks = body.get("notebooks")
        if not isinstance(notebooks, dict) or not notebooks:
            raise RegressionError(
                f"{where}.notebooks is missing or empty.",
                "List notebooks as `NAME.ipynb: {parameter: value, ...}`.",
            )
        for notebook, params in notebooks.items():
            if params is not None and not isinstance(params, dict):
                raise RegressionError(
                    f"{where}.notebooks.{notebook} must be a mapping of parameters, got {params!r}.",
                    "Write `{}` (or nothing) to run the notebook with its own defaults.",
                )
        env = body.get("env") or {}
        if not isinstance(env, dict):
            raise RegressionError(f"{where}.env must be a mapping.", "Write `env: {NAME: value}`.")
        profiles[str(name)] = Profile(
            name=str(name),
            notebooks={str(nb): dict(params or {}) for nb, params in notebooks.items()},
            description=str(body.get("description") or ""),
            kernel=str(body.get("kernel") or "python3"),
            cell_timeout_s=positive(
                body.get("cell_timeout_s", DEFAULT_CELL_TIMEOUT_S), f"{where}.cell_timeout_s"
            ),
            notebook_timeout_s=positive(
                body.get("notebook_timeout_s", DEFAULT_NOTEBOOK_TIMEOUT_S),
                f"{where}.notebook_timeout_s",
            ),
            env={str(k): str(v) for k, v in env.items()},
        )
    return profiles


def select_notebooks(profile: Profile, wanted: list[str] | None) -> list[str]:
    """The profile's notebooks matching ``wanted`` (a path, file name, stem or name prefix)."""
    if not wanted:
        return list(profile.notebooks)
    chosen = []
    for want in wanted:
        matches = [
            nb
            for nb in profile.notebooks
            if want in (nb, Path(nb).name, Path(nb).stem) or Path(nb).name.startswith(want)
        ]
        if not matches:
            raise RegressionError(
                f"--notebooks {want!r} matches no notebook of profile {profile.name!r}.",
                f"Choose from: {', '.join(profile.notebooks)}.",
            )
        chosen += [nb for nb in matches if nb not in chosen]
    return [nb for nb in profile.notebooks if nb in chosen]  # keep the profile's order


def notebook_parameters(path: str | Path) -> set[str] | None:
    """Names assigned in the cell tagged `parameters`, or None if the notebook has none."""
    with open(path, encoding="utf-8") as f:
        nb = json.load(f)
    for cell in nb.get("cells", []):
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            source = "".join(cell.get("source", ""))
            names = set()
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    names.add(node.id)
            return names
    return None
