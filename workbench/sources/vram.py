"""What fine-tuning a model needs in GPU memory, and whether it fits the GPU: the estimates
for classifiers (:func:`estimate_vram`, :func:`check_fit`), from the facts ``models.py``
reads off a model's config; the causal-LM estimates (full, LoRA, QLoRA, preference pairs)
are in ``vram_causal.py``, which reads this module's constants and free-memory reading.

The memory estimate (:func:`estimate_vram`), for one GPU, AdamW and PyTorch autocast
(as Accelerate does it: fp32 master weights, 16-bit compute)::

    weights      4 P                 fp32 parameters (P = parameter count)
    gradients    4 P                 fp32, one per parameter
    optimizer    8 P                 AdamW: exp_avg and exp_avg_sq in fp32
    autocast     2 P                 16-bit weight copies cached during forward (fp16/bf16 only)
    activations  L * layer + embed   saved for backward, see below
    overhead     CUDA context (~500 MiB) + 10 % of the above for allocator fragmentation

Activations follow Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models" (2022), eq. 2: one transformer layer stores
``s*b*h*(34 + 5*a*s/h)`` bytes in 16-bit (s sequence length, b micro-batch, h hidden
size, a attention heads, intermediate size 4h). Split by element size ``d`` (2 bytes
for fp16/bf16 autocast, 4 for fp32) and the 1-byte dropout masks, that is::

    layer = s*b*h*(16 d + 2)  +  a*s^2*b*(2 d + 1)          (eager attention)

which gives back 34 sbh + 5 as^2b for d = 2. With fused attention (PyTorch SDPA
flash / memory-efficient kernels, the transformers default on GPU) the a*s^2*b term
is not stored; the kernel keeps a log-sum-exp of a*s*b fp32 values instead. The
intermediate-size terms are scaled by ``intermediate_size / 4h`` for models that
are not 4h. Embeddings add ``s*b*h*(2 d + 1)`` (sum, layer norm, dropout mask).
Gradient checkpointing keeps only each layer's input (``s*b*h*d`` per layer) plus one
layer's activations while it is recomputed. Gradient accumulation does not change
the peak: it is the micro-batch that counts.

Accuracy: ``tests/test_models.py`` compares the estimate with the measured peak of a
real training step of a BERT-like model on CPU (within 35 %), ``tests/gpu/test_vram_gpu.py``
with ``torch.cuda.max_memory_allocated`` (within 25 %).

"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.errors import ModelError
from workbench.sources.models import (
    ModelInfo,
    model_info,
)

CUDA_CONTEXT_BYTES = 500 * 2**20  # CUDA context + cuBLAS/cuDNN workspaces, typical for recent GPUs
FRAGMENTATION = 0.10  # caching-allocator slack on top of live tensors
GiB = 2**30


# ---------------------------------------------------------------- memory estimate


@dataclass(frozen=True)
class VramEstimate:
    """Bytes a fine-tuning step needs on one GPU, by component (see the module docstring)."""

    precision: str  # fp32 | fp16 | bf16
    batch_size: int  # micro-batch
    seq_len: int
    gradient_checkpointing: bool
    attention: str  # "eager" (stores a*s^2*b) or "sdpa" (fused kernel)
    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    autocast_copy_bytes: int
    activations_bytes: int
    overhead_bytes: int  # CUDA context + allocator slack; 0 for allocated-only comparisons
    gradient_accumulation_steps: int = 1

    @property
    def allocated_bytes(self) -> int:
        """What torch.cuda.max_memory_allocated should show (tensors only)."""
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes
                + self.autocast_copy_bytes + self.activations_bytes)

    @property
    def total_bytes(self) -> int:
        return self.allocated_bytes + self.overhead_bytes

    def describe(self) -> str:
        gib = lambda n: f"{n / GiB:.2f} GiB"  # noqa: E731
        accum = (f" x {self.gradient_accumulation_steps} accumulation"
                 if self.gradient_accumulation_steps > 1 else "")
        return (
            f"{gib(self.total_bytes)} at {self.precision}, batch {self.batch_size}{accum}, "
            f"{self.seq_len} tokens{', gradient checkpointing' if self.gradient_checkpointing else ''}"
            f" (weights {gib(self.weights_bytes)}, gradients {gib(self.gradients_bytes)}, AdamW "
            f"{gib(self.optimizer_bytes)}, 16-bit copies {gib(self.autocast_copy_bytes)}, activations "
            f"{gib(self.activations_bytes)}, CUDA context and slack {gib(self.overhead_bytes)})"
        )


def activation_bytes(*, batch_size: int, seq_len: int, hidden_size: int, num_layers: int,
                     num_heads: int, intermediate_size: int | None = None, precision: str = "fp32",
                     attention: str = "eager", gradient_checkpointing: bool = False) -> int:
    """Activations saved for backward (Korthikanti et al. eq. 2, generalised; module docstring)."""
    s, b, h, a = seq_len, batch_size, hidden_size, num_heads
    d = 4 if precision == "fp32" else 2
    mlp_ratio = (intermediate_size or 4 * h) / (4 * h)
    sbh = s * b * h
    # attention block: X, Q, K, V, context at d bytes + a 1-byte dropout mask; layer norms 2 x d;
    # MLP: input (d) + GELU input and output (4h each, d) + mask (1).
    attention_part = sbh * (5 * d + 1)
    norms = sbh * 2 * d
    mlp = sbh * (d + 8 * d * mlp_ratio + 1)
    # eager: softmax output, dropout mask, dropout output; fused kernel: a fp32 log-sum-exp
    scores = a * s * s * b * (2 * d + 1) if attention == "eager" else a * s * b * 4
    layer = attention_part + norms + mlp + scores
    embeddings = sbh * (2 * d + 1)
    if gradient_checkpointing:
        return num_layers * sbh * d + layer + embeddings
    return num_layers * layer + embeddings


def resolve_precision_name(precision: str, device: Any = None) -> str:
    """The precision a run would use on ``device`` (a workbench.gpu DeviceInfo, None = no GPU:
    this machine's CPU, bf16 where it computes bf16 natively).

    "auto" is decided by ``workbench.engine.precision.resolve_precision``, the one owner of that
    policy; an explicit choice is estimated as asked (the estimate may be for another machine).
    """
    if precision != "auto":
        return precision
    from workbench.engine.precision import DeviceFacts, cpu_bf16, resolve_precision

    if device is None:
        cpu = cpu_bf16()
        return resolve_precision("auto", DeviceFacts(cuda=False, bf16=cpu.native, evidence=cpu.evidence))
    capability = getattr(device, "compute_capability", None)
    facts = DeviceFacts(cuda=True, bf16=bool(capability and capability[0] >= 8), name=getattr(device, "name", "cpu"))
    return resolve_precision("auto", facts)


def estimate_vram(model: str | ModelInfo, *, batch_size: int = 16, seq_len: int = 256,
                  precision: str = "fp32", gradient_checkpointing: bool = False,
                  gradient_accumulation_steps: int = 1, attention: str | None = None,
                  include_overhead: bool = True, device: Any = None) -> VramEstimate:
    """Estimate GPU memory for fine-tuning ``model`` with AdamW (formula: module docstring).

    ``model`` is a ModelInfo or a name/path (its config is read). ``attention`` is
    "eager" or "sdpa"; default: the config's choice, else "sdpa" (transformers' default).
    ``device`` (a workbench.gpu DeviceInfo) only resolves precision="auto".
    """
    info = model if isinstance(model, ModelInfo) else model_info(model)
    precision = resolve_precision_name(precision, device)
    if precision not in ("fp32", "fp16", "bf16"):
        raise ModelError(f"precision {precision!r} is not one of fp32, fp16, bf16, auto.",
                         "choose one of them.")
    if not (info.hidden_size and info.num_layers and info.num_attention_heads):
        raise ModelError(
            f"{info.name_or_path}: the config does not give hidden size, layers and heads, so"
            " activations cannot be estimated.", "estimate by a trial run with a small batch.")
    attention = attention or info.attn_implementation or "sdpa"
    attention = "eager" if attention == "eager" else "sdpa"
    if info.max_position_embeddings and seq_len > info.max_position_embeddings:
        raise ModelError(
            f"seq_len {seq_len} is longer than the model's {info.max_position_embeddings} positions.",
            f"use max_length <= {info.max_position_embeddings}.")
    p = info.num_parameters
    allocated = dict(
        weights_bytes=4 * p,
        gradients_bytes=4 * p,
        optimizer_bytes=8 * p,
        autocast_copy_bytes=0 if precision == "fp32" else 2 * p,
        activations_bytes=activation_bytes(
            batch_size=batch_size, seq_len=seq_len, hidden_size=info.hidden_size,
            num_layers=info.num_layers, num_heads=info.num_attention_heads,
            intermediate_size=info.intermediate_size, precision=precision, attention=attention,
            gradient_checkpointing=gradient_checkpointing),
    )
    overhead = int(CUDA_CONTEXT_BYTES + FRAGMENTATION * sum(allocated.values())) if include_overhead else 0
    return VramEstimate(precision=precision, batch_size=batch_size, seq_len=seq_len,
                        gradient_checkpointing=gradient_checkpointing, attention=attention,
                        overhead_bytes=overhead, gradient_accumulation_steps=gradient_accumulation_steps,
                        **allocated)


@dataclass(frozen=True)
class FitCheck:
    """The estimate next to the GPU's free memory, with alternatives when it does not fit."""

    estimate: VramEstimate
    free_bytes: int | None  # None: no GPU to compare with
    gpu_name: str | None
    fits: bool | None  # None when there is no GPU
    alternatives: list[VramEstimate]
    message: str


