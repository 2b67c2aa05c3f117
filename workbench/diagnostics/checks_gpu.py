"""Checks of the GPUs: the NVIDIA driver against torch's CUDA build, each GPU's architecture
against the kernels torch ships, bf16 support and MIG mode.

CUDA driver rule (``check_driver``), comparing torch's build (``torch.version.cuda``)
with the highest CUDA version the driver supports (NVML):

* driver CUDA >= build: ok.
* same major, older minor (driver 12.2, build 12.4): warn. CUDA minor-version
  compatibility lets a driver at or above the major's first release
  (525.60.13 for 12.x, 450.80.02 for 11.x, 580.65.06 for 13.x) run newer minor
  builds, but PTX newer than the driver cannot be JIT-compiled and APIs added
  after the driver fail. Below that floor: error.
* older major (driver 11.8, build 12.4): error -- CUDA cannot initialise.
  Only the cuda-compat forward-compatibility package on data-centre GPUs gets
  around this; when torch really does see CUDA, the result is a warn instead.

GPU architecture rule (``check_gpu_arch``) against ``torch.cuda.get_arch_list()``:
an ``sm_XY`` entry (machine code) runs on GPUs of the same major version with
minor >= Y (Jetson chips 5.3/6.2/7.2/8.7 run only their own code, and ``sm_XYa``
entries run only on exactly that version); a ``compute_XY`` entry (PTX) can be
JIT-compiled for any GPU with compute capability >= X.Y, which works but makes the
first run slow (warn). Neither: error.

Devices and the NVML status are ``workbench.gpu`` objects (``DeviceInfo``, ``NvmlStatus``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from workbench.diagnostics.report import ERROR, OK, WARN, CheckResult
from workbench.diagnostics.values import _version_tuple, format_bytes

# Lowest Linux driver of each CUDA toolkit release (CUDA release notes, table 3).
TOOLKIT_MIN_DRIVER = {
    (11, 0): "450.36.06",
    (11, 1): "455.23",
    (11, 2): "460.27.03",
    (11, 3): "465.19.01",
    (11, 4): "470.42.01",
    (11, 5): "495.29.05",
    (11, 6): "510.39.01",
    (11, 7): "515.43.04",
    (11, 8): "520.61.05",
    (12, 0): "525.60.13",
    (12, 1): "530.30.02",
    (12, 2): "535.54.03",
    (12, 3): "545.23.06",
    (12, 4): "550.54.14",
    (12, 5): "555.42.02",
    (12, 6): "560.28.03",
    (12, 8): "570.26",
    (12, 9): "575.51.03",
    (13, 0): "580.65.06",
}
# CUDA versions with a torch wheel index (download.pytorch.org/whl/cuXYZ), recent releases.
TORCH_WHEEL_CUDA = [(11, 8), (12, 1), (12, 4), (12, 6), (12, 8), (12, 9), (13, 0)]
# Lowest driver that runs any build of that major through minor-version compatibility.
MINOR_COMPAT_MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}

# Jetson/integrated parts: their machine code runs only on them, and they run only their own
# (torch.cuda.DEVICE_REQUIREMENT makes the same exclusions).
EXACT_ONLY_SM = {53, 62, 72, 87, 101}


def _cuda_tuple(text: str | None) -> tuple[int, int] | None:
    v = _version_tuple(text)
    if len(v) < 1:
        return None
    return (v[0], v[1] if len(v) > 1 else 0)


def _min_driver_for(cuda: tuple[int, int]) -> str | None:
    """Lowest driver for a toolkit; an unlisted minor falls back to the next listed one above."""
    candidates = [k for k in TOOLKIT_MIN_DRIVER if k >= cuda]
    return TOOLKIT_MIN_DRIVER[min(candidates)] if candidates else None


def check_driver(status: Any, torch_cuda: str | None, cuda_available: bool = False) -> CheckResult:
    """The NVIDIA driver, and whether it is new enough for torch's CUDA build (rule: module doc)."""
    name = "nvidia driver"
    if not getattr(status, "available", False):
        reason = getattr(status, "reason", None) or "NVML is not available"
        # NVML can start (a driver version is known) yet show no GPU: say which case it is.
        what = "no usable NVIDIA GPU" if getattr(status, "driver_version", None) else "no NVIDIA driver"
        return CheckResult(
            name, WARN,
            f"{what}: {reason}. The CPU checks below still apply; training runs on the CPU.",
            "On a GPU machine install the NVIDIA driver (nvidia-smi must work). In Docker, install "
            "the NVIDIA Container Toolkit on the host and start with --gpus all "
            "(compose: deploy.resources.reservations.devices with capabilities: [gpu]).",
        )
    driver = status.driver_version or "unknown"
    supports = _cuda_tuple(status.cuda_driver_version)
    described = f"driver {driver}, supports CUDA <= {status.cuda_driver_version or 'unknown'}"
    build = _cuda_tuple(torch_cuda)
    if build is None:
        return CheckResult(name, OK, f"{described} (torch is a CPU-only build: nothing to compare)")
    if supports is None:
        return CheckResult(
            name, WARN, f"{described}: cannot compare with torch's CUDA {torch_cuda} build.",
            "Update the NVIDIA driver; nvidia-smi shows the CUDA version it supports.",
        )
    need = _min_driver_for(build)
    need_text = f" (>= {need})" if need else ""
    build_s, supports_s = f"{build[0]}.{build[1]}", f"{supports[0]}.{supports[1]}"
    wheels = [v for v in TORCH_WHEEL_CUDA if v <= supports]
    other_build = (
        f", or install a torch built for CUDA <= {supports_s}: pip install torch --index-url "
        f"https://download.pytorch.org/whl/cu{wheels[-1][0]}{wheels[-1][1]} (an older torch "
        "release may be needed)"
        if wheels else f"; there are no recent torch wheels for CUDA <= {supports_s}"
    )
    if supports >= build:
        return CheckResult(name, OK, f"{described}; torch's CUDA {build_s} build is covered")
    if supports[0] == build[0]:
        floor = MINOR_COMPAT_MIN_DRIVER.get(build[0])
        if floor and _version_tuple(driver) and _version_tuple(driver) < _version_tuple(floor):
            return CheckResult(
                name, ERROR,
                f"{described}, older than {floor}, the lowest driver that runs CUDA {build[0]}.x "
                f"builds: torch's CUDA {build_s} build cannot start.",
                f"Upgrade the NVIDIA driver to one for CUDA {build_s}{need_text}{other_build}.",
            )
        return CheckResult(
            name, WARN,
            f"{described}; torch is built for CUDA {build_s}. It runs under CUDA minor-version "
            f"compatibility, but PTX newer than the driver cannot be compiled and features added "
            f"after CUDA {supports_s} fail.",
            f"Upgrade the NVIDIA driver to one for CUDA {build_s}{need_text}{other_build}.",
        )
    if cuda_available:  # cuda-compat forward compatibility package, data-centre GPUs only
        return CheckResult(
            name, WARN,
            f"{described}; torch is built for CUDA {build_s} and CUDA works, so the cuda-compat "
            f"forward-compatibility package must be in use (data-centre GPUs only).",
            f"Upgrade the NVIDIA driver to one for CUDA {build_s}{need_text} to drop the compat layer.",
        )
    floor = MINOR_COMPAT_MIN_DRIVER.get(build[0])
    floor_text = f" (>= {floor}; >= {need} for all of CUDA {build_s})" if floor and need else need_text
    return CheckResult(
        name, ERROR,
        f"{described}, but torch's CUDA {build_s} build needs a CUDA {build[0]}.x driver"
        f"{floor_text}: CUDA cannot initialise.",
        f"Upgrade the NVIDIA driver to one for CUDA {build_s}{need_text}{other_build}.",
    )


