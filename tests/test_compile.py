"""Compilation (engine/compile.py): what auto chooses, the blocks it compiles in place, the
fallback to eager, and runs with compile forced on that must end where the eager run ends.

Compiling on 2 CPU cores is slow (inductor builds C++ kernels): the runs below are tiny,
and those over ~30 s are marked slow. Inductor's on-disk cache makes a second compile of
the same block fast, so the resume test's later processes pay little.
"""

from __future__ import annotations

import copy
import itertools
import json
import signal

import pytest
import torch

from workbench.config import TrainConfig
from workbench.engine import compile as compiling
from workbench.engine import fuse_adapters
from workbench.errors import ConfigError


# ------------------------------------------------------------------ the choice
def test_auto_compiles_on_cuda_only_and_true_false_force_it():
    assert compiling.wanted("auto", "cuda")[0] is True
    on, reason = compiling.wanted("auto", "cpu")
    assert on is False and "compile=True forces it" in reason
    assert compiling.wanted(True, "cpu")[0] is True
    assert compiling.wanted(False, "cuda")[0] is False


def test_cuda_graphs_only_on_cuda_with_bucketed_lengths():
    assert compiling.choose_mode("auto", "cuda", bucketed=True) == "reduce-overhead"
    assert compiling.choose_mode("auto", "cuda", bucketed=False) == "default"  # flattened batches: any length
    assert compiling.choose_mode("auto", "cpu", bucketed=True) == "default"
    assert compiling.choose_mode("reduce-overhead", "cpu", bucketed=True) == "reduce-overhead"  # as asked


def test_buckets_grow_by_at_most_half_and_end_at_max_length():
    assert compiling.bucket_lengths(128) == (8, 16, 24, 32, 48, 64, 96, 128)
    assert compiling.bucket_lengths(100)[-2:] == (96, 100)  # never past max_length: positions may end there
    lengths = compiling.bucket_lengths(4096)
    assert all(b <= a * 3 // 2 for a, b in itertools.pairwise(lengths[1:]))  # <= 1/3 of a batch is extra padding
    assert all(n % 8 == 0 for n in lengths) and len(lengths) == 18  # few shapes: CUDA graphs record one each
    assert [compiling.bucket_for(n, lengths) for n in (1, 8, 9, 17, 25, 4096)] == [8, 8, 16, 24, 32, 4096]


def test_bucketed_batches_are_padded_to_their_bucket_by_the_tasks_collator():
    from workbench.tasks.causal_lm_data import PaddingCollator

    collate = compiling.Bucketed(PaddingCollator(pad_token_id=0), max_length=128)
    short = collate([{"input_ids": [5] * 10, "labels": [5] * 10}, {"input_ids": [6] * 3, "labels": [6] * 3}])
    assert short["input_ids"].shape == (2, 16) and short["attention_mask"].sum() == 13
    assert short["labels"][1, 3:].eq(-100).all()  # the bucket's padding is masked out of the loss
    assert collate([{"input_ids": [5] * 33, "labels": [5] * 33}])["input_ids"].shape == (1, 48)
    assert collate([{"input_ids": [5] * 128, "labels": [5] * 128}])["input_ids"].shape == (1, 128)


def test_aligned_batches_pad_to_a_multiple_of_8_and_leave_the_tasks_collator_as_it_was():
    from workbench.tasks.causal_lm_data import PaddingCollator

    task_collate = PaddingCollator(pad_token_id=0)
    collate = compiling.Aligned(task_collate)
    batch = collate([{"input_ids": [5] * 10, "labels": [5] * 10}, {"input_ids": [6] * 3, "labels": [6] * 3}])
    assert batch["input_ids"].shape == (2, 16) and batch["labels"][1, 3:].eq(-100).all()
    assert collate([{"input_ids": [5] * 93, "labels": [5] * 93}])["input_ids"].shape == (1, 96)
    assert task_collate.pad_to_multiple_of is None  # the eager fallback pads as the task does
    assert compiling.Aligned(PaddingCollator(pad_token_id=0, pad_to_multiple_of=64)).multiple == 64  # never less


def test_bad_settings_name_the_field():
    with pytest.raises(ConfigError, match="compile"):
        TrainConfig(compile="yes")
    with pytest.raises(ConfigError, match="compile_mode"):
        TrainConfig(compile_mode="fast")
    assert TrainConfig().compile == "auto"


# ------------------------------------------------------------ the blocks, in place
def _tiny_classifier(tiny_bert):
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=2)


