"""Choosing the numeric precision of a run: fp32, fp16 (with a loss scaler) or bf16, and why.

The choice is made once, from facts about the device, so it can be unit-tested
without a GPU or a particular CPU: ``choose_precision("auto", DeviceFacts(cuda=False, bf16=True))``.
Autocast and the fp16 GradScaler themselves are Accelerate's
(``Accelerator(mixed_precision=...)``: the model's forward runs under ``torch.autocast``, the
weights, gradients and optimizer state stay fp32); this module only decides and explains.

"auto" is mixed precision wherever the hardware computes the 16-bit type natively: bf16 on
Ampere and newer GPUs, fp16 with a loss scaler on older ones, bf16 on CPUs with bf16
instructions (AVX512-BF16, AMX-BF16: a MiniLM step 2.1x faster than fp32 on a 2-core AMD
EPYC), and fp32 on other CPUs, which only emulate bf16 and would run slower than fp32.

Whether this CPU computes bf16 natively (:func:`cpu_bf16`) is answered from the CPU's flags,
as PyTorch reads them (``torch.cpu.get_capabilities()``, else ``/proc/cpuinfo``); only when the
flags cannot settle it (an Arm CPU with BF16 instructions, whose speed depends on how PyTorch
was built; no flags at all) does a ~30 ms matmul timing decide. Asked once per process.

``WORKBENCH_CPU_BF16=0`` in the environment says "this CPU has no native bf16" whatever its
flags, so ``auto`` trains CPU runs in fp32 as on a CPU without AVX512-BF16 or AMX: for running
the tests (or comparing numerics) on a bf16 CPU as a CI machine without it would. bf16 rounds
differently on each kind of CPU; a test that holds in fp32 and in bf16 holds on any x86-64.
It changes nothing on a GPU.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass

from workbench.errors import ConfigError

# our name -> Accelerate's mixed_precision argument
_ACCELERATE_NAMES = {"fp32": "no", "fp16": "fp16", "bf16": "bf16"}
# x86 instruction sets with bf16 arithmetic (dot products), by the names torch and Linux give them
X86_BF16 = {"avx512_bf16": "AVX512-BF16", "amx_bf16": "AMX-BF16"}
# Arm: the BF16 extension (BFDOT, BFMMLA) and its SVE form; fast only where PyTorch's kernels use it
ARM_BF16 = {"bf16": "Arm BF16", "sve_bf16": "SVE-BF16", "svebf16": "SVE-BF16"}
PROBE_SPEEDUP = 1.25  # a timed bf16 matmul must beat fp32 by this much to count as native
# "0": treat this CPU as one without native bf16, so auto is fp32 (module doc); unset: detect
CPU_BF16_ENV = "WORKBENCH_CPU_BF16"


@dataclass(frozen=True)
class DeviceFacts:
    """What the precision choice depends on."""

    cuda: bool  # a usable CUDA GPU
    # the device computes bf16 natively: a GPU of compute capability 8.0 (Ampere) or newer,
    # or a CPU with bf16 instructions that PyTorch uses (AVX512-BF16, AMX-BF16, ...)
    bf16: bool
    name: str = "cpu"  # for messages: "NVIDIA A100-SXM4-80GB" or "cpu"
    evidence: str = ""  # what bf16 was judged from: "AVX512-BF16", "compute capability 7.5", ...


@dataclass(frozen=True)
class CpuBf16:
    """Whether this CPU computes bf16 natively, and what says so."""

    native: bool
    evidence: str  # "AVX512-BF16"; "no AVX512-BF16 or AMX-BF16"; "Arm BF16, timed: bf16 1.9x fp32"
    timed: bool = False  # the flags were ambiguous and a matmul timing decided


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision a run uses, what was asked for, and the sentence that says why."""

    precision: str  # fp32 | fp16 | bf16: what runs
    requested: str  # auto | fp32 | fp16 | bf16: what the settings said
    reason: str  # "auto: bf16, this CPU computes it natively (AVX512-BF16)"
    warning: str | None = None  # said at the start of the run (an explicit choice that will be slow)


