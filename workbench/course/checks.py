"""Check cells for the BERT course notebook (notebooks/02_bert_course.ipynb).

Each check runs a student's answer on fixed inputs and says *which* mistake it
found, in words a student who knows Python but not transformers can act on:
"gradients are None: did you call loss.backward()?" rather than "assert failed".
Checks judge behaviour (do gradients reach the weights? do the weights move?
do gradients pile up from one call to the next?), so any correct way of writing
the answer passes (``model.zero_grad()`` as well as ``optimizer.zero_grad()``).

A check prints its verdict and returns a ``CheckResult``; it never raises, so a
student can read the hint, fix the cell and run the check again.

Every verdict is also recorded (``workbench.classroom.client``): which exercise, passed or
not, when; never the student's code, data or the hint. In a class on JupyterHub it reaches
the teacher's page, and the student sees one more line, "recorded for your teacher";
anywhere else it stays in a local file and nothing is sent. A teacher's own check cells
get the same with :func:`verdict`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workbench.classroom import client as classroom
from workbench.classroom.record import clean_name

PASS_MARK = "✅"
FAIL_MARK = "❌"
# What the teacher's page groups the course's results under.
COURSE = "bert-course"
NOTEBOOK = "02_bert_course"
EXERCISE_1 = "1. tokenized batch"
EXERCISE_2 = "2. logits -> probabilities"
EXERCISE_3 = "3. train_step"


@dataclass
class CheckResult:
    """The verdict of one check: ``passed`` and a message that says what to do next."""

    name: str
    passed: bool
    message: str

    def __str__(self) -> str:
        return f"{PASS_MARK if self.passed else FAIL_MARK} {self.name}: {self.message}"

    def __bool__(self) -> bool:
        return self.passed


def verdict(name: str, passed: bool, message: str, *, exercise: str | None = None,
            notebook: str | None = None, course: str = "workbench", quiet: bool = False) -> CheckResult:
    """Print a check's verdict and record it: the helper for a teacher's own check cells.

    ``exercise`` (default ``name``) and ``notebook`` (default: the notebook this kernel runs,
    from ``JPY_SESSION_NAME``) are the teacher's column; pick names that stay the same from
    one class to the next. Example::

        verdict("my exercise", answer == 42, "the answer is 42, try again",
                notebook="week1", course="intro")
    """
    result = CheckResult(name, passed, message)
    if not quiet:
        print(result)
    line = classroom.report(clean_name(course), clean_name(notebook or _this_notebook()),
                            clean_name(exercise or name), passed)
    if line and not quiet:
        print(line)
    return result


def _this_notebook() -> str:
    import os

    session = os.environ.get("JPY_SESSION_NAME", "")  # the notebook's path, set by jupyter_server
    return clean_name(os.path.splitext(os.path.basename(session))[0]) if session else "unnamed"


def _verdict(exercise: str, name: str, passed: bool, message: str, quiet: bool) -> CheckResult:
    return verdict(name, passed, message, exercise=exercise, notebook=NOTEBOOK, course=COURSE,
                   quiet=quiet)


# --- exercise 1: tokenization -------------------------------------------------


def check_tokenized_batch(encoded: Any, texts: list[str], tokenizer, max_length: int,
                          *, quiet: bool = False) -> CheckResult:
    """Exercise 1: ``encoded`` should be ``tokenizer(texts, padding=True, truncation=True,
    max_length=max_length, return_tensors="pt")``: a padded batch of PyTorch tensors."""
    import torch

    name = "tokenized batch"
    if encoded is None:
        return _verdict(EXERCISE_1, name, False, "`encoded` is still None: call the tokenizer on `texts`.", quiet)
    try:
        input_ids = encoded["input_ids"]
        attention_mask = encoded["attention_mask"]
    except (KeyError, TypeError):
        return _verdict(EXERCISE_1, name, False, "`encoded` has no 'input_ids' and 'attention_mask': it should "
                        "be what `tokenizer(texts, ...)` returns.", quiet)
    if not isinstance(input_ids, torch.Tensor):
        if isinstance(input_ids, list) and input_ids and isinstance(input_ids[0], list):
            lengths = {len(row) for row in input_ids}
            if len(lengths) > 1:
                return _verdict(EXERCISE_1, name, False, "the rows have different lengths, so they cannot be "
                                "stacked into one tensor: pass `padding=True`.", quiet)
        return _verdict(EXERCISE_1, name, False, "input_ids is a Python list, not a tensor: pass "
                        "`return_tensors=\"pt\"` so the model can take it.", quiet)
    if input_ids.dim() != 2 or input_ids.shape[0] != len(texts):
        return _verdict(EXERCISE_1, name, False, f"input_ids has shape {tuple(input_ids.shape)}; expected "
                        f"({len(texts)}, sequence length): tokenize the whole list `texts` at once.",
                        quiet)
    if input_ids.shape[1] > max_length:
        return _verdict(EXERCISE_1, name, False, f"sequences are {input_ids.shape[1]} tokens long, more than "
                        f"max_length={max_length}: pass `truncation=True, max_length=max_length`.",
                        quiet)
    longest = max(len(tokenizer(t, truncation=True, max_length=max_length)["input_ids"])
                  for t in texts)
    if input_ids.shape[1] > longest:
        return _verdict(EXERCISE_1, name, False, f"every row is padded to {input_ids.shape[1]} tokens but the "
                        f"longest sentence needs only {longest}: use `padding=True` (pad to the "
                        "longest in the batch), not padding='max_length'. It is correct, just "
                        "slower.", quiet)
    pad_positions = input_ids == tokenizer.pad_token_id
    if bool((attention_mask[pad_positions] != 0).any()):
        return _verdict(EXERCISE_1, name, False, "the attention mask is 1 on padding tokens: keep the mask "
                        "the tokenizer returns so the model ignores [PAD].", quiet)
    return _verdict(EXERCISE_1, name, True, f"{len(texts)} sentences -> a tensor of shape "
                    f"{tuple(input_ids.shape)}, padding masked out. Well done!", quiet)


# --- exercise 2: logits -> probabilities --------------------------------------


def check_probabilities(to_probs: Callable | None, *, quiet: bool = False) -> CheckResult:
    """Exercise 2: ``to_probs(logits)`` should turn a (batch, classes) tensor of logits into
    probabilities with a softmax over the class dimension."""
    import torch

    name = "logits -> probabilities"
    if to_probs is None:
        return _verdict(EXERCISE_2, name, False, "`logits_to_probs` is still None: define it as a function "
                        "of `logits`.", quiet)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 3, generator=generator) * 3
    expected = torch.softmax(logits, dim=-1)
    try:
        probs = to_probs(logits.clone())
    except Exception as error:  # a student's bug: report it, do not crash the check
        return _verdict(EXERCISE_2, name, False, f"your function raised {type(error).__name__}: {error}",
                        quiet)
    if not isinstance(probs, torch.Tensor) or probs.shape != logits.shape:
        shape = tuple(probs.shape) if isinstance(probs, torch.Tensor) else type(probs).__name__
        return _verdict(EXERCISE_2, name, False, f"expected a tensor of shape {tuple(logits.shape)} (one "
                        f"probability per class), got {shape}.", quiet)
    probs = probs.detach().float()
    if torch.allclose(probs, expected, atol=1e-4):
        return _verdict(EXERCISE_2, name, True, "each row now sums to 1 and keeps the order of the logits.",
                        quiet)
    if torch.allclose(probs, torch.softmax(logits, dim=0), atol=1e-4):
        return _verdict(EXERCISE_2, name, False, "your softmax runs over the batch (dim=0): use dim=-1, so each "
                        "example's class probabilities sum to 1.", quiet)
    if torch.allclose(probs, torch.sigmoid(logits), atol=1e-4):
        return _verdict(EXERCISE_2, name, False, "that is a sigmoid: it treats each class on its own. The "
                        "classes exclude each other, so use torch.softmax(logits, dim=-1).", quiet)
    if not torch.allclose(probs.sum(dim=-1), torch.ones(len(logits)), atol=1e-3):
        return _verdict(EXERCISE_2, name, False, "the probabilities of an example do not sum to 1: apply a "
                        "softmax over the last dimension.", quiet)
    return _verdict(EXERCISE_2, name, False, "the values sum to 1 but differ from a softmax of the logits: "
                    "use torch.softmax(logits, dim=-1).", quiet)


# --- exercise 3: the training step ---------------------------------------------


def _check_model(device):
    """A small BERT classifier and a fixed batch: the same on every run of the check."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=2,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForSequenceClassification(config).to(device).train()
    generator = torch.Generator().manual_seed(0)
    batch = {
        "input_ids": torch.randint(5, 64, (8, 12), generator=generator),
        "attention_mask": torch.ones(8, 12, dtype=torch.long),
        "labels": torch.tensor([0, 1] * 4),
    }
    return model, {key: value.to(device) for key, value in batch.items()}


