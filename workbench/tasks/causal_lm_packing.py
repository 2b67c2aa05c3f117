"""Padding-free packing for causal LMs: a batch's conversations end to end in one row.

The padded batch (``causal_lm_data.PaddingCollator``) is the reference; packing is a switch
around it (``TrainConfig.packing``: "auto" | True | False), chosen once per run by
:func:`choose_packing` and applied by the collator the task hands the loader.

**Layout.** The rows of one loader batch are concatenated into a single row
(``transformers.DataCollatorWithFlattening``): ``position_ids`` restart at 0 at each
conversation, the label of each conversation's first token is -100 (no token predicts
across a boundary), there is no ``attention_mask``. transformers 5 then builds the mask
itself: ``masking_utils._preprocess_mask_arguments`` calls ``find_packed_sequence_indices``
on the position ids whenever the attention mask is None and there is no cache (training),
and ``create_causal_mask`` (what ``LlamaModel.forward`` calls, so SmolLM2 and every Llama-
family model) ANDs a block-diagonal "same sequence" mask into the causal one, for the
sdpa, eager and flex_attention mask builders. FlashAttention instead gets the sequence
offsets (``cu_seq_lens_*``) and runs its variable-length kernel.

**Why one row per batch, not rows of max_length filled across batches.** The sampler's
batches stay exactly what they are on the padded path: the same conversations make each
optimizer step, so the loss per step equals the padded run's (tested to 1e-5 in fp32),
``batch_size``, the length grouping and an exact resume mean what they meant, and the
flattened layout is the one the task already cuts into micro-batches at conversation
boundaries after an out-of-memory (``CausalLMTask.split``). The cost: a row of ``B x L``
tokens, so attention with a dense mask does ``B`` times the padded path's score work.

**When "auto" turns it on** (measured on 2 CPU cores, LoRA r=16, batch 8, forward+backward,
torch 2.13): with SmolLM2's width (hidden 576, 4 layers) padded vs packed took 997 vs 1122
ms at 7% padding (lengths grouped, the default) but 3077 vs 1654 ms at 37% padding (lengths
20-200 ungrouped); at the launch-bound stand-in's width (hidden 64, 30 layers) packing lost
even at 37% (676 vs 867 ms). So packing pays by the padding it removes and costs attention
work that grows with the row: on with FlashAttention (its varlen kernel does no masked work),
otherwise on where the planned batches would be at least ``PAYS_AT_PADDING`` padding
(:func:`padding_share`), which with ``group_by_length`` (the default) they rarely are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from workbench.errors import ConfigError

PAYS_AT_PADDING = 0.25  # share of padded positions above which packing won in the measurements above
GROUPING_WINDOW = 50  # batches sorted together by the length-grouped sampler (engine/batching.py)


@dataclass(frozen=True)
class PackingChoice:
    on: bool
    reason: str  # said in the run's messages: why packing is on or off
    flash: bool = False  # FlashAttention: the batch carries its sequence offsets


def attention_packs(attn_implementation: str | None) -> bool:
    """Whether this attention keeps packed conversations apart: FlashAttention through its sequence
    offsets, the others when transformers has a mask builder for them (sdpa, eager, flex_attention,
    and the workbench's CPU attention, registered in ``engine/cpu_bf16.py``)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    impl = attn_implementation or ""
    # Not `in ALL_MASK_ATTENTION_FUNCTIONS`: transformers itself reads the class mapping, and a
    # name missing there gets no mask at all, so packed rows would attend across conversations.
    return "flash" in impl or impl in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping


def padding_share(lengths: Sequence[int], batch_size: int, group_by_length: bool, seed: int = 0) -> float:
    """The share of padded positions in an epoch of batches shaped as the training sampler makes them:
    random batches, or (``group_by_length``) batches cut from windows sorted by length."""
    order = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(seed)).tolist()
    window = batch_size * GROUPING_WINDOW if group_by_length else batch_size
    padded = real = 0
    for start in range(0, len(order), window):
        chunk = order[start:start + window]
        if group_by_length:
            chunk = sorted(chunk, key=lambda i: -lengths[i])
        for b in range(0, len(chunk), batch_size):
            rows = [lengths[i] for i in chunk[b:b + batch_size]]
            padded += max(rows) * len(rows)
            real += sum(rows)
    return 1 - real / padded if padded else 0.0


def choose_packing(setting, *, attn_implementation: str | None, cuda: bool, lengths: Sequence[int],
                   batch_size: int, group_by_length: bool) -> PackingChoice:
    """Whether the run packs its batches, and why. ConfigError when forced on where it cannot run."""
    impl = attn_implementation or "unknown"
    if setting is False:
        return PackingChoice(False, "packing=False: batches are padded.")
    if not attention_packs(attn_implementation):
        if setting is True:
            raise ConfigError("packing", True, f"'auto' or False with attention {impl!r}",
                              fix=f"set packing: auto (batches are padded), or load the model with an attention "
                                  f"that keeps packed conversations apart (sdpa, eager, flex_attention, "
                                  f"flash_attention_2); {impl!r} would let them attend to each other.")
        return PackingChoice(False, f"Batches are padded: attention {impl!r} cannot keep packed "
                                    "conversations apart.")
    flash = "flash" in impl
    if flash and not cuda:
        if setting is True:
            raise ConfigError("packing", True, "'auto' or False without CUDA for attention " + repr(impl),
                              fix="set packing: auto, or train on a CUDA GPU with flash-attn installed.")
        return PackingChoice(False, f"Batches are padded: {impl} runs on CUDA only.")
    if setting is True:
        return PackingChoice(True, "packing=True: each batch's conversations are packed into one row.", flash)
    if flash:
        return PackingChoice(True, f"Batches are packed (packing=auto): {impl}'s variable-length kernel "
                                   "attends within each conversation at no cost for the others.", True)
    share = padding_share(lengths, batch_size, group_by_length)
    if share >= PAYS_AT_PADDING:
        return PackingChoice(True, f"Batches are packed (packing=auto): padded, {share:.0%} of their positions "
                                   f"would be padding (packing pays from {PAYS_AT_PADDING:.0%}).")
    return PackingChoice(False, f"Batches are padded (packing=auto): only {share:.0%} of their positions are "
                                f"padding, less than the {PAYS_AT_PADDING:.0%} from which packing pays with "
                                f"{impl} attention.")


def packed_collator(flash: bool):
    """Rows -> one row: input_ids, labels (-100 at each conversation's first token), position_ids
    restarting at 0; with ``flash``, FlashAttention's sequence offsets too."""
    from transformers import DataCollatorWithFlattening

    return DataCollatorWithFlattening(return_flash_attn_kwargs=flash)


def is_packed(batch: dict) -> bool:
    """A flattened batch: position ids and no attention mask (what the padded collator always sends)."""
    return "position_ids" in batch and "attention_mask" not in batch


def example_of(batch: dict, keep: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(the example each kept position belongs to, the number of examples in the batch): rows of a
    padded batch, conversations of a packed one, so evaluation outputs are per example either way."""
    if not is_packed(batch):
        return keep.nonzero()[:, 0], keep.shape[0]
    starts = batch["position_ids"] == 0
    example = starts.flatten().cumsum(0) - 1  # row-major, as logits_to_keep gathers
    return example[keep.flatten()], int(starts.sum())
