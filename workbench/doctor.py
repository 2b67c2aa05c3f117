"""`workbench doctor`: find the environment traps that waste days, name each one, give the fix.

The traps: an NVIDIA driver older than torch's CUDA build, a GPU too old for the
kernels torch ships, a 64 MB /dev/shm that kills DataLoader workers, checkpoints
written inside a container layer that is deleted with the container, a Jupyter
server anyone can use.

Three layers, so every check can be tested with plain inputs:

* ``gather_*()`` collect *facts* (dataclasses) from torch, ``workbench.gpu``
  (the only NVML user), ``os`` and ``/proc``. They never raise for a missing
  GPU, driver or package: the absence is a fact.
* ``check_*()`` are pure functions from facts to a :class:`CheckResult`
  (level ``ok`` / ``warn`` / ``error``, a message, and the fix).
* :class:`DoctorReport` renders the results: a text table for terminals, an
  HTML table in notebooks (``workbench.doctor()`` as the last line of a cell),
  JSON for machines.

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
entries run only on exactly that version); a ``compute_XY`` entry (PTX) can be JIT-compiled for any GPU with
compute capability >= X.Y, which works but makes the first run slow (warn).
Neither: error.

JSON written by ``workbench doctor --json`` (schema version 1)::

    {
      "version": 1,
      "ok": true,                       # false when any result has level "error"
      "counts": {"ok": 17, "warn": 2, "error": 0},
      "results": [
        {"section": "gpu",              # python | torch | gpu | system | storage |
                                        # huggingface | jupyter
         "name": "nvidia driver",       # the check, unique within the report
         "level": "warn",               # "ok" | "warn" | "error"
         "message": "no NVIDIA driver: ...",
         "fix": "..."}                  # "" when there is nothing to do
      ],
      "facts": {                        # what the checks were computed from
        "python": {...}, "packages": {...}, "torch": {...}, "nvml": {...},
        "gpus": [...], "shm": {...}, "container": "...|null",
        "output_dir": {...}, "huggingface": {...}, "jupyter": {...}
      }
    }

Facts never hold a Jupyter token or password, only whether one is set.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import textwrap
import threading
import types
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

OK, WARN, ERROR = "ok", "warn", "error"
LEVELS = (OK, WARN, ERROR)
JSON_VERSION = 1
GiB = 1024**3
MiB = 1024**2

SHM_MIN_BYTES = 1 * GiB  # below this, DataLoader workers run out of shared memory
OUTPUT_MIN_FREE_BYTES = 5 * GiB  # a BERT-base checkpoint with optimizer state is ~1.3 GB
HUB_TIMEOUT_S = 2.0
MIN_PYTHON = (3, 10)

# package -> lowest version workbench works with (mirrors pyproject.toml)
REQUIRED_PACKAGES = {
    "torch": "2.4",
    "transformers": "5.0",
    "datasets": "3.0",
    "accelerate": "1.0",
}

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

CONTAINER_MARKERS = ("/.dockerenv", "/run/.containerenv")
CONTAINER_CGROUP_WORDS = ("docker", "kubepods", "containerd", "libpod", "lxc")

SHM_FIX = (
    "Give the container more shared memory: docker run --shm-size=8g ... "
    '(compose: shm_size: "8gb"), or docker run --ipc=host; '
    "or set num_workers=0 in TrainConfig (slower data loading)."
)
VOLUME_FIX = (
    "Mount a volume there and write checkpoints into it: "
    "docker run -v $PWD/outputs:/workspace/outputs ... "
    "(compose: volumes: [\"./outputs:/workspace/outputs\"]), "
    "then use --output-dir / TrainConfig(output_dir=...) under that mount."
)


# --------------------------------------------------------------------------- results


@dataclass
class CheckResult:
    """One finding. ``fix`` says what to do next; empty when nothing needs doing."""

    name: str
    level: str  # "ok" | "warn" | "error"
    message: str
    fix: str = ""
    section: str = ""

    def __post_init__(self):
        if self.level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}, got {self.level!r}")


@dataclass
class DoctorReport:
    """The doctor's results; shows as an HTML table in a notebook, a text table in a terminal."""

    results: list[CheckResult]
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """False when any check failed at level "error"."""
        return not self.errors

    @property
    def errors(self) -> list[CheckResult]:
        return [r for r in self.results if r.level == ERROR]

    @property
    def warnings(self) -> list[CheckResult]:
        return [r for r in self.results if r.level == WARN]

    def __getitem__(self, name: str) -> CheckResult:
        for result in self.results:
            if result.name == name:
                return result
        raise KeyError(f"no check named {name!r}; have: {', '.join(r.name for r in self.results)}")

    def counts(self) -> dict[str, int]:
        return {level: sum(r.level == level for r in self.results) for level in LEVELS}

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": JSON_VERSION,
            "ok": self.ok,
            "counts": self.counts(),
            "results": [
                {k: getattr(r, k) for k in ("section", "name", "level", "message", "fix")}
                for r in self.results
            ],
            "facts": self.facts,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def summary(self) -> str:
        c = self.counts()
        verdict = "problems found" if c[ERROR] else ("usable, with warnings" if c[WARN] else "all good")
        return f"{c[ERROR]} error(s), {c[WARN]} warning(s), {c[OK]} ok: {verdict}"

    def to_text(self, width: int | None = None) -> str:
        width = width or max(80, min(shutil.get_terminal_size((100, 24)).columns, 140))
        name_w = max([len(r.name) for r in self.results] + [5])
        indent = 7 + name_w + 2
        text_w = max(30, width - indent)
        lines = [f"{'LEVEL':<7}{'CHECK':<{name_w}}  RESULT"]
        section = None
        for r in self.results:
            if r.section != section:
                section = r.section
                lines.append(f"-- {section} " + "-" * max(0, width - len(section) - 4))
            marker = {OK: "ok", WARN: "WARN", ERROR: "ERROR"}[r.level]
            # Paths, URLs and commands stay whole so they can be copied.
            wrap = dict(width=text_w, break_on_hyphens=False, break_long_words=False)
            body = textwrap.wrap(r.message, **wrap) or [""]
            if r.fix and r.level != OK:
                body += textwrap.wrap("fix: " + r.fix, subsequent_indent="     ", **wrap)
            lines.append(f"{marker:<7}{r.name:<{name_w}}  {body[0]}")
            lines.extend(" " * indent + line for line in body[1:])
        lines.append("")
        lines.append(self.summary())
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        c = self.counts()
        return f"<DoctorReport ok={c[OK]} warn={c[WARN]} error={c[ERROR]}>"

    def _repr_html_(self) -> str:
        colours = {OK: "#e6f4ea", WARN: "#fef7e0", ERROR: "#fce8e6"}
        rows = []
        for r in self.results:
            fix = (
                f"<br><b>Fix:</b> {html.escape(r.fix)}" if r.fix and r.level != OK else ""
            )
            rows.append(
                f'<tr style="background:{colours[r.level]};color:#202124">'
                f"<td>{html.escape(r.section)}</td><td>{html.escape(r.name)}</td>"
                f"<td><b>{r.level}</b></td>"
                f'<td style="text-align:left">{html.escape(r.message)}{fix}</td></tr>'
            )
        return (
            '<table class="workbench-doctor">'
            "<thead><tr><th>section</th><th>check</th><th>level</th><th>result</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>"
            f"<p>{html.escape(self.summary())}</p>"
        )


