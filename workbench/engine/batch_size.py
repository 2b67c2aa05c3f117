"""``batch_size="auto"``: the micro-batch that fills the GPU, from the memory estimate.

On CUDA the micro-batch grows until the estimated peak of a training step
(``workbench.sources.vram``: BERT within 6-12 %, LoRA/full within 20 %, QLoRA +3.6 % of the
measured peak on an H200) reaches ``TARGET_SHARE`` (85 %) of the GPU's free memory. The
estimator's error and the caching allocator's slack are what the other 15 % is for; when the
estimate was low anyway, the loop's out-of-memory halving (``memory.py``) catches the step and
goes on with half the micro-batch and twice the accumulation.

On a CPU there is no device memory to fill (the batch changes only the time per step), and a
model the estimator does not know has no estimate: both fall back to 16, the default.

With auto the chosen micro-batch IS the batch: the effective batch is it x
``gradient_accumulation_steps`` x devices, so it changes from the default's 16 whenever auto
picks something else; the message (``BatchChoice.reason``) says so, and the learning rate is
not rescaled. A resumed run keeps the value its checkpoint was planned with (never re-chosen:
which rows form each batch must stay the same).

``choose_batch_size`` is the pure choice (a peak-bytes function, free bytes, bounds);
``resolve_batch_size`` applies it to a run; ``peak_function`` builds the peak from the estimator.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

DEFAULT_BATCH_SIZE = 16  # TrainConfig's default: what "auto" is where there is nothing to fill
TARGET_SHARE = 0.85  # of the free memory the estimated peak may reach
MAX_BATCH_SIZE = 512  # past this, a step is long enough that a bigger batch buys no speed
GiB = 2**30

Peak = Callable[[int], int]  # micro-batch -> estimated peak bytes of one training step


@dataclass(frozen=True)
class BatchChoice:
    """What ``batch_size="auto"`` resolved to, and why (recorded in the start event and the run record)."""

    batch_size: int
    reason: str
    estimate_bytes: int | None = None  # the estimated peak at batch_size
    free_bytes: int | None = None  # the GPU's free memory it was compared with
    target_share: float = TARGET_SHARE
    source: str = "estimate"  # estimate | cpu | no-estimate | checkpoint

    def record(self) -> dict[str, Any]:
        return {"auto": True, **asdict(self)}


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


def choose_batch_size(peak: Peak | None, free_bytes: int | None, *, target_share: float = TARGET_SHARE,
                      minimum: int = 1, cap: int = MAX_BATCH_SIZE, rows: int | None = None,
                      devices: int = 1) -> BatchChoice:
    """The largest power of two in [minimum, min(cap, rows per device)] whose estimated peak fits
    ``target_share`` of ``free_bytes``. ``rows``: the training rows, shared by ``devices`` processes.

    Powers of two, not the largest batch that fits: the estimate is good to 5-20 %, so a finer
    step would claim a precision it does not have; the out-of-memory fallback halves, so a power
    of two halves to whole powers down to 1; and GPU kernels tile them without a ragged remainder.
    ``peak`` None (no estimate for this model) or ``free_bytes`` None (no GPU): 16, the default.
    When not even ``minimum`` fits, ``minimum`` is returned with a reason that says so.
    """
    if peak is None or free_bytes is None:
        why = "no GPU memory to compare with" if free_bytes is None else "no memory estimate for this model"
        return BatchChoice(DEFAULT_BATCH_SIZE, f"batch_size auto: {DEFAULT_BATCH_SIZE} (the default): {why}.",
                           free_bytes=free_bytes, target_share=target_share,
                           source="cpu" if free_bytes is None else "no-estimate")
    budget = int(target_share * free_bytes)
    per_device = ""
    if rows and devices > 1:  # each process sees its share of the rows: a larger batch would be the same rows
        rows, per_device = -(-rows // devices), f" per device, across {devices} devices"
    upper = max(minimum, min(cap, rows) if rows else cap)
    size, chosen = minimum, None
    while size <= upper:
        if peak(size) > budget:
            break
        chosen, size = size, size * 2
    where = f"{_gib(free_bytes)} free, {target_share:.0%} of it is {_gib(budget)}"
    if chosen is None:
        need = peak(minimum)
        return BatchChoice(minimum, f"batch_size auto: {minimum}, though even that is estimated at "
                                    f"{_gib(need)} ({where}); lower max_length, turn on gradient_checkpointing "
                                    "or choose a smaller model if it runs out of memory.",
                           estimate_bytes=need, free_bytes=free_bytes, target_share=target_share)
    need = peak(chosen)
    limit = ""
    if chosen * 2 > upper:
        limit = (f" (capped at the {rows} training rows{per_device})" if rows and rows < cap and chosen * 2 > rows
                 else f" (capped at {cap})")
    else:
        limit = f"; {chosen * 2} would need {_gib(peak(chosen * 2))}"
    return BatchChoice(chosen, f"batch_size auto: {chosen}, estimated peak {_gib(need)} ({where}){limit}.",
                       estimate_bytes=need, free_bytes=free_bytes, target_share=target_share)


def _linear(at_one: int, at_two: int) -> Peak:
    """The causal-LM estimate is linear in the micro-batch (weights and optimizer fixed, activations
    and logits per row, slack a share of both): two estimates give every other one to a few bytes,
    without building the model on the meta device again for each batch tried."""
    return lambda b: int(at_one + (b - 1) * (at_two - at_one))


def peak_function(model: Any, *, task: str, precision: str, max_length: int, gradient_checkpointing: bool = False,
                  finetune: str = "lora", lora_r: int = 16, lora_dropout: float = 0.05,
                  preference_loss: str = "dpo", precompute_reference: bool = True) -> Peak | None:
    """micro-batch -> estimated peak bytes for this model and settings; None without an estimate.

    ``model``: a name/path or a ``ModelInfo``; ``precision``: the one that runs (fp32 | fp16 | bf16).
    ``task="preference"``: the micro-batch counts pairs (two rows each), ``preference_loss`` and
    ``precompute_reference`` say whether a full fine-tuning run keeps a reference copy.
    """
    from workbench.sources import vram, vram_causal
    from workbench.sources.models import ModelInfo, model_info

    try:
        if task in ("causal_lm", "preference"):
            from transformers import AutoConfig

            config = AutoConfig.for_model(**model.config) if isinstance(model, ModelInfo) else model
            if isinstance(config, str):
                from workbench.sources.models import load_config

                config, _ = load_config(config)
            if finetune == "qlora" and precision == "fp32":
                precision = "bf16"

            def one(b):
                return vram_causal.estimate_causal_vram(
                    config, finetune=finetune, batch_size=b, seq_len=max_length, precision=precision,
                    gradient_checkpointing=gradient_checkpointing, lora_r=lora_r, lora_dropout=lora_dropout,
                    preference_loss=preference_loss if task == "preference" else None,
                    precompute_reference=precompute_reference).total_bytes
            return _linear(one(1), one(2))
        else:
            info = model if isinstance(model, ModelInfo) else model_info(str(model))

            def peak(b):  # arithmetic only: exact at every batch
                return int(vram.estimate_vram(info, batch_size=b, seq_len=max_length, precision=precision,
                                              gradient_checkpointing=gradient_checkpointing).total_bytes)
            peak(1)  # an estimator that cannot price this model says so now
            return peak
    except Exception:  # ModelError, a config the estimator cannot read: no estimate, the default
        return None


def free_cuda_bytes() -> int | None:
    """This process's GPU's free memory (``torch.cuda.mem_get_info``); None without CUDA."""
    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.mem_get_info(int(os.environ.get("LOCAL_RANK", "0")))[0])


def _effective(config, size: int) -> str:
    devices = int(os.environ.get("WORLD_SIZE", "1"))
    parts = [f"{size}"] + ([f"x {config.gradient_accumulation_steps} accumulation"]
                           if config.gradient_accumulation_steps > 1 else []) \
        + ([f"x {devices} devices"] if devices > 1 else [])
    effective = size * config.gradient_accumulation_steps * devices
    default = DEFAULT_BATCH_SIZE * config.gradient_accumulation_steps * devices
    shown = f"{' '.join(parts)} = {effective}" if len(parts) > 1 else f"{effective}"
    changed = (f"; the effective batch is {shown} rows per optimizer step, "
               f"not the default's {default} (the learning rate is not rescaled)") if size != DEFAULT_BATCH_SIZE \
        else f"; the effective batch is {effective} rows per optimizer step, as with the default"
    return changed


def resolve_batch_size(config, model_name: str | None, *, precision: str, rows: int | None,
                       checkpoint_record: dict | None = None) -> tuple[Any, BatchChoice | None]:
    """(config with an int batch_size, the choice) for ``config.batch_size == "auto"``;
    (config, None) for any other value.

    ``checkpoint_record``: the run record of the checkpoint this run resumes: its batch size is
    kept. ``precision``: the one that runs. ``rows``: training rows (the choice never exceeds their share
    per device: ``WORLD_SIZE`` processes split them).
    """
    if config.batch_size != "auto":
        return config, None
    saved = (checkpoint_record or {}).get("config", {}).get("batch_size")
    if isinstance(saved, int) and not isinstance(saved, bool) and saved > 0:
        choice = BatchChoice(saved, f"batch_size auto: {saved}, what this run chose when it started (resumed "
                                    "from its checkpoint, not chosen again: the batches stay the ones it planned)"
                                    + _effective(config, saved) + ".", source="checkpoint")
        return replace(config, batch_size=saved), choice
    free = free_cuda_bytes()
    if free is None:
        choice = BatchChoice(DEFAULT_BATCH_SIZE, f"batch_size auto: {DEFAULT_BATCH_SIZE} on CPU: there is no "
                                                 "device memory to fill.", source="cpu")
        return replace(config, batch_size=DEFAULT_BATCH_SIZE), choice
    peak = peak_function(model_name, task=config.task, precision=precision, max_length=config.max_length,
                         gradient_checkpointing=config.gradient_checkpointing, finetune=config.finetune,
                         lora_r=config.lora_r, lora_dropout=config.lora_dropout,
                         preference_loss=config.preference_loss,
                         # "auto" may compute the train pairs' reference per step: priced as the copy kept
                         precompute_reference=config.precompute_reference is True) if model_name else None
    choice = choose_batch_size(peak, free, rows=rows, devices=int(os.environ.get("WORLD_SIZE", "1")))
    choice = replace(choice, reason=choice.reason.rstrip(".") + _effective(config, choice.batch_size) + ".")
    return replace(config, batch_size=choice.batch_size), choice


def describe_auto(peak: Peak | None, free_bytes: int | None, rows: int | None = None) -> str:
    """One line for the picker: what ``batch_size="auto"`` would use here."""
    if free_bytes is None:
        return f"batch_size auto: {DEFAULT_BATCH_SIZE} on CPU: there is no device memory to fill."
    return choose_batch_size(peak, free_bytes, rows=rows).reason
