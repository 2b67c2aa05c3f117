"""fit(): learning, the saved model, bad input caught before training, interrupts,
NaN losses and out-of-memory retries (simulated on CPU)."""

from __future__ import annotations

import json
import multiprocessing
import shutil

import pytest
import torch
from datasets import Dataset, DatasetDict

from workbench import frontend
from workbench.engine import checkpoint, train
from workbench.errors import CheckpointError, ConfigError, DataError, ModelError, TrainingError
from workbench.frontend import fit
from workbench.sources.synthetic import make_dataset
from workbench.tasks.classification import ClassificationTask


@pytest.fixture(autouse=True)
def _few_threads():
    torch.set_num_threads(2)


@pytest.fixture(scope="module")
def small_data():
    return make_dataset(96, 32, seed=5)


def _quick(tiny_bert, data, out, **overrides):
    settings = dict(output_dir=str(out), learning_rate=2e-3, batch_size=8, num_workers=0, progress="none", max_length=128,
                    max_steps=6, log_every=1, warmup_ratio=0.0)
    settings.update(overrides)
    return fit(str(tiny_bert), data, **settings)


def _simulate_oom(monkeypatch, trigger):
    """Raise CUDA's out-of-memory error at an optimizer step when ``trigger(step, micro_batch_size)``."""
    original = train._optimizer_step

    def step_or_oom(run, batches, step):
        if trigger(step, run.state.micro_batch_size):
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (simulated at step {step})")
        return original(run, batches, step)

    monkeypatch.setattr(train, "_optimizer_step", step_or_oom)


def _checkpoint_weights_of_model(path):
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


def _checkpoint_weights(path):
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


def _events(result, kind):
    return [e for e in result.history if e["kind"] == kind]


# ------------------------------------------------------------------------ learning
def test_learns_the_sentiment_task_and_saves_a_pipeline_ready_model(tiny_bert, sentiment_data, tmp_path):
    result = fit(str(tiny_bert), sentiment_data, output_dir=str(tmp_path / "run"), learning_rate=2e-3,
                 num_epochs=1, batch_size=8, warmup_ratio=0.1, num_workers=0, progress="none", log_every=10)
    assert result.status == "completed"
    assert result.metrics["eval_accuracy"] >= 0.9
    assert set(result.metrics) == {"eval_loss", "eval_accuracy", "eval_f1"}
    assert result.label_names == ["negative", "positive"]
    assert result.best_checkpoint == tmp_path / "run" / "best"
    assert json.loads((result.best_checkpoint / "best.json").read_text())["metrics"]["eval_accuracy"] >= 0.9

    from transformers import pipeline

    classify = pipeline("text-classification", model=str(result.model_dir), device="cpu")
    assert classify("The film is really wonderful, the cast is superb.")[0]["label"] == "positive"
    assert classify("The plot is awful, the pacing is so dull.")[0]["label"] == "negative"
    labels = json.loads((result.model_dir / "labels.json").read_text())
    assert labels["label2id"] == {"negative": 0, "positive": 1}

    kinds = [e["kind"] for e in result.history]
    assert kinds[0] == "start" and kinds[-1] == "end"
    train = _events(result, "train")[0]
    for name in ("step", "epoch", "loss", "lr", "samples_per_s", "gpu_mem_bytes", "eta_s", "skipped_steps"):
        assert name in train
    assert (tmp_path / "run" / "events.jsonl").is_file()
    run_json = json.loads((checkpoint.latest_checkpoint(tmp_path / "run") / "run.json").read_text())
    assert run_json["seed"] == 42 and run_json["environment"]["packages"]["torch"]


def test_rerunning_a_finished_run_resumes_and_does_nothing_more(tiny_bert, small_data, tmp_path):
    first = _quick(tiny_bert, small_data, tmp_path / "run")
    again = _quick(tiny_bert, small_data, tmp_path / "run")
    assert again.status == "completed"
    assert _events(again, "train") == []  # nothing left to do
    assert any("Resumed from" in e["text"] for e in _events(again, "message"))
    assert again.metrics == first.metrics
    # Another seed means other batches: not this run any more (issue: resuming someone else's run).
    with pytest.raises(CheckpointError, match="train.seed 42 in the checkpoint, 1 now"):
        _quick(tiny_bert, small_data, tmp_path / "run", seed=1)


# ------------------------------------------------------------- bad input, up front
def _assert_nothing_trained(out):
    assert not (out / "events.jsonl").exists()