# --------------------------------------------------------------------------- small helpers


def _version_tuple(text: str | None) -> tuple[int, ...]:
    """"12.4" -> (12, 4); "2.13.0+cpu" -> (2, 13, 0); junk -> ()."""
    if not text:
        return ()
    numbers = []
    for part in str(text).split("+")[0].split("."):
        match = re.match(r"\d+", part)
        if not match:
            break
        numbers.append(int(match.group()))
    return tuple(numbers)


def format_bytes(n: int | None) -> str:
    if n is None:
        return "unknown"
    if n >= GiB:
        return f"{n / GiB:.1f} GiB"
    return f"{n / MiB:.0f} MiB"


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


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


# --------------------------------------------------------------------------- python & packages


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


def check_python(version: str, minimum: tuple[int, int] = MIN_PYTHON) -> CheckResult:
    if _version_tuple(version)[:2] < minimum:
        need = ".".join(map(str, minimum))
        return CheckResult(
            "python", ERROR, f"Python {version} is too old: workbench needs Python >= {need}.",
            f"Create the environment with Python {need} or newer (bash scripts/setup.sh).",
        )
    return CheckResult("python", OK, f"Python {version}")


def check_package(name: str, version: str | None, minimum: str | None = None) -> CheckResult:
    if version is None:
        return CheckResult(
            name, ERROR, f"{name} is not installed.",
            f"pip install -r environment/requirements-cpu.txt (or -gpu.txt); at least: pip install '{name}>={minimum or '0'}'",
        )
    if minimum and _version_tuple(version) < _version_tuple(minimum):
        return CheckResult(
            name, ERROR, f"{name} {version} is older than the {minimum} workbench needs.",
            f"pip install -U '{name}>={minimum}' (the pinned set: environment/requirements-*.txt).",
        )
    return CheckResult(name, OK, f"{name} {version}")


