"""The notebooks, profiles and baselines shipped with the package, and where baselines may be written.

All three are package data found with importlib.resources, never relative to the
working directory, so `workbench regress` runs the same from a checkout, from an
installed wheel and from any folder. In a checkout's editable install (scripts/setup.sh)
they *are* the checkout's files: ``workbench._notebooks`` maps onto the top-level
notebooks/ folder (pyproject.toml) and the YAML files sit beside this module.
"""

from __future__ import annotations

import os
import site
import sysconfig
from importlib import resources
from pathlib import Path

from workbench.errors import RegressionError

NOTEBOOKS_PACKAGE = "workbench._notebooks"


def _package_path(package: str, name: str = "") -> Path:
    """A real file-system path to package data (papermill and kernels need one)."""
    try:
        traversable = resources.files(package)
    except ModuleNotFoundError as exc:
        raise RegressionError(
            f"the workbench package is incomplete: {package} is missing ({exc}).",
            "Reinstall it (pip install --force-reinstall workbench, or bash scripts/setup.sh "
            "in a checkout), or pass the folder or file explicitly.",
        ) from exc
    path = Path(str(traversable / name if name else traversable))
    if not path.exists():
        raise RegressionError(
            f"the workbench package is incomplete: {path} is missing.",
            "Reinstall it (pip install --force-reinstall workbench, or bash scripts/setup.sh "
            "in a checkout), or pass the folder or file explicitly.",
        )
    return path


def notebooks_dir() -> Path:
    """The folder of the shipped notebooks (a checkout's notebooks/ in an editable install)."""
    return _package_path(NOTEBOOKS_PACKAGE)


def profiles_file() -> Path:
    return _package_path(__package__, "profiles.yaml")


def baselines_file() -> Path:
    return _package_path(__package__, "baselines.yaml")


def install_dirs() -> list[Path]:
    """Where pip installs packages for this interpreter (site-packages / dist-packages)."""
    found = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")}
    found.update(getattr(site, "getsitepackages", list)())
    user_site = getattr(site, "getusersitepackages", lambda: None)()
    if user_site:
        found.add(user_site)
    return sorted(Path(p).resolve() for p in found)


def is_installed_copy(path: str | Path) -> bool:
    """True for a file that pip installed: editing it changes an installed package."""
    path = Path(path).resolve()
    return any(path.is_relative_to(folder) for folder in install_dirs())


def check_baselines_writable(path: str | Path) -> None:
    """Refuse, before any notebook runs, a --update-baselines that would write site-packages.

    The copy installed with a wheel is the package's, not the user's: the next install
    replaces it and it may be read-only (a container image). In a checkout's editable
    install the default file is the checkout's own and is written in place.
    """
    path = Path(path).resolve()
    if is_installed_copy(path):
        checkout_copy = Path.cwd() / "workbench" / "notebook_regression" / "baselines.yaml"
        where = (
            f"--baselines-file {checkout_copy} (this checkout's file)"
            if checkout_copy.is_file()
            else f"--baselines-file my_baselines.yaml after `cp {path} my_baselines.yaml`"
        )
        raise RegressionError(
            f"--update-baselines would write {path}, the copy installed with the workbench "
            "package: the next install would overwrite it, and it may be read-only.",
            f"Pass the file to update: {where}; or run from a checkout with its editable "
            "install (bash scripts/setup.sh), where the default is the checkout's file.",
        )
    target = path if path.exists() else path.parent
    if not os.access(target, os.W_OK):
        raise RegressionError(
            f"--update-baselines cannot write {path}: {target} is missing or not writable.",
            "Pass --baselines-file with a path you can write (its folder must exist).",
        )
