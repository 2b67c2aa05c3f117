"""The package as a user gets it: a wheel in a fresh venv, run from a folder outside any checkout.

The wheel is built from a copy of the files pyproject.toml packages (no build/ or
egg-info left in the checkout), installed with --no-deps into a venv in a temporary
folder, and its commands run with a working directory that is neither the checkout
nor the venv. To stay fast, the venv reaches the project's dependencies through a
.pth line naming this interpreter's site-packages; a plain path line is not a site
dir, so the editable install's finder there is never run (the tests prove which
``workbench`` is imported). The dependencies' data files (JupyterLab's assets,
kernelspecs) live under the prefix, so ``share/jupyter`` links to this venv's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

try:
    from tests.lab_helpers import LabServer, free_port, http, isolated_env, new_token
except ImportError:  # tests/ itself on sys.path (pytest's rootdir insertion)
    from lab_helpers import LabServer, free_port, http, isolated_env, new_token

REPO = Path(__file__).resolve().parents[1]
# What the build reads (docker/Dockerfile must copy the same before its `pip install`).
SOURCES = ["pyproject.toml", "README.md", "workbench", "notebooks"]


@dataclass
class Installed:
    venv: Path
    site_packages: Path
    wheel: Path
    workdir: Path  # a folder outside the checkout and the venv, used as cwd
    env: dict[str, str]
    regress: subprocess.Popen | None = None  # started early: it runs while lab and doctor do

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)

    def run(self, *argv: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(
            argv, cwd=self.workdir, env=self.env, capture_output=True, text=True,
            timeout=timeout, **kwargs,
        )  # fmt: skip


def _check(done: subprocess.CompletedProcess, what: str) -> None:
    assert done.returncode == 0, f"{what} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Iterator[Installed]:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "outputs",
                                                          ".ipynb_checkpoints"))  # fmt: skip
        else:
            shutil.copy2(REPO / name, src / name)
    # --no-build-isolation --no-index: this venv's setuptools, never the network.
    _check(subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-q", "-w", str(tmp / "dist"), str(src)],
        capture_output=True, text=True, timeout=180,
    ), "pip wheel")  # fmt: skip
    (wheel,) = (tmp / "dist").glob("workbench-*.whl")

    venv = tmp / "venv"
    _check(subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
                          capture_output=True, text=True, timeout=60), "python -m venv")  # fmt: skip
    python = venv / "bin" / "python"
    site_packages = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip())  # fmt: skip
    # The dependencies: this venv's site-packages, appended after the new venv's own.
    (site_packages / "project_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (venv / "share").mkdir(exist_ok=True)
    (venv / "share" / "jupyter").symlink_to(Path(sys.prefix) / "share" / "jupyter")
    # This pip installs into the new venv (pip >= 22.3): the new venv needs no pip of its own.
    _check(subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "-q", str(wheel)],
        capture_output=True, text=True, timeout=180,
    ), "pip install the wheel")  # fmt: skip

    workdir = tmp / "elsewhere"
    workdir.mkdir()
    env = isolated_env(tmp / "isolated")
    env.pop("PYTHONPATH", None)  # nothing may put the checkout on sys.path
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONDONTWRITEBYTECODE="1")  # fmt: skip
    found = Installed(venv, site_packages, wheel, workdir, env)
    # The longest check (a kernel runs the notebook) starts now and is read by its test.
    found.regress = subprocess.Popen(
        [found.bin("workbench"), "regress", "--profile", "ci", "--notebooks", "00_environment_check",
         "--output-dir", str(workdir / "regress-out")],
        cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    yield found
    if found.regress.poll() is None:  # a test failed before reading it
        found.regress.kill()
        found.regress.communicate()


def test_the_wheel_holds_every_module_notebook_and_data_file(installed):
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    in_checkout = {p.relative_to(REPO).as_posix() for p in (REPO / "workbench").rglob("*.py")
                   if "__pycache__" not in p.parts}  # fmt: skip
    missing = sorted(in_checkout - names)
    assert not missing, (
        f"modules missing from the wheel: {missing}; list their package in "
        "[tool.setuptools] packages in pyproject.toml"
    )
    notebooks = {f"workbench/_notebooks/{p.name}" for p in (REPO / "notebooks").glob("*.ipynb")}
    assert notebooks and notebooks <= names, sorted(notebooks - names)
    for data in ("workbench/notebook_regression/profiles.yaml",
                 "workbench/notebook_regression/baselines.yaml",
                 "workbench/server/jupyter_config/jupyter_server_config.py", "workbench/py.typed",
                 "workbench/classroom/static/teacher.html", "workbench/classroom/static/teacher.js"):  # fmt: skip
        assert data in names, data


def test_the_wheels_files_are_the_ones_imported(installed):
    code = (
        "import json, workbench, workbench.server.jupyter_config, workbench._notebooks\n"
        "from workbench.notebook_regression import bundled\n"
        "print(json.dumps([workbench.__file__, workbench.server.jupyter_config.__file__,\n"
        "                  str(bundled.notebooks_dir()), str(bundled.profiles_file())]))\n"
    )
    done = installed.run(installed.bin("python"), "-c", code)
    _check(done, "import workbench")
    for path in json.loads(done.stdout):
        assert Path(path).resolve().is_relative_to(installed.site_packages.resolve()), (
            f"{path} is not the wheel's copy in {installed.site_packages}: the checkout leaked in"
        )


def test_doctor_json_from_the_wheel(installed):
    done = installed.run(installed.bin("workbench"), "doctor", "--json")
    assert done.returncode in (0, 1), done.stderr  # 1: an environment error, still a report
    report = json.loads(done.stdout)
    assert report["version"] == 1 and report["results"], done.stdout
    # The default output folder is taken from where the command runs, not from the package.
    checked = Path(report["facts"]["output_dir"]["path"])
    assert checked.is_relative_to(installed.workdir.resolve()), checked


def test_lab_from_the_wheel_needs_the_token(installed, tmp_path):
    port, token = free_port(), new_token()
    env = {**installed.env, "JUPYTER_TOKEN": token}
    argv = [installed.bin("workbench"), "lab", "--port", str(port),
            "--notebook-dir", str(installed.workdir)]  # fmt: skip
    server = LabServer(argv, env, port, token, tmp_path / "server.log").wait_ready()
    try:
        session = http()
        assert session.get(f"{server.url}/api/contents").status_code == 403
        right = session.get(f"{server.url}/api/contents",
                            headers={"Authorization": f"token {token}"})  # fmt: skip
        assert right.status_code == 200, right.text
        # The server ran the configuration shipped in the wheel.
        assert str(installed.site_packages / "workbench" / "server" / "jupyter_config") in server.log()
    finally:
        server.stop()


def test_regress_runs_the_bundled_notebook_from_the_wheel(installed):
    out = installed.workdir / "regress-out"
    output, _ = installed.regress.communicate(timeout=300)
    assert installed.regress.returncode == 0, f"workbench regress failed:\n{output}"
    report = json.loads((out / "report.json").read_text())
    assert [r["notebook"] for r in report["results"]] == ["00_environment_check.ipynb"]
    assert report["results"][0]["status"] == "passed"
    bundled = installed.site_packages / "workbench"
    assert Path(report["notebooks_dir"]) == bundled / "_notebooks"
    assert Path(report["baselines_file"]) == bundled / "notebook_regression" / "baselines.yaml"


def test_update_baselines_refuses_to_write_into_site_packages(installed):
    done = installed.run(
        installed.bin("workbench"), "regress", "--profile", "ci",
        "--notebooks", "00_environment_check", "--update-baselines",
        "--output-dir", str(installed.workdir / "refused"),
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "installed with the workbench package" in done.stderr
    assert "--baselines-file" in done.stderr
    assert not (installed.workdir / "refused").exists()  # refused before any kernel started
