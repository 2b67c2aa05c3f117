"""The engine is headless: no module it is made of reaches a notebook front end.

Walks every ``import`` statement of the package (module level and inside
functions, read with ``ast``, so a lazy import counts too) and follows the
workbench modules each engine module reaches. A run under torchrun, papermill or
CI must never drag ipywidgets or IPython's display machinery in, and the GPU
query layer must not know the engine exists.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "workbench"
FRONT_END = ("ipywidgets", "IPython.display", "workbench.widgets")
# Engine modules, and the packages whose every module counts as engine (headless).
ENGINE = ("workbench.train", "workbench.tasks", "workbench.checkpoint", "workbench.events", "workbench.data",
          "workbench.batching", "workbench.precision", "workbench.config", "workbench.watcher",
          "workbench.distributed", "workbench.stopping", "workbench.optim", "workbench.results",
          "workbench.memory", "workbench.progress", "workbench.train_cli", "workbench.gpu",
          "workbench.diagnostics", "workbench.notebook_regression")
# Notebook-only helpers the engine may call into without following their display code.
NOTEBOOK_HELPERS = ("workbench.record",)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Every module a file imports (``from a import b`` counts as a.b when that is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py") if "lab_config" not in p.parts}
    return {name: _imports(path, set(files)) for name, path in files.items()}


def _is(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _path_to(graph, start: str, target) -> list[str] | None:
    """The import chain from ``start`` to a module matching ``target``, or None."""
    seen, queue = {start}, [[start]]
    while queue:
        chain = queue.pop(0)
        for imported in sorted(graph.get(chain[-1], ())):
            if target(imported):
                return [*chain, imported]
            if imported in graph and imported not in seen and not _is(imported, NOTEBOOK_HELPERS):
                seen.add(imported)
                queue.append([*chain, imported])
    return None


def test_the_graph_sees_the_package(graph):
    assert "workbench.train" in graph and "workbench.widgets.progress" in graph
    assert "workbench.widgets.progress" in {m for m in graph["workbench.frontend"]}  # a lazy import counts


def test_no_engine_module_reaches_the_notebook_front_end(graph):
    engine = [name for name in graph if _is(name, ENGINE)]
    assert len(engine) > 20
    chains = [_path_to(graph, name, lambda m: _is(m, FRONT_END)) for name in engine]
    assert [" -> ".join(c) for c in chains if c] == []


def test_the_gpu_layer_does_not_import_the_engine(graph):
    engine_not_gpu = tuple(p for p in ENGINE if p != "workbench.gpu")
    chains = [_path_to(graph, name, lambda m: _is(m, engine_not_gpu) or _is(m, FRONT_END))
              for name in graph if _is(name, ("workbench.gpu",))]
    assert [" -> ".join(c) for c in chains if c] == []


def test_the_walk_would_catch_a_lazy_front_end_import(tmp_path):
    """The check itself can fail: a function-level import of ipywidgets is found."""
    module = tmp_path / "lazy.py"
    module.write_text("def show():\n    import ipywidgets\n    from IPython.display import display\n")
    assert {"ipywidgets", "IPython.display"} <= _imports(module, set())
