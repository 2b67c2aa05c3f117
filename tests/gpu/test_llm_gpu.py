"""Causal LM on a real GPU: the LoRA / QLoRA / full estimate vs the measured peak; QLoRA trains.

Runs only where CUDA is usable (tests/conftest.py skips the `gpu` marker elsewhere).
The model is the offline SmolLM2-135M-Instruct (the ``smollm2_dir`` fixture).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

GPU_TOLERANCE = 0.20  # |estimate - measured| / measured, allocated bytes (no CUDA context)


def _peak_of_steps(task, choice, tokenizer, config, batch):
    import torch

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = task.build_model(choice, tokenizer, config)
    if next(model.parameters()).device.type != "cuda":  # QLoRA is placed on the GPU when loaded
        model = model.cuda()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    batch = {k: v.cuda() for k, v in batch.items()}
    model.train()
    for _ in range(2):  # the second step has the AdamW state allocated
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = task.loss(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    peak = torch.cuda.max_memory_allocated()
    del model, optimizer
    return peak, loss.item()


@pytest.mark.parametrize("finetune, checkpointing", [("lora", False), ("lora", True), ("qlora", False),
                                                     ("full", False)])
def test_causal_estimate_vs_max_memory_allocated(smollm2_dir, finetune, checkpointing):
    import math

    import torch

    from workbench.config import ModelChoice, TrainConfig
    from workbench.sources.synthetic_llm import make_chat_dataset
    from workbench.sources.vram_causal import estimate_causal_vram
    from workbench.tasks.causal_lm import CausalLMTask
    from workbench.tasks.causal_lm_data import IGNORE

    if finetune == "qlora":
        pytest.importorskip("bitsandbytes")
    if not torch.cuda.is_bf16_supported():
        pytest.skip("bf16 needs compute capability 8.0+")
    choice = ModelChoice(str(smollm2_dir))
    task = CausalLMTask(finetune=finetune, lora_r=16, lora_alpha=32, lora_dropout=0.05)
    data = make_chat_dataset(16, 4)
    task.check_data(data)
    tokenizer = task.load_tokenizer(choice)
    config = TrainConfig(precision="bf16", gradient_checkpointing=checkpointing)
    # Every row padded to 256 tokens: the estimate's batch x length, no length variation.
    train, _ = task.datasets(data, tokenizer, 256, None)
    rows = [train[i] for i in range(16)]
    batch = task.collator(tokenizer)(rows)
    pad = 256 - batch["input_ids"].shape[1]
    batch = {k: torch.nn.functional.pad(v, (0, pad), value=(IGNORE if k == "labels" else 0))
             for k, v in batch.items()}
    share = float((batch["labels"][:, 1:] != IGNORE).float().mean())
    measured, loss = _peak_of_steps(task, choice, tokenizer, config, batch)
    assert math.isfinite(loss)
    estimate = estimate_causal_vram(str(smollm2_dir), finetune=finetune, batch_size=16, seq_len=256,
                                    precision="bf16", gradient_checkpointing=checkpointing, lora_r=16,
                                    lora_dropout=0.05, loss_share=share, include_overhead=False)
    error = abs(estimate.allocated_bytes - measured) / measured
    assert error <= GPU_TOLERANCE, (f"{finetune} checkpointing={checkpointing}: estimate "
                                    f"{estimate.allocated_bytes / 2**20:.0f} MiB vs measured "
                                    f"{measured / 2**20:.0f} MiB ({error:.0%})")
