"""Kernels that import nothing from their notebook's folder while they start.

A kernel spec runs ``python -m ipykernel_launcher`` in the notebook's folder, and ``-m`` puts
that folder first on sys.path: an ``ipykernel_launcher.py`` -- or a ``psutil.py``, which
ipykernel imports later, when the kernel is interrupted or shut down -- planted next to a
notebook would run as soon as the notebook is opened. The server's kernel spec manager starts
such kernels with ``server/processes.py``'s launcher instead: ``-P``, nothing from the folder
until the first cell runs, then the folder after site-packages, so notebooks keep importing
their helper modules. ``SafePathKernelManager`` does the same for the kernels papermill starts
(``workbench sweep``, ``workbench regress``).

Only kernels whose Python is the server's own are changed; other kernel specs run as they are.
"""

from __future__ import annotations

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from traitlets import default

from workbench.server.processes import safe_kernel_argv


class SafePathKernelSpecManager(KernelSpecManager):
    """KernelSpecManager whose Python kernels start with :func:`safe_kernel_argv`."""

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        spec = super().get_kernel_spec(kernel_name)
        spec.argv = safe_kernel_argv(spec.argv)
        return spec


class SafePathKernelManager(AsyncKernelManager):
    """The kernel manager papermill (nbclient) uses, with :class:`SafePathKernelSpecManager`'s kernels."""

    @default("kernel_spec_manager")
    def _safe_kernel_spec_manager(self) -> KernelSpecManager:
        return SafePathKernelSpecManager(data_dir=self.data_dir)
