"""Facts about this environment, gathered from torch, ``workbench.gpu`` (the only NVML user),
``os``, ``/proc``, huggingface_hub and jupyter_server.

Every ``gather_*()`` returns a plain dataclass and never raises for a missing GPU, driver or
package: the absence is a fact, and the checks turn it into advice. torch, huggingface_hub and
jupyter_server are imported inside the functions so ``workbench doctor`` starts fast and still
reports when one of them is broken.

Every value read from a library is read defensively: pyproject allows torch >= 2.4, and the
attributes the doctor reads change shape between releases (``PYTORCH_RELEASES_CODE_CC`` is
``{cuda: set}`` in torch 2.11, ``{cuda: {host: set}}`` in 2.13). A value of a shape we do not
know becomes "unknown" (None, an empty list or table, with a note saying what was seen), never a
traceback: the doctor is what a user runs when the environment is already odd.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
import tempfile
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from workbench.diagnostics.mounts import MountEntry, find_mount

# package -> lowest version workbench works with (mirrors pyproject.toml)
REQUIRED_PACKAGES = {
    "torch": "2.4",
    "transformers": "5.0",
    "datasets": "3.0",
    "accelerate": "1.0",
}


@dataclass
class PythonFacts:
    version: str
    executable: str
    packages: dict[str, str | None]  # distribution -> installed version, None when missing


def gather_python(packages: Iterable[str] = tuple(REQUIRED_PACKAGES)) -> PythonFacts:
    installed: dict[str, str | None] = {}
    for name in packages:
        try:
            installed[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed[name] = None
    return PythonFacts(platform.python_version(), sys.executable, installed)


@dataclass
class TorchFacts:
    version: str | None = None
    import_error: str | None = None
    cuda_build: str | None = None  # torch.version.cuda, e.g. "12.4"; None for a CPU-only build
    cudnn: str | None = None
    nccl: str | None = None
    cuda_available: bool = False
    cuda_error: str | None = None  # why torch.cuda.is_available() is False, when torch says
    cuda_visible_devices: str | None = None  # the CUDA_VISIBLE_DEVICES torch ran with
    device_count: int = 0
    arch_list: list[str] = field(default_factory=list)  # torch.cuda.get_arch_list()
    # CUDA version -> compute capabilities that torch's published wheels of that CUDA ship
    release_archs: dict[str, list[int]] = field(default_factory=dict)
    # why release_archs is empty or partial ("unknown: ... had an unexpected shape"); None when read
    release_archs_note: str | None = None


def _text(value: Any) -> str | None:
    """A version-like value as text; None for None, empty or something that is no scalar."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (str, int, float)):
        return str(value).strip() or None
    return None


def _shape(value: Any) -> str:
    return type(value).__name__


