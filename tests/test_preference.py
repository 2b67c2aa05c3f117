"""Preference tuning (task="preference"): the losses, the pairs' checks, DPO runs with LoRA and in full.

The losses are checked against the papers' formulas written out here; the runs use the tiny Llama
(SmolLM2's tokenizer and chat template) after a short supervised fine-tuning, so that the pairs'
preference (the color from the notes over an evasive or wrong answer) is something it can learn.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from datasets import Dataset, DatasetDict

from workbench.engine import checkpoint
from workbench.engine.train import fit
from workbench.errors import ConfigError, DataError
from workbench.sources.synthetic_llm import make_preference_dataset, make_preference_rows
from workbench.tasks import preference_loss as losses

PAIRS = {"task": "preference", "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "batch_size": 8,
         "max_length": 160, "num_workers": 0, "log_every": 1, "precision": "fp32"}


def _events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


def _messages(out: Path) -> str:
    return " ".join(e.get("text", "") for e in _events(out) if e["kind"] == "message")


# ------------------------------------------------------------------------ the losses
def _logps(c, r, nc=None, nr=None):
    c, r = torch.tensor(c, dtype=torch.float64), torch.tensor(r, dtype=torch.float64)
    nc = torch.tensor(nc or [1.0] * len(c), dtype=torch.float64)
    nr = torch.tensor(nr or [1.0] * len(r), dtype=torch.float64)
    return losses.PairLogps(c, r, nc, nr)


def test_dpo_is_ln2_at_the_reference_and_follows_its_formula():
    policy = _logps([-10.0, -4.0], [-12.0, -3.0])
    assert losses.pair_losses("dpo", policy, policy, beta=0.1).tolist() == pytest.approx([math.log(2)] * 2)
    reference = _logps([-11.0, -5.0], [-11.0, -5.0])
    got = losses.pair_losses("dpo", policy, reference, beta=0.1)
    h = [(-10 + 11) - (-12 + 11), (-4 + 5) - (-3 + 5)]  # chosen log-ratio minus rejected log-ratio
    assert got.tolist() == pytest.approx([math.log1p(math.exp(-0.1 * x)) for x in h])
    chosen, rejected = losses.rewards("dpo", policy, reference, beta=0.1)
    assert chosen.tolist() == pytest.approx([0.1, 0.1]) and rejected.tolist() == pytest.approx([-0.1, 0.2])
    assert losses.reward_accuracy(chosen, rejected).tolist() == [1.0, 0.0]
    assert losses.reward_accuracy(torch.zeros(3), torch.zeros(3)).tolist() == [0.5] * 3  # a tie is a coin flip


def test_ipo_simpo_and_orpo_follow_their_formulas_on_per_token_means():
    policy = _logps([-6.0], [-12.0], nc=[3], nr=[4])  # means -2 and -3
    reference = _logps([-9.0], [-8.0], nc=[3], nr=[4])  # means -3 and -2
    h = (-2 + 3) - (-3 + 2)
    assert losses.pair_losses("ipo", policy, reference, beta=0.5).item() == pytest.approx((h - 1.0) ** 2)
    simpo = losses.pair_losses("simpo", policy, None, beta=2.0, gamma=0.5).item()
    assert simpo == pytest.approx(math.log1p(math.exp(-(2.0 * (-2 + 3) - 0.5))))

    def log_odds(m):
        return m - math.log(1 - math.exp(m))

    ratio = -math.log1p(math.exp(-(log_odds(-2) - log_odds(-3))))
    assert losses.pair_losses("orpo", policy, None, beta=0.1).item() == pytest.approx(2 - 0.1 * ratio)
    # log(1 - e^m) at an answer the model is certain of (m -> 0): finite, not -inf or nan
    sure = _logps([0.0], [-1e-9])
    assert math.isfinite(losses.pair_losses("orpo", sure, None, beta=0.1).item())


# ------------------------------------------------------------------- the pairs' checks
def _splits(train: list[dict], validation: list[dict] | None = None) -> DatasetDict:
    return DatasetDict({"train": Dataset.from_list(train),
                        "validation": Dataset.from_list(validation or make_preference_rows(4, 9))})


def _refused(model, data, tmp_path, **settings) -> str:
    out = tmp_path / "run"
    with pytest.raises((DataError, ConfigError)) as caught:
        fit(str(model), data, output_dir=str(out), max_steps=1, **{**PAIRS, **settings})
    assert not (out / "model").exists()
    return str(caught.value)


def test_preference_columns_pick_the_task_and_every_trl_format_trains(tiny_llama_dir, tmp_path):
    from workbench.sources.data_checks import detect_task

    for fmt in ("conversational", "standard", "implicit"):
        data = make_preference_dataset(8, 4, fmt=fmt)
        assert detect_task(data["train"]) == "preference"
        settings = {k: v for k, v in PAIRS.items() if k != "task"}  # task="auto" finds it
        result = fit(str(tiny_llama_dir), data, output_dir=str(tmp_path / fmt), max_steps=1, **settings)
        start = next(e for e in _events(tmp_path / fmt) if e["kind"] == "start")
        assert start["config"]["task"] == "preference"
        assert math.isfinite(result.metrics["eval_loss"]) and "eval_reward_accuracy" in result.metrics


def test_raw_text_pairs_share_their_prompt_up_to_a_word(tiny_llama_dir, tmp_path):
    rows = [{"chosen": f"Q: What color is the sky? A: blue number {i}", "rejected": f"Q: What color is the sky? "
             f"A: bluish green {i}"} for i in range(8)]
    from workbench.config import TrainConfig
    from workbench.tasks.preference_data import split_pair

    prompt, chosen, rejected, problem = split_pair(rows[0], "implicit_text", TrainConfig(task="preference"))
    assert (prompt, chosen, rejected, problem) == ("Q: What color is the sky? A:", " blue number 0", " bluish green 0",
                                                   None)
    result = fit(str(tiny_llama_dir), _splits(rows, rows[:4]), output_dir=str(tmp_path / "run"), max_steps=1, **PAIRS)
    assert math.isfinite(result.metrics["eval_loss"])


def test_bad_pairs_are_refused_with_the_row_named(tiny_llama_dir, tmp_path):
    good = make_preference_rows(6, 0, "standard")
    no_rejected = [{k: v for k, v in r.items() if k != "rejected"} for r in good]
    message = _refused(tiny_llama_dir, _splits(no_rejected), tmp_path / "a")
    assert "'rejected'" in message and "rejected_column" in message

    same = [dict(r) for r in good]
    same[3]["rejected"] = same[3]["chosen"]
    message = _refused(tiny_llama_dir, _splits(same, make_preference_rows(4, 9, "standard")), tmp_path / "b")
    assert "train split row 3" in message and "equals the rejected" in message

    empty = [dict(r) for r in good]
    empty[1]["chosen"] = "   "
    message = _refused(tiny_llama_dir, _splits(empty, make_preference_rows(4, 9, "standard")), tmp_path / "c")
    assert "train split row 1" in message and "empty" in message

    # A template that trims each message: " Blue." and "Blue." render, and tokenize, the same.
    trimmed = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n"
               "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    alike = [dict(r) for r in good]
    alike[5]["chosen"], alike[5]["rejected"] = "Blue.", " Blue."
    message = _refused(tiny_llama_dir, _splits(alike, make_preference_rows(4, 9, "standard")), tmp_path / "d",
                       chat_template=trimmed)
    assert "train split row 5" in message and "tokenize identically" in message

    conversation_as_answer = make_preference_rows(6, 0)
    conversation_as_answer[0]["chosen"] = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]
    message = _refused(tiny_llama_dir, _splits(conversation_as_answer), tmp_path / "e")
    assert "train split row 0" in message and "'user' message in the answer" in message

    message = _refused(tiny_llama_dir, make_preference_dataset(8, 4), tmp_path / "f", eval_generate=2)
    assert "eval_generate" in message


def test_pairs_longer_than_max_length_are_counted_and_those_cut_away_left_out(tiny_llama_dir, tmp_path):
    data = make_preference_dataset(16, 4)
    long_prompt = [{"role": "user", "content": "Read this. " * 80 + "What color?"}]
    train = data["train"].to_list()
    train[2]["prompt"] = long_prompt  # the prompt alone fills max_length: nothing of the answers is left
    out = tmp_path / "run"
    fit(str(tiny_llama_dir), _splits(train, data["validation"].to_list()), output_dir=str(out), max_steps=1,
        **{**PAIRS, "max_length": 120})
    said = _messages(out)
    assert "pairs are longer than max_length=120" in said and "left out" in said and "train split row 2" in said
    record = json.loads((out / "run.json").read_text())
    assert record["dropped_rows"]["train"] == 1 and record["preference"]["cut_rows"]["train"] >= 1


# ------------------------------------------------------------------------------ runs
@pytest.fixture(scope="module")
def dpo_run(trained_tiny_llama, tmp_path_factory):
    """A DPO run with LoRA on generated pairs, evaluated before training and every 8 steps."""
    out = tmp_path_factory.mktemp("dpo") / "run"
    result = fit(str(trained_tiny_llama), make_preference_dataset(96, 32), output_dir=str(out), max_steps=24,
                 eval_every=8, eval_before_training=True, learning_rate=3e-3, warmup_ratio=0.1, **PAIRS)
    return result, out


def test_dpo_with_lora_starts_at_the_reference_and_learns_the_preference(dpo_run):
    result, out = dpo_run
    evals = [e for e in _events(out) if e["kind"] == "eval"]
    first = evals[0]
    assert first["step"] == 0
    # The reference is the model with its adapter off: at step 0 the policy equals it exactly.
    assert first["eval_loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert first["eval_reward_accuracy"] == pytest.approx(0.5) and first["eval_reward_margin"] == pytest.approx(0)
    last = evals[-1]
    # Half the rejected answers evade (learned at once), half name a wrong color (learned only by
    # reading the notes): ~0.81-0.84 over seeds on 32 pairs, where chance passes 0.68 one time in 50.
    assert last["eval_reward_accuracy"] >= 0.7, evals
    assert last["eval_reward_margin"] > 0 and last["eval_loss"] < math.log(2)
    assert last["eval_logps_rejected"] < first["eval_logps_rejected"]  # the rejected answers became less likely
    assert result.verdict["outcome"] == "better" and result.verdict["metric"] == "eval_reward_accuracy"
    assert result.verdict["baseline"] == "chance"
    assert (out / "best" / "adapter_model.safetensors").is_file()
    record = json.loads((out / "run.json").read_text())
    assert record["preference"]["loss"] == "dpo" and record["preference"]["beta"] == 0.1
    assert "adapter off" in record["preference"]["reference"]


def test_train_events_carry_the_reward_metrics_and_the_chart_draws_them(dpo_run):
    """Each train line has the train pairs' reward accuracy, rewards, margin and log-probabilities:
    step 1's forward is at the reference (all rewards 0, a tie: 0.5), later ones learned."""
    from workbench.engine.progress import RunHistory, format_train_line, plot_history

    _, out = dpo_run
    events = _events(out)
    trains = [e for e in events if e["kind"] == "train"]
    first, late = trains[0], trains[-4:]
    assert first["step"] == 1
    assert first["reward_accuracy"] == pytest.approx(0.5) and first["reward_margin"] == pytest.approx(0, abs=1e-6)
    assert first["rewards_chosen"] == pytest.approx(0, abs=1e-6)
    assert sum(e["reward_accuracy"] for e in late) / len(late) > 0.6, late
    assert all(e["reward_margin"] > 0 for e in late)
    assert all(e["logps_chosen"] > e["logps_rejected"] - 50 for e in trains)  # mean log-probs, not sums or junk
    assert "reward acc" in format_train_line(trains[-1]) and "margin" in format_train_line(trains[-1])

    history = RunHistory()
    for event in events:
        history.add(event)
    fig = plot_history(history)
    metric_ax, rewards_ax = fig.axes[1], fig.axes[2]
    assert len(fig.axes) == 3
    labels = {line.get_label() for line in metric_ax.lines}
    assert {"reward_accuracy", "train reward_accuracy"} <= labels
    reward_labels = {line.get_label() for line in rewards_ax.lines}
    assert {"rewards chosen", "rewards rejected", "reward margin"} <= reward_labels
    train_margin = next(line for line in rewards_ax.lines if line.get_label() == "reward margin")
    assert list(train_margin.get_ydata()) == pytest.approx([e["reward_margin"] for e in trains])


