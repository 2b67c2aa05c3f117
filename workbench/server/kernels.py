"""Kernels started without the notebook's folder first on sys.path.

A kernel spec runs ``python -m ipykernel_launcher`` in the notebook's folder, and ``-m``
puts that folder first on sys.path: an ``ipykernel_launcher.py`` (or ``ipykernel/``,
``zmq.py``...) planted next to a notebook would run as the kernel as soon as the notebook
is opened. The workbench's kernel spec manager starts such kernels with ``-P`` and a
one-line launcher that puts the folder back on sys.path *after the standard library*
(where IPython itself puts it) once the kernel's own modules are imported: notebooks keep
importing helper modules from their folder, as with any IPython kernel.

Only kernels whose Python is the server's own are changed (``-P`` needs Python 3.11+);
other kernel specs run as they are.
"""

from __future__ import annotations

import os
import shutil
import sys

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager

# sys.argv[1:] is what follows -c (the "-f {connection_file}" of the kernel spec).
LAUNCHER = (
    "import os, sys; from ipykernel import kernelapp; "
    "i = next((n for n, p in enumerate(sys.path) if os.path.basename(p) in ('site-packages', 'dist-packages')), "
    "len(sys.path)); sys.path.insert(i, ''); kernelapp.launch_new_instance()"
)


def _is_this_python(executable: str) -> bool:
    # jupyter_client runs a spec's "python", "python3" or "python3.X" with sys.executable.
    if executable in {"python", f"python{sys.version_info[0]}", "python{}.{}".format(*sys.version_info[:2])}:
        return True
    found = shutil.which(executable) if not os.path.isabs(executable) else executable
    return bool(found) and os.path.realpath(found) == os.path.realpath(sys.executable)


def safe_kernel_argv(argv: list[str]) -> list[str]:
    """``python -m ipykernel_launcher ARGS`` -> ``python -P -c LAUNCHER ARGS``; others unchanged."""
    if (len(argv) >= 3 and argv[1:3] == ["-m", "ipykernel_launcher"] and sys.version_info >= (3, 11)
            and _is_this_python(argv[0])):
        return [argv[0], "-P", "-c", LAUNCHER, *argv[3:]]
    return list(argv)


class SafePathKernelSpecManager(KernelSpecManager):
    """KernelSpecManager whose Python kernels start with :func:`safe_kernel_argv`."""

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        spec = super().get_kernel_spec(kernel_name)
        spec.argv = safe_kernel_argv(spec.argv)
        return spec