def _code(value: Any) -> int | None:
    """A compute capability code as torch's tables write it (90 for sm_90): an int or "90"."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, str):
        digits = value.strip().removeprefix("sm_")
        return int(digits) if digits.isdigit() and int(digits) > 0 else None
    return None


def read_release_table(table: Any, host: str) -> tuple[dict[str, list[int]], str | None]:
    """``torch.cuda.PYTORCH_RELEASES_CODE_CC`` as {cuda: sorted codes} for ``host``, and a note.

    Shapes known: ``{cuda: {host: set}}`` (torch 2.13), ``{cuda: set}`` (torch 2.11, one table for
    every host). Anything else -- the table missing, None, a list, a CUDA entry of another shape,
    codes that are no numbers -- is left out, and the note says what was seen, so the report can
    say "unknown" instead of the doctor raising.
    """
    if table is None:
        return {}, "unknown: this torch has no PYTORCH_RELEASES_CODE_CC table"
    if not isinstance(table, Mapping):
        return {}, f"unknown: PYTORCH_RELEASES_CODE_CC is a {_shape(table)}, not a table"
    archs: dict[str, list[int]] = {}
    skipped: list[str] = []
    for cuda, entry in table.items():
        version = _text(cuda)
        if isinstance(entry, Mapping):  # torch 2.13: per host
            entry = entry.get(host, ())
        if version is None or isinstance(entry, (str, bytes)) or not isinstance(entry, Iterable):
            skipped.append(f"{cuda!r}: {_shape(entry)}")
            continue
        try:
            codes = sorted({c for c in (_code(v) for v in entry) if c is not None})
        except Exception as exc:  # an iterable that fails while read
            skipped.append(f"{cuda!r}: {type(exc).__name__}")
            continue
        if codes:
            archs[version] = codes
    note = None
    if skipped:
        note = f"unknown for {', '.join(skipped)}: an unexpected shape in PYTORCH_RELEASES_CODE_CC"
    elif not archs:
        note = "unknown: PYTORCH_RELEASES_CODE_CC lists no compute capability for this host"
    return archs, note


def _format_cudnn(v: int | None) -> str | None:
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        return None
    if v >= 90000:  # cuDNN 9 encodes major*10000 + minor*100 + patch
        return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"
    return f"{v // 1000}.{v % 1000 // 100}.{v % 100}"  # cuDNN 8: major*1000 + minor*100 + patch


def gather_torch() -> TorchFacts:
    try:
        import torch
    except Exception as exc:  # not installed, or a broken build (missing .so)
        return TorchFacts(import_error=f"{type(exc).__name__}: {exc}")
    try:
        cuda_build = _text(torch.version.cuda)
    except Exception:  # no torch.version module in an odd build
        cuda_build = None
    facts = TorchFacts(
        version=_text(getattr(torch, "__version__", None)) or "unknown",
        cuda_build=cuda_build,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
    )
    # torch explains a failed CUDA start (driver too old, ...) only as a warning.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            facts.cuda_available = bool(torch.cuda.is_available())
            facts.device_count = int(torch.cuda.device_count()) if facts.cuda_available else 0
        except Exception as exc:
            facts.cuda_error = f"{type(exc).__name__}: {exc}"
    if not facts.cuda_available and not facts.cuda_error and caught:
        facts.cuda_error = " ".join(str(caught[-1].message).split())
    try:
        # only text entries: the arch check parses "sm_90" / "compute_90" and nothing else
        facts.arch_list = [a for a in torch.cuda.get_arch_list() if isinstance(a, str)]
    except Exception:
        facts.arch_list = []
    try:
        facts.cudnn = _format_cudnn(torch.backends.cudnn.version())
    except Exception:
        facts.cudnn = None
    if facts.cuda_build:
        try:
            facts.nccl = _format_nccl(torch.cuda.nccl.version())
        except Exception:  # built without NCCL
            facts.nccl = None
    host = "aarch64" if platform.machine().lower() == "aarch64" else "x86_64"
    try:
        table = getattr(torch.cuda, "PYTORCH_RELEASES_CODE_CC", None)
    except Exception:  # a lazy attribute that fails to load
        table = None
    facts.release_archs, facts.release_archs_note = read_release_table(table, host)
    return facts


def _format_nccl(v: Any) -> str | None:
    """(2, 27, 5) in torch >= 1.13; an int such as 2708 (major*1000 + minor*100 + patch) before."""
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v // 1000}.{v % 1000 // 100}.{v % 100}" if v > 0 else None
    if isinstance(v, (tuple, list)) and v and all(isinstance(p, int) for p in v):
        return ".".join(str(p) for p in v)
    return None


@dataclass
class CpuFacts:
    name: str | None = None  # "AMD EPYC", as torch's cpuinfo reads it
    cores: int | None = None  # logical CPUs this process may use
    bf16_native: bool | None = None  # computes bf16 natively (None: could not be judged)
    bf16_evidence: str | None = None  # "AVX512-BF16"; "no AVX512-BF16 or AMX-BF16: ..."
    auto_precision: str | None = None  # what precision="auto" picks for a run on this CPU
    auto_reason: str | None = None  # "auto: bf16, this CPU computes it natively (AVX512-BF16)"
    error: str | None = None  # why it could not be judged


def gather_cpu() -> CpuFacts:
    """The CPU and its bf16 support, judged as a run judges it (``workbench.engine.precision``)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count()
    try:
        from workbench.engine.precision import DeviceFacts, choose_precision, cpu_bf16, cpu_flags

        cpu = cpu_bf16()
        choice = choose_precision("auto", DeviceFacts(cuda=False, bf16=cpu.native, evidence=cpu.evidence))
        name = cpu_flags().get("cpu_name")
    except Exception as exc:  # torch missing or broken: the torch check says so
        return CpuFacts(cores=cores, error=f"{type(exc).__name__}: {exc}")
    return CpuFacts(name=str(name) if name else None, cores=cores, bf16_native=cpu.native,
                    bf16_evidence=cpu.evidence, auto_precision=choice.precision, auto_reason=choice.reason)


def gather_gpus(nvml: Any = None) -> tuple[Any, list[Any]]:
    """(NvmlStatus, [DeviceInfo]) from workbench.gpu; never raises."""
    try:
        from workbench import gpu
    except Exception as exc:  # the module itself missing or broken
        from types import SimpleNamespace

        status = SimpleNamespace(
            available=False, reason=f"workbench.gpu cannot be imported ({exc})",
            driver_version=None, cuda_driver_version=None, device_count=0,
        )
        return status, []
    status = gpu.nvml_status(nvml)
    devices = gpu.list_devices(nvml) if status.available else []
    return status, devices