def test_eval_before_training_records_step_0_and_never_keeps_it_as_best(trained_tiny_bert, small_data, tmp_path):
    """The trained model is at accuracy ~1 from step 0: every evaluation beats chance, step 0 is still no result."""
    out = tmp_path / "run"
    result = _quick(trained_tiny_bert, small_data, out, max_steps=4, eval_every=2, eval_before_training=True)
    evals = _events(result, "eval")
    assert [e["step"] for e in evals] == [0, 2, 4]
    assert set(evals[0]) >= {"eval_loss", "eval_accuracy", "eval_f1"}
    assert json.loads((out / "best" / "best.json").read_text())["step"] in (2, 4)
    resumed = _quick(trained_tiny_bert, small_data, out, max_steps=6, eval_every=2, eval_before_training=True)
    assert [e["step"] for e in _events(resumed, "eval")] == [6]  # a resume does not evaluate step 0 again


def test_unknown_eval_label(tiny_bert, tmp_path):
    data = make_dataset(32, 8)
    data["validation"] = Dataset.from_dict({"text": ["so so"], "label": ["neutral"]})
    with pytest.raises(DataError, match="'neutral'"):
        _quick(tiny_bert, data, tmp_path / "run")
    _assert_nothing_trained(tmp_path / "run")


def test_missing_text_column_names_the_available_ones(tiny_bert, small_data, tmp_path):
    with pytest.raises(DataError, match="available columns: text, label"):
        _quick(tiny_bert, small_data, tmp_path / "run", text_columns=["sentence"])
    _assert_nothing_trained(tmp_path / "run")


def test_empty_dataset(tiny_bert, tmp_path):
    empty = Dataset.from_dict({"text": [], "label": []})
    data = DatasetDict(train=empty, validation=make_dataset(8, 8)["validation"])
    with pytest.raises(DataError, match="empty"):
        _quick(tiny_bert, data, tmp_path / "run")
    _assert_nothing_trained(tmp_path / "run")


def test_batch_size_zero(tiny_bert, small_data, tmp_path):
    with pytest.raises(ConfigError, match="batch_size"):
        _quick(tiny_bert, small_data, tmp_path / "run", batch_size=0)
    with pytest.raises(ConfigError, match="batch_sise"):
        _quick(tiny_bert, small_data, tmp_path / "run", batch_sise=8)
    _assert_nothing_trained(tmp_path / "run")


def test_unwritable_output_dir(tiny_bert, small_data, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigError, match="output_dir"):
        _quick(tiny_bert, small_data, blocker / "run")


def test_unknown_model_offline(small_data, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match="no-such-org/no-such-model") as info:
        fit("no-such-org/no-such-model", small_data, output_dir=str(tmp_path / "run"), progress="none")
    assert "local folder" in info.value.fix
    _assert_nothing_trained(tmp_path / "run")


# -------------------------------------------------------------------- interrupts
def test_keyboard_interrupt_saves_and_rerun_finishes(tiny_bert, small_data, tmp_path, monkeypatch):
    class StopAtStep3:
        def __call__(self, event):
            if event["kind"] == "train" and event["step"] == 3:
                raise KeyboardInterrupt

        def close(self):
            pass

    monkeypatch.setattr(frontend, "make_view", lambda mode: StopAtStep3())
    out = tmp_path / "run"
    result = _quick(tiny_bert, small_data, out, progress="console", max_steps=8, save_every=100,
                    num_workers=2)
    assert result.status == "interrupted"
    assert multiprocessing.active_children() == []  # DataLoader workers are gone
    assert result.model_dir is None
    assert checkpoint.latest_checkpoint(out).name == "step-000003"
    assert _events(result, "end")[0]["status"] == "interrupted"

    monkeypatch.undo()
    resumed = _quick(tiny_bert, small_data, out, max_steps=8, save_every=100)
    assert resumed.status == "completed"
    assert [e["step"] for e in _events(resumed, "train")] == [4, 5, 6, 7, 8]
    assert (out / "model" / "config.json").is_file()


def test_sigterm_handler_is_restored(tiny_bert, small_data, tmp_path):
    import signal

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    _quick(tiny_bert, small_data, tmp_path / "run", max_steps=1)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


# ------------------------------------------------------------ resuming another run
def test_resume_refuses_the_checkpoints_of_another_run(tiny_bert, small_data, tmp_path):
    out = tmp_path / "run"
    _quick(tiny_bert, small_data, out, max_steps=2, save_every=2)
    other_data = make_dataset(96, 32, seed=11)  # same columns and labels, other rows
    with pytest.raises(CheckpointError, match="data_fingerprint") as info:
        _quick(tiny_bert, other_data, out, max_steps=4, save_every=2)
    assert "new output_dir" in info.value.fix and "resume=None" in info.value.fix
    with pytest.raises(CheckpointError, match=r"train.batch_size 8 in the checkpoint, 4 now"):
        _quick(tiny_bert, small_data, out, max_steps=4, batch_size=4)

    rows = [{"text": f"review {i}", "label": ["bad", "good", "fine"][i % 3]} for i in range(48)]
    three_labels = DatasetDict(train=Dataset.from_list(rows), validation=Dataset.from_list(rows[:12]))
    with pytest.raises(CheckpointError, match="labels") as info:  # not a 100-line state_dict traceback
        _quick(tiny_bert, three_labels, out, max_steps=4)
    assert "['negative', 'positive'] in the checkpoint" in str(info.value)
    resumed = _quick(tiny_bert, small_data, out, max_steps=4, save_every=2)  # the same run resumes
    assert resumed.status == "completed"
    assert [e["step"] for e in _events(resumed, "train")] == [3, 4]