# ------------------------------------------------------------------------ detection
def detect_cpu_bf16(flags: dict, *, mkldnn_bf16: bool | None = True, probe=None) -> CpuBf16:
    """Judge native bf16 from CPU ``flags`` (``torch.cpu.get_capabilities()``'s names, or the
    flags of /proc/cpuinfo), ``mkldnn_bf16`` (PyTorch's oneDNN has bf16 kernels for this CPU;
    None: unknown) and, only when those are ambiguous, ``probe()`` -> bf16/fp32 matmul speed-up.

    A pure function of its inputs, so tests can describe any CPU.
    """
    arch = str(flags.get("architecture", "")).lower()
    x86 = [name for key, name in X86_BF16.items() if flags.get(key)]
    arm = sorted({name for key, name in ARM_BF16.items() if flags.get(key)})
    if x86:
        if mkldnn_bf16 is False:  # PyTorch built without oneDNN's bf16 kernels: the flag alone is not enough
            return CpuBf16(False, f"{', '.join(x86)}, but this PyTorch has no oneDNN bf16 kernels")
        return CpuBf16(True, ", ".join(x86))
    if arch in ("x86_64", "amd64", "x86", "i686") or any(k.startswith(("avx", "sse")) for k in flags if flags[k]):
        return CpuBf16(False, "no AVX512-BF16 or AMX-BF16: bf16 would be emulated, slower than fp32")
    if not arm and arch in ("aarch64", "arm64"):
        return CpuBf16(False, "no Arm BF16 instructions: bf16 would be emulated, slower than fp32")
    # An Arm CPU with BF16 instructions (fast only where PyTorch's kernels use them), or a CPU
    # whose flags cannot be read: time it.
    what = ", ".join(arm) if arm else "CPU flags unknown"
    if probe is None:
        return CpuBf16(False, f"{what}, not timed")
    speedup = probe()
    native = speedup >= PROBE_SPEEDUP
    verdict = "native" if native else "emulated"
    return CpuBf16(native, f"{what}, timed: bf16 matmul {speedup:.2f}x fp32, {verdict}", timed=True)


def cpu_flags() -> dict:
    """The CPU's feature flags: ``torch.cpu.get_capabilities()`` (recent torch; 2.13 has it), else
    /proc/cpuinfo (older torch: its helpers for this move between releases)."""
    import torch

    get = getattr(getattr(torch, "cpu", None), "get_capabilities", None)
    if get is not None:
        try:
            return dict(get())
        except Exception:  # noqa: BLE001 — a CPU cpuinfo cannot describe: fall back to /proc
            pass
    return proc_cpuinfo_flags()


def proc_cpuinfo_flags(text: str | None = None) -> dict:
    """Flags of the first processor in /proc/cpuinfo (x86 ``flags``, Arm ``Features``); {} elsewhere."""
    import platform

    if text is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            return {}
    flags: dict = {"architecture": platform.machine().lower()}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            flags.update(dict.fromkeys(value.split(), True))
            break
    return flags


def _mkldnn_bf16() -> bool | None:
    import torch

    try:
        if not torch.backends.mkldnn.is_available():
            return False
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())  # private: may move between releases
    except Exception:  # noqa: BLE001
        return None


def matmul_rate(bf16: bool, size: int = 512, repeats: int = 10) -> float:
    """FLOP/s of a ``size``-cubed matmul on this CPU, in fp32 or under bf16 autocast (best of
    ``repeats``: other load only ever slows a run down). ~30 ms for both on two cores."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    times = []
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        torch.mm(a, b)  # warm-up: kernel selection, first touch of the output
        for _ in range(repeats):
            started = time.perf_counter()
            torch.mm(a, b)
            times.append(time.perf_counter() - started)
    return 2 * size**3 / max(min(times), 1e-9)


def matmul_speedup() -> float:
    """How many times faster a bf16-autocast matmul is than an fp32 one on this CPU.

    Used only when the CPU's flags cannot settle native bf16.
    """
    return matmul_rate(True) / matmul_rate(False)


@functools.lru_cache(maxsize=1)
def detected_cpu_bf16() -> CpuBf16:
    """Whether this process's CPU computes bf16 natively (cached: asked once per process)."""
    return detect_cpu_bf16(cpu_flags(), mkldnn_bf16=_mkldnn_bf16(), probe=matmul_speedup)


