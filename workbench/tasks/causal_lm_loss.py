"""The causal-LM loss: which head path computes it (``TrainConfig.fused_loss``), and the fused one.

**Sparse LM head** (the reference, ``causal_lm.token_loss``): the model is asked for logits
only at the positions that carry loss, so it materialises ``[supervised tokens, vocab]``
logits, then one fp32 cross-entropy over them.

**Fused linear cross-entropy** (liger-kernel, CUDA with Triton): the same positions' hidden
states and the head's weight go to liger's kernel, which computes the matmul and the
cross-entropy chunk by chunk and never holds the whole logits tensor (nor its fp32 copy and
gradient): with a 49k-152k vocabulary those are the largest activations of a step. The
hidden states come from the model's own forward with the head's forward swapped for the
identity while it runs (:func:`hidden_at_loss_positions`), so DDP and peft hooks still run
and the gather at the loss positions is the sparse head's. Same reduction: the mean over
the micro-batch's supervised tokens, which the engine then weights by ``units`` across
accumulation.

:func:`fused_linear_ce` is the one seam to liger: tests replace it by plain torch
(``F.cross_entropy(hidden @ weight.T, labels)``) to show on a CPU that the routing gives the
sparse head's loss and gradients.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from workbench.errors import ConfigError

INSTALL = "pip install liger-kernel"
IGNORE = -100
# Model config fields that change the logits after the head: the fused kernel would skip them.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


@dataclass(frozen=True)
class LossChoice:
    fused: bool
    reason: str  # said once in the run's messages


def liger_available() -> bool:
    """Whether liger-kernel's fused linear cross-entropy imports (it needs Triton)."""
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy  # noqa: F401
    except Exception:  # ImportError, or Triton failing to load without a GPU driver
        return False
    return True


def head_problem(model) -> str | None:
    """Why the fused kernel cannot stand in for this model's LM head; None when it can: a plain
    ``nn.Linear`` (tied to the embeddings or not) without bias, with nothing applied to its logits."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        return f"{type(model).__name__} has no output embeddings (LM head) to fuse"
    if type(head) is not torch.nn.Linear:  # a LoRA-wrapped or quantized head: its forward is more than W x
        return f"its LM head is a {type(head).__name__}, not a plain nn.Linear"
    if head.bias is not None:
        return "its LM head has a bias"
    config = getattr(model, "config", None)
    for name in _LOGIT_TRANSFORMS:
        value = getattr(config, name, None)
        if value not in (None, 1, 1.0, 0, 0.0) and not isinstance(value, bool):
            return f"its logits are transformed after the head ({name}={value})"
    return None


def choose_loss(setting, *, cuda: bool, liger: bool, head_issue: str | None,
                distributed: str = "ddp") -> LossChoice:
    """Fused (liger) or the sparse LM head, and why. ConfigError when forced on where it cannot run.

    ``setting``: ``TrainConfig.fused_loss``; ``liger``: :func:`liger_available`; ``head_issue``:
    :func:`head_problem` of the model."""
    if setting is False:
        return LossChoice(False, "fused_loss=False: the loss runs the LM head at the loss positions (sparse head).")
    problem = fix = None
    if not cuda:
        problem, fix = "it runs on CUDA only (Triton kernels)", "train on a CUDA GPU"
    elif not liger:
        problem, fix = "liger-kernel is not installed", INSTALL
    elif distributed == "fsdp":
        problem, fix = "under FSDP the head's weight is sharded outside its forward", "use distributed: ddp"
    elif head_issue:
        problem, fix = head_issue, "use a model whose LM head is a plain linear layer"
    if problem is None:
        how = "fused_loss=True" if setting is True else "fused_loss=auto"
        return LossChoice(True, f"Loss: liger-kernel's fused linear cross-entropy ({how}): the head's logits "
                                "are computed chunk by chunk, never held whole.")
    if setting is True:
        raise ConfigError("fused_loss", True, f"'auto' or False here: {problem}",
                          fix=f"{fix} ({INSTALL} on a CUDA machine), or set fused_loss: auto.")
    extra = f" ({INSTALL} to fuse it)" if not liger and cuda else ""
    return LossChoice(False, f"Loss: the LM head at the loss positions (sparse head), not liger-kernel's fused "
                             f"linear cross-entropy: {problem}{extra}.")


def fused_linear_ce(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``hidden @ weight.T`` against ``labels``, without the logits: liger's kernel."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    if weight.dtype != hidden.dtype:  # a fp32 head under bf16 autocast: the matmul ran in bf16 there too
        weight = weight.to(hidden.dtype)
    return liger_fused_linear_cross_entropy(hidden, weight, labels, ignore_index=IGNORE, reduction="mean")


@contextlib.contextmanager
def _identity_head(head: torch.nn.Module):
    head.forward = lambda hidden: hidden  # an instance attribute: parameters and state dict untouched
    try:
        yield
    finally:
        del head.forward


def hidden_at_loss_positions(model, inner, inputs: dict, keep: torch.Tensor) -> torch.Tensor:
    """[N, hidden] at the ``keep`` positions, by the model's own forward with the head as identity.

    ``model``: what the loop calls (maybe wrapped); ``inner``: the unwrapped model that owns the head."""
    with _identity_head(inner.get_output_embeddings()):
        hidden = model(**inputs, logits_to_keep=keep, use_cache=False).logits
    if hidden.dim() != 2:  # an architecture that ignores a tensor logits_to_keep (as supervised_logits)
        hidden = hidden[keep] if hidden.shape[1] == keep.shape[1] else hidden.reshape(-1, hidden.shape[-1])
    return hidden
