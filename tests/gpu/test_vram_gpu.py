"""The VRAM estimate against torch.cuda.max_memory_allocated on a real GPU (BERT-like, no download)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

GPU_TOLERANCE = 0.25  # |estimate - measured| / measured, allocated bytes (no CUDA context)


def bert_like(attention: str):
    from transformers import BertConfig

    # BERT-base shapes with a smaller vocabulary: ~86 M parameters, built from the config
    return BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                      intermediate_size=3072, num_labels=2, attn_implementation=attention)


@pytest.mark.parametrize(
    "precision, attention, batch, seq, checkpointing",
    [
        ("fp32", "eager", 16, 128, False),
        ("bf16", "sdpa", 32, 256, False),
        ("fp16", "eager", 16, 256, False),
        ("bf16", "sdpa", 32, 256, True),
    ],
)
def test_estimate_vs_max_memory_allocated(precision, attention, batch, seq, checkpointing):
    import torch
    from transformers import BertForSequenceClassification

    from workbench.sources import models, vram

    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("bf16 needs compute capability 8.0+")
    config = bert_like(attention)
    params, _ = models.count_parameters(config)
    info = models.ModelInfo("bert-like", "folder", "bert", "BertForSequenceClassification", params,
                            "meta", 768, 12, 12, 3072, 512, 30522, True, attention)
    estimate = vram.estimate_vram(info, batch_size=batch, seq_len=seq, precision=precision,
                                  gradient_checkpointing=checkpointing, attention=attention,
                                  include_overhead=False)

    torch.manual_seed(0)
    device = torch.device("cuda")
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    model = BertForSequenceClassification(config).to(device).train()
    if checkpointing:
        # transformers 5 renamed it; the old name still works but warns
        enable = getattr(model, "activation_checkpointing_enable", None)
        (enable or model.gradient_checkpointing_enable)()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")
    dtype = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    ids = torch.randint(0, 30522, (batch, seq), device=device)
    labels = torch.randint(0, 2, (batch,), device=device)
    torch.cuda.reset_peak_memory_stats(device)
    for _ in range(3):  # the optimizer states exist from the first step on
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = model(input_ids=ids, labels=labels).loss
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated(device) - base - ids.numel() * 8 - labels.numel() * 8
    error = abs(estimate.allocated_bytes - measured) / measured
    print(f"{precision} {attention} b={batch} s={seq} ckpt={checkpointing}: estimate "
          f"{estimate.allocated_bytes / 2**20:.0f} MiB, measured {measured / 2**20:.0f} MiB, "
          f"error {error:.0%}")
    del model, opt
    torch.cuda.empty_cache()
    assert error < GPU_TOLERANCE