@dataclass
class ShmFacts:
    path: str
    exists: bool
    total_bytes: int | None = None
    free_bytes: int | None = None


def gather_shm(path: str = "/dev/shm") -> ShmFacts:
    try:
        st = os.statvfs(path)
    except OSError:
        return ShmFacts(path, exists=False)
    return ShmFacts(path, True, st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize)


@dataclass
class DirFacts:
    path: str  # absolute, symlinks resolved
    exists: bool
    probe_dir: str | None  # the directory a test file was written in: path, or its nearest existing parent
    writable: bool
    write_error: str | None
    free_bytes: int | None
    mount: MountEntry | None
    container: str | None  # why we think we are in a container; None outside one


def probe_writable(directory: str) -> str | None:
    """Try to create and delete a file in ``directory``; the error text, or None when it worked."""
    try:
        fd, name = tempfile.mkstemp(prefix=".workbench-doctor-", dir=directory)
        os.close(fd)
        os.unlink(name)
        return None
    except OSError as exc:
        return f"{exc.strerror or exc} ({type(exc).__name__})"


def gather_dir(path: str | os.PathLike, mounts: Sequence[MountEntry], container: str | None) -> DirFacts:
    resolved = os.path.realpath(os.path.abspath(os.path.expanduser(str(path))))
    probe = resolved
    while not os.path.exists(probe) and probe != os.path.dirname(probe):
        probe = os.path.dirname(probe)
    exists = os.path.exists(resolved)
    if not os.path.isdir(probe):
        error = f"{probe} is not a directory"
        writable = False
    else:
        error = probe_writable(probe)
        writable = error is None
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        free = None
    return DirFacts(resolved, exists, probe, writable, error, free, find_mount(resolved, mounts), container)


@dataclass
class HubFacts:
    installed: bool
    home: str | None = None
    hub_cache: str | None = None
    offline: bool = False
    endpoint: str | None = None
    cache: DirFacts | None = None


def gather_hub(mounts: Sequence[MountEntry], container: str | None) -> HubFacts:
    try:
        from huggingface_hub import constants
    except Exception:
        return HubFacts(installed=False)
    # constants renamed or removed in a later huggingface_hub are "unknown", not an AttributeError
    hub_cache = _text(getattr(constants, "HF_HUB_CACHE", None))
    return HubFacts(
        installed=True,
        home=_text(getattr(constants, "HF_HOME", None)),
        hub_cache=hub_cache,
        offline=bool(getattr(constants, "HF_HUB_OFFLINE", False)),
        endpoint=_text(getattr(constants, "ENDPOINT", None)),
        cache=gather_dir(hub_cache, mounts, container) if hub_cache else None,
    )


@dataclass
class ServerFacts:
    url: str
    pid: int | None
    has_token: bool
    has_password: bool
    weak_token: bool = False  # too short or predictable (workbench.server.credentials.token_problem)


@dataclass
class JupyterFacts:
    token_env: bool  # JUPYTER_TOKEN is set and not empty
    token_file: str | None  # JUPYTER_TOKEN_FILE
    token_file_ok: bool | None  # the file exists and is not empty
    servers: list[ServerFacts] = field(default_factory=list)
    error: str | None = None  # why the running servers could not be listed
    # Run inside a Jupyter kernel (JPY_PARENT_PID / JPY_SESSION_NAME): `workbench lab` keeps
    # JUPYTER_TOKEN out of kernels, so here the token is read from the server's runtime file.
    in_kernel: bool = False


def gather_jupyter(env: Mapping[str, str] | None = None, runtime_dir: str | None = None) -> JupyterFacts:
    env = os.environ if env is None else env
    token_file = env.get("JUPYTER_TOKEN_FILE") or None
    token_file_ok = None
    if token_file:
        try:
            token_file_ok = bool(Path(token_file).read_text().strip())
        except OSError:
            token_file_ok = False
    facts = JupyterFacts(bool(env.get("JUPYTER_TOKEN")), token_file, token_file_ok,
                         in_kernel=bool(env.get("JPY_PARENT_PID") or env.get("JPY_SESSION_NAME")))
    try:
        from jupyter_server.serverapp import list_running_servers

        from workbench.server.credentials import token_problem

        for info in list_running_servers(runtime_dir):
            facts.servers.append(
                ServerFacts(
                    url=str(info.get("url", "?")).split("?")[0],  # never a token in a query
                    pid=info.get("pid"),
                    has_token=bool(info.get("token")),
                    has_password=bool(info.get("password")),
                    # jpserver-<pid>.json (mode 600) holds the token: judged, never kept.
                    weak_token=bool(info.get("token")) and token_problem(str(info["token"]).strip()) is not None,
                )
            )
    except Exception as exc:
        facts.error = f"{type(exc).__name__}: {exc}"
    return facts
