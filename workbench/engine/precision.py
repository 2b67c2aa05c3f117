"""Choosing the numeric precision of a run: fp32, fp16 (with a loss scaler) or bf16.

The choice is made once, from facts about the device, so it can be unit-tested
without a GPU: ``resolve_precision("auto", DeviceFacts(cuda=True, bf16=False))``.
Autocast and the fp16 GradScaler themselves are Accelerate's
(``Accelerator(mixed_precision=...)``); this module only decides and explains.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.errors import ConfigError

# our name -> Accelerate's mixed_precision argument
_ACCELERATE_NAMES = {"fp32": "no", "fp16": "fp16", "bf16": "bf16"}


@dataclass(frozen=True)
class DeviceFacts:
    """What the precision choice depends on."""

    cuda: bool  # a usable CUDA GPU
    bf16: bool  # the GPU computes bf16 natively (Ampere, compute capability 8.0, or newer)
    name: str = "cpu"  # for messages: "NVIDIA A100-SXM4-80GB" or "cpu"


def device_facts() -> DeviceFacts:
    """Facts about this process's device. Touches CUDA only when it is available."""
    import torch

    if not torch.cuda.is_available():
        return DeviceFacts(cuda=False, bf16=False)
    index = torch.cuda.current_device()
    major, _ = torch.cuda.get_device_capability(index)
    # is_bf16_supported() also answers True for emulated bf16 on older GPUs, which is
    # slower than fp16; we want native support, which starts with compute capability 8.
    return DeviceFacts(cuda=True, bf16=major >= 8, name=torch.cuda.get_device_name(index))


def resolve_precision(requested: str, facts: DeviceFacts | None = None) -> str:
    """Turn ``auto|fp32|fp16|bf16`` into the precision this device will run.

    ``auto``: bf16 on GPUs that support it, fp16 on other CUDA GPUs, fp32 on CPU.
    An explicit request the device cannot honour is a ConfigError, never a silent
    fallback: fp16 needs a GPU (on CPU there is no fp16 autocast worth having and
    Accelerate would silently train in fp32), and bf16 on a pre-Ampere GPU is emulated.
    bf16 on CPU is allowed: PyTorch autocasts to bf16 on CPU.
    """
    facts = facts or device_facts()
    if requested == "auto":
        if not facts.cuda:
            return "fp32"
        return "bf16" if facts.bf16 else "fp16"
    if requested == "fp32":
        return "fp32"
    if requested == "fp16":
        if not facts.cuda:
            raise ConfigError(
                "precision", "fp16", "fp16 only on a CUDA GPU",
                fix="on CPU use precision='bf16' (autocast) or 'fp32'; or 'auto' to let the workbench pick.",
            )
        return "fp16"
    if requested == "bf16":
        if facts.cuda and not facts.bf16:
            raise ConfigError(
                "precision", "bf16", f"bf16 only on Ampere or newer GPUs, not {facts.name}",
                fix="use precision='fp16' (or 'auto', which picks fp16 here).",
            )
        return "bf16"
    raise ConfigError("precision", requested, "auto | fp32 | fp16 | bf16")


def accelerate_mixed_precision(precision: str) -> str:
    """Accelerate's name for a resolved precision ("no", "fp16", "bf16")."""
    return _ACCELERATE_NAMES[precision]


def uses_scaler(precision: str) -> bool:
    """fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none."""
    return precision == "fp16"