# --------------------------------------------------------------------------- torch


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


def _format_cudnn(v: int | None) -> str | None:
    if not v:
        return None
    if v >= 90000:  # cuDNN 9 encodes major*10000 + minor*100 + patch
        return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"
    return f"{v // 1000}.{v % 1000 // 100}.{v % 100}"  # cuDNN 8: major*1000 + minor*100 + patch


def gather_torch() -> TorchFacts:
    try:
        import torch
    except Exception as exc:  # not installed, or a broken build (missing .so)
        return TorchFacts(import_error=f"{type(exc).__name__}: {exc}")
    facts = TorchFacts(
        version=torch.__version__,
        cuda_build=torch.version.cuda,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
    )
    # torch explains a failed CUDA start (driver too old, ...) only as a warning.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            facts.cuda_available = bool(torch.cuda.is_available())
            facts.device_count = torch.cuda.device_count() if facts.cuda_available else 0
        except Exception as exc:
            facts.cuda_error = f"{type(exc).__name__}: {exc}"
    if not facts.cuda_available and not facts.cuda_error and caught:
        facts.cuda_error = " ".join(str(caught[-1].message).split())
    try:
        facts.arch_list = list(torch.cuda.get_arch_list())
    except Exception:
        facts.arch_list = []
    try:
        facts.cudnn = _format_cudnn(torch.backends.cudnn.version())
    except Exception:
        facts.cudnn = None
    if facts.cuda_build:
        try:
            facts.nccl = ".".join(str(p) for p in torch.cuda.nccl.version())
        except Exception:  # built without NCCL
            facts.nccl = None
    host = "aarch64" if platform.machine().lower() == "aarch64" else "x86_64"
    releases = getattr(torch.cuda, "PYTORCH_RELEASES_CODE_CC", {}) or {}
    facts.release_archs = {
        cuda: sorted(by_arch.get(host, ())) for cuda, by_arch in releases.items()
    }
    return facts


def check_torch_build(t: TorchFacts) -> CheckResult:
    if t.version is None:
        return CheckResult(
            "torch build", ERROR, f"torch cannot be imported: {t.import_error}",
            "Reinstall torch from environment/requirements-*.txt (CUDA machines: requirements-gpu.txt).",
        )
    if not t.cuda_build:
        return CheckResult("torch build", OK, f"torch {t.version}: CPU-only build (no CUDA)")
    parts = [f"CUDA {t.cuda_build}", f"cuDNN {t.cudnn or 'none'}", f"NCCL {t.nccl or 'none'}"]
    return CheckResult("torch build", OK, f"torch {t.version}: " + ", ".join(parts))