def _spy_optimizer(model, batch, lr: float, spying: dict):
    """SGD that records, at each step(), the gradient it is about to apply and how far that
    gradient is from a fresh one computed at the same weights (large: old gradients piled up)."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]

    class SpyOptimizer(torch.optim.SGD):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.step_grad_norms: list[float] = []
            self.stale_ratios: list[float] = []  # |grad - fresh| / |fresh| at each step

        def step(self, closure=None):
            grads = [p.grad for p in params]
            if any(g is not None for g in grads):
                spying["on"] = False  # the reference pass is ours: the hooks must not count it
                device_type = batch["input_ids"].device.type
                try:  # fp32, no autocast: the reference gradient at the weights step() updates
                    with torch.enable_grad(), torch.autocast(device_type, enabled=False):
                        fresh = torch.autograd.grad(model(**batch).loss, params,
                                                    allow_unused=True)
                finally:
                    spying["on"] = True
                diff = total = norm = 0.0
                for grad, ref in zip(grads, fresh, strict=True):
                    grad = torch.zeros_like(ref) if grad is None else grad.detach().float()
                    ref = torch.zeros_like(grad) if ref is None else ref.float()
                    diff += float(((grad - ref) ** 2).sum())
                    total += float((ref ** 2).sum())
                    norm += float((grad ** 2).sum())
                self.stale_ratios.append(math.sqrt(diff / total) if total > 0 else 0.0)
                self.step_grad_norms.append(math.sqrt(norm))
            else:
                self.step_grad_norms.append(0.0)
            return super().step(closure)

    return SpyOptimizer(params, lr=lr)


def _spy_scaler(device_type: str, enabled: bool):
    """A GradScaler that counts its calls, to check they come in the right places."""
    import torch

    class SpyScaler(torch.amp.GradScaler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.calls = {"scale": 0, "step": 0, "update": 0}

        def scale(self, outputs):
            self.calls["scale"] += 1
            return super().scale(outputs)

        def step(self, optimizer, *args, **kwargs):
            self.calls["step"] += 1
            return super().step(optimizer, *args, **kwargs)

        def update(self, new_scale=None):
            self.calls["update"] += 1
            return super().update(new_scale)

    # A modest initial scale: with the default 2**16 the first fp16 steps of a fresh model may
    # overflow and be skipped, and a skipped step would read as "the loss did not decrease".
    return SpyScaler(device_type, init_scale=2.0**8, enabled=enabled)


def check_train_step(train_step: Callable | None, *, device="cpu", amp_dtype=None,
                     use_scaler: bool = False, steps: int = 5, lr: float = 0.2,
                     quiet: bool = False) -> CheckResult:
    """Exercise 3: run ``train_step(model, batch, optimizer, scaler) -> float`` ``steps`` times
    on one fixed batch and diagnose the classic mistakes of the four-step loop.

    ``amp_dtype``: the autocast dtype the notebook chose (None = full precision);
    ``use_scaler``: whether the notebook's GradScaler is enabled (fp16 on CUDA).
    """
    import torch

    name = "train_step"
    if train_step is None:
        return _verdict(EXERCISE_3, name, False, "`train_step` is still None: define the function in the "
                        "exercise cell.", quiet)
    device = torch.device(device)
    model, batch = _check_model(device)
    params = [p for p in model.parameters() if p.requires_grad]
    spying = {"on": True}
    optimizer = _spy_optimizer(model, batch, lr, spying)
    scaler = _spy_scaler(device.type, enabled=use_scaler)
    before = [p.detach().clone() for p in params]

    backward_calls = [0]
    # Fires once per backward pass that reaches the classifier, whatever API called it.
    model.classifier.weight.register_hook(lambda grad: backward_calls.__setitem__(
        0, backward_calls[0] + spying["on"]))
    autocast_seen: list[bool] = []

    def note_autocast(module, args) -> None:  # a pre-hook must return None: args stay as given
        if spying["on"]:
            autocast_seen.append(torch.is_autocast_enabled(device.type))

    model.register_forward_pre_hook(note_autocast)

    losses: list[float] = []
    backward_per_call: list[int] = []
    for call in range(steps):
        calls_before = backward_calls[0]
        try:
            returned = train_step(model, batch, optimizer, scaler)
        except Exception as error:  # a student's bug: explain it instead of crashing
            return _verdict(EXERCISE_3, name, False, _explain_exception(error, call), quiet)
        backward_per_call.append(backward_calls[0] - calls_before)
        if isinstance(returned, torch.Tensor):
            if returned.numel() != 1:
                return _verdict(EXERCISE_3, name, False, "train_step returned a tensor with "
                                f"{returned.numel()} values: return the loss, `loss.item()`.",
                                quiet)
            returned = returned.item()
        if not isinstance(returned, (int, float)) or isinstance(returned, bool):
            return _verdict(EXERCISE_3, name, False, f"train_step returned {returned!r}: end it with "
                            "`return loss.item()` so the loop can log the loss.", quiet)
        if not math.isfinite(returned):
            return _verdict(EXERCISE_3, name, False, f"the loss became {returned}: check the learning rate "
                            "and that labels are in the batch.", quiet)
        losses.append(float(returned))

    moved = any(not torch.equal(p.detach(), b) for p, b in zip(params, before, strict=True))
    if not autocast_seen:
        return _verdict(EXERCISE_3, name, False, "the model was never called: compute "
                        "`outputs = model(**batch)` and take `outputs.loss`.", quiet)
    if sum(backward_per_call) == 0:
        return _verdict(EXERCISE_3, name, False, "gradients are None: did you call loss.backward() (with a "
                        "scaler: scaler.scale(loss).backward())? No gradient reached the model.",
                        quiet)
    if max(backward_per_call) > 1:
        return _verdict(EXERCISE_3, name, False, f"one call ran backward {max(backward_per_call)} times: call "
                        "loss.backward() exactly once per step.", quiet)
    if not optimizer.step_grad_norms and not moved:
        return _verdict(EXERCISE_3, name, False, "your loss did not decrease and the weights never changed: "
                        "did you call optimizer.step() (with a scaler: scaler.step(optimizer))?",
                        quiet)
    norms = optimizer.step_grad_norms
    if norms and max(norms) == 0.0:
        return _verdict(EXERCISE_3, name, False, "the gradients were all zero when optimizer.step() ran: call "
                        "optimizer.zero_grad() at the START of the step, before loss.backward(), "
                        "not between backward() and step().", quiet)
    if use_scaler:
        missing = [call for call, count in scaler.calls.items() if count < steps]
        if missing:
            return _verdict(EXERCISE_3, name, False, "with fp16 the GradScaler must take part in every step: "
                            f"scaler.{missing[0]}(...) was not called each time. Use "
                            "scaler.scale(loss).backward(), scaler.step(optimizer), "
                            "scaler.update().", quiet)
    if optimizer.stale_ratios and max(optimizer.stale_ratios) > 0.5:
        growth = " -> ".join(f"{n:.2f}" for n in norms)
        return _verdict(EXERCISE_3, name, False, f"gradients keep growing from one step to the next ({growth}): "
                        "did you call optimizer.zero_grad()? Without it PyTorch adds each new "
                        "gradient to the old ones.", quiet)
    if amp_dtype is not None and not any(autocast_seen):
        return _verdict(EXERCISE_3, name, False, "the forward pass ran in full precision: wrap "
                        "`outputs = model(**batch)` in `with torch.autocast(device_type="
                        f"device.type, dtype=amp_dtype):` ({amp_dtype} here).", quiet)
    if not losses[-1] < losses[0]:
        return _verdict(EXERCISE_3, name, False, f"your loss did not decrease ({losses[0]:.3f} -> "
                        f"{losses[-1]:.3f}) on the same batch: did you call optimizer.step() "
                        "after loss.backward(), and return this step's loss?", quiet)
    trend = " -> ".join(f"{loss:.3f}" for loss in losses)
    return _verdict(EXERCISE_3, name, True, f"the loss goes down on a fixed batch ({trend}). "
                    "Your loop is ready to train.", quiet)


def _explain_exception(error: Exception, call: int) -> str:
    text = f"{type(error).__name__}: {error}"
    if "does not require grad" in str(error):
        return (f"{text}. backward() needs the loss from the forward pass: do not wrap the "
                "forward in torch.no_grad() and do not call .item() before backward().")
    if "backward through the graph a second time" in str(error):
        return f"{text}. Call backward() once per step, on this step's loss."
    if "unscale_() has already been called" in str(error) or "update()" in str(error):
        return f"{text}. Call scaler.update() once at the end of every step."
    where = "the first call" if call == 0 else f"call {call + 1}"
    return f"train_step raised {text} on {where}; read the message and fix the cell."
