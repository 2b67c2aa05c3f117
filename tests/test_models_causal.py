"""workbench.sources.models and vram for causal LMs: config facts, parameter split, the full / LoRA / QLoRA
estimate by hand."""

from __future__ import annotations

import pytest

from workbench.errors import ModelError
from workbench.sources.models import causal_facts
from workbench.sources.vram_causal import (
    causal_parameters,
    compare_finetune_modes,
    estimate_causal_vram,
)


@pytest.fixture
def small_llama():
    """vocab 1000, hidden 64, MLP 128, 2 layers, 4 heads / 2 KV heads (head_dim 16), tied."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                       tie_word_embeddings=True)


def test_parameter_split_by_hand(small_llama):
    split = causal_parameters(small_llama, lora_r=8)
    # per layer: q 64x64, k and v 64x32, o 64x64, gate/up/down 64x128: 36,864; 2 norms of 64
    assert split.decoder_linear == 2 * 36_864
    assert split.total == 1000 * 64 + 2 * (36_864 + 128) + 64  # embedding (tied head) + layers + norm
    # r * (in + out): q 8*128, k 8*96, v 8*96, o 8*128, gate/up/down 8*192 -> 8,192 per layer
    assert split.adapter == 2 * 8_192
    assert causal_parameters(small_llama, lora_r=8, targets=["q_proj", "v_proj"]).adapter == 2 * (1024 + 768)


def test_lora_estimate_by_hand(small_llama):
    est = estimate_causal_vram(small_llama, finetune="lora", batch_size=2, seq_len=16, precision="bf16",
                               lora_r=8, lora_dropout=0.05, include_overhead=False)
    assert est.trainable_parameters == 16_384
    assert est.base_weights_bytes == 2 * 138_048  # frozen base at 16-bit
    assert (est.trainable_weights_bytes, est.gradients_bytes, est.optimizer_bytes) == (65_536, 65_536, 131_072)
    assert est.autocast_copy_bytes == 0
    # layer: s*b*d*(h*(6+3g) + 4i) = 64*(480+512) = 63,488; + LSE 4*16*2*4 = 512;
    # + LoRA dropout copies 64*(5*64+128) = 28,672 -> 92,672 x 2 layers + embeddings 4,096
    assert est.activations_bytes == 2 * 92_672 + 4_096
    assert est.logits_bytes == 16 * 2 * 1000 * (2 + 8)
    assert est.allocated_bytes == 1_047_680 == est.total_bytes

    checkpointed = estimate_causal_vram(small_llama, finetune="lora", batch_size=2, seq_len=16,
                                        precision="bf16", lora_r=8, gradient_checkpointing=True,
                                        include_overhead=False)
    assert checkpointed.activations_bytes == 2 * 4_096 + 92_672 + 4_096  # layer inputs + one layer + embeddings
    share = estimate_causal_vram(small_llama, finetune="lora", batch_size=2, seq_len=16, precision="bf16",
                                 lora_r=8, loss_share=0.25, include_overhead=False)
    assert share.logits_bytes == 320_000 // 4


def test_qlora_and_full_estimates_by_hand(small_llama):
    q = estimate_causal_vram(small_llama, finetune="qlora", batch_size=2, seq_len=16, precision="bf16",
                             lora_r=8, include_overhead=False)
    # 4.127 bits per decoder linear weight (NF4 + double-quantized absmax); the rest (embeddings,
    # tied head, norms) at fp32: peft's prepare_model_for_kbit_training casts them (issue 32)
    assert q.base_weights_bytes == 38_034 + 4 * (138_048 - 73_728)
    full = estimate_causal_vram(small_llama, finetune="full", batch_size=2, seq_len=16, precision="fp32",
                                include_overhead=False)
    assert (full.base_weights_bytes, full.gradients_bytes, full.optimizer_bytes) == \
        (4 * 138_048, 4 * 138_048, 8 * 138_048)
    assert full.trainable_weights_bytes == 0 and full.autocast_copy_bytes == 0
    assert full.activations_bytes == 2 * (16 * 2 * 4 * 992 + 512) + 16 * 2 * 64 * 4
    assert full.logits_bytes == 16 * 2 * 1000 * 12
    bf16 = estimate_causal_vram(small_llama, finetune="full", batch_size=2, seq_len=16, precision="bf16",
                                include_overhead=False)
    assert bf16.autocast_copy_bytes == 2 * 138_048
    with_overhead = estimate_causal_vram(small_llama, finetune="full", batch_size=2, seq_len=16,
                                         precision="fp32")
    assert with_overhead.overhead_bytes == int(500 * 2**20 + 0.1 * full.allocated_bytes)


def test_preference_pairs_price_two_rows_each_and_a_reference_copy_only_when_it_is_kept(small_llama):
    settings = dict(batch_size=2, seq_len=16, precision="fp32", include_overhead=False)
    rows = estimate_causal_vram(small_llama, finetune="full", **{**settings, "batch_size": 4})
    for finetune in ("full", "lora"):
        for loss in ("dpo", "simpo"):
            pairs = estimate_causal_vram(small_llama, finetune=finetune, preference_loss=loss, **settings)
            plain = estimate_causal_vram(small_llama, finetune=finetune, **{**settings, "batch_size": 4})
            # 2 pairs: a chosen and a rejected row each, as one batch of 4 rows
            assert (pairs.activations_bytes, pairs.logits_bytes) == (plain.activations_bytes, plain.logits_bytes)
            assert pairs.reference_bytes == 0  # adapter off, precomputed, or reference-free
    kept = estimate_causal_vram(small_llama, finetune="full", preference_loss="dpo", precompute_reference=False,
                                **settings)
    assert kept.reference_bytes == 4 * 138_048 and kept.allocated_bytes == rows.allocated_bytes + 4 * 138_048
    assert "reference copy" in kept.describe()
    assert estimate_causal_vram(small_llama, finetune="lora", preference_loss="dpo", precompute_reference=False,
                                **settings).reference_bytes == 0
    assert estimate_causal_vram(small_llama, finetune="full", preference_loss="orpo", precompute_reference=False,
                                **settings).reference_bytes == 0


def test_qlora_keeps_an_fp32_residual_stream_and_a_cast_per_4bit_layer(small_llama):
    settings = dict(batch_size=2, seq_len=16, precision="bf16", lora_r=8, include_overhead=False)
    tokens, h, i = 2 * 16, 64, 128
    for dropout, lora_extra, qlora_extra in ((0.05, tokens * 2 * (5 * h + i), tokens * (18 * h + 3 * i)),
                                             (0.0, 0, tokens * 10 * h)):
        lora = estimate_causal_vram(small_llama, finetune="lora", lora_dropout=dropout, **settings)
        q = estimate_causal_vram(small_llama, finetune="qlora", lora_dropout=dropout, **settings)
        # per layer: X, norm(X), X2, norm(X2) at fp32 + a bf16 cast for q, k, v, gate, up (26 h)
        # instead of 3 h at bf16; the adapters' own copies; the embedding output at fp32
        per_layer = tokens * (26 * h - 3 * h * 2) + qlora_extra - lora_extra
        assert q.activations_bytes - lora.activations_bytes == 2 * per_layer + tokens * h * 2


def test_estimate_refuses_what_cannot_be(small_llama):
    with pytest.raises(ModelError, match="context of 256"):
        estimate_causal_vram(small_llama, seq_len=512)
    with pytest.raises(ModelError, match="16-bit"):
        estimate_causal_vram(small_llama, finetune="qlora", precision="fp32")
    with pytest.raises(ModelError, match="full, lora, qlora"):
        estimate_causal_vram(small_llama, finetune="adapter")


def test_smollm2_facts_and_the_three_modes(smollm2_dir):
    from transformers import AutoConfig

    facts = causal_facts(AutoConfig.from_pretrained(smollm2_dir), str(smollm2_dir))
    assert (facts.num_layers, facts.hidden_size, facts.num_heads, facts.num_kv_heads, facts.head_dim) == \
        (30, 576, 9, 3, 64)
    assert (facts.vocab_size, facts.context_length, facts.tied_embeddings, facts.chat_template) == \
        (49152, 8192, True, True)
    assert "9 heads / 3 KV heads" in facts.summary()
    modes = compare_finetune_modes(str(smollm2_dir), batch_size=8, seq_len=512, precision="bf16")
    assert modes["lora"].total_bytes < modes["full"].total_bytes
    # QLoRA saves on weights, but its fp32 residual stream (prepare_model_for_kbit_training) costs
    # more in activations than a 135M model's weights: it is the larger of the two here (issue 32).
    assert modes["qlora"].base_weights_bytes < modes["lora"].base_weights_bytes
    assert modes["qlora"].activations_bytes > modes["lora"].activations_bytes
    assert modes["lora"].trainable_parameters == 30 * 16 * (2 * (576 + 576) + 2 * (576 + 192)
                                                            + 3 * (576 + 1536))
    assert "lora at bf16" in modes["lora"].describe()


def test_chat_template_unknown_without_tokenizer_files(tmp_path):
    from workbench.sources.models import has_chat_template

    assert has_chat_template(str(tmp_path)) is None
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    assert has_chat_template(str(tmp_path)) is False


@pytest.mark.parametrize("model_type, architectures, expected", [
    ("llama", ["LlamaForCausalLM"], True),
    ("gpt2", ["GPT2LMHeadModel"], True),  # a decoder family: its LM head counts
    ("qwen2", [], True),  # no architectures: the model type decides
    ("llama", ["LlamaForSequenceClassification"], False),  # a decoder fine-tuned as a classifier
    ("bert", ["BertLMHeadModel"], False),  # an encoder with an LM head is not a causal LM here
    ("bert", ["BertForSequenceClassification"], False),
    ("roberta", ["RobertaForCausalLM"], True),  # what the config says it is
])
def test_is_causal_lm(model_type, architectures, expected):
    from workbench.sources.models import ModelInfo, is_causal_lm

    info = ModelInfo(name_or_path="x", source="folder", model_type=model_type,
                     architecture=architectures[0] if architectures else model_type, num_parameters=1,
                     parameter_method="", hidden_size=None, num_layers=None, num_attention_heads=None,
                     intermediate_size=None, max_position_embeddings=None, vocab_size=None,
                     supports_sequence_classification=True, config={"architectures": architectures})
    assert is_causal_lm(info) is expected