def cpu_bf16() -> CpuBf16:
    """The CPU's bf16 as runs judge it: detected, unless $WORKBENCH_CPU_BF16 turns it off.

    The variable is read on every call (the detection is what is cached), so a test can set it
    with monkeypatch and a subprocess inherits it.
    """
    value = os.environ.get(CPU_BF16_ENV, "").strip()
    if value in ("", "auto"):
        return detected_cpu_bf16()
    if value in ("0", "off"):
        return CpuBf16(False, f"{CPU_BF16_ENV}={value}: native bf16 turned off for this CPU")
    raise ConfigError(
        CPU_BF16_ENV, value, "0 or off (treat this CPU as one without native bf16), or unset",
        fix=f"unset {CPU_BF16_ENV} to detect the CPU's bf16, or export {CPU_BF16_ENV}=0 for fp32 auto runs.",
    )


def device_facts() -> DeviceFacts:
    """Facts about this process's device. Touches CUDA only when it is available."""
    import torch

    if not torch.cuda.is_available():
        cpu = cpu_bf16()
        return DeviceFacts(cuda=False, bf16=cpu.native, name="cpu", evidence=cpu.evidence)
    index = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    # is_bf16_supported() also answers True for emulated bf16 on older GPUs, which is
    # slower than fp16; we want native support, which starts with compute capability 8.
    return DeviceFacts(cuda=True, bf16=major >= 8, name=torch.cuda.get_device_name(index),
                       evidence=f"compute capability {major}.{minor}")


# --------------------------------------------------------------------------- choice
def choose_precision(requested: str, facts: DeviceFacts | None = None) -> PrecisionChoice:
    """Turn ``auto|fp32|fp16|bf16`` into the precision this device will run, with the reason.

    ``auto``: bf16 where the device computes it natively (Ampere+ GPUs, CPUs with bf16
    instructions), fp16 with a loss scaler on other CUDA GPUs, fp32 on other CPUs.
    An explicit request the device cannot honour is a ConfigError, never a silent
    fallback: fp16 needs a GPU (on CPU there is no fp16 autocast worth having and
    Accelerate would silently train in fp32), and bf16 on a pre-Ampere GPU is emulated.
    bf16 on a CPU without bf16 instructions runs (PyTorch emulates it), with a warning.
    """
    facts = facts or device_facts()
    where = facts.name if facts.cuda else "this CPU"
    because = f" ({facts.evidence})" if facts.evidence else ""
    if requested == "auto":
        if facts.bf16:
            return PrecisionChoice("bf16", "auto", f"auto: bf16, {where} computes it natively{because}")
        if facts.cuda:
            return PrecisionChoice("fp16", "auto",
                                   f"auto: fp16 with a loss scaler, {where} has no native bf16{because}")
        return PrecisionChoice("fp32", "auto", f"auto: fp32, {where} has no native bf16{because}")
    if requested == "fp32":
        return PrecisionChoice("fp32", "fp32", "asked for: fp32")
    if requested == "fp16":
        if not facts.cuda:
            raise ConfigError(
                "precision", "fp16", "fp16 only on a CUDA GPU",
                fix="on CPU use precision='bf16' (autocast) or 'fp32'; or 'auto' to let the workbench pick.",
            )
        return PrecisionChoice("fp16", "fp16", "asked for: fp16 with a loss scaler")
    if requested == "bf16":
        if facts.cuda and not facts.bf16:
            raise ConfigError(
                "precision", "bf16", f"bf16 only on Ampere or newer GPUs, not {facts.name}",
                fix="use precision='fp16' (or 'auto', which picks fp16 here).",
            )
        if not facts.cuda and not facts.bf16:
            return PrecisionChoice(
                "bf16", "bf16", f"asked for: bf16, emulated on this CPU{because}",
                warning=f"precision='bf16' on a CPU without native bf16{because}: PyTorch emulates it, "
                        "which is usually slower than fp32; use precision='auto' (fp32 here) unless you "
                        "want bf16's numerics.")
        return PrecisionChoice("bf16", "bf16", "asked for: bf16")
    raise ConfigError("precision", requested, "auto | fp32 | fp16 | bf16")


def resolve_precision(requested: str, facts: DeviceFacts | None = None) -> str:
    """The precision ``choose_precision`` picks, without the reason."""
    return choose_precision(requested, facts).precision


def accelerate_mixed_precision(precision: str) -> str:
    """Accelerate's name for a resolved precision ("no", "fp16", "bf16")."""
    return _ACCELERATE_NAMES[precision]


def uses_scaler(precision: str) -> bool:
    """fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none."""
    return precision == "fp16"