class _Collate:
    pad_to_multiple_of = None


@pytest.mark.parametrize("mode, device, expected", [
    ("default", "cpu", {"fallback_random": True}),
    ("default", "cuda", {}),  # inductor's fused Philox dropout
    ("reduce-overhead", "cuda", {"triton.cudagraphs": True}),
    ("max-autotune-no-cudagraphs", "cpu", {"max_autotune": True, "coordinate_descent_tuning": True}),
])
def test_compile_arguments_are_the_modes_options_plus_atens_random_numbers_on_a_cpu_and_the_fusion(mode, device, expected):
    assert compiling.compile_arguments(mode, device) == \
        {"options": {**expected, "pre_grad_custom_pass": fuse_adapters.FUSE_SIBLING_ADAPTERS}}


def test_blocks_compile_in_place_and_the_state_dict_keeps_its_keys(tiny_bert):
    model = _tiny_classifier(tiny_bert)
    keys = list(model.state_dict())
    collate = _Collate()
    compiled = compiling.prepare(model, collate, True, "auto", "cpu", max_length=64)
    assert compiled.on and compiled.block_name == "BertLayer" and len(compiled.blocks) == 2
    assert all(block._compiled_call_impl is not None for block in compiled.blocks)
    assert isinstance(compiled.collate, compiling.Aligned) and compiled.multiple == 8  # default mode on a CPU
    assert compiled.buckets is None and collate.pad_to_multiple_of is None
    assert list(model.state_dict()) == keys  # no _orig_mod.: checkpoints and resume match eager runs


def test_compiled_blocks_on_a_cpu_drop_what_the_eager_blocks_drop(tiny_bert):
    """With aten's generator (``fallback_random``) a compiled block's dropout draws the eager
    block's masks from the same seed: the compiled run trains on what the eager one would.
    Inductor's own random kernels draw others: every output differs, by up to ~0.05 here."""
    from transformers.models.bert.modeling_bert import BertLayer

    eager = _tiny_classifier(tiny_bert)
    for module in eager.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.3
    layer = next(m for m in eager.modules() if isinstance(m, BertLayer)).train()
    compiled = copy.deepcopy(layer)
    compiled.compile(**compiling.compile_arguments("default", "cpu"))
    x = torch.randn(2, 8, layer.attention.self.query.in_features)
    compiled(x)  # compiles; draws numbers too
    outputs = []
    for block in (layer, compiled):
        torch.manual_seed(7)
        out = block(x)
        outputs.append(out[0] if isinstance(out, tuple) else out)
    torch.manual_seed(8)
    other_seed = layer(x)
    other_seed = other_seed[0] if isinstance(other_seed, tuple) else other_seed
    assert not torch.allclose(other_seed, outputs[0])  # the dropout draws: equal outputs are not vacuous
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-5, rtol=1e-5)


def test_cuda_graphs_get_buckets_and_a_step_mark_the_other_modes_only_alignment(tiny_bert, monkeypatch):
    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    graphs = compiling.prepare(_tiny_classifier(tiny_bert), _Collate(), True, "reduce-overhead", "cpu", max_length=64)
    assert isinstance(graphs.collate, compiling.Bucketed) and graphs.buckets == (8, 16, 24, 32, 48, 64)
    assert graphs.describe()["buckets"] == [8, 16, 24, 32, 48, 64] and graphs.multiple is None
    graphs.step_begins()
    assert marks == [1]
    default = compiling.prepare(_tiny_classifier(tiny_bert), _Collate(), True, "auto", "cpu", max_length=64)
    assert isinstance(default.collate, compiling.Aligned) and default.buckets is None
    assert default.describe()["multiple"] == 8
    default.step_begins()
    assert marks == [1]  # no CUDA graphs, no mark


