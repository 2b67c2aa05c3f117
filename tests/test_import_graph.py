"""The package's layout is its architecture: these tests hold the import rules the tree shows.

Walks every ``import`` statement of the package (module level and inside functions, read
with ``ast``, so a lazy import counts too, and so does one under ``TYPE_CHECKING``) and
follows the workbench modules each module reaches. The rules (``docs/architecture.md``):

* ``engine/`` never reaches a view (``widgets/``, ipywidgets, IPython.display) or ``server/``:
  a run under torchrun, papermill or CI never drags a front end in; views are listeners.
* ``server/`` never reaches ``engine/``, ``tasks/``, ``sources/`` or torch (nor the other heavy
  ML libraries): starting the lab stays fast and small.
* ``tasks/`` never reaches ``engine/``: the engine asks, the task answers.
* ``gpu/`` (the NVML layer) knows nothing of the engine, the tasks or the views.
* ``evaluation/`` and ``shipping/`` never reach a view (the notebook bar is ``widgets/evaluation.py``,
  attached by ``frontend.py``).
* ``engine/`` reaches ``shipping/`` only through the card writer (``shipping/card.py``, which it calls
  for every model folder it saves) and never reaches ``evaluation/``; ``tasks/`` reaches neither.
* The card writer reaches no model library (transformers, datasets, peft, gguf, lm_eval): a card costs
  no loading. (torch is reachable through ``engine/events.py``'s lazy TensorBoard writer, never called.)
* ``classroom/`` (the class service, run next to JupyterHub) never reaches torch or the other
  ML libraries, the tasks, sources, widgets or the server: the hub's machine has none of them.
* The kernel side of the class service (``course/``, ``classroom/client.py`` and
  ``record.py``) never reaches tornado or jupyterhub: a check cell stays standard library.
* No circles between modules: what two modules both need lives in a third.

Each rule is checked on the real package and, so that the check itself can fail, on a
small package written for the test that breaks it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "workbench"
FRONT_END = ("ipywidgets", "IPython.display", "workbench.widgets")
HEAVY = ("torch", "transformers", "datasets", "accelerate", "peft", "bitsandbytes")
WEB_STACK = ("tornado", "jupyterhub")
# Notebook-only helpers the engine may call into without following their display code.
NOTEBOOK_HELPERS = ("workbench.notebook_regression.record",)


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Every module a file imports (``from a import b`` counts as a.b when that is a module, else a)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            submodules = {f"{node.module}.{a.name}" for a in node.names} & modules
            found.update(submodules)
            # ``from pkg import sub`` needs pkg's __init__ only as every submodule import does;
            # a name that is not a submodule is read from pkg itself.
            if len(submodules) < len(node.names):
                found.add(node.module)
    return found


def build_graph(root: Path) -> dict[str, set[str]]:
    """module -> the modules it imports, for every .py file under ``root`` (a package folder).

    The server's traitlets config file (``server/jupyter_config/jupyter_server_config.py``)
    is executed by Jupyter, not imported, but what it imports counts: it is a module here.
    """
    files = {_module_name(p, root): p for p in root.rglob("*.py")}
    return {name: _imports(path, set(files)) for name, path in files.items()}


def _is(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def path_to(graph, start: str, target) -> list[str] | None:
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


def violations(graph, sources, forbidden) -> list[str]:
    """Import chains from any module under ``sources`` to any module under ``forbidden``."""
    chains = [path_to(graph, name, lambda m: _is(m, forbidden)) for name in graph if _is(name, sources)]
    return [" -> ".join(c) for c in chains if c]


def circles(graph) -> list[list[str]]:
    """Import circles between the package's modules (strongly connected groups, Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in graph:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def rule_breaks(graph) -> dict[str, list]:
    """Every rule of the module docstring, checked on ``graph``: rule -> what breaks it."""
    pkg = next(iter(graph)).split(".")[0]
    p = lambda *names: tuple(f"{pkg}.{n}" for n in names)  # noqa: E731
    front_end = (*FRONT_END[:2], f"{pkg}.widgets")
    card = f"{pkg}.shipping.card"
    beyond_card = (*p("evaluation"), *(m for m in graph if _is(m, p("shipping")) and m not in (card, f"{pkg}.shipping")))
    return {
        "engine reaches a view or the server": violations(graph, p("engine"), (*front_end, *p("server"))),
        "server reaches the engine, tasks, sources or torch":
            violations(graph, p("server"), (*p("engine", "tasks", "sources"), *HEAVY)),
        "tasks reach the engine": violations(graph, p("tasks"), p("engine")),
        "gpu reaches the engine, tasks or views": violations(graph, p("gpu"), (*p("engine", "tasks"), *front_end)),
        "evaluation or shipping reaches a view": violations(graph, p("evaluation", "shipping"), front_end),
        "engine reaches evaluation or shipping beyond the card writer": violations(graph, p("engine"), beyond_card),
        "tasks reach evaluation or shipping": violations(graph, p("tasks"), p("evaluation", "shipping")),
        "the card writer reaches a model library": violations(graph, (card,), ("transformers", "datasets", "peft",
                                                                                "gguf", "lm_eval")),
        "classroom reaches torch, tasks, sources, widgets or the server":
            violations(graph, p("classroom"), (*HEAVY, *front_end, *p("tasks", "sources", "server"))),
        "the check cells reach tornado or jupyterhub":
            violations(graph, p("course", "classroom.client", "classroom.record"), WEB_STACK),
        "import circles": circles(graph),
    }


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return build_graph(PACKAGE)