def check_cuda_available(t: TorchFacts, status: Any) -> CheckResult:
    """Can torch use the GPU? ``status`` is the NVML status (``workbench.gpu.NvmlStatus``)."""
    name = "torch.cuda"
    if t.version is None:
        return CheckResult(name, WARN, "not checked: torch cannot be imported.", "See 'torch build'.")
    if t.cuda_available:
        return CheckResult(name, OK, f"torch.cuda.is_available() = True, {t.device_count} device(s)")
    driver_ok = bool(getattr(status, "available", False))
    hidden = t.cuda_visible_devices
    if not driver_ok:
        return CheckResult(
            name, WARN,
            "torch.cuda.is_available() = False: no usable NVIDIA GPU, training runs on the CPU.",
            "See 'nvidia driver' for how to give this environment a GPU.",
        )
    if not t.cuda_build:
        return CheckResult(
            name, ERROR,
            f"The NVIDIA driver sees {getattr(status, 'device_count', '?')} GPU(s) but torch "
            f"{t.version} is a CPU-only build: training would silently run on the CPU.",
            "Install a CUDA build of torch: pip install -r environment/requirements-gpu.txt "
            "(or pick the command at https://pytorch.org/get-started/locally/).",
        )
    if hidden is not None and hidden.strip() in ("", "-1"):
        return CheckResult(
            name, ERROR, f"torch.cuda.is_available() = False: CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU.",
            "unset CUDA_VISIBLE_DEVICES, or set it to the GPU indices to use (e.g. 0,1).",
        )
    reason = t.cuda_error or "torch gave no reason"
    return CheckResult(
        name, ERROR, f"The NVIDIA driver works but torch cannot initialise CUDA: {reason}",
        "Check 'nvidia driver' below (driver too old for this build?); in Docker, start with "
        "--gpus all and the NVIDIA Container Toolkit.",
    )


# --------------------------------------------------------------------------- driver & GPUs


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
        if any(arch_coverage(cc, [f"sm_{c}"])[0] == "sass" for c in codes)
    ]
    sm = f"sm_{device}"
    if good:
        base = (torch_version or "").split("+")[0]
        pin = f"=={base}" if base else ""
        tags = ", ".join(f"cu{c.replace('.', '')}" for c in good)
        first = good[0].replace(".", "")
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


# --------------------------------------------------------------------------- /dev/shm


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


def check_shm(shm: ShmFacts, minimum: int = SHM_MIN_BYTES) -> CheckResult:
    name = "shared memory"
    if not shm.exists:
        return CheckResult(
            name, WARN, f"{shm.path} does not exist: DataLoader workers (num_workers > 0) share "
            "batches through it and will fail.", SHM_FIX,
        )
    size = f"{shm.path} is {format_bytes(shm.total_bytes)} ({format_bytes(shm.free_bytes)} free)"
    if (shm.total_bytes or 0) < minimum:
        return CheckResult(
            name, WARN,
            f"{size}, under {format_bytes(minimum)}: DataLoader workers fail with "
            "'No space left on device' or 'bus error' (Docker's default is 64 MiB).",
            SHM_FIX,
        )
    return CheckResult(name, OK, size)


# --------------------------------------------------------------------------- mounts, containers


@dataclass(frozen=True)
class MountEntry:
    """One line of /proc/self/mountinfo (proc(5)); paths already unescaped."""

    mount_id: int
    parent_id: int
    root: str  # the directory of the source filesystem mounted here ("/" for a whole fs)
    mount_point: str
    fstype: str
    source: str


def _unescape_mount(text: str) -> str:
    # The kernel writes space, tab, newline and backslash in paths as octal: \040 \011 \012 \134.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def parse_mountinfo(text: str) -> list[MountEntry]:
    """Parse /proc/self/mountinfo text; malformed lines are skipped."""
    entries = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)  # optional fields (shared:N ...) end at a lone "-"
            entries.append(
                MountEntry(
                    mount_id=int(fields[0]),
                    parent_id=int(fields[1]),
                    root=_unescape_mount(fields[3]),
                    mount_point=_unescape_mount(fields[4]),
                    fstype=fields[sep + 1],
                    source=_unescape_mount(fields[sep + 2]) if len(fields) > sep + 2 else "",
                )
            )
        except (ValueError, IndexError):
            continue
    return entries


def find_mount(path: str, entries: Sequence[MountEntry]) -> MountEntry | None:
    """The mount that holds ``path`` (absolute, symlinks resolved): the longest matching
    mount point; of equal ones the last listed, which is mounted on top."""
    best = None
    for entry in entries:
        mp = entry.mount_point
        inside = mp == "/" or path == mp or path.startswith(mp.rstrip("/") + "/")
        if inside and (best is None or len(mp) >= len(best.mount_point)):
            best = entry
    return best


def detect_container(markers_present: Iterable[str], cgroup_text: str, root_fstype: str | None) -> str | None:
    """Why we believe we run in a container, or None."""
    present = list(markers_present)
    if present:
        return f"{present[0]} exists"
    for line in cgroup_text.splitlines():
        for word in CONTAINER_CGROUP_WORDS:
            if word in line:
                return f"/proc/1/cgroup names {word}"
    if root_fstype == "overlay":
        return "the root filesystem is an overlay"
    return None