# -------------------------------------------------------------------------- NaN
def test_nan_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(tiny_bert, small_data, tmp_path,
                                                                         monkeypatch):
    original = ClassificationTask.loss
    calls = {"n": 0}

    def loss_with_nan(self, model, batch):
        calls["n"] += model.training  # training steps only: the divergence guard's start is measured in eval mode
        loss = original(self, model, batch)
        return loss * float("nan") if calls["n"] == 5 else loss  # 5th micro-batch = step 5

    monkeypatch.setattr(ClassificationTask, "loss", loss_with_nan)
    out = tmp_path / "run"
    with pytest.raises(TrainingError, match="step 5") as info:
        _quick(tiny_bert, small_data, out, max_steps=8, save_every=2, log_every=4)
    assert info.value.step == 5
    assert "learning_rate" in info.value.fix
    good = checkpoint.latest_checkpoint(out)
    assert good.name == "step-000004"
    weights = _checkpoint_weights(good)
    assert all(torch.isfinite(t).all() for t in weights.values() if t.is_floating_point())
    ends = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert ends[-1]["kind"] == "end" and ends[-1]["status"] == "failed"


def test_nan_before_an_evaluation_is_caught_and_never_kept_as_best(trained_tiny_bert, small_data, tmp_path,
                                                                     monkeypatch):
    """With log_every=10 the NaN of step 3 used to reach the step-4 evaluation and be saved as best/."""
    original = ClassificationTask.loss
    calls = {"n": 0}

    def loss_with_nan(self, model, batch):
        calls["n"] += model.training  # training steps only: the divergence guard's start is measured in eval mode
        loss = original(self, model, batch)
        return loss * float("nan") if calls["n"] == 3 else loss

    monkeypatch.setattr(ClassificationTask, "loss", loss_with_nan)
    out = tmp_path / "run"
    with pytest.raises(TrainingError, match="step 3") as info:
        _quick(trained_tiny_bert, small_data, out, max_steps=8, eval_every=2, log_every=10, save_every=100)
    assert "No checkpoint was saved before it" in str(info.value)  # no false promise
    best = json.loads((out / "best" / "best.json").read_text())
    assert best["step"] == 2  # the evaluation at step 4 never ran on the ruined weights
    weights = _checkpoint_weights_of_model(out / "best")
    assert all(torch.isfinite(t).all() for t in weights.values() if t.is_floating_point())


def test_out_of_memory_in_evaluation_halves_the_eval_batch(tiny_bert, small_data, tmp_path, monkeypatch):
    # fp32: the metrics must not depend on the eval batch size; bf16 would round by batch shape
    plain = _quick(tiny_bert, small_data, tmp_path / "plain", max_steps=2, precision="fp32")
    original = ClassificationTask.eval_outputs

    def eval_outputs_or_oom(self, model, batch):
        if len(batch["labels"]) > 4:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated in evaluation)")
        return original(self, model, batch)

    monkeypatch.setattr(ClassificationTask, "eval_outputs", eval_outputs_or_oom)
    retried = _quick(tiny_bert, small_data, tmp_path / "oom", max_steps=2, precision="fp32")
    assert retried.status == "completed"
    warnings = [e["text"] for e in _events(retried, "message") if e["level"] == "warn"]
    assert any("eval batches of 8" in w for w in warnings) and any("eval batches of 4" in w for w in warnings)
    assert retried.metrics == pytest.approx(plain.metrics, abs=1e-6)


def test_huge_learning_rate_is_reported_not_silently_saved(tiny_bert, small_data, tmp_path):
    out = tmp_path / "run"
    try:
        result = _quick(tiny_bert, small_data, out, learning_rate=1e6, max_grad_norm=None, max_steps=12)
    except TrainingError as exc:
        assert "step" in str(exc) and exc.step is not None
        return
    # If the loss never became NaN/inf, the saved model must at least be finite.
    state = _checkpoint_weights(checkpoint.latest_checkpoint(out))
    assert all(torch.isfinite(t).all() for t in state.values() if t.is_floating_point()), result