def _arch_code(entry: str) -> tuple[str, int, str] | None:
    """"sm_86" -> ("sm", 86, ""); "compute_90" -> ("compute", 90, ""); "sm_90a" -> ("sm", 90, "a")."""
    if not isinstance(entry, str):  # an arch list of another shape: not an entry we can read
        return None
    match = re.fullmatch(r"(sm|compute)_(\d+)([af]?)", entry.strip())
    if not match:
        return None
    return match.group(1), int(match.group(2)), match.group(3)


def arch_coverage(cc: tuple[int, int], arch_list: Sequence[str]) -> tuple[str, str | None]:
    """How a GPU of compute capability ``cc`` runs this build: ("sass"|"ptx"|"none", entry)."""
    device = cc[0] * 10 + cc[1]
    ptx = None
    for entry in arch_list:
        parsed = _arch_code(entry)
        if parsed is None:
            continue
        kind, code, suffix = parsed
        if kind == "sm":
            if suffix == "a" or code in EXACT_ONLY_SM or device in EXACT_ONLY_SM:
                if device == code:
                    return "sass", entry
            elif code // 10 == device // 10 and code <= device:
                return "sass", entry
        elif code <= device and (ptx is None or code > _arch_code(ptx)[1]):
            ptx = entry
    if ptx:
        return "ptx", ptx
    return "none", None


