"""Every file the package writes that a shell or another program runs later, against hostile values.

``GENERATED`` is the list: for each file, the values a user (or a folder others can write)
controls, how the package writes the file with one of them, and how the program that reads it
runs it -- harmlessly, in a scratch folder, with stand-ins for what it would start. Every
value of ``script_safety.hostile_values()`` goes into every field: it must be refused with a
fix, or come out of the program unchanged; never run (security round 4, item 5).

To add a file (a launcher script, ...): a ``GeneratedFile`` with its fields, a ``write`` and a
``run``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from ollama_parser import parse_modelfile
from script_safety import check, file_name_values, hostile_values

from workbench.shipping.modelfile import MODELFILE, modelfile_text
from workbench.sweep import runner, slurm

PARAMETERS = "label = 'x'\nseed = 1\noutput_dir = 'outputs'\n"


def notebook(folder: Path, name: str = "lesson.ipynb") -> Path:
    """A notebook with a ``parameters`` cell (label, seed, output_dir)."""
    folder.mkdir(parents=True, exist_ok=True)
    cell = {"id": "parameters", "cell_type": "code", "metadata": {"tags": ["parameters"]}, "source": PARAMETERS,
            "outputs": [],
            "execution_count": None}
    path = folder / name
    path.write_text(json.dumps({"cells": [cell], "metadata": {"kernelspec": {"name": "python3", "language": "python",
                                "display_name": "Python 3"}}, "nbformat": 4, "nbformat_minor": 5}))
    return path


@dataclass
class GeneratedFile:
    name: str
    fields: dict[str, bool]  # field -> whether it is a file or folder name (no '/', no NUL)
    # (scratch folder, field, value) -> the written file; raises WorkbenchError to refuse the value
    write: Callable[[Path, str, str], Path]
    # (the written file, scratch folder, field) -> what the program saw of the value
    run: Callable[[Path, Path, str], str]


# --- sweep.slurm: bash, and sbatch reads its #SBATCH lines -----------------------------------


def write_slurm(tmp: Path, field: str, value: str) -> Path:
    choice = {"notebook file name": "lesson.ipynb", "outputs folder": "out", "sweep name": "s",
              "nodes' Python": None, "time limit": "04:00:00"}
    choice[field] = value + ".ipynb" if field == "notebook file name" else value
    plan = runner.make_plan(notebook(tmp / "course", choice["notebook file name"]), {"seed": [1, 2]},
                            name=choice["sweep name"], outputs=tmp / "outputs" / choice["outputs folder"])
    plan.save()
    return slurm.write_script(plan, python=choice["nodes' Python"], time_limit=choice["time limit"])


def run_slurm(script: Path, tmp: Path, field: str) -> str:
    """bash runs it as an array task, with an srun that records its arguments; sbatch's reading of
    the #SBATCH lines is modelled: one --name=value word each."""
    text = script.read_text()
    directives = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH"):
            words = line.split()
            assert len(words) == 2 and words[1].startswith("--"), f"a #SBATCH line sbatch would misread: {line!r}"
            key, _, value = words[1][2:].partition("=")
            directives[key] = value
    stubs = tmp / "stubs"
    stubs.mkdir(exist_ok=True)
    (stubs / "srun").write_text('#!/usr/bin/env bash\nprintf "%s\\0" "$@" > "$SRUN_ARGS"\n')
    (stubs / "srun").chmod(0o755)
    args_file = tmp / "srun-args"
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "SLURM_ARRAY_TASK_ID": "1",
           "SRUN_ARGS": str(args_file)}
    env.pop("PYTHON", None)
    done = subprocess.run(["bash", str(script)], cwd=tmp, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    args = args_file.read_bytes().split(b"\0")[:-1]
    python, dash_c, _, module, plan_path, index = (a.decode() for a in args)
    assert (dash_c, module, index) == ("-c", "workbench.sweep.slurm", "1")
    plan = json.loads(Path(plan_path).read_text())
    return {"notebook file name": Path(plan["notebook"]).name.removesuffix(".ipynb"),
            "outputs folder": Path(plan["root"]).parent.name, "sweep name": plan["name"],
            "nodes' Python": python, "time limit": directives["time"]}[field]


# --- the parameters cell papermill injects into each sweep combination's notebook: Python ------


def write_parameters(tmp: Path, field: str, value: str) -> Path:
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    grid, fixed, outputs = {"seed": [1]}, {}, tmp / "outputs"
    if field == "grid value":
        grid = {"label": [value]}
    elif field == "fixed parameter":
        fixed = {"label": value}
    else:
        outputs = tmp / "outputs" / value
    source = notebook(tmp / "course")
    plan = runner.make_plan(source, grid, parameters=fixed, outputs=outputs, name="s")
    # As the sweep's worker has papermill do it (papermill.execute_notebook).
    injected = parameterize_notebook(load_notebook_node(str(source)), plan.parameters_of(plan.combinations[0]),
                                     language="python")
    cell = next(c for c in injected.cells if "injected-parameters" in c.metadata.get("tags", []))
    path = tmp / "injected_parameters.py"
    path.write_text(cell.source, encoding="utf-8")
    return path


def run_parameters(path: Path, tmp: Path, field: str) -> str:
    code = ("import json, sys\nseen = {}\nexec(open(sys.argv[1], encoding='utf-8').read(), seen)\n"
            "print(json.dumps({'label': seen.get('label'), 'output_dir': seen.get('output_dir')}))")
    done = subprocess.run([sys.executable, "-c", code, str(path)], cwd=tmp, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    # output_dir is <outputs>/<sweep>/<combination>
    return seen["label"] if field != "outputs folder" else Path(seen["output_dir"]).parents[1].name


# --- the Ollama Modelfile beside a GGUF export: `ollama create -f Modelfile` parses it ---------

MODELFILE_PLAIN = {"GGUF file name": "run.f16.gguf", "system prompt": "Be brief.", "stop token": "<|im_end|>"}


def write_modelfile(tmp: Path, field: str, value: str, title: str = "run: exported by workbench from base") -> Path:
    """As gguf_export.export writes it; the template comes from the tokenizer (test_modelfile.py)."""
    values = {**MODELFILE_PLAIN, field: value}
    path = tmp / MODELFILE
    path.write_text(modelfile_text(values["GGUF file name"], shape=None, system=values["system prompt"],
                                   stops=[values["stop token"], "<|endoftext|>"], title=title), encoding="utf-8")
    return path


def run_modelfile(path: Path, tmp: Path, field: str) -> str:
    """Ollama's parser (ported rune for rune): exactly FROM, SYSTEM and two stops, nothing injected."""
    text = path.read_bytes().decode("utf-8")  # as Ollama reads it: a \r stays a \r
    commands = parse_modelfile(text)
    assert [name for name, _ in commands] == ["model", "system", "stop", "stop"], f"commands injected: {commands}"
    seen = {"GGUF file name": commands[0][1].removeprefix("./"), "system prompt": commands[1][1],
            "stop token": commands[2][1]}
    return seen[field]


GENERATED = [
    GeneratedFile("sweep.slurm", {"notebook file name": True, "outputs folder": True, "sweep name": True,
                                  "nodes' Python": False, "time limit": False}, write_slurm, run_slurm),
    GeneratedFile("sweep parameters cell", {"grid value": False, "fixed parameter": False, "outputs folder": True},
                  write_parameters, run_parameters),
    GeneratedFile("Modelfile", {"GGUF file name": True, "system prompt": False, "stop token": False},
                  write_modelfile, run_modelfile),
]
CASES = [(f, field, name) for f in GENERATED for field, is_name in f.fields.items()
         for name in (file_name_values(hostile_values()) if is_name else hostile_values())]


@pytest.mark.parametrize(("generated", "field", "value_name"), CASES,
                         ids=[f"{f.name}-{field}-{name}" for f, field, name in CASES])
def test_a_hostile_value_is_refused_or_quoted(tmp_path, generated, field, value_name):
    value = hostile_values()[value_name]
    check(lambda v: generated.write(tmp_path, field, v), lambda path: generated.run(path, tmp_path, field),
          value, tmp_path)


def test_plain_values_go_through(tmp_path):
    """The check can tell: ordinary values are written and read back, not refused."""
    for generated in GENERATED:
        for field in generated.fields:
            plain = {"time limit": "1-00:00:00", "nodes' Python": "/shared/env/bin/python"}.get(field, "lr-sweep_2")
            scratch = tmp_path / f"{generated.name}-{field}".replace(" ", "_").replace("'", "")
            scratch.mkdir()
            assert check(lambda v, g=generated, f=field, s=scratch: g.write(s, f, v),
                         lambda path, g=generated, f=field, s=scratch: g.run(path, s, f), plain, scratch) == "quoted"


@pytest.mark.parametrize("name", [".", "..", ".hidden"])
def test_a_sweep_name_that_is_not_a_folder_of_its_own_is_refused(tmp_path, name):
    from workbench.errors import ConfigError

    with pytest.raises(ConfigError, match="not starting with '.'.*Fix:"):
        runner.make_plan(notebook(tmp_path / "course"), {"seed": [1]}, name=name, outputs=tmp_path / "outputs")


@pytest.mark.parametrize("name", ["{seed}.ipynb", "{seed:>999999999}.ipynb", "{output_dir.__class__}", "a{{b}}"])
def test_papermill_opens_exactly_the_notebook_named(name):
    """papermill formats its paths with the parameters; the sweep and regress workers pass them escaped."""
    from papermill.parameterize import parameterize_path

    from workbench.notebook_regression.worker import literal_path

    assert parameterize_path(literal_path(f"/course/{name}"), {"seed": 1, "output_dir": "x"}) == f"/course/{name}"


@pytest.mark.parametrize("value_name", sorted(hostile_values()))
def test_a_run_name_stays_inside_the_modelfiles_comment(tmp_path, value_name):
    """The run's name is written only into the Modelfile's first comment line (escaped like the
    sweep script's comments): Ollama reads no command from it, and the comment stays one line."""
    value = hostile_values()[value_name]
    path = write_modelfile(tmp_path, "system prompt", "Be brief.", title=f"{value}: exported by workbench from base")
    run_modelfile(path, tmp_path, "system prompt")  # exactly FROM, SYSTEM, two stops
    first, second = path.read_bytes().decode("utf-8").split("\n", 2)[:2]
    assert first.startswith("# ") and "\r" not in first and second.startswith("# ollama create"), first