def _free_memory(device_index: int = 0, nvml: Any = None) -> tuple[int | None, str | None, Any]:
    """(free bytes, name, DeviceInfo) of a GPU via workbench.gpu; (None, None, None) without one.

    Free = total - used from one NVML snapshot, so memory held by other processes
    (another kernel, another container's job) counts against the fit.
    """
    try:
        from workbench import gpu

        status = gpu.nvml_status(nvml)
        if not status.available or status.device_count == 0:
            return None, None, None
        device = next((d for d in gpu.list_devices(nvml)
                       if d.index == device_index and not d.is_mig), None)
        if device is None:
            return None, None, None
        snapshot = gpu.GpuReader(nvml=nvml).read()
        sample = next((g for g in snapshot.gpus if g.index == device_index and not g.is_mig), None)
        total = sample.memory_total_bytes if sample else None
        used = sample.memory_used_bytes if sample else None
        if total is None or used is None:
            return device.memory_total_bytes, device.name, device
        return total - used, device.name, device
    except Exception:  # the GPU panel reports NVML problems; here they only mean "no comparison"
        return None, None, None


def check_fit(info: ModelInfo, *, batch_size: int, seq_len: int, precision: str = "auto",
              gradient_checkpointing: bool = False, gradient_accumulation_steps: int = 1,
              free_bytes: int | None = None, gpu_name: str | None = None, device_index: int = 0,
              nvml: Any = None, device: Any = None) -> FitCheck:
    """Compare the estimate with a GPU's free memory; when it does not fit, price the options.

    ``free_bytes`` given: compare with it; otherwise ask workbench.gpu about GPU ``device_index``.
    """
    if free_bytes is None:
        free_bytes, gpu_name, device = _free_memory(device_index, nvml)
    est = estimate_vram(info, batch_size=batch_size, seq_len=seq_len, precision=precision,
                        gradient_checkpointing=gradient_checkpointing,
                        gradient_accumulation_steps=gradient_accumulation_steps, device=device)
    if free_bytes is None:
        return FitCheck(est, None, None, None, [],
                        f"Estimated need: {est.describe()}. No GPU: nothing to compare with.")
    fits = est.total_bytes <= free_bytes
    where = f"{gpu_name or 'the GPU'} has {free_bytes / GiB:.2f} GiB free"
    if fits:
        return FitCheck(est, free_bytes, gpu_name, True, [],
                        f"Fits: needs about {est.describe()}; {where}.")
    options = []
    base = dict(seq_len=seq_len, device=device)
    if est.precision == "fp32":
        options.append(("use bf16 (or fp16 on GPUs before Ampere)", dict(
            batch_size=batch_size, precision="bf16", gradient_checkpointing=gradient_checkpointing,
            gradient_accumulation_steps=gradient_accumulation_steps)))
    if not gradient_checkpointing:
        options.append(("turn on gradient checkpointing", dict(
            batch_size=batch_size, precision=est.precision, gradient_checkpointing=True,
            gradient_accumulation_steps=gradient_accumulation_steps)))
    small, accum = batch_size, gradient_accumulation_steps
    while small > 1:
        small, accum = small // 2, accum * 2
        trial = estimate_vram(info, batch_size=small, seq_len=seq_len, precision=est.precision,
                              gradient_checkpointing=gradient_checkpointing)
        if trial.total_bytes <= free_bytes or small == 1:
            break
    if small < batch_size:
        options.append((f"batch_size={small} with gradient_accumulation_steps={accum} (same "
                        "effective batch)", dict(batch_size=small, precision=est.precision,
                                                 gradient_checkpointing=gradient_checkpointing,
                                                 gradient_accumulation_steps=accum)))
    smallest = dict(batch_size=small, precision="fp32" if est.precision == "fp32" else est.precision,
                    gradient_checkpointing=True, gradient_accumulation_steps=accum)
    if est.precision == "fp32":
        smallest["precision"] = "bf16"
    options.append(("all of these together", smallest))
    alternatives, lines = [], []
    for label, kwargs in options:
        alt = estimate_vram(info, **base, **kwargs)
        alternatives.append(alt)
        verdict = "fits" if alt.total_bytes <= free_bytes else "still too big"
        lines.append(f"- {label}: {alt.total_bytes / GiB:.2f} GiB ({verdict})")
    message = (f"Will not fit: needs about {est.describe()}; {where}. Options:\n" + "\n".join(lines))
    if not any(a.total_bytes <= free_bytes for a in alternatives):
        message += ("\nNone of these fits: choose a smaller model, a shorter max_length, or a GPU with"
                    " more memory (or distributed='fsdp' over several GPUs).")
    return FitCheck(est, free_bytes, gpu_name, False, alternatives, message)