def test_auto_on_cpu_leaves_model_and_collator_untouched(tiny_bert):
    model, collate = _tiny_classifier(tiny_bert), _Collate()
    compiled = compiling.prepare(model, collate, "auto", "auto", "cpu", max_length=64)
    assert not compiled.on and compiled.collate is collate and collate.pad_to_multiple_of is None
    assert "forward" not in vars(model)  # not even the fallback wrapper


def test_a_failing_compilation_falls_back_to_eager_with_the_same_outputs(tiny_bert):
    model = _tiny_classifier(tiny_bert).eval()
    batch = {"input_ids": torch.tensor([[2, 5, 6, 7, 3]]), "attention_mask": torch.ones(1, 5, dtype=torch.long)}
    with torch.no_grad():
        expected = model(**batch).logits
    compiled = compiling.prepare(model, _Collate(), True, "auto", "cpu", max_length=64)

    def broken_backend(graph, example_inputs):
        raise RuntimeError("inductor cannot build this kernel")

    for block in compiled.blocks:  # what a compiler bug looks like: it surfaces at the first forward
        block._compiled_call_impl = torch.compile(block._call_impl, backend=broken_backend)
    with torch.no_grad():
        got = model(**batch).logits
    assert torch.equal(got, expected)
    assert not compiled.on and all(block._compiled_call_impl is None for block in compiled.blocks)
    text, level = compiled.notes[-1]
    assert level == "warn" and "inductor cannot build this kernel" in text and "compile=False" in text


def test_an_error_of_the_model_itself_is_not_swallowed(tiny_bert):
    model = _tiny_classifier(tiny_bert)
    compiling.prepare(model, _Collate(), True, "auto", "cpu", max_length=64)
    with pytest.raises((IndexError, RuntimeError)):
        model(input_ids=torch.tensor([[10**6]]))  # a token id past the vocabulary


# ------------------------------------------------------------- runs with compile on
def _fit_bert(tiny_bert, out, **settings):
    from workbench.engine.train import fit
    from workbench.sources.synthetic import make_dataset

    return fit(str(tiny_bert), make_dataset(64, 16, seed=3), output_dir=str(out), learning_rate=2e-3,
               batch_size=8, max_length=64, max_steps=6, num_workers=0, precision="fp32", log_every=1,
               **settings)


def _events(out):
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


def test_compiled_classifier_ends_where_the_eager_one_ends(tiny_bert, tmp_path):
    """In the default set: the one compiled run CI always makes (a 2-layer BERT, ~20 s on 2 cores)."""
    from safetensors.torch import load_file

    eager = _fit_bert(tiny_bert, tmp_path / "eager", compile=False)
    compiled = _fit_bert(tiny_bert, tmp_path / "compiled", compile=True)
    assert compiled.status == "completed"
    # Compiled kernels sum in another order and batches are padded to a multiple of 8: close, not bitwise.
    assert compiled.metrics["eval_loss"] == pytest.approx(eager.metrics["eval_loss"], rel=1e-3, abs=1e-4)
    assert compiled.metrics["eval_accuracy"] == eager.metrics["eval_accuracy"]
    start = _events(tmp_path / "compiled")[0]
    assert start["compile"]["on"] and start["compile"]["block"] == "BertLayer" and start["compile"]["multiple"] == 8
    texts = [e["text"] for e in _events(tmp_path / "compiled") if e["kind"] == "message"]
    assert any("Compiled 2 BertLayer blocks" in t and "first step took" in t for t in texts), texts
    assert load_file(eager.model_dir / "model.safetensors").keys() == \
        load_file(compiled.model_dir / "model.safetensors").keys()
    assert compiled.verdict["outcome"] == eager.verdict["outcome"]  # the verdict judges the same run


