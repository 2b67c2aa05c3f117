"""What fine-tuning a causal LM needs in GPU memory, in full, LoRA and QLoRA, and for preference
pairs (:func:`estimate_causal_vram`, :func:`check_causal_fit`): the causal-LM half of
``vram.py``, which keeps the classifier estimate, the activation model's notes and the
free-memory reading this module shares.

Accuracy: ``tests/test_models_causal.py`` on CPU, ``tests/gpu/test_llm_gpu.py`` against
``torch.cuda.max_memory_allocated`` (full and LoRA within 20%, QLoRA +3.6%).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.errors import ModelError
from workbench.sources import vram
from workbench.sources.models import CausalFacts, ModelInfo, causal_facts, first_line, load_config
from workbench.sources.vram import CUDA_CONTEXT_BYTES, FRAGMENTATION, GiB, resolve_precision_name

# A causal LM (LLaMA-class decoder) fine-tuned in one of three ways. What one GPU holds:
#
#   full    base 4 P (fp32 master) + grads 4 P + AdamW 8 P (+ 2 P 16-bit copies under autocast)
#   lora    base 2 P at 16-bit (4 P at fp32) frozen; adapters A in fp32: 4 A + grads 4 A + AdamW 8 A
#   qlora   linear layers of the decoder at 4-bit NF4 with double quantization
#           (4 + 8/64 + 32/(64*256) = 4.127 bits per weight), embeddings, norms and head at
#           fp32 (prepare_model_for_kbit_training casts them); the same adapters
#
# A (adapter parameters) = r * (in + out) summed over the adapted linear layers, counted on a
# model built on the meta device (exact for any architecture; targets as workbench.tasks.lora picks).
#
# Activations of one decoder layer (LLaMA: RMSNorm, rotary attention with grouped KV heads,
# SwiGLU MLP; no dropout), d bytes per element (2 under 16-bit compute, 4 at fp32),
# s tokens, b rows, h hidden, i intermediate, g = kv_heads / heads:
#
#   layer = s*b*d*(h*(6 + 3 g) + 4 i)   X, norm(X), Q, rotated Q, K, V, rotated K (g each),
#                                        attention output, norm(X2) (h each); gate, up,
#                                        act(gate), act(gate)*up (i each)
#         + a*s*b*4                      fused attention (SDPA): fp32 log-sum-exp; eager: a*s^2*b*2d
#   LoRA dropout > 0 keeps a dropped copy of each adapted input: s*b*d*(5 h + i) more per layer.
#
# QLoRA (issue 32: 35% low before): peft's prepare_model_for_kbit_training casts the weights
# that stay unquantized (embeddings, tied head, norms) to fp32, so the embedding output and every
# RMSNorm output (weight fp32 * normed) are fp32 and the residual stream stays fp32. Per layer:
#   X, norm(X), X2, norm(X2) at 4 bytes (16 h) instead of 3 h at d; each Linear4bit casts its fp32
#   input to the compute dtype and saves that copy (bitsandbytes MatMul4Bit saves A and the packed
#   weight, not the dequantized one, which lives one matmul): 2 h each for q, k, v, gate, up;
#   LoRA on those 5: dropout mask (1 h) + lora_A's own bf16 cast (2 h), o: 3 h, down: 3 i
#   (without dropout: 2 h each for the 5 casts); residual and checkpointed inputs at 4 bytes.
# SmolLM2-135M, batch 16 x 256, r=16 on all linear layers, dropout 0.05: 5,776 MiB against
# 5,576 MiB measured (+3.6%; 3,647 MiB before).
#
# Preference pairs (task="preference", batch_size counts pairs): the chosen and the rejected
# rows go through the model as one batch, so activations and logits are those of 2 b rows. The
# reference costs nothing at the peak with LoRA/QLoRA (the adapter switched off; its forward
# runs without gradients before the policy's, its transients freed by then), nor with full
# fine-tuning when its log-probabilities are precomputed (the frozen copy is released before
# the first step builds AdamW's state); a full fine-tuning run that computes them per step keeps
# the copy: P weights more, in the dtype the model was loaded in (4 P).
# Gradient checkpointing keeps each layer's input (s*b*h*d) plus one layer being recomputed.
# The LM head: logits (d) plus their fp32 upcast and log-softmax (4 + 4) at every position
# that carries loss: s*b*V*(d + 8)*share, share = 1 for a loss on every position (what
# model(**batch).loss computes), the supervised share with workbench's causal-LM loss.

FINETUNE_MODES = ("full", "lora", "qlora")
NF4_BYTES_PER_WEIGHT = (4 + 8 / 64 + 32 / (64 * 256)) / 8  # NF4 + double-quantized absmax


@dataclass(frozen=True)
class ParameterSplit:
    """Parameter counts of a causal LM, from a meta-device build."""

    total: int
    decoder_linear: int  # weights of the linear layers LoRA adapts and QLoRA quantizes
    adapter: int  # LoRA parameters for the given rank and targets


def causal_parameters(config, lora_r: int = 16, targets: list[str] | None = None) -> ParameterSplit:
    import torch
    from transformers import AutoModelForCausalLM

    from workbench.tasks.lora import linear_target_names

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception as e:
        raise ModelError(f"cannot build a causal LM from this {config.model_type} config: {first_line(e)}",
                         "check that the model is a causal (decoder) LM transformers supports.") from None
    targets = targets or linear_target_names(model)
    head = model.get_output_embeddings()
    linear = adapter = 0
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if module is head or weight is None or weight.dim() != 2 or not hasattr(module, "in_features"):
            continue
        linear += weight.numel()
        if name.rsplit(".", 1)[-1] in targets:
            adapter += lora_r * (module.in_features + module.out_features)
    return ParameterSplit(total=sum(p.numel() for p in model.parameters()), decoder_linear=linear,
                          adapter=adapter)


@dataclass(frozen=True)
class CausalVramEstimate:
    """Bytes one GPU needs to fine-tune a causal LM, by component (formulas above)."""

    finetune: str  # full | lora | qlora
    precision: str  # fp32 | fp16 | bf16 (compute)
    batch_size: int
    seq_len: int
    gradient_checkpointing: bool
    base_weights_bytes: int  # fp32 master (full), 16/32-bit frozen (lora), 4-bit + 16-bit rest (qlora)
    trainable_parameters: int
    trainable_weights_bytes: int  # adapters (lora/qlora); 0 for full (they are the base weights)
    gradients_bytes: int
    optimizer_bytes: int
    autocast_copy_bytes: int
    activations_bytes: int
    logits_bytes: int
    overhead_bytes: int
    reference_bytes: int = 0  # preference, full fine-tuning, reference per step: the frozen copy

    @property
    def allocated_bytes(self) -> int:
        return (self.base_weights_bytes + self.trainable_weights_bytes + self.gradients_bytes
                + self.optimizer_bytes + self.autocast_copy_bytes + self.activations_bytes + self.logits_bytes
                + self.reference_bytes)

    @property
    def total_bytes(self) -> int:
        return self.allocated_bytes + self.overhead_bytes

    def describe(self) -> str:
        gib = lambda n: f"{n / GiB:.2f} GiB"  # noqa: E731
        return (f"{gib(self.total_bytes)} for {self.finetune} at {self.precision}, batch {self.batch_size} x "
                f"{self.seq_len} tokens{', gradient checkpointing' if self.gradient_checkpointing else ''} "
                f"(weights {gib(self.base_weights_bytes + self.trainable_weights_bytes)}, gradients "
                f"{gib(self.gradients_bytes)}, AdamW {gib(self.optimizer_bytes)}, activations "
                f"{gib(self.activations_bytes)}, logits {gib(self.logits_bytes)}, "
                + (f"reference copy {gib(self.reference_bytes)}, " if self.reference_bytes else "")
                + f"CUDA context and "
                f"slack {gib(self.overhead_bytes)}; {self.trainable_parameters:,} trainable parameters)")


def causal_activation_bytes(facts: CausalFacts, *, batch_size: int, seq_len: int, precision: str,
                            gradient_checkpointing: bool = False, attention: str = "sdpa",
                            lora_dropout: bool = False, lora: bool = False,
                            fp32_residual: bool = False) -> int:
    """Activations saved for backward by the decoder layers (formula above), without the LM head.

    ``fp32_residual``: QLoRA after peft's prepare_model_for_kbit_training, whose fp32 norms and
    embeddings keep the residual stream in fp32 (formula above); ``lora``: adapters are attached.
    """
    s, b, h, i, a = seq_len, batch_size, facts.hidden_size, facts.intermediate_size, facts.num_heads
    d = 4 if precision == "fp32" else 2
    g = facts.num_kv_heads / facts.num_heads
    layer = s * b * d * (h * (6 + 3 * g) + 4 * i)
    layer += a * s * s * b * 2 * d if attention == "eager" else a * s * b * 4
    residual = d
    if fp32_residual:
        residual = 4
        # X, norm(X), X2, norm(X2) in fp32 (16 h) and each 4-bit layer's own bf16 cast of its
        # fp32 input (q, k, v, gate, up: 10 h), instead of X, norm(X), norm(X2) at d.
        layer += s * b * (26 * h - 3 * h * d)
        if lora_dropout:  # the 5 fp32-fed adapters: mask h + bf16 cast 2h; o: 3h; down: 3i
            layer += s * b * (18 * h + 3 * i)
        elif lora:  # lora_A casts the fp32 input to bf16 apart from the 4-bit layer's cast
            layer += s * b * 10 * h
    elif lora_dropout:
        layer += s * b * d * (5 * h + i)
    embeddings = s * b * h * residual
    if gradient_checkpointing:
        return int(facts.num_layers * s * b * h * residual + layer + embeddings)
    return int(facts.num_layers * layer + embeddings)


def estimate_causal_vram(model, *, finetune: str = "lora", batch_size: int = 8, seq_len: int = 512,
                         precision: str = "bf16", gradient_checkpointing: bool = False,
                         lora_r: int = 16, lora_targets: list[str] | None = None,
                         lora_dropout: float = 0.05, loss_share: float = 1.0,
                         attention: str = "sdpa", include_overhead: bool = True,
                         preference_loss: str | None = None, precompute_reference: bool = True
                         ) -> CausalVramEstimate:
    """Estimate GPU memory for fine-tuning a causal LM: ``model`` is a name/path, ModelInfo or config.

    ``loss_share``: the share of positions whose logits are computed (1 for the
    standard loss; the supervised share for workbench's causal-LM task).
    ``preference_loss`` (dpo | ipo | simpo | orpo): ``batch_size`` pairs, 2 x rows through the
    model; ``precompute_reference=False``: a full fine-tuning run keeps its reference copy.
    """
    from transformers import AutoConfig

    if finetune not in FINETUNE_MODES:
        raise ModelError(f"finetune {finetune!r} is not one of {', '.join(FINETUNE_MODES)}.", "choose one.")
    if precision not in ("fp32", "fp16", "bf16"):
        raise ModelError(f"precision {precision!r} is not one of fp32, fp16, bf16.", "choose one of them.")
    if finetune == "qlora" and precision == "fp32":
        raise ModelError("QLoRA computes in 16-bit; precision='fp32' does not apply.", "use bf16 or fp16.")
    if isinstance(model, str):
        config, _ = load_config(model)
    elif isinstance(model, ModelInfo):
        config = AutoConfig.for_model(**model.config)
    else:
        config = model
    facts = causal_facts(config)
    if facts.context_length and seq_len > facts.context_length:
        raise ModelError(f"seq_len {seq_len} is longer than the model's context of {facts.context_length}.",
                         f"use max_length <= {facts.context_length}.")
    split = causal_parameters(config, lora_r, lora_targets)
    p, half = split.total, 2
    rows = 2 * batch_size if preference_loss else batch_size  # a pair is a chosen and a rejected row
    reference_copy = (finetune == "full" and preference_loss in ("dpo", "ipo") and not precompute_reference)
    if finetune == "full":
        trainable = p
        base = 4 * p
        adapters = 0
        autocast = 0 if precision == "fp32" else half * p
    else:
        trainable = split.adapter
        adapters = 4 * trainable
        autocast = 0
        if finetune == "lora":
            base = (4 if precision == "fp32" else half) * p
        else:
            # peft's prepare_model_for_kbit_training casts every weight that is not 4-bit
            # (embeddings, tied head, norms) to fp32: 4 bytes, not 2.
            base = int(NF4_BYTES_PER_WEIGHT * split.decoder_linear) + 4 * (p - split.decoder_linear)
    d = 4 if precision == "fp32" else 2
    allocated = dict(
        base_weights_bytes=int(base), trainable_parameters=trainable, trainable_weights_bytes=adapters,
        gradients_bytes=4 * trainable, optimizer_bytes=8 * trainable, autocast_copy_bytes=autocast,
        activations_bytes=causal_activation_bytes(
            facts, batch_size=rows, seq_len=seq_len, precision=precision,
            gradient_checkpointing=gradient_checkpointing, attention=attention,
            lora_dropout=finetune != "full" and lora_dropout > 0, lora=finetune != "full",
            fp32_residual=finetune == "qlora"),
        logits_bytes=int(seq_len * rows * facts.vocab_size * (d + 8) * loss_share),
        reference_bytes=4 * p if reference_copy else 0,
    )
    summed = sum(v for k, v in allocated.items() if k != "trainable_parameters")
    overhead = int(CUDA_CONTEXT_BYTES + FRAGMENTATION * summed) if include_overhead else 0
    return CausalVramEstimate(finetune=finetune, precision=precision, batch_size=batch_size, seq_len=seq_len,
                              gradient_checkpointing=gradient_checkpointing, overhead_bytes=overhead,
                              **allocated)


def compare_finetune_modes(model, **settings) -> dict[str, CausalVramEstimate]:
    """The same run priced as full, LoRA and QLoRA (what the picker shows side by side)."""
    precision = settings.pop("precision", "bf16")
    return {mode: estimate_causal_vram(model, finetune=mode,
                                       precision="bf16" if mode == "qlora" and precision == "fp32" else precision,
                                       **settings)
            for mode in FINETUNE_MODES}


@dataclass(frozen=True)
class CausalFitCheck:
    """Full, LoRA and QLoRA, each with and without gradient checkpointing, against free memory."""

    estimates: dict[tuple[str, bool], CausalVramEstimate]  # (finetune mode, gradient checkpointing)
    free_bytes: int | None  # None: no GPU to compare with
    gpu_name: str | None

    def fits(self, finetune: str, gradient_checkpointing: bool) -> bool | None:
        """None without a GPU to compare with."""
        if self.free_bytes is None:
            return None
        return self.estimates[(finetune, gradient_checkpointing)].total_bytes <= self.free_bytes

    @property
    def fitting_modes(self) -> list[str]:
        """The modes that fit, with gradient checkpointing if that is what it takes."""
        return [mode for mode in FINETUNE_MODES if self.fits(mode, True) or self.fits(mode, False)]


def check_causal_fit(info: ModelInfo, *, batch_size: int, seq_len: int, precision: str = "auto",
                     lora_r: int = 16, lora_dropout: float = 0.05, free_bytes: int | None = None,
                     gpu_name: str | None = None, device_index: int = 0, nvml: Any = None,
                     preference_loss: str | None = None, precompute_reference: bool = True) -> CausalFitCheck:
    """Price the run as full / LoRA / QLoRA, with and without checkpointing, next to the GPU's free memory.

    ``free_bytes`` given: compare with it; otherwise ask workbench.gpu about GPU ``device_index``.
    "auto" precision resolves as a run on that GPU would (no GPU: as on this CPU, bf16 where
    it computes bf16 natively, else fp32; QLoRA is priced at bf16).
    """
    device = None
    if free_bytes is None:
        free_bytes, gpu_name, device = vram._free_memory(device_index, nvml)  # patched in tests
    from transformers import AutoConfig

    resolved = resolve_precision_name(precision, device)
    config = AutoConfig.for_model(**info.config)
    estimates = {}
    for checkpointing in (False, True):
        for mode, est in compare_finetune_modes(
                config, batch_size=batch_size, seq_len=seq_len, precision=resolved, lora_r=lora_r,
                lora_dropout=lora_dropout, gradient_checkpointing=checkpointing, preference_loss=preference_loss,
                precompute_reference=precompute_reference).items():
            estimates[(mode, checkpointing)] = est
    return CausalFitCheck(estimates, free_bytes, gpu_name)
