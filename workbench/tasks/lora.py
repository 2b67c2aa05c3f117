"""LoRA and QLoRA through peft: which layers get adapters, wrapping, saving, merging.

Only this module and ``tasks/causal_lm.py`` import peft. What it decides:

- **Targets.** By default every ``nn.Linear`` of the model except the output head,
  named by its leaf name (``q_proj``, ``k_proj``, ..., ``down_proj`` for Llama;
  ``c_attn``, ``c_proj``, ``c_fc`` for GPT-2's Conv1D): the attention and MLP
  projections of any architecture, found from the model rather than from a list per
  family. peft's ``target_modules="all-linear"`` applies the same rule (it also skips
  ``get_output_embeddings()``), but stores every full module path in the adapter
  config; leaf names read better in the run record and match across model sizes.
- **QLoRA** needs CUDA and bitsandbytes: the base model is loaded in 4-bit NF4 with
  double quantization and 16-bit compute; elsewhere it is refused with a fix.
- **Merging** never touches the model being trained: the adapter is saved, the base
  model is loaded again in 16/32-bit, the adapter merged into it and the result
  saved. That also gives QLoRA a merged model in full precision (merging into 4-bit
  weights would round the update away).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from workbench.errors import ConfigError, ModelError

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def linear_target_names(model: nn.Module) -> list[str]:
    """Leaf names of the linear layers that LoRA should adapt: all but the output head."""
    from transformers.pytorch_utils import Conv1D

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names = set()
    for name, module in model.named_modules():
        if module is head or not isinstance(module, (nn.Linear, Conv1D)):
            continue
        # bitsandbytes' Linear4bit subclasses nn.Linear, so QLoRA models are covered too.
        names.add(name.rsplit(".", 1)[-1])
    if head is not None:
        head_name = next((n for n, m in model.named_modules() if m is head), "")
        names.discard(head_name.rsplit(".", 1)[-1])  # a leaf name shared with the head would adapt it
    if not names:
        raise ModelError(f"{type(model).__name__} has no linear layers to put LoRA adapters on.",
                         "use finetune='full', or name the layers in lora_target_modules.")
    return sorted(names)


def check_targets(model: nn.Module, targets: list[str]) -> None:
    """Every requested target name matches at least one module, or a ConfigError listing the choices."""
    from transformers.pytorch_utils import Conv1D

    adaptable = (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.MultiheadAttention, Conv1D)
    kinds: dict[str, set[str]] = {}  # leaf name -> class names of the modules so named
    for name, module in model.named_modules():
        if name:
            kinds.setdefault(name.rsplit(".", 1)[-1], set()).add(type(module).__name__)
    missing = [t for t in targets if t not in kinds]
    if missing:
        raise ConfigError("lora_target_modules", missing,
                          "names of linear layers of this model: " + ", ".join(linear_target_names(model)),
                          fix="use some of those names, or leave lora_target_modules unset (every linear "
                              "layer but the head).")
    # peft adapts only these layer types; anything else (a norm, an activation, a whole block)
    # would end in peft's ValueError traceback after the model has loaded.
    wrong = {}
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in targets and not isinstance(module, adaptable):
            wrong.setdefault(leaf, type(module).__name__)
    if wrong:
        described = ", ".join(f"{leaf!r} is a {kind}" for leaf, kind in wrong.items())
        raise ConfigError("lora_target_modules", list(wrong),
                          "names of linear layers of this model: " + ", ".join(linear_target_names(model)),
                          fix=f"{described}, which LoRA cannot adapt (it adapts Linear, Embedding and Conv "
                              "layers); name linear layers from the list, or leave lora_target_modules unset.")


def require_qlora_support() -> None:
    """QLoRA needs an NVIDIA GPU and bitsandbytes; say so, and what to use instead."""
    if not torch.cuda.is_available():
        raise ConfigError(
            "finetune", "qlora", "'lora' or 'full' on a machine without CUDA",
            "QLoRA loads the base model in 4-bit with bitsandbytes, which needs an NVIDIA GPU: "
            "use finetune='lora' here (same adapters, 16/32-bit base weights), or run on a GPU machine.")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise ModelError("QLoRA needs the bitsandbytes package, which is not installed.",
                         "pip install bitsandbytes (or use finetune='lora').") from None


def quantization_config(compute_dtype: torch.dtype):
    """4-bit NF4 with double quantization: the QLoRA paper's recipe (Dettmers et al., 2023)."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                              bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=compute_dtype)


def wrap(model: nn.Module, *, r: int, alpha: int, dropout: float, targets: list[str] | None,
         quantized: bool = False, gradient_checkpointing: bool = False) -> Any:
    """Freeze the base model and add LoRA adapters; returns the PeftModel (adapters in fp32)."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    targets = list(targets) if targets else linear_target_names(model)
    check_targets(model, targets)
    if quantized:
        # Casts norms/head to fp32 for stability and, with checkpointing, makes the
        # embedding output require grad so that recomputed segments have a path back.
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=gradient_checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False})
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets,
                        bias="none", task_type="CAUSAL_LM")
    with quiet_peft():
        return get_peft_model(model, config)


@contextlib.contextmanager
def quiet_peft():
    # peft asks transformers 5 for a renamed attribute (is_gradient_checkpointing): a FutureWarning
    # that is peft's to fix, not the user's; every other warning still shows.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def is_peft(model: nn.Module) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter weights only (what a LoRA checkpoint holds), detached copies on CPU."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(model).items()}


def load_adapter_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Put saved adapter weights back; every adapter weight must be in ``state``."""
    from peft import set_peft_model_state_dict

    expected = set(adapter_state_keys(model))
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ModelError(
            f"The adapter state does not fit this model: missing {missing[:3]}, unexpected {unexpected[:3]}.",
            "resume with the same lora_r, lora_target_modules and base model as the checkpoint.")
    set_peft_model_state_dict(model, state)


def adapter_state_keys(model: nn.Module) -> list[str]:
    from peft import get_peft_model_state_dict

    return list(get_peft_model_state_dict(model))


def merge_adapter_folder(adapter_dir: str | os.PathLike, output_dir: str | os.PathLike, *,
                         dtype: torch.dtype = torch.float32, base: str | None = None) -> Path:
    """Base model + saved adapter -> one plain model folder that ``pipeline(...)`` loads.

    ``base`` defaults to the adapter config's ``base_model_name_or_path``.
    """
    from peft import PeftConfig, PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter_dir, output_dir = Path(adapter_dir), Path(output_dir)
    base = base or PeftConfig.from_pretrained(adapter_dir).base_model_name_or_path
    try:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
    except OSError as exc:
        raise ModelError(f"Cannot load the base model {base!r} of the adapter in {adapter_dir}: {exc}",
                         "pass base='path/to/the/base/model' (the folder or hub id it was trained on).") from None
    with quiet_peft():
        merged = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    merged.save_pretrained(output_dir)
    tokenizer_source = adapter_dir if (adapter_dir / "tokenizer_config.json").is_file() else base
    AutoTokenizer.from_pretrained(tokenizer_source).save_pretrained(output_dir)
    return output_dir


def merge_and_save(model: nn.Module, tokenizer, directory: str | os.PathLike, *,
                   dtype: torch.dtype = torch.float32) -> Path:
    """Save the adapter to a temporary folder, then :func:`merge_adapter_folder` into ``directory``."""
    with tempfile.TemporaryDirectory(prefix="workbench-adapter-") as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        return merge_adapter_folder(tmp, directory, dtype=dtype)