# -------------------------------------------------------------------------- OOM
@pytest.fixture(scope="module")
def tiny_bert_without_dropout(tiny_bert, tmp_path_factory):
    """Dropout masks depend on the micro-batch shape; without dropout the curves must agree."""
    copy = tmp_path_factory.mktemp("models") / "no-dropout"
    shutil.copytree(tiny_bert, copy)
    config = json.loads((copy / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def test_oom_halves_the_micro_batch_and_keeps_the_loss_curve(tiny_bert_without_dropout, small_data, tmp_path,
                                                             monkeypatch):
    model = tiny_bert_without_dropout
    # fp32: "the same losses up to summation order" is an fp32 promise; under bf16 autocast (auto on
    # a CPU with AVX512-BF16) a smaller micro-batch rounds its activations differently (~1e-4).
    plain = _quick(model, small_data, tmp_path / "plain", precision="fp32")
    _simulate_oom(monkeypatch, lambda step, size: step == 3 and size > 2)
    retried = _quick(model, small_data, tmp_path / "oom", precision="fp32")
    assert retried.status == "completed"
    warnings = [e["text"] for e in _events(retried, "message") if "Out of GPU memory" in e["text"]]
    assert len(warnings) == 2 and "micro-batch 4 x 2" in warnings[0] and "micro-batch 2 x 4" in warnings[1]
    sizes = [e["micro_batch_size"] for e in _events(retried, "train")]
    assert sizes[:2] == [8, 8] and sizes[2:] == [2, 2, 2, 2]
    # Same effective batch: the same losses, up to float summation order.
    plain_losses = [e["loss"] for e in _events(plain, "train")]
    retried_losses = [e["loss"] for e in _events(retried, "train")]
    assert retried_losses == pytest.approx(plain_losses, abs=1e-5)


def test_oom_at_micro_batch_one_gives_up(tiny_bert, small_data, tmp_path, monkeypatch):
    _simulate_oom(monkeypatch, lambda step, size: step == 2)
    with pytest.raises(TrainingError, match="micro-batch of 1") as info:
        _quick(tiny_bert, small_data, tmp_path / "run")
    assert info.value.step == 2


def test_epoch_ends_keep_the_caches_and_the_run_frees_memory_once_at_its_end(tiny_bert, tmp_path, monkeypatch):
    # gc.collect over a loaded transformers heap costs ~0.2 s and empty_cache makes the next
    # epoch re-allocate what it frees: at every epoch end that was an epoch of a small dataset.
    calls = []
    monkeypatch.setattr(train, "free_memory", lambda: calls.append("free"))
    result = _quick(tiny_bert, make_dataset(24, 8, seed=5), tmp_path / "run", max_steps=9)  # 3 epochs of 3 steps
    epochs = [e["epoch"] for e in result.history if e["kind"] == "eval"]
    assert result.status == "completed" and epochs == [1.0, 2.0, 3.0]
    assert calls == ["free"]  # _close, once


def test_every_step_clips_the_gradients_of_every_parameter_of_the_prepared_model(tiny_bert, tmp_path, monkeypatch):
    # The loop lists the parameters once (walking the module tree each step costs ~5 ms on a
    # 30-layer LoRA model); the list must be the prepared model's, and clipping must still bite.
    from accelerate import Accelerator

    seen = []
    original = Accelerator.clip_grad_norm_

    def spy(self, parameters, max_norm, norm_type=2):
        total = original(self, parameters, max_norm, norm_type)
        grads = [p.grad for p in parameters if p.grad is not None]
        after = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        seen.append(({id(p) for p in parameters}, {id(p) for p in self._models[0].parameters()},
                     float(total), float(after)))
        return total

    monkeypatch.setattr(Accelerator, "clip_grad_norm_", spy)
    result = _quick(tiny_bert, make_dataset(24, 8, seed=5), tmp_path / "run", max_steps=3, max_grad_norm=1e-3)
    assert result.status == "completed" and len(seen) == 3
    for passed, model_params, before, after in seen:
        assert passed == model_params and len(passed) > 10
        assert before > 1e-3 and after == pytest.approx(1e-3, rel=1e-3)  # clipped to max_grad_norm


def test_sentence_pairs_int_labels_and_gradient_checkpointing(tiny_bert, tmp_path):
    rows = [{"a": "the film is great", "b": "the plot is dull", "label": i % 3} for i in range(48)]
    data = DatasetDict(train=Dataset.from_list(rows), validation=Dataset.from_list(rows[:12]))
    result = _quick(tiny_bert, data, tmp_path / "run", text_columns=["a", "b"], gradient_checkpointing=True,
                    max_steps=3)
    assert result.status == "completed"
    assert result.label_names == ["0", "1", "2"]
    config = json.loads((result.model_dir / "config.json").read_text())
    assert config["id2label"] == {"0": "0", "1": "1", "2": "2"}