def test_the_tuned_adapter_prefers_the_chosen_answers_outside_the_engine(dpo_run, trained_tiny_llama):
    """Loaded with peft as a user would: the chosen answers' log-probability gain over the base
    model beats the rejected answers' on held-out pairs it never saw."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, out = dpo_run
    tokenizer = AutoTokenizer.from_pretrained(out / "model")
    base = AutoModelForCausalLM.from_pretrained(trained_tiny_llama, dtype=torch.float32)
    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(trained_tiny_llama, dtype=torch.float32),
                                      out / "model").eval()

    def answer_logp(model, prompt, answer):
        context = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(context, add_special_tokens=False)["input_ids"]
        full = ids + tokenizer(answer, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([full])).logits[0, :-1].log_softmax(-1)
        return sum(logits[i - 1, full[i]].item() for i in range(len(ids), len(full)))

    wins = 0
    rows = make_preference_rows(24, 77)
    for row in rows:
        gain = {side: answer_logp(tuned, row["prompt"], row[side][0]["content"])
                - answer_logp(base, row["prompt"], row[side][0]["content"]) for side in ("chosen", "rejected")}
        wins += gain["chosen"] > gain["rejected"]
    print("held-out pairs preferred:", wins, "of", len(rows))
    assert wins / len(rows) >= 0.7, wins


@pytest.mark.parametrize("loss", ["ipo", "simpo", "orpo"])
def test_the_other_losses_train_and_the_reference_free_ones_never_turn_the_adapter_off(
        trained_tiny_llama, tmp_path, loss, monkeypatch):
    from workbench.tasks import preference

    turned_off = []
    original = preference._adapter_off

    def spy(model):
        turned_off.append(True)
        return original(model)

    monkeypatch.setattr(preference, "_adapter_off", spy)
    result = fit(str(trained_tiny_llama), make_preference_dataset(16, 8), output_dir=str(tmp_path / "run"),
                 max_steps=2, preference_loss=loss, **PAIRS)
    assert math.isfinite(result.metrics["eval_loss"])
    assert bool(turned_off) == (loss == "ipo")


def test_full_fine_tuning_keeps_a_frozen_reference_copy_and_says_what_it_costs(trained_tiny_llama, tmp_path):
    out = tmp_path / "run"
    result = fit(str(trained_tiny_llama), make_preference_dataset(16, 8), output_dir=str(out), max_steps=3,
                 eval_before_training=True, finetune="full", learning_rate=1e-3, **PAIRS)
    evals = [e for e in _events(out) if e["kind"] == "eval"]
    assert evals[0]["eval_loss"] == pytest.approx(math.log(2), abs=1e-6)  # the copy is the starting model
    assert evals[-1]["eval_loss"] != pytest.approx(math.log(2), abs=1e-4)  # ... and stays it: the policy moved
    assert "frozen copy of the starting model" in _messages(out) and "MiB more memory" in _messages(out)
    # Every pair's reference precomputed (3 steps x 8 pairs see the 16): the copy is let go.
    assert "reference copy was released" in _messages(out)
    assert (result.model_dir / "model.safetensors").is_file()


def test_a_preference_run_has_its_card_is_scored_on_its_pairs_and_exports(dpo_run, trained_tiny_llama, tmp_path):
    """What follows training: the model card names the loss, beta and reference; ``workbench.evaluate``
    scores the held-out pairs as chosen-against-rejected; the adapter merges and exports to GGUF."""
    import shutil

    import workbench

    _, out = dpo_run
    run = Path(shutil.copytree(out, tmp_path / "run", ignore=shutil.ignore_patterns("checkpoints", "tensorboard")))
    card = (run / "model" / "README.md").read_text()
    assert "| preference loss | dpo, beta 0.1; reference: the base model (the same weights with the adapter off) |" \
        in card and "| batch | 8 pairs x" in card
    data = make_preference_dataset(96, 32)
    result = workbench.evaluate({"base": str(trained_tiny_llama), "tuned": str(run)}, "heldout", data=data,
                                progress="none")
    rows = [json.loads(line) for line in (run / "evaluation" / "tasks" / "heldout" / "heldout.jsonl")
            .read_text().splitlines()]
    assert len(rows) == 32 and all(r["label"] == 0 and len(r["choices"]) == 2 for r in rows)
    assert rows[0]["prompt"].endswith("<|im_start|>assistant\n") and rows[0]["choices"][0] in \
        data["validation"][0]["chosen"][-1]["content"]
    base, tuned = result["base"].score("heldout/acc"), result["tuned"].score("heldout/acc")
    # Likelihood alone (no reference): the SFT model already finds most evasive answers unlikely
    # (~0.81 here); DPO moves the answers apart from the reference, and never makes this worse.
    assert 0.5 < base <= tuned, (base, tuned)
    assert json.loads(result["tuned"].saved.read_text())["n-samples"]["heldout"]["effective"] == 32
    exported = workbench.export(run, "f16", log=lambda *a, **k: None)
    assert exported.gguf.is_file() and (run / "model_merged" / "model.safetensors").is_file()
    assert json.loads((exported.folder / "export.json").read_text())["verification"]["passed"]


# ------------------------------------------------------------- the precomputed reference
def test_the_reference_is_computed_once_before_training_and_trains_as_the_per_step_one(
        trained_tiny_llama, tmp_path, monkeypatch):
    """precompute_reference: one pass with the adapter off before the first step, none in the
    steps or evaluations; the same losses as computing the reference in every step."""
    from workbench.tasks import preference

    turned_off = []
    original = preference._adapter_off

    def spy(model):
        turned_off.append(model.training)
        return original(model)

    monkeypatch.setattr(preference, "_adapter_off", spy)
    data = make_preference_dataset(24, 8)
    common = dict(max_steps=4, eval_every=2, learning_rate=3e-3, **PAIRS)  # 4 x 8 pairs: the 24 train pairs seen
    cached = fit(str(trained_tiny_llama), data, output_dir=str(tmp_path / "cached"), precompute_reference=True,
                 **common)
    passes = len(turned_off)
    # The train pairs in batches of 16 (evaluation's), then the held-out ones: 2 + 1 batches, in eval mode.
    assert passes == 3 and not any(turned_off)
    assert "Reference log-probabilities of 24 train and 8 held-out pairs computed" in _messages(tmp_path / "cached")
    saved = torch.load(tmp_path / "cached" / "reference_logps.pt", weights_only=True)
    assert saved["values"].shape == (32, 4) and saved["cached"] == {"train": True, "validation": True}
    assert bool((saved["values"][:, :2] < 0).all())  # every pair's summed log-probabilities, none left at 0

    turned_off.clear()
    per_step = fit(str(trained_tiny_llama), data, output_dir=str(tmp_path / "per_step"),
                   precompute_reference=False, **common)
    # Each step in train mode; each evaluation (one batch) and the start loss's batches in eval mode.
    assert turned_off.count(True) == 4 and turned_off.count(False) >= 2 + 1
    assert not (tmp_path / "per_step" / "reference_logps.pt").exists()
    got, want = _losses(tmp_path / "cached"), _losses(tmp_path / "per_step")
    assert got.keys() == want.keys()
    # fp32: the reference of a pair in another batch differs in its last bits only.
    assert all(got[k] == pytest.approx(want[k], abs=1e-4) for k in want)
    assert cached.metrics["eval_loss"] == pytest.approx(per_step.metrics["eval_loss"], abs=1e-4)


def test_auto_caches_only_the_held_out_pairs_when_the_run_sees_part_of_the_train_ones():
    from workbench.tasks import preference_reference as reference

    assert reference.wanted("auto", train_pairs=1000, rows_trained=64) == {"train": False, "validation": True}
    # One epoch: the pass costs what it saves (benchmarks/preference_vs_trl.py); two: it pays.
    assert reference.wanted("auto", train_pairs=1000, rows_trained=1000) == {"train": False, "validation": True}
    assert reference.wanted("auto", train_pairs=1000, rows_trained=2000) == {"train": True, "validation": True}
    # Full fine-tuning: once is enough, the frozen copy is released.
    assert reference.wanted("auto", 1000, 1000, full_copy=True) == {"train": True, "validation": True}
    assert reference.wanted(True, 1000, 64) == {"train": True, "validation": True}
    assert reference.wanted(False, 10, 64) == {"train": False, "validation": False}
    with pytest.raises(ConfigError, match="precompute_reference"):
        from workbench.config import TrainConfig

        TrainConfig(task="preference", precompute_reference="yes")


def test_a_reference_file_of_other_settings_or_torn_is_not_read(tmp_path):
    from workbench.tasks import preference_reference as reference

    table = reference.ReferenceTable(torch.randn(6, 4), {"train": True, "validation": True})
    reference.save(tmp_path, "key-a", table)
    assert torch.equal(reference.load(tmp_path, "key-a", "cpu").values, table.values)
    assert reference.load(tmp_path, "key-b", "cpu") is None  # another model, precision or data
    (tmp_path / reference.FILE).write_bytes(b"half a file")
    assert reference.load(tmp_path, "key-a", "cpu") is None
    assert not list(tmp_path.glob(".*.tmp"))


# ------------------------------------------------------------------------------ kill -9
WORKER = r'''
import os, sys, time
import torch
torch.set_num_threads(1)
import workbench.engine.events as events
from workbench.sources.synthetic_llm import make_preference_dataset
from workbench.engine.train import fit

if os.environ.get("SLOW_STEP_S"):
    original = events.EventLog.write
    def write(self, kind, **fields):
        if kind == "train":
            time.sleep(float(os.environ["SLOW_STEP_S"]))
        return original(self, kind, **fields)
    events.EventLog.write = write

result = fit(sys.argv[1], make_preference_dataset(40, 8, seed=3), output_dir=sys.argv[2], task="preference",
             lora_r=4, lora_alpha=8, lora_dropout=0.1, learning_rate=3e-3, batch_size=4, max_length=160,
             max_steps=10, save_every=3, log_every=1, keep_checkpoints=2, num_workers=0, precision="bf16",
             precompute_reference=True)
print("STATUS", result.status)
'''


def _start(script, model, out, env=None):
    return subprocess.Popen([sys.executable, str(script), str(model), str(out)],
                            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc):
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "STATUS completed" in output, output[-3000:]


def _losses(out: Path) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in _events(out) if e["kind"] == "train"}


@pytest.mark.slow
def test_a_dpo_run_killed_mid_run_resumes_exactly(tiny_llama_dir, tmp_path):
    """The adapter, its AdamW state, the schedule and the dropout RNG come back, and the reference
    (the adapter switched off) is the same model after the resume: losses and adapter bit-exact."""
    from safetensors.torch import load_file

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    reference = tmp_path / "uninterrupted"
    _finish(_start(script, tiny_llama_dir, reference))
    out = tmp_path / "killed"
    proc = _start(script, tiny_llama_dir, out, env={"SLOW_STEP_S": "0.3"})
    deadline = time.time() + 240
    while not ((out / "events.jsonl").exists() and len(_losses(out)) >= 7):
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.time() < deadline, "the worker did not reach step 7"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    resumed_after = checkpoint.step_of(checkpoint.latest_checkpoint(out))
    assert 3 <= resumed_after < 10
    _finish(_start(script, tiny_llama_dir, out))
    ref, got = _losses(reference), _losses(out)
    for step in range(resumed_after + 1, 11):
        assert got[step] == pytest.approx(ref[step], abs=1e-6), step
    # The resumed run read the reference the first one computed, rather than computing it again.
    assert "pairs read from reference_logps.pt" in _messages(out)
    ref_w = load_file(reference / "model" / "adapter_model.safetensors")
    got_w = load_file(out / "model" / "adapter_model.safetensors")
    assert ref_w.keys() == got_w.keys() and ref_w
    assert all(torch.equal(got_w[k], ref_w[k]) for k in ref_w)