def gather_container(mounts: Sequence[MountEntry]) -> str | None:
    root = find_mount("/", mounts)
    return detect_container(
        [m for m in CONTAINER_MARKERS if os.path.exists(m)],
        _read_text("/proc/1/cgroup"),
        root.fstype if root else None,
    )


# --------------------------------------------------------------------------- output directory


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


def check_output_writable(d: DirFacts) -> CheckResult:
    name = "output dir"
    if not d.writable:
        return CheckResult(
            name, ERROR, f"cannot write checkpoints to {d.path}: {d.write_error}",
            "Choose a writable directory: workbench doctor --output-dir DIR, "
            "WORKBENCH_OUTPUT_DIR=DIR, or TrainConfig(output_dir=...); or fix its owner "
            "(chown) / mount it read-write.",
        )
    if d.exists:
        return CheckResult(name, OK, f"{d.path} is writable")
    return CheckResult(name, OK, f"{d.path} does not exist yet; it can be created in {d.probe_dir}")


def check_output_space(d: DirFacts, minimum: int = OUTPUT_MIN_FREE_BYTES) -> CheckResult:
    name = "output free space"
    if d.free_bytes is None:
        return CheckResult(name, WARN, f"free space at {d.path} unknown", "Check it with df -h.")
    if d.free_bytes < minimum:
        return CheckResult(
            name, WARN,
            f"only {format_bytes(d.free_bytes)} free at {d.path}: a BERT-base checkpoint with "
            f"optimizer state takes ~1.3 GB, and a full disk corrupts the last one.",
            "Free space, keep fewer checkpoints (TrainConfig.keep_checkpoints), or point "
            "--output-dir at a larger volume.",
        )
    return CheckResult(name, OK, f"{format_bytes(d.free_bytes)} free")


def check_output_volume(d: DirFacts) -> CheckResult:
    name = "output volume"
    m = d.mount
    if m is None:
        return CheckResult(name, WARN, f"no mount found for {d.path} in /proc/self/mountinfo")
    where = f"{m.mount_point} ({m.fstype} {m.source})"
    if m.fstype in ("tmpfs", "ramfs"):
        return CheckResult(
            name, WARN, f"{d.path} is on {where}, held in memory: checkpoints are lost at the next "
            "restart and use RAM.", VOLUME_FIX if d.container else
            "Use a directory on a disk: --output-dir / TrainConfig(output_dir=...).",
        )
    if m.mount_point == "/" and d.container:
        return CheckResult(
            name, WARN,
            f"{d.path} is inside the container's own filesystem ({m.fstype} root; container: "
            f"{d.container}), not on a mounted volume: checkpoints vanish when the container is "
            "removed.",
            VOLUME_FIX,
        )
    if d.container:
        return CheckResult(name, OK, f"on mounted volume {where}: survives the container")
    return CheckResult(name, OK, f"on {where} (not in a container)")


# --------------------------------------------------------------------------- Hugging Face


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
    return HubFacts(
        installed=True,
        home=constants.HF_HOME,
        hub_cache=constants.HF_HUB_CACHE,
        offline=bool(constants.HF_HUB_OFFLINE),
        endpoint=constants.ENDPOINT,
        cache=gather_dir(constants.HF_HUB_CACHE, mounts, container),
    )


def check_hub_cache(h: HubFacts) -> CheckResult:
    name = "hf cache"
    if not h.installed:
        return CheckResult(name, ERROR, "huggingface_hub is not installed.",
                           "pip install -r environment/requirements-cpu.txt")
    c = h.cache
    if c is not None and not c.writable:
        return CheckResult(
            name, WARN, f"the Hugging Face cache {h.hub_cache} is not writable ({c.write_error}): "
            "downloads will fail.", "Point HF_HOME at a writable directory, e.g. export HF_HOME=$PWD/.hf",
        )
    message = f"cache {h.hub_cache} (HF_HOME={h.home})"
    if c is not None and c.mount and c.mount.mount_point == "/" and c.container:
        return CheckResult(
            name, OK, message + "; inside the container's filesystem, so models are downloaded "
            "again in every new container",
            "Mount a volume for it: docker run -v hf-cache:/root/.cache/huggingface ... "
            "or set HF_HOME to a directory on a mounted volume.",
        )
    return CheckResult(name, OK, message)


