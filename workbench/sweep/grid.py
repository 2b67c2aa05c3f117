"""The combinations of a sweep: ``--grid learning_rate=1e-5,2e-5 --grid seed=1,2`` -> four.

Values are read as YAML scalars (``2e-5`` is a number, ``true`` a bool, ``none`` None,
anything else a string), as in a parameter file. A combination's folder name is its
values, ``learning_rate=2e-05,seed=1``: readable in the runs table and TensorBoard, and
the same every time the sweep is run again, which is what makes a sweep resumable.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from workbench.errors import ConfigError

_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+-]")


@dataclass
class Combination:
    """One run of the sweep: its folder name and the parameters injected into the notebook."""

    name: str
    parameters: dict[str, Any] = field(default_factory=dict)


def parse_value(text: str) -> Any:
    import yaml

    from workbench.config_files import yaml_loader

    try:
        value = yaml.load(text, Loader=yaml_loader())  # noqa: S506 — SafeLoader plus one float rule
    except yaml.YAMLError:
        return text
    return text if isinstance(value, (dict, list)) else value


def parse_grid(items: Iterable[str]) -> dict[str, list[Any]]:
    """``["k=v1,v2", ...]`` -> ``{"k": [v1, v2]}``; ConfigError naming the item that is wrong."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier() or not values.strip():
            raise ConfigError("--grid", item, "NAME=VALUE1,VALUE2,... with NAME a parameter of the notebook",
                              fix="e.g. --grid learning_rate=1e-5,2e-5 --grid seed=1,2")
        if key in grid:
            raise ConfigError("--grid", item, f"one --grid per parameter ({key} is given twice)")
        grid[key] = [parse_value(v.strip()) for v in values.split(",")]
    return grid


def parse_parameters(items: Iterable[str]) -> dict[str, Any]:
    """``["k=v", ...]`` (``--param``) -> the fixed parameters, the same in every combination."""
    fixed = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ConfigError("--param", item, "NAME=VALUE with NAME a parameter of the notebook")
        fixed[key.strip()] = parse_value(value.strip())
    return fixed


def format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def combination_name(parameters: Mapping[str, Any]) -> str:
    name = ",".join(f"{k}={format_value(v)}" for k, v in parameters.items())
    return _UNSAFE.sub("_", name)[:200] or "default"


def combinations(grid: Mapping[str, list[Any]]) -> list[Combination]:
    """Every combination, the last key varying fastest (as nested loops would)."""
    keys = list(grid)
    found = []
    for values in itertools.product(*(grid[k] for k in keys)):
        parameters = dict(zip(keys, values, strict=True))
        found.append(Combination(combination_name(parameters), parameters))
    names = [c.name for c in found]
    if len(set(names)) != len(names):
        raise ConfigError("--grid", dict(grid), "values that give each combination its own folder name",
                          fix="two values print the same (e.g. 1 and 1.0): give distinct values.")
    return found