def test_the_graph_sees_the_package(graph):
    assert "workbench.engine.train" in graph and "workbench.widgets.progress" in graph
    assert "workbench.server.jupyter_config.jupyter_server_config" in graph
    assert "workbench.widgets.progress" in graph["workbench.frontend"]  # a lazy import counts
    assert len([m for m in graph if m.startswith("workbench.engine.")]) > 12


@pytest.mark.parametrize("rule", list(rule_breaks(build_graph(PACKAGE))))
def test_the_package_keeps_the_rule(graph, rule):
    assert rule_breaks(graph)[rule] == []


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in [root / "pkg", *(p for p in (root / "pkg").rglob("*") if p.is_dir())]:
        (folder / "__init__.py").touch()
    return root / "pkg"


# Each case breaks one rule, the way a real change would (often through a lazy import).
BROKEN = {
    "engine reaches a view or the server": {
        "engine/train.py": "def fit():\n    from pkg.engine import progress\n",
        "engine/progress.py": "def show():\n    from IPython.display import display\n",
    },
    "server reaches the engine, tasks, sources or torch": {
        "server/lab.py": "from pkg.server import guard\n",
        "server/guard.py": "def check():\n    from pkg.sources import models\n",
        "sources/models.py": "import torch\n",
    },
    "tasks reach the engine": {"tasks/causal_lm.py": "from pkg.engine.checkpoint import write\n",
                               "engine/checkpoint.py": ""},
    "gpu reaches the engine, tasks or views": {"gpu/nvml.py": "import ipywidgets\n"},
    "evaluation or shipping reaches a view": {
        "evaluation/harness.py": "def run():\n    from pkg.evaluation import progress\n",
        "evaluation/progress.py": "def bar():\n    from pkg.widgets import evaluation\n",
        "widgets/evaluation.py": "",
    },
    "engine reaches evaluation or shipping beyond the card writer": {
        "engine/checkpoint.py": "from pkg.shipping.card import write_card\n",
        "shipping/card.py": "def write_card():\n    from pkg.shipping import gguf_export\n",
        "shipping/gguf_export.py": "",
    },
    "tasks reach evaluation or shipping": {"tasks/causal_lm.py": "def finish():\n    from pkg.shipping import card\n",
                                           "shipping/card.py": ""},
    "the card writer reaches a model library": {"shipping/card.py": "def build():\n    import transformers\n"},
    "classroom reaches torch, tasks, sources, widgets or the server": {
        "classroom/store.py": "def rows():\n    from pkg.classroom import tables\n",
        "classroom/tables.py": "import torch\n",
    },
    "the check cells reach tornado or jupyterhub": {
        "course/checks.py": "from pkg.classroom import client\n",
        "classroom/client.py": "def send():\n    from jupyterhub.services.auth import HubAuth\n",
    },
    "import circles": {
        "server/guard.py": "from pkg.server import identity\n",
        "server/identity.py": "from pkg.server.origins import allowed\n",
        "server/origins.py": "def allowed():\n    from pkg.server import guard\n",
    },
}


@pytest.mark.parametrize("rule", list(BROKEN))
def test_the_check_catches_a_broken_rule(tmp_path, rule):
    """The checks themselves can fail: each broken package is caught by its rule, and only by it."""
    breaks = rule_breaks(build_graph(_write(tmp_path, BROKEN[rule])))
    assert breaks[rule], f"{rule}: not caught"
    assert [r for r, found in breaks.items() if found] == [rule]


def test_the_walk_would_catch_a_lazy_front_end_import(tmp_path):
    module = tmp_path / "lazy.py"
    module.write_text("def show():\n    import ipywidgets\n    from IPython.display import display\n")
    assert {"ipywidgets", "IPython.display"} <= _imports(module, set())


def _defined_names(path: Path) -> set[str]:
    """Functions, classes and variables a module defines at its top level (imported names excluded)."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_each_public_name_is_defined_where_the_package_maps_it():
    """``workbench/__init__.py`` loads each public name lazily from the module that defines it:
    when a module is split or a function moves, the map moves with it (a name merely imported
    there would be a re-export, which the tree does not keep)."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    exports = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                   and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets))
    misplaced = []
    for name, module in exports.items():
        path = PACKAGE.parent.joinpath(*module.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        if not path.is_file() or name not in _defined_names(path):
            misplaced.append(f"{name} -> {module}")
    assert len(exports) > 20 and misplaced == []