def check_hub_offline(h: HubFacts) -> CheckResult:
    if h.offline:
        return CheckResult("hf offline", OK, "HF_HUB_OFFLINE is set: only local folders and cached models load")
    return CheckResult("hf offline", OK, f"online mode: models download from {h.endpoint}")


def _head(url: str, timeout: float) -> tuple[bool, str]:
    request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": "workbench-doctor"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return True, f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return True, f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, str(reason) or type(exc).__name__


def probe_url(url: str, timeout: float = HUB_TIMEOUT_S) -> tuple[bool, str]:
    """HEAD ``url``: (reachable, detail). Any HTTP answer, even 4xx/5xx, counts as reachable.

    The request runs in a daemon thread so a hanging DNS lookup, which the socket
    timeout does not cover, cannot hold the doctor up for longer than ``timeout``.
    """
    answer: list[tuple[bool, str]] = []
    thread = threading.Thread(target=lambda: answer.append(_head(url, timeout)), daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    return answer[0] if answer else (False, f"no answer within {timeout:g} s")


def check_hub_reachable(url: str | None, offline: bool, timeout: float = HUB_TIMEOUT_S) -> CheckResult:
    """Does a HEAD request to the hub answer within ``timeout``? Skipped in offline mode."""
    name = "hf hub reachable"
    if offline:
        return CheckResult(name, OK, "skipped: offline mode (HF_HUB_OFFLINE) is set")
    if not url:
        return CheckResult(name, OK, "skipped: no hub endpoint configured")
    reachable, detail = probe_url(url, timeout)
    if reachable:
        return CheckResult(name, OK, f"{url} answered ({detail})")
    return CheckResult(
        name, WARN, f"{url} is unreachable ({detail}): models and datasets cannot be downloaded.",
        "Use local folders or already-cached models with HF_HUB_OFFLINE=1, or set HTTPS_PROXY; "
        "HF_ENDPOINT points at a mirror.",
    )


# --------------------------------------------------------------------------- Jupyter


@dataclass
class ServerFacts:
    url: str
    pid: int | None
    has_token: bool
    has_password: bool


@dataclass
class JupyterFacts:
    token_env: bool  # JUPYTER_TOKEN is set and not empty
    token_file: str | None  # JUPYTER_TOKEN_FILE
    token_file_ok: bool | None  # the file exists and is not empty
    servers: list[ServerFacts] = field(default_factory=list)
    error: str | None = None  # why the running servers could not be listed


def gather_jupyter(env: Mapping[str, str] | None = None, runtime_dir: str | None = None) -> JupyterFacts:
    env = os.environ if env is None else env
    token_file = env.get("JUPYTER_TOKEN_FILE") or None
    token_file_ok = None
    if token_file:
        try:
            token_file_ok = bool(Path(token_file).read_text().strip())
        except OSError:
            token_file_ok = False
    facts = JupyterFacts(bool(env.get("JUPYTER_TOKEN")), token_file, token_file_ok)
    try:
        from jupyter_server.serverapp import list_running_servers

        for info in list_running_servers(runtime_dir):
            facts.servers.append(
                ServerFacts(
                    url=str(info.get("url", "?")).split("?")[0],  # never a token in a query
                    pid=info.get("pid"),
                    has_token=bool(info.get("token")),
                    has_password=bool(info.get("password")),
                )
            )
    except Exception as exc:
        facts.error = f"{type(exc).__name__}: {exc}"
    return facts


def check_jupyter(j: JupyterFacts) -> CheckResult:
    name = "jupyter auth"
    open_servers = [s for s in j.servers if not s.has_token and not s.has_password]
    if open_servers:
        listed = ", ".join(f"{s.url} (pid {s.pid})" for s in open_servers)
        return CheckResult(
            name, ERROR,
            f"Jupyter server {listed} runs with no token and no password: anyone who can reach "
            "its port can run code as this user.",
            "Stop it and start it with `workbench lab` (sets a token), or set JUPYTER_TOKEN "
            "(e.g. export JUPYTER_TOKEN=$(openssl rand -hex 32)) before starting; never publish "
            "port 8888 without a token.",
        )
    if j.servers:
        return CheckResult(name, OK, f"{len(j.servers)} running server(s), each with a token or password")
    if j.token_file and not j.token_file_ok:
        return CheckResult(
            name, WARN, f"JUPYTER_TOKEN_FILE={j.token_file} is missing or empty.",
            "Write a token into that file (openssl rand -hex 32 > FILE) or unset JUPYTER_TOKEN_FILE.",
        )
    if j.token_env or j.token_file:
        via = "JUPYTER_TOKEN" if j.token_env else "JUPYTER_TOKEN_FILE"
        return CheckResult(name, OK, f"a token is configured ({via}); no running server found")
    note = f" ({j.error})" if j.error else ""
    return CheckResult(
        name, OK, f"no running Jupyter server found{note}; a server started without JUPYTER_TOKEN "
        "generates a random token (`workbench lab` sets one)",
    )


# --------------------------------------------------------------------------- the doctor


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
        container=container,
        output_dir=gather_dir(output_dir, mounts, container),
        hub=gather_hub(mounts, container),
        jupyter=gather_jupyter(),
    )


