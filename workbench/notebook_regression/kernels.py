"""Choosing the Jupyter kernel the notebooks run in, and making sure it is this venv's Python."""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from workbench.errors import RegressionError
from workbench.notebook_regression.console import Log, print_line


@dataclass
class KernelChoice:
    name: str
    python: str  # the interpreter the kernel will run
    env: dict[str, str]  # extra environment for the worker (JUPYTER_PATH override)


def resolve_kernel(name: str, shared_dir: Path, log: Log = print_line) -> KernelChoice:
    """Find kernel ``name``; make sure "python3" runs *this* Python (the venv's).

    jupyter_client replaces a bare ``python``/``python3`` in a kernelspec's argv
    with ``sys.executable``, so the ipykernel spec installed in the venv runs the
    venv. But a user-level spec (~/.local/share/jupyter/kernels/python3) is found
    first and may point at another interpreter that has no workbench installed;
    then we put a spec for this interpreter first on JUPYTER_PATH, for the worker only.
    """
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec(name)
    except NoSuchKernel:
        raise RegressionError(
            f"Jupyter kernel {name!r} is not installed.",
            "List kernels with `jupyter kernelspec list`; use --kernel python3, or install one "
            f"with `python -m ipykernel install --sys-prefix --name {name}`.",
        ) from None
    argv0 = spec.argv[0] if spec.argv else ""
    aliases = {
        "python",
        f"python{sys.version_info[0]}",
        "python{}.{}".format(*sys.version_info[:2]),
    }
    if argv0 in aliases:
        return KernelChoice(name, sys.executable, {})
    if name == "python3" and _bin_dir(argv0) != _bin_dir(sys.executable):
        kernel_dir = shared_dir / "jupyter" / "kernels" / name
        kernel_dir.mkdir(parents=True, exist_ok=True)
        override = {
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": f"{spec.display_name} (workbench regress)",
            "language": "python",
            "metadata": {"debugger": True},
        }
        (kernel_dir / "kernel.json").write_text(json.dumps(override, indent=1), encoding="utf-8")
        log(f"[regress] kernel python3 points at {argv0}; using {sys.executable} instead")
        jupyter_path = os.pathsep.join(
            filter(None, [str(shared_dir / "jupyter"), os.environ.get("JUPYTER_PATH")])
        )
        return KernelChoice(name, sys.executable, {"JUPYTER_PATH": jupyter_path})
    return KernelChoice(name, argv0, {})  # a kernel the user named on purpose: respected


def _bin_dir(executable: str) -> Path:
    """The folder of an interpreter, links not followed: a venv's bin/python links to the
    base interpreter, which lacks the venv's packages, so resolving links would hide that."""
    return Path(os.path.abspath(shutil.which(executable) or executable)).parent
