"""What bf16 autocast on a CPU needs beyond Accelerate's autocast: attention in fp32.

PyTorch's CPU flash-attention kernel (``scaled_dot_product_attention``, transformers' default
"sdpa") is slower in bf16 than in fp32: forward plus backward of SmolLM2's attention at batch
8 x 101 tokens took 42 ms in bf16 and 16 ms in fp32 on an AMD EPYC core (torch 2.13; with a
padding mask 33 / 18 ms), and autocast runs it in bf16. In a LoRA step of SmolLM2-135M the
attention backward alone was half the step's time under bf16. So on a CPU the workbench
computes attention in fp32: q, k and v go up to fp32 (a few MB per layer), the output comes
back down in the dtype it came in; the matmuls around it, where bf16 gains 2x, keep bf16.

Through transformers' attention interface: a function registered under its own name and set
as the model's ``config._attn_implementation``, which is not saved with the model (a saved
``config.json`` says nothing of it). Models that do not use "sdpa" are left as they are.
"""

from __future__ import annotations

import torch

ATTENTION = "workbench_cpu_sdpa_fp32"


def sdpa_in_fp32(module, query, key, value, attention_mask, **kwargs):
    """transformers' sdpa attention, computed in fp32 on a CPU; anything else is passed through."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.device.type != "cpu" or (query.dtype == torch.float32 and not torch.is_autocast_enabled("cpu")):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.float()
    with torch.autocast("cpu", enabled=False):
        output, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(),
                                                 attention_mask, **kwargs)
    return output.to(query.dtype), weights


def attention_in_fp32(model) -> bool:
    """Switch ``model``'s sdpa attention (and its sub-models') to :func:`sdpa_in_fp32`.
    Returns whether anything changed."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ATTENTION, sdpa_in_fp32)
    # Its mask is sdpa's: transformers builds no mask at all for a name it has no mask builder
    # for, and packed rows (tasks/causal_lm_packing.py) would then attend across conversations.
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)
    changed = False
    for module in model.modules():
        config = getattr(module, "config", None)
        if getattr(config, "_attn_implementation", None) == "sdpa":
            config._attn_implementation = ATTENTION
            changed = True
    return changed
