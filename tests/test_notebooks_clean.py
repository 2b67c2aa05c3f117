"""The notebooks in notebooks/ are committed as clean documents that CI can parameterize.

Each one: no outputs or execution counts, a markdown title first, exactly one cell
tagged `parameters` (papermill injects after it), a place in the ci profile of
`workbench regress`, and only known parameter names in the profiles.
"""

from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path

import pytest

from workbench.notebook_regression.baselines import load_baselines
from workbench.notebook_regression.bundled import baselines_file, profiles_file
from workbench.notebook_regression.profiles import load_profiles, notebook_parameters

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
IDS = [p.name for p in NOTEBOOKS]


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_committed_without_outputs_or_execution_counts(path):
    dirty = [
        i + 1
        for i, cell in enumerate(load(path)["cells"])
        if cell.get("outputs") or cell.get("execution_count") is not None
    ]
    assert not dirty, (
        f"{path.name}: cells {dirty} have outputs or execution counts; clear them "
        "(JupyterLab: Edit > Clear Outputs of All Cells, or `jupyter nbconvert --clear-output`)"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_starts_with_a_markdown_title(path):
    first = load(path)["cells"][0]
    source = "".join(first["source"]).lstrip()
    assert first["cell_type"] == "markdown" and source.startswith("# "), (
        f"{path.name}: the first cell must be a markdown cell starting with a '# Title'"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_has_exactly_one_parameters_cell(path):
    tagged = [
        i + 1
        for i, cell in enumerate(load(path)["cells"])
        if "parameters" in cell.get("metadata", {}).get("tags", [])
    ]
    assert len(tagged) == 1, f"{path.name}: cells tagged `parameters`: {tagged} (need exactly one)"
    cell = load(path)["cells"][tagged[0] - 1]
    assert cell["cell_type"] == "code"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_is_in_the_ci_profile(path):
    ci = load_profiles(profiles_file())["ci"]
    assert path.name in ci.notebooks, (
        f"{path.name} is not in the ci profile of {profiles_file()}: add it so CI runs it"
    )


def test_profiles_name_existing_notebooks_and_known_parameters():
    problems = []
    for profile in load_profiles(profiles_file()).values():
        for notebook, params in profile.notebooks.items():
            path = REPO / "notebooks" / notebook
            if not path.is_file():
                problems.append(f"{profile.name}: {notebook} does not exist")
                continue
            unknown = set(params) - (notebook_parameters(path) or set())
            if unknown:
                problems.append(f"{profile.name}: {notebook} has no parameter(s) {sorted(unknown)}")
    assert not problems, "\n".join(problems)


def test_baselines_name_notebooks_of_their_profile():
    profiles = load_profiles(profiles_file())
    for name, profile in profiles.items():
        extra = set(load_baselines(baselines_file(), name)) - set(profile.notebooks)
        assert not extra, f"baselines for {name} name notebooks outside the profile: {extra}"


def workbench_imports(source: str) -> list[tuple[str, str | None]]:
    """(module, name) for each ``from workbench... import name`` and ``import workbench...``
    in a cell's code; IPython magics and shell lines are left out before parsing."""
    code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                     for line in source.splitlines())
    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "workbench":
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names
                      if alias.name.split(".")[0] == "workbench"]
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_every_workbench_import_in_the_notebook_resolves(path):
    """A name moved between modules must not break a notebook at its import cell, which
    otherwise shows only when `workbench regress` runs the notebook end to end."""
    broken = []
    for i, cell in enumerate(load(path)["cells"]):
        if cell["cell_type"] != "code":
            continue
        for module, name in workbench_imports("".join(cell["source"])):
            try:
                loaded = importlib.import_module(module)
            except ImportError as error:
                broken.append(f"cell {i + 1}: import {module}: {error}")
                continue
            if name is not None and name != "*" and not hasattr(loaded, name):
                try:
                    importlib.import_module(f"{module}.{name}")
                except ImportError:
                    broken.append(f"cell {i + 1}: {module} has no {name}")
    assert not broken, f"{path.name}: " + "; ".join(broken)