def _release_suggestion(cc: tuple[int, int], release_archs: Mapping[str, Sequence[int]], torch_version: str | None) -> str:
    device = cc[0] * 10 + cc[1]
    good = [
        cuda for cuda, codes in release_archs.items()
        # a table of another shape (a caller's own, not read_release_table's) suggests nothing
        if isinstance(codes, Iterable) and not isinstance(codes, (str, bytes))
        and any(arch_coverage(cc, [f"sm_{c}"])[0] == "sass" for c in codes)
    ]
    sm = f"sm_{device}"
    if good:
        base = (torch_version or "").split("+")[0]
        pin = f"=={base}" if base else ""
        tags = ", ".join(f"cu{str(c).replace('.', '')}" for c in good)
        first = str(good[0]).replace(".", "")
        return (
            f"Install a torch build whose arch list includes {sm}: this release's {tags} wheels do, "
            f"e.g. pip install torch{pin} --index-url https://download.pytorch.org/whl/cu{first}."
        )
    return (
        f"Install a torch build whose arch list includes {sm}, or an older release that still "
        "supports this GPU (https://pytorch.org/get-started/previous-versions/), "
        f"or build torch from source with TORCH_CUDA_ARCH_LIST={cc[0]}.{cc[1]}."
    )


def check_gpu_arch(
    device: Any,
    arch_list: Sequence[str],
    *,
    cuda_build: str | None = "unknown",
    release_archs: Mapping[str, Sequence[int]] | None = None,
    torch_version: str | None = None,
) -> CheckResult:
    """One GPU (``workbench.gpu.DeviceInfo``): name, memory, compute capability, arch coverage."""
    name = f"gpu {device.index}"
    if getattr(device, "error", None):
        return CheckResult(
            name, WARN, f"GPU {device.index} could not be read: {device.error}",
            "Run nvidia-smi; a GPU that has fallen off the bus needs a reset or a reboot.",
        )
    cc = device.compute_capability
    memory = format_bytes(device.memory_total_bytes)
    described = f"{device.name}, {memory}"
    if cc is None:
        return CheckResult(name, WARN, f"{described}, compute capability unknown: arch not checked.",
                           "Update the NVIDIA driver so NVML reports the compute capability.")
    sm = f"sm_{cc[0]}{cc[1]}"
    described += f", compute capability {cc[0]}.{cc[1]} ({sm})"
    if not cuda_build:
        return CheckResult(name, WARN, f"{described}: torch is CPU-only, this GPU is unused.",
                           "See 'torch.cuda': install a CUDA build of torch.")
    if not arch_list:
        return CheckResult(name, WARN, f"{described}: torch reports no compiled arch list, not checked.")
    how, entry = arch_coverage(cc, arch_list)
    shipped = " ".join(arch_list)
    if how == "sass":
        return CheckResult(name, OK, f"{described}: kernels included ({entry})")
    if how == "ptx":
        return CheckResult(
            name, WARN,
            f"{described}: no {sm} kernels in this torch build ({shipped}); it runs only by "
            f"JIT-compiling the {entry} PTX, which is slow on first use and misses some kernels.",
            _release_suggestion(cc, release_archs or {}, torch_version),
        )
    return CheckResult(
        name, ERROR,
        f"{described} is not supported by this torch build: it ships kernels for {shipped} "
        f"and none runs on {sm}.",
        _release_suggestion(cc, release_archs or {}, torch_version),
    )


def check_bf16(device: Any) -> CheckResult:
    name = f"gpu {device.index} bf16"
    cc = device.compute_capability
    if cc is None:
        return CheckResult(name, OK, "bf16 support unknown (compute capability not reported)")
    if tuple(cc) >= (8, 0):
        return CheckResult(name, OK, "bf16 supported (compute capability >= 8.0): precision='auto' uses bf16")
    return CheckResult(
        name, OK,
        f"no bf16 (compute capability {cc[0]}.{cc[1]} < 8.0): precision='auto' uses fp16 with a "
        "loss scaler; precision='bf16' would fail",
    )


def check_mig(device: Any, slices: Sequence[Any] = ()) -> CheckResult:
    """MIG mode of one physical GPU; ``slices`` are its MIG instances from list_devices()."""
    name = f"gpu {device.index} MIG"
    mode = device.mig_mode
    if mode is None:
        return CheckResult(name, OK, "MIG not supported by this GPU")
    if not mode:
        return CheckResult(name, OK, "MIG off: the whole GPU is available")
    listed = "; ".join(
        f"{s.name} ({'error: ' + s.error if s.error else format_bytes(s.memory_total_bytes)})"
        for s in slices
    ) or "none created"
    return CheckResult(
        name, WARN,
        f"MIG mode is on, instances: {listed}. CUDA sees MIG instances, not the whole GPU: one "
        "process uses one instance, and multi-GPU training (DDP/NCCL) across MIG instances is "
        "not supported.",
        "Pick an instance with CUDA_VISIBLE_DEVICES=MIG-<uuid> (nvidia-smi -L lists them), or ask "
        f"the administrator to turn MIG off: nvidia-smi -i {device.index} -mig 0 (needs a GPU reset).",
    )