def build_report(facts: DoctorFacts, *, check_network: bool = True) -> DoctorReport:
    """Run every check on the facts (only the hub probe touches the network)."""
    f = facts
    results: list[tuple[str, CheckResult]] = [("python", check_python(f.python.version))]
    for pkg, minimum in REQUIRED_PACKAGES.items():
        results.append(("python", check_package(pkg, f.python.packages.get(pkg), minimum)))
    results.append(("torch", check_torch_build(f.torch)))
    results.append(("torch", check_cuda_available(f.torch, f.nvml)))
    results.append(("gpu", check_driver(f.nvml, f.torch.cuda_build, f.torch.cuda_available)))
    for device in (d for d in f.gpus if not d.is_mig):
        results.append(("gpu", check_gpu_arch(
            device, f.torch.arch_list, cuda_build=f.torch.cuda_build,
            release_archs=f.torch.release_archs, torch_version=f.torch.version,
        )))
        if not device.error:
            slices = [d for d in f.gpus if d.is_mig and d.index == device.index]
            results.append(("gpu", check_bf16(device)))
            results.append(("gpu", check_mig(device, slices)))
    results.append(("system", check_shm(f.shm)))
    results.append(("storage", check_output_writable(f.output_dir)))
    results.append(("storage", check_output_space(f.output_dir)))
    results.append(("storage", check_output_volume(f.output_dir)))
    results.append(("huggingface", check_hub_cache(f.hub)))
    if f.hub.installed:
        results.append(("huggingface", check_hub_offline(f.hub)))
        if check_network:
            results.append(("huggingface", check_hub_reachable(f.hub.endpoint, f.hub.offline)))
    results.append(("jupyter", check_jupyter(f.jupyter)))
    for section, result in results:
        result.section = section
    plain = {
        "python": {"version": f.python.version, "executable": f.python.executable},
        "packages": f.python.packages,
        "torch": _plain(f.torch),
        "nvml": _plain(f.nvml),
        "gpus": _plain(f.gpus),
        "shm": _plain(f.shm),
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


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON (schema: workbench/doctor.py)")
    parser.add_argument(
        "--output-dir", default=None, metavar="DIR",
        help="checkpoint directory to check (default: $WORKBENCH_OUTPUT_DIR or ./outputs)",
    )
    parser.add_argument("--no-network", action="store_true", help="skip the Hugging Face Hub reachability request")


def run_cli(args: argparse.Namespace) -> int:
    """Exit status: 1 when any check fails at level error, else 0 (warnings included)."""
    report = doctor(args.output_dir, check_network=not args.no_network)
    print(report.to_json() if args.json else report.to_text())
    return 0 if report.ok else 1


class _CallableModule(types.ModuleType):
    """``workbench.doctor`` names both this module and its doctor() function; once the
    submodule is imported, the package attribute is the module. Calling the module
    runs doctor(), so ``workbench.doctor()`` works in either case."""

    def __call__(self, *args: Any, **kwargs: Any) -> DoctorReport:
        return doctor(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
