"""The doctor itself: gather every fact, run every check on them, return the report.

``build_report(facts)`` is pure, so tests can edit facts and see what the checks make of them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from workbench.diagnostics.checks_gpu import check_bf16, check_driver, check_gpu_arch, check_mig
from workbench.diagnostics.checks_hub import check_hub_cache, check_hub_offline, check_hub_reachable
from workbench.diagnostics.checks_jupyter import check_jupyter
from workbench.diagnostics.checks_software import (
    check_cuda_available,
    check_package,
    check_python,
    check_torch_build,
)
from workbench.diagnostics.checks_system import (
    check_cpu_bf16,
    check_output_space,
    check_output_volume,
    check_output_writable,
    check_shm,
)
from workbench.diagnostics.facts import (
    REQUIRED_PACKAGES,
    CpuFacts,
    DirFacts,
    HubFacts,
    JupyterFacts,
    PythonFacts,
    ShmFacts,
    TorchFacts,
    gather_cpu,
    gather_dir,
    gather_gpus,
    gather_hub,
    gather_jupyter,
    gather_python,
    gather_shm,
    gather_torch,
)
from workbench.diagnostics.mounts import _read_text, gather_container, parse_mountinfo
from workbench.diagnostics.report import WARN, CheckResult, DoctorReport


def _plain(obj: Any) -> Any:
    """Dataclasses/namespaces -> JSON-able dicts."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return {k: _plain(v) for k, v in vars(obj).items() if not k.startswith("_")}
    return obj


def default_output_dir() -> str:
    return os.environ.get("WORKBENCH_OUTPUT_DIR") or "outputs"


@dataclass
class DoctorFacts:
    """Everything the checks look at; build_report(facts) is pure, so tests can edit facts."""

    python: PythonFacts
    torch: TorchFacts
    nvml: Any  # workbench.gpu.NvmlStatus
    gpus: list[Any]  # workbench.gpu.DeviceInfo, each GPU followed by its MIG slices
    shm: ShmFacts
    cpu: CpuFacts
    container: str | None
    output_dir: DirFacts
    hub: HubFacts
    jupyter: JupyterFacts


def gather_facts(
    output_dir: str | os.PathLike | None = None,
    *,
    nvml: Any = None,
    mountinfo: str | None = None,
) -> DoctorFacts:
    """Collect the facts. ``nvml``: a module like pynvml (tests: a fake); ``mountinfo``:
    /proc/self/mountinfo text (default: read from /proc)."""
    output_dir = output_dir or default_output_dir()
    if mountinfo is None:
        mountinfo = _read_text("/proc/self/mountinfo")
    mounts = parse_mountinfo(mountinfo)
    container = gather_container(mounts)
    status, devices = gather_gpus(nvml)
    return DoctorFacts(
        python=gather_python(),
        torch=gather_torch(),
        nvml=status,
        gpus=devices,
        shm=gather_shm(),
        cpu=gather_cpu(),
        container=container,
        output_dir=gather_dir(output_dir, mounts, container),
        hub=gather_hub(mounts, container),
        jupyter=gather_jupyter(),
    )


def _checked(name: str, check: Callable[..., CheckResult], *args: Any, **kwargs: Any) -> CheckResult:
    """Run one check; a check that raises on facts it did not expect becomes a warning row
    named ``name``, so one odd fact costs its own row and never the whole report."""
    try:
        return check(*args, **kwargs)
    except Exception as exc:
        return CheckResult(
            name, WARN, f"could not be checked: {check.__name__} raised {type(exc).__name__}: {exc}",
            "Report this at the workbench issue tracker with `workbench doctor --json`; the other "
            "rows still hold.",
        )


def build_report(facts: DoctorFacts, *, check_network: bool = True) -> DoctorReport:
    """Run every check on the facts (only the hub probe touches the network)."""
    f = facts
    results: list[tuple[str, CheckResult]] = [("python", _checked("python", check_python, f.python.version))]
    for pkg, minimum in REQUIRED_PACKAGES.items():
        results.append(("python", _checked(pkg, check_package, pkg, f.python.packages.get(pkg), minimum)))
    results.append(("torch", _checked("torch build", check_torch_build, f.torch)))
    results.append(("torch", _checked("torch.cuda", check_cuda_available, f.torch, f.nvml)))
    results.append(("gpu", _checked("nvidia driver", check_driver, f.nvml, f.torch.cuda_build,
                                    f.torch.cuda_available)))
    for device in (d for d in f.gpus if not d.is_mig):
        gpu = f"gpu {getattr(device, 'index', '?')}"
        results.append(("gpu", _checked(
            gpu, check_gpu_arch, device, f.torch.arch_list, cuda_build=f.torch.cuda_build,
            release_archs=f.torch.release_archs, torch_version=f.torch.version,
        )))
        if not device.error:
            slices = [d for d in f.gpus if d.is_mig and d.index == device.index]
            results.append(("gpu", _checked(f"{gpu} bf16", check_bf16, device)))
            results.append(("gpu", _checked(f"{gpu} MIG", check_mig, device, slices)))
    results.append(("system", _checked("cpu bf16", check_cpu_bf16, f.cpu, f.torch.cuda_available)))
    results.append(("system", _checked("shared memory", check_shm, f.shm)))
    results.append(("storage", _checked("output dir", check_output_writable, f.output_dir)))
    results.append(("storage", _checked("output free space", check_output_space, f.output_dir)))
    results.append(("storage", _checked("output volume", check_output_volume, f.output_dir)))
    results.append(("huggingface", _checked("hf cache", check_hub_cache, f.hub)))
    if f.hub.installed:
        results.append(("huggingface", _checked("hf offline", check_hub_offline, f.hub)))
        if check_network:
            results.append(("huggingface", _checked("hf hub reachable", check_hub_reachable,
                                                    f.hub.endpoint, f.hub.offline)))
    results.append(("jupyter", _checked("jupyter auth", check_jupyter, f.jupyter)))
    for section, result in results:
        result.section = section
    plain = {
        "python": {"version": f.python.version, "executable": f.python.executable},
        "packages": f.python.packages,
        "torch": _plain(f.torch),
        "nvml": _plain(f.nvml),
        "gpus": _plain(f.gpus),
        "shm": _plain(f.shm),
        "cpu": _plain(f.cpu),
        "container": f.container,
        "output_dir": _plain(f.output_dir),
        "huggingface": _plain(f.hub),
        "jupyter": _plain(f.jupyter),
    }
    return DoctorReport([r for _, r in results], plain)


def doctor(
    output_dir: str | os.PathLike | None = None,
    *,
    check_network: bool = True,
    nvml: Any = None,
    mountinfo: str | None = None,
) -> DoctorReport:
    """Check this environment; the report shows as an HTML table when it ends a notebook cell.

    output_dir: where checkpoints will go (default: $WORKBENCH_OUTPUT_DIR or ./outputs).
    check_network: False skips the Hugging Face Hub HEAD request (~2 s at most).
    nvml, mountinfo: see gather_facts (for tests).
    """
    facts = gather_facts(output_dir, nvml=nvml, mountinfo=mountinfo)
    return build_report(facts, check_network=check_network)