@pytest.mark.slow
def test_compiled_lora_run_ends_where_the_eager_one_ends_and_merges(tiny_llama_dir, tmp_path):
    from llm_fixtures import TINY_LORA, write_chat_files
    from safetensors.torch import load_file

    from workbench.engine.train import fit

    data = write_chat_files(tmp_path / "data", n_train=16, n_eval=8)
    results = {}
    for name, on in (("eager", False), ("compiled", True)):
        results[name] = fit(str(tiny_llama_dir), str(data), output_dir=str(tmp_path / name), max_steps=4,
                            precision="fp32", lora_dropout=0.0, merge_adapter=True, compile=on, **TINY_LORA)
    eager, compiled = results["eager"], results["compiled"]
    assert compiled.metrics["eval_loss"] == pytest.approx(eager.metrics["eval_loss"], rel=1e-3)
    assert load_file(eager.model_dir / "adapter_model.safetensors").keys() == \
        load_file(compiled.model_dir / "adapter_model.safetensors").keys()
    assert (tmp_path / "compiled" / "model_merged" / "config.json").is_file()
    assert _events(tmp_path / "compiled")[0]["compile"]["block"] == "LlamaDecoderLayer"


@pytest.mark.slow
def test_kill_then_resume_with_compile_on_matches_the_uninterrupted_compiled_run(tiny_bert, tmp_path):
    """kill -9 mid-run and resume, compile on in every process: the losses after the resumed step and
    the final weights equal the uninterrupted compiled run's (the same kernels, the same RNG streams)."""
    from test_train_resume import WORKER, _assert_same_as_reference, _losses, _run, _wait_for

    from workbench.engine import checkpoint

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {"COMPILE": "1"}
    reference = tmp_path / "uninterrupted"
    _run(script, tiny_bert, reference, env=env)
    assert _events(reference)[0]["compile"]["on"]
    out = tmp_path / "killed"
    proc = _run(script, tiny_bert, out, env={**env, "SLOW_STEP_S": "0.15"}, wait=False)
    _wait_for(lambda: len(_losses(out)) >= 8 if (out / "events.jsonl").exists() else False, proc, timeout=300)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    resumed_after = int(checkpoint.latest_checkpoint(out).name.split("-")[1])
    _run(script, tiny_bert, out, env=env)
    _assert_same_as_reference(reference, out, resumed_after)


def test_every_block_of_a_lora_model_runs_compiled_and_dynamo_traces_the_block_at_most_twice():
    """One compile serves the blocks: twice under LoRA (the first block's input, from the frozen
    embeddings, needs no gradient; the others' do), never once per block, which a KV cache in the
    task's forward would cause (a guard per layer index) until the recompile limit left the rest eager."""
    from test_fuse_adapters import _lora_llama

    from workbench.tasks.causal_lm import supervised_logits

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = _lora_llama(layers=4)
    compiled = compiling.prepare(model, lambda rows: rows, True, "default", "cpu", 64)
    assert compiled.on and len(compiled.blocks) == 4
    ids = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}

    def step():
        logits, targets, _ = supervised_logits(model, batch)
        torch.nn.functional.cross_entropy(logits, targets).backward()

    step()  # compiles
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        step()
    regions = [e for e in profile.events() if e.name.startswith("Torch-Compiled Region")]
    assert len(regions) == 4, [e.name for e in regions]  # every block compiled, none left eager
    assert 1 <= torch._dynamo.utils.counters["stats"]["unique_graphs"] <= 2
    assert not compiled.limit_hit and not any("recompile" in text for text, _ in compiled.notes)


def test_blocks_past_dynamos_recompile_limit_give_the_run_a_warning_once():
    """A KV cache in the forward gives each block a guard (its layer index): past the limit dynamo
    runs the rest eagerly and only logs it; the run says so in its own messages, once."""
    from test_fuse_adapters import _lora_llama

    torch._dynamo.reset()
    model = _lora_llama(layers=4)
    compiled = compiling.prepare(model, lambda rows: rows, True, "default", "cpu", 64)
    ids = torch.randint(0, 300, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch._dynamo.config.patch(recompile_limit=2), torch.no_grad():
        for _ in range(2):
            model(input_ids=ids, use_cache=True)
    warnings = [text for text, level in compiled.notes if level == "warn"]
    assert compiled.on and compiled.limit_hit and len(warnings) == 1, compiled.notes
    assert "recompile_limit (2)" in warnings[0] and "LlamaDecoderLayer" in warnings[0]
    assert "compile=False" in warnings[0]
    torch._dynamo.reset()
