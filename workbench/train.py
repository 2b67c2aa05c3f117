"""Fine-tune a sequence classifier: ``fit(model, data, **settings) -> FitResult``.

The loop (``_train``) reads top to bottom: take the next window of batches, do
one optimizer step, then log / evaluate / checkpoint when due. Accelerate does
device placement, autocast, the fp16 loss scaler and DDP/FSDP; ``batching``,
``precision``, ``checkpoint`` and ``memory`` each do one job beside it.

What a task (classification today, causal LM later) must provide is gathered in
``ClassificationTask``: build the model, turn splits into tokenized datasets and
batches, the training loss, and the eval outputs and metrics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from workbench import batching, checkpoint
from workbench.config import DatasetChoice, ModelChoice, TrainConfig
from workbench.errors import ConfigError, DataError, ModelError, TrainingError, WorkbenchError
from workbench.memory import free_memory, halve, is_oom, maybe_simulate_oom
from workbench.metrics import classification_metrics
from workbench.precision import accelerate_mixed_precision, device_facts, resolve_precision

MODEL_DIR = "model"  # final model: save_pretrained + tokenizer + label mapping
BEST_DIR = "best"  # the best model by config.best_metric, same layout
LABELS_FILE = "labels.json"
_ORDER_SETTINGS = ("batch_size", "gradient_accumulation_steps", "seed", "max_length", "group_by_length")
_PARAM_HASH_ENV = "WORKBENCH_TEST_PARAM_HASH_DIR"  # test-only: each rank writes a hash of its weights


@dataclass
class FitResult:
    output_dir: Path
    model_dir: Path | None  # loadable with pipeline("text-classification", model=model_dir)
    status: str  # completed | interrupted
    metrics: dict[str, float]  # last evaluation: eval_loss, eval_accuracy, eval_f1
    history: list[dict] = field(default_factory=list)  # the events of this call
    best_checkpoint: Path | None = None
    label_names: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v:.4f}" for k, v in self.metrics.items())
        return f"FitResult(status={self.status!r}, {shown}, model_dir={str(self.model_dir)!r})"


@dataclass
class TrainState:
    """Where the run is; saved in each checkpoint's state.json."""

    step: int = 0  # optimizer steps done
    epoch: int = 0  # current epoch (0-based)
    batch_in_epoch: int = 0  # loader batches of this epoch already consumed
    micro_batch_size: int = 0  # after out-of-memory halvings; batch_size otherwise
    skipped_steps: int = 0  # fp16 overflow skips, in total
    consecutive_skips: int = 0
    best_value: float | None = None
    best_step: int | None = None
    metrics: dict = field(default_factory=dict)  # last evaluation


# ------------------------------------------------------------------------- the task
class ClassificationTask:
    """Sequence classification with any AutoModelForSequenceClassification."""

    def __init__(self, text_columns: Sequence[str], label_column: str):
        self.text_columns = tuple(text_columns)
        self.label_column = label_column
        self.labels: batching.LabelMapping | None = None

    def check_data(self, splits) -> None:
        """Everything that can be wrong with the data, found before any training."""
        if not hasattr(splits, "keys"):
            raise DataError(f"data must be a DatasetDict with 'train' and 'validation' splits, "
                            f"not {type(splits).__name__}.",
                            "pass a DatasetDict, a DatasetChoice, or a path to local files.")
        for split in ("train", "validation"):
            batching.check_split(splits.get(split), split, self.text_columns, self.label_column)
        self.labels = batching.build_label_mapping(splits["train"], splits["validation"], self.label_column)

    def load_tokenizer(self, choice: ModelChoice):
        from transformers import AutoTokenizer

        tokenizer = _load(AutoTokenizer, choice)
        if tokenizer.pad_token is None:  # GPT-style tokenizers: padding is masked out anyway
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer

    def build_model(self, choice: ModelChoice, tokenizer):
        from transformers import AutoModelForSequenceClassification

        model = _load(
            AutoModelForSequenceClassification, choice,
            num_labels=len(self.labels.names), id2label=self.labels.id2label,
            label2id=self.labels.label2id,
            ignore_mismatched_sizes=True,  # a new head when the label count differs
            # fp32 master weights whatever the checkpoint stores: autocast gives the speed,
            # and AdamW on bf16/fp16 weights loses small updates.
            dtype=torch.float32,
        )
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        return model

    def datasets(self, splits, tokenizer, max_length: int, model=None):
        token_types = getattr(getattr(model, "config", None), "type_vocab_size", 0) > 1
        return tuple(
            batching.tokenize(splits[s], tokenizer, self.text_columns, self.label_column, self.labels,
                              max_length, token_types=token_types)
            for s in ("train", "validation")
        )

    def collator(self, tokenizer):
        from transformers import DataCollatorWithPadding

        # Pads each batch to its own longest row (never to max_length) with the mask to match.
        return DataCollatorWithPadding(tokenizer, return_tensors="pt")

    def loss(self, model, batch) -> torch.Tensor:
        return model(**batch).loss

    def eval_outputs(self, model, batch) -> tuple[torch.Tensor, ...]:
        """Per-row tensors that the metrics need (gathered across processes)."""
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        logits = model(**inputs).logits.float()
        row_loss = F.cross_entropy(logits, batch["labels"], reduction="none")
        return row_loss, logits.argmax(-1), batch["labels"]

    def metrics(self, outputs: list[tuple[torch.Tensor, ...]]) -> dict[str, float]:
        loss, predictions, labels = (torch.cat(parts) for parts in zip(*outputs, strict=True))
        return classification_metrics(predictions, labels, len(self.labels.names), loss.mean().item())

    def save_extra(self, directory: Path) -> None:
        mapping = {"id2label": self.labels.id2label, "label2id": self.labels.label2id,
                   "values": [str(v) for v in self.labels.values]}
        (directory / LABELS_FILE).write_text(json.dumps(mapping, indent=2) + "\n", encoding="utf-8")


def _load(auto_class, choice: ModelChoice, **kwargs):
    try:
        return auto_class.from_pretrained(choice.name_or_path, revision=choice.revision, **kwargs)
    except Exception as exc:  # OSError, ValueError, HF hub errors: all mean "cannot load this"
        offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1"
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        fix = "check the name on https://huggingface.co/models, or pass a local folder with config.json"
        if offline:
            fix = ("offline mode (HF_HUB_OFFLINE=1) only finds cached models and local folders: "
                   "download it once online (huggingface-cli download NAME) or pass a local folder")
        raise ModelError(f"Cannot load model {choice.name_or_path!r}: {reason}", fix) from None


# ------------------------------------------------------------------ graceful stops
class _StopRequest:
    """Set by SIGINT (stopping a notebook cell) or SIGTERM; the loop stops after the step."""

    def __init__(self):
        self.reason: str | None = None

    def __call__(self, signum, frame):
        if self.reason is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self.reason = signal.Signals(signum).name


@contextlib.contextmanager
def _stop_on_signals():
    stop = _StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop  # signal handlers can only be installed from the main thread
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in previous:
        signal.signal(s, stop)
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


# ----------------------------------------------------------------------- the run
@dataclass
class _Run:
    """Everything the loop touches, built once by ``_prepare``."""

    config: TrainConfig
    task: ClassificationTask
    accelerator: Any
    model: Any
    optimizer: Any
    scheduler: Any
    train_loader: Any
    eval_loader: Any
    sampler: batching.LengthGroupedBatchSampler
    tokenizer: Any
    log: Any
    record: dict
    precision: str
    total_steps: int
    batches_per_epoch: int
    state: TrainState
    stop: _StopRequest
    display: bool = False  # a progress listener shows messages; otherwise they are printed
    pending_losses: list = field(default_factory=list)  # (step, device tensor) since last log
    last_log: tuple[float, int, int] = (0.0, 0, 0)  # (time, step, samples) at the last train event
    samples: int = 0  # rows seen by this process since the start of this call

    @property
    def output_dir(self) -> Path:
        return Path(self.config.output_dir)


def _windows(run: _Run):
    """Lists of loader batches, one list per optimizer step, continuing from run.state.

    The sampler order depends only on (seed, epoch) and already-seen batches are
    skipped, so a resumed run gets the same batches as an uninterrupted one.
    """
    accum = run.config.gradient_accumulation_steps
    while True:
        run.sampler.set_epoch(run.state.epoch)
        run.train_loader.set_epoch(run.state.epoch)
        loader = run.train_loader
        if run.state.batch_in_epoch:
            loader = run.accelerator.skip_first_batches(loader, run.state.batch_in_epoch)
        window = []
        for batch in loader:
            window.append(batch)
            if len(window) == accum:
                yield window
                window = []
        if window:
            yield window


def _split(batch: dict, size: int) -> list[dict]:
    rows = len(batch["labels"])
    if rows <= size:
        return [batch]
    return [{k: v[i:i + size] for k, v in batch.items()} for i in range(0, rows, size)]


def _optimizer_step(run: _Run, batches: list[dict], step: int) -> torch.Tensor:
    """Forward/backward over the window in micro-batches, then one optimizer step.

    Each micro-batch's mean loss is weighted by its share of the window's rows, so
    the gradient is that of the whole window's mean loss however it is split.
    Returns the window's mean loss as a device tensor (no host sync).
    """
    acc, model, micro = run.accelerator, run.model, run.state.micro_batch_size
    pieces = [piece for b in batches for piece in _split(b, micro)]
    rows = sum(len(p["labels"]) for p in pieces)
    step_loss = None
    for i, piece in enumerate(pieces):
        maybe_simulate_oom(step, micro)
        # Gradients are all-reduced only on the last backward of the step (DDP).
        sync = contextlib.nullcontext() if i == len(pieces) - 1 else acc.no_sync(model)
        with sync:
            loss = run.task.loss(model, piece)
            if len(pieces) > 1:
                loss = loss * (len(piece["labels"]) / rows)
            acc.backward(loss)
        step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
    if run.config.max_grad_norm is not None:
        acc.clip_grad_norm_(model.parameters(), run.config.max_grad_norm)
    run.optimizer.step()  # with fp16, Accelerate's GradScaler skips the step on inf/NaN gradients
    if acc.optimizer_step_was_skipped:
        run.state.skipped_steps += 1
        run.state.consecutive_skips += 1
    else:
        run.state.consecutive_skips = 0
        run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    return step_loss


def _step_with_oom_retry(run: _Run, batches: list[dict], step: int) -> torch.Tensor:
    """Retry the same step with half the micro-batch (twice the accumulation) on CUDA OOM."""
    while True:
        try:
            return _optimizer_step(run, batches, step)
        except Exception as exc:
            if not is_oom(exc):
                raise
        # Out of the except block: the exception and its traceback (which hold every
        # activation of the failed pass) are gone, so the memory can really be freed.
        run.optimizer.zero_grad(set_to_none=True)
        free_memory()
        size = run.state.micro_batch_size
        if size == 1:
            raise TrainingError(
                f"CUDA out of memory at step {step} even with a micro-batch of 1.",
                "use a shorter max_length, gradient_checkpointing=True, bf16/fp16 precision, "
                "a smaller model, or distributed='fsdp' across several GPUs.", step=step)
        run.state.micro_batch_size = halve(size)
        factor = run.config.batch_size // run.state.micro_batch_size
        _message(run, f"Out of GPU memory at step {step}: retrying with micro-batch "
                      f"{run.state.micro_batch_size} x {factor} accumulation (same effective batch).", "warn")


def _train(run: _Run) -> str:
    """The loop. Returns "completed" or "interrupted" (a stop was requested)."""
    cfg, state = run.config, run.state
    windows = _windows(run)
    run.model.train()  # from_pretrained returns a model in eval mode: dropout would be off
    run.last_log = (time.perf_counter(), state.step, 0)
    try:
        while state.step < run.total_steps:
            batches = next(windows)
            step = state.step + 1
            loss = _step_with_oom_retry(run, batches, step)
            run.pending_losses.append((step, loss))
            run.samples += sum(len(b["labels"]) for b in batches)
            state.step = step
            state.batch_in_epoch += len(batches)
            epoch_done = state.batch_in_epoch >= run.batches_per_epoch
            if epoch_done:
                state.epoch, state.batch_in_epoch = state.epoch + 1, 0
            if state.consecutive_skips > cfg.max_skipped_steps:
                raise TrainingError(
                    f"The fp16 loss scaler skipped {state.consecutive_skips} steps in a row (step {step}): "
                    "the gradients keep overflowing.",
                    "lower learning_rate, or use precision='bf16' on GPUs that support it.", step=step)
            last = step == run.total_steps

            if step % cfg.log_every == 0 or last:
                _log_train(run)  # the only per-interval host sync: .item() of the losses
            if last or ((step % cfg.eval_every == 0) if cfg.eval_every else epoch_done):
                _evaluate(run)
            if last or ((step % cfg.save_every == 0) if cfg.save_every else epoch_done):
                _save_checkpoint(run)
            if epoch_done:
                free_memory()
            if _stop_requested(run, step):
                return "interrupted"
    finally:
        windows.close()  # ends the loader iterator: DataLoader workers exit
    return "completed"


def _stop_requested(run: _Run, step: int) -> bool:
    stop = run.stop.reason is not None
    if run.accelerator.num_processes > 1:
        # Every rank must stop at the same step, or DDP waits forever for the others.
        # Agreeing costs a collective and a host sync, so ranks ask only every log_every steps.
        if step % run.config.log_every:
            return False
        flag = torch.tensor(float(stop), device=run.accelerator.device)
        stop = bool(run.accelerator.reduce(flag, "max").item())
    return stop


# ------------------------------------------------------------- logging and checks
def _check_losses(run: _Run) -> float | None:
    """Mean of the losses since the last check; TrainingError at the first non-finite one."""
    if not run.pending_losses:
        return None
    steps, losses = zip(*run.pending_losses, strict=True)
    stacked = torch.stack(losses)
    if run.accelerator.num_processes > 1:
        stacked = run.accelerator.reduce(stacked, "mean")
    values = stacked.tolist()  # host sync
    run.pending_losses.clear()
    for step, value in zip(steps, values, strict=True):
        if not math.isfinite(value):
            raise TrainingError(
                f"The loss became {value} at step {step}; the weights are no longer usable.",
                "lower learning_rate (e.g. by 10x), keep max_grad_norm set, or use precision='bf16' "
                "instead of fp16. The last good checkpoint is kept in "
                f"{checkpoint.checkpoints_dir(run.output_dir)}.", step=step)
    return sum(values) / len(values)


def _log_train(run: _Run) -> None:
    loss = _check_losses(run)
    now, state = time.perf_counter(), run.state
    then, then_step, then_samples = run.last_log
    elapsed = max(now - then, 1e-9)
    seconds_per_step = elapsed / max(state.step - then_step, 1)
    samples_per_s = (run.samples - then_samples) * run.accelerator.num_processes / elapsed
    run.last_log = (now, state.step, run.samples)
    gpu_mem = torch.cuda.max_memory_allocated() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    run.log.write(
        "train", step=state.step, epoch=round(state.epoch + state.batch_in_epoch / run.batches_per_epoch, 4),
        loss=loss, lr=run.scheduler.get_last_lr()[0], samples_per_s=round(samples_per_s, 2),
        gpu_mem_bytes=gpu_mem, eta_s=round(seconds_per_step * (run.total_steps - state.step), 1),
        skipped_steps=state.skipped_steps, micro_batch_size=state.micro_batch_size,
    )


def _message(run: _Run, text: str, level: str = "info") -> None:
    run.log.write("message", text=text, level=level)
    if run.log.enabled and not run.display:  # no display attached: still say it
        print(f"workbench: {text}", file=sys.stderr if level != "info" else sys.stdout)


def _evaluate(run: _Run) -> dict[str, float]:
    acc, model = run.accelerator, run.model
    model.eval()
    outputs = []
    with torch.no_grad():
        for batch in run.eval_loader:
            outputs.append(acc.gather_for_metrics(run.task.eval_outputs(model, batch)))
    model.train()
    metrics = run.task.metrics(outputs)
    run.state.metrics = metrics
    run.log.write("eval", step=run.state.step,
                  epoch=round(run.state.epoch + run.state.batch_in_epoch / run.batches_per_epoch, 4), **metrics)
    value = metrics[f"eval_{run.config.best_metric}"]
    best = run.state.best_value
    lower_is_better = run.config.best_metric == "loss"
    if math.isfinite(value) and (best is None or (value < best if lower_is_better else value > best)):
        run.state.best_value, run.state.best_step = value, run.state.step
        _save_model(run, run.output_dir / BEST_DIR, extra={"step": run.state.step, "metrics": metrics})
    return metrics


# ------------------------------------------------------------------------- saving
def _save_checkpoint(run: _Run) -> Path:
    """All ranks collect state (FSDP gathers weights); only the main process writes."""
    _check_losses(run)  # never checkpoint weights that a NaN loss has already ruined
    acc = run.accelerator
    model_state = acc.get_state_dict(run.model)
    path = None
    if acc.is_main_process:
        if not _all_finite(model_state):
            raise TrainingError(f"The weights contain NaN/inf at step {run.state.step}.",
                                "lower learning_rate or use precision='bf16'.", step=run.state.step)
        objects = {"model": model_state, "scheduler": run.scheduler.state_dict(), "rng": checkpoint.rng_state()}
        if run.config.distributed != "fsdp":  # FSDP optimizer state is sharded per rank (not saved)
            objects["optimizer"] = run.optimizer.state_dict()
        if acc.scaler is not None:
            objects["scaler"] = acc.scaler.state_dict()
        path = checkpoint.save_checkpoint(run.output_dir, run.state.step, objects, asdict(run.state),
                                          run.record, keep=run.config.keep_checkpoints)
        run.log.write("checkpoint", step=run.state.step, path=str(path))
    acc.wait_for_everyone()
    return path or checkpoint.checkpoints_dir(run.output_dir) / checkpoint.step_dir_name(run.state.step)


@contextlib.contextmanager
def _no_hf_progress_bars():
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _all_finite(state_dict: dict) -> bool:
    """True when no weight is NaN/inf. A tensor's max-abs (inf-norm) is NaN/inf exactly
    when one of its values is; one fused pass plus a single host sync costs far less than
    an isfinite().all() sync per tensor (~1 s per save for a 22M-parameter model)."""
    tensors = [t.float() if t.dtype in (torch.float16, torch.bfloat16) else t
               for t in state_dict.values() if t.is_floating_point() and t.numel()]
    if not tensors:
        return True
    return bool(torch.isfinite(torch.stack(torch._foreach_norm(tensors, ord=math.inf))).all())


def _save_model(run: _Run, directory: Path, extra: dict | None = None) -> Path:
    """save_pretrained + tokenizer + label mapping, written atomically by the main process."""
    acc = run.accelerator
    state_dict = acc.get_state_dict(run.model)
    if acc.is_main_process:
        def write(tmp: Path) -> None:
            with _no_hf_progress_bars():  # "Writing model shards" bars: noise in logs and cells
                acc.unwrap_model(run.model).save_pretrained(tmp, state_dict=state_dict)
            run.tokenizer.save_pretrained(tmp)
            run.task.save_extra(tmp)
            if extra:
                (tmp / "best.json").write_text(json.dumps(extra, indent=2) + "\n", encoding="utf-8")

        checkpoint.write_dir_atomically(directory, write)
    acc.wait_for_everyone()
    return directory


def _resume(run: _Run, path: Path) -> list[tuple[str, str]]:
    """Load everything from ``path``; returns (text, level) messages to log after "start"."""
    names = ("model", "optimizer", "scheduler", "scaler", "rng")
    objects, state, record = checkpoint.load_checkpoint(path, names)
    run.accelerator.unwrap_model(run.model).load_state_dict(objects["model"])
    if "optimizer" in objects:
        run.optimizer.load_state_dict(objects["optimizer"])
    run.scheduler.load_state_dict(objects["scheduler"])
    if "scaler" in objects and run.accelerator.scaler is not None:
        run.accelerator.scaler.load_state_dict(objects["scaler"])
    run.state = TrainState(**state)
    if run.state.micro_batch_size > run.config.batch_size or run.state.micro_batch_size < 1:
        run.state.micro_batch_size = run.config.batch_size
    checkpoint.set_rng_state(objects["rng"])
    changes = checkpoint.compare_records(record, run.record)
    messages = [(f"Resumed from {path} (step {run.state.step}).", "info")]
    # Settings that decide which rows form each batch: changing them mid-run means the
    # rest of the epoch is not the batches the first part of the run was planned with.
    before, now = record.get("config", {}), run.record["config"]
    changed = [f"{k} {before.get(k)!r} -> {now.get(k)!r}" for k in _ORDER_SETTINGS if before.get(k) != now.get(k)]
    if changed:
        messages.append(("The run's settings changed since the checkpoint: " + "; ".join(changed)
                         + ". Use a new output_dir (or resume=None) to start over with them.", "warn"))
    if changes:
        messages.append(("Resuming on different hardware or software, results may differ slightly: "
                         + "; ".join(changes) + ".", "warn"))
    return messages


# ------------------------------------------------------------------------- set-up
def _make_config(config: TrainConfig | None, overrides: dict[str, Any]) -> TrainConfig:
    config = config or TrainConfig()
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    for name in overrides:
        if name not in known:
            raise ConfigError(name, overrides[name], "a TrainConfig field: " + ", ".join(sorted(known)))
    return dataclasses.replace(config, **overrides)  # __post_init__ validates again


def _resolve_data(data, text_columns, label_column):
    """(DatasetDict, text_columns, label_column) from any accepted ``data``."""
    if isinstance(data, (str, os.PathLike)):
        source = "files" if Path(data).exists() else "hub"
        data = DatasetChoice(source=source, path=str(data), text_columns=tuple(text_columns or ("text",)),
                             label_column=label_column or "label")
    if isinstance(data, DatasetChoice):
        from workbench.data import load_choice

        return load_choice(data), data.text_columns, data.label_column
    columns = tuple([text_columns] if isinstance(text_columns, str) else (text_columns or ("text",)))
    if not 1 <= len(columns) <= 2:
        raise ConfigError("text_columns", columns, "one column, or two for sentence pairs")
    return data, columns, label_column or "label"


def _check_output_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise ConfigError("output_dir", str(path), "a writable folder",
                          fix=f"choose another output_dir ({exc.strerror or exc}).") from None


def _make_accelerator(config: TrainConfig, precision: str):
    from accelerate import Accelerator, DataLoaderConfiguration
    from accelerate.state import AcceleratorState, GradientState

    # Accelerate keeps its state in process-wide singletons; a second fit() in the same
    # notebook kernel (maybe with another precision) needs a fresh one.
    AcceleratorState._reset_state()
    GradientState._reset_state()
    kwargs = {}
    if config.distributed == "fsdp":
        if not torch.cuda.is_available():
            raise ConfigError("distributed", "fsdp", "'fsdp' only on CUDA GPUs", fix="use distributed='ddp'.")
        from accelerate import FullyShardedDataParallelPlugin

        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin()
    return Accelerator(
        # cpu=True on a machine without CUDA: Accelerate then recognises torchrun's
        # environment as multi-process CPU (gloo) instead of one process per rank.
        cpu=not torch.cuda.is_available(),
        mixed_precision=accelerate_mixed_precision(precision),
        dataloader_config=DataLoaderConfiguration(non_blocking=torch.cuda.is_available()),
        step_scheduler_with_optimizer=False,  # we step the scheduler ourselves, once per real step
        **kwargs,
    )


def _lr_schedule(name: str, warmup: int, total: int):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = (step - warmup) / max(1, total - warmup)
        if name == "constant":
            return 1.0
        if name == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
        return max(0.0, 1.0 - progress)

    return factor


def _make_optimizer(model, config: TrainConfig):
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]  # biases, LayerNorm
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    try:
        # The fused kernel updates all parameters in one pass (CPU and CUDA); the default
        # loops over them in Python, which cost ~5x the optimizer time of a 22M-parameter
        # BERT on CPU (benchmarks/train_throughput.py).
        return torch.optim.AdamW(groups, lr=config.learning_rate, fused=True)
    except (RuntimeError, TypeError):  # a device or dtype without a fused kernel
        return torch.optim.AdamW(groups, lr=config.learning_rate, foreach=True)


def _num_workers(config: TrainConfig) -> int:
    if config.num_workers is not None:
        return config.num_workers
    # On a GPU, workers collate the next batches while the GPU computes. On a CPU they
    # compete with the model for the same cores and their fork costs seconds.
    return 2 if torch.cuda.is_available() else 0


def _loader(dataset, sampler, collate, config: TrainConfig):
    return torch.utils.data.DataLoader(
        dataset, batch_sampler=sampler, collate_fn=collate, num_workers=_num_workers(config),
        # Workers are forked once for the run, not once per epoch (each fork copies a
        # process that holds the model); they end with the loader when fit returns.
        persistent_workers=_num_workers(config) > 0,
        pin_memory=torch.cuda.is_available(),  # page-locked memory: faster, asynchronous copies
        # Worker seeds come from this generator, not the global RNG, so creating a
        # loader never shifts the dropout random stream (exact resume).
        generator=torch.Generator().manual_seed(config.seed),
    )


def _prepare(model_choice, splits, task: ClassificationTask, config: TrainConfig, precision: str,
             stop: _StopRequest, progress: str) -> _Run:
    from accelerate.utils import set_seed

    from workbench.events import EventLog

    accelerator = _make_accelerator(config, precision)
    output_dir = Path(config.output_dir)
    set_seed(config.seed)  # the new classifier head's initial weights depend on it
    tokenizer = task.load_tokenizer(model_choice)
    model = task.build_model(model_choice, tokenizer)
    if config.gradient_checkpointing:
        # Non-reentrant checkpointing works with DDP and with frozen inputs. transformers 5
        # renamed the method (the old name warns); keep both for older versions.
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    with accelerator.main_process_first():  # datasets' cache is written once
        train_ds, eval_ds = task.datasets(splits, tokenizer, config.max_length, model)
    collate = task.collator(tokenizer)
    sampler = batching.LengthGroupedBatchSampler(train_ds.lengths, config.batch_size, seed=config.seed,
                                                 group_by_length=config.group_by_length)
    eval_sampler = batching.LengthGroupedBatchSampler(eval_ds.lengths, config.batch_size * 2, shuffle=False)
    train_loader, eval_loader = _loader(train_ds, sampler, collate, config), _loader(eval_ds, eval_sampler, collate, config)
    optimizer = _make_optimizer(model, config)
    model, optimizer, train_loader, eval_loader = accelerator.prepare(model, optimizer, train_loader, eval_loader)

    batches_per_epoch = len(train_loader)  # this process's share
    steps_per_epoch = math.ceil(batches_per_epoch / config.gradient_accumulation_steps)
    total_steps = config.max_steps or math.ceil(config.num_epochs * steps_per_epoch)
    warmup = int(config.warmup_ratio * total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_schedule(config.scheduler, warmup, total_steps))

    log = EventLog(output_dir, enabled=accelerator.is_main_process)
    display = False
    if accelerator.is_main_process and progress != "none":
        try:
            from workbench.widgets.progress import make_progress

            log.add_listener(make_progress(progress))
            display = True
        except ImportError as exc:
            warnings.warn(f"No progress display ({exc}); events still go to {output_dir}.", stacklevel=2)
    record = checkpoint.run_record(_config_dict(config), seed=config.seed, precision=precision,
                                   world_size=accelerator.num_processes,
                                   extra={"model": model_choice.name_or_path, "labels": task.labels.names})
    return _Run(config=config, task=task, accelerator=accelerator, model=model, optimizer=optimizer,
                scheduler=scheduler, train_loader=train_loader, eval_loader=eval_loader, sampler=sampler,
                tokenizer=tokenizer, log=log, record=record, precision=precision, total_steps=total_steps,
                batches_per_epoch=batches_per_epoch, state=TrainState(micro_batch_size=config.batch_size),
                stop=stop, display=display)


def _config_dict(config: TrainConfig) -> dict:
    return asdict(config)


def _close(run: _Run) -> None:
    for listener in list(run.log._listeners):
        with contextlib.suppress(Exception):
            listener.close()
    run.log.close()
    if run.accelerator.num_processes == 1:
        # Leave the kernel as we found it: accelerate.notebook_launcher refuses to start
        # while an Accelerator's state exists in the process.
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state()
        GradientState._reset_state()
    free_memory()


def _write_param_hash(run: _Run) -> None:
    """Test-only: a hash of this rank's weights, to prove DDP kept the ranks identical."""
    target = os.environ.get(_PARAM_HASH_ENV)
    if not target:
        return
    digest = hashlib.sha256()
    for name, tensor in sorted(run.accelerator.unwrap_model(run.model).state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    Path(target).mkdir(parents=True, exist_ok=True)
    (Path(target) / f"rank{run.accelerator.process_index}.sha256").write_text(digest.hexdigest())


# -------------------------------------------------------------------- entry points
def fit(
    model: str | ModelChoice,
    data,
    config: TrainConfig | None = None,
    *,
    text_columns: Sequence[str] | None = None,
    label_column: str | None = None,
    progress: str = "auto",
    **overrides,
) -> FitResult:
    """Fine-tune ``model`` for sequence classification on ``data``.

    ``data``: a DatasetDict with "train" and "validation" splits, a DatasetChoice,
    or a path to local files. ``overrides`` are TrainConfig fields
    (``fit("bert-base-uncased", ds, output_dir="runs/a", num_epochs=1)``).
    Re-running the same call continues from the newest valid checkpoint
    (``resume="auto"``). Stopping the cell saves a checkpoint and returns
    ``status="interrupted"``.
    """
    # Everything that can be wrong is checked here, before any training starts.
    config = _make_config(config, overrides)
    if progress not in ("auto", "notebook", "console", "none"):
        raise ConfigError("progress", progress, "auto | notebook | console | none")
    model_choice = model if isinstance(model, ModelChoice) else ModelChoice(str(model))
    splits, columns, label = _resolve_data(data, text_columns, label_column)
    task = ClassificationTask(columns, label)
    task.check_data(splits)
    precision = resolve_precision(config.precision, device_facts())
    output_dir = Path(config.output_dir)
    _check_output_dir(output_dir)
    resume_from = checkpoint.resolve_resume(output_dir, config.resume)

    with _stop_on_signals() as stop:
        run = _prepare(model_choice, splits, task, config, precision, stop, progress)
        history: list[dict] = []
        if run.log.enabled:
            run.log.add_listener(history.append)
        try:
            return _fit_run(run, resume_from, history)
        finally:
            _close(run)


def _fit_run(run: _Run, resume_from: Path | None, history: list[dict]) -> FitResult:
    acc, config = run.accelerator, run.config
    if acc.is_main_process:
        checkpoint.remove_stale_temporaries(checkpoint.checkpoints_dir(run.output_dir))
        checkpoint.remove_stale_temporaries(run.output_dir)
    messages = _resume(run, resume_from) if resume_from is not None else []
    steps_per_epoch = math.ceil(run.batches_per_epoch / config.gradient_accumulation_steps)
    run.log.write("start", total_steps=run.total_steps, num_epochs=round(run.total_steps / steps_per_epoch, 3),
                  config=_config_dict(config), world_size=acc.num_processes, precision=run.precision,
                  device=str(acc.device), resumed_from_step=run.state.step,
                  label_names=run.task.labels.names)
    for text, level in messages:
        _message(run, text, level)
    try:
        try:
            status = _train(run)
        except KeyboardInterrupt:
            status = "interrupted"  # raised mid-step (e.g. by a display): drop that partial step
            run.optimizer.zero_grad(set_to_none=True)
            run.pending_losses.clear()
        if status == "interrupted":
            path = _save_checkpoint(run)
            text = (f"Interrupted at step {run.state.step}/{run.total_steps}: checkpoint saved in {path}; "
                    "run the same fit again to continue.")
            run.log.write("message", text=text, level="warn")
            run.log.write("end", status="interrupted", step=run.state.step, metrics=run.state.metrics)
            if acc.is_main_process:
                print(f"workbench: {text}", file=sys.stderr)
            return _result(run, "interrupted", None, history)
        model_dir = _save_model(run, run.output_dir / MODEL_DIR)
        _write_param_hash(run)
        run.log.write("end", status="completed", step=run.state.step, metrics=run.state.metrics)
        return _result(run, "completed", model_dir, history)
    except BaseException as exc:
        if not isinstance(exc, KeyboardInterrupt):  # a second Ctrl-C: stop without more output
            run.log.write("message", text=str(exc), level="error")
            run.log.write("end", status="failed", step=getattr(exc, "step", None) or run.state.step,
                          metrics=run.state.metrics)
        raise


def _result(run: _Run, status: str, model_dir: Path | None, history: list[dict]) -> FitResult:
    best = run.output_dir / BEST_DIR
    return FitResult(output_dir=run.output_dir, model_dir=model_dir, status=status,
                     metrics=dict(run.state.metrics), history=history,
                     best_checkpoint=best if best.is_dir() else None, label_names=list(run.task.labels.names))


def _fit_worker(model, data, config, kwargs) -> None:
    from accelerate.state import AcceleratorState

    # A forked child inherits the kernel's single-process state (from an earlier fit):
    # drop it so Accelerate reads the launcher's multi-process environment.
    AcceleratorState._reset_state(reset_partial_state=True)
    fit(model, data, config, **kwargs)


def fit_distributed(model: str | ModelChoice, data, config: TrainConfig | None = None, *,
                    num_processes: int, **kwargs) -> FitResult:
    """``fit`` on ``num_processes`` GPUs from a notebook (accelerate.notebook_launcher).

    The launcher forks the kernel, which CUDA does not survive: call this before
    anything in the kernel touches the GPU.
    """
    if torch.cuda.is_initialized():
        raise WorkbenchError(
            "CUDA is already initialised in this kernel, so it cannot fork the training processes.",
            "restart the kernel (Kernel > Restart) and run fit_distributed before any cell that "
            "uses the GPU (no fit(), .to('cuda') or GPU panel sampling through torch first).")
    from accelerate import notebook_launcher

    progress = kwargs.pop("progress", "console")
    kwargs["progress"] = "console" if progress == "auto" else progress  # widgets do not cross a fork
    notebook_launcher(_fit_worker, args=(model, data, config, kwargs), num_processes=num_processes)
    config = _make_config(config, {k: v for k, v in kwargs.items() if k not in ("text_columns", "label_column", "progress")})
    return result_from_disk(config.output_dir)


def result_from_disk(output_dir: str | os.PathLike) -> FitResult:
    """A FitResult rebuilt from a run's folder (events.jsonl, model/, best/)."""
    from workbench.events import read_events

    output_dir = Path(output_dir)
    events = read_events(output_dir)
    ends = [e for e in events if e.get("kind") == "end"]
    starts = [e for e in events if e.get("kind") == "start"]
    model_dir = output_dir / MODEL_DIR
    labels = []
    if (model_dir / LABELS_FILE).is_file():
        mapping = json.loads((model_dir / LABELS_FILE).read_text(encoding="utf-8"))
        labels = [mapping["id2label"][k] for k in sorted(mapping["id2label"], key=int)]
    elif starts:
        labels = starts[-1].get("label_names", [])
    status = ends[-1]["status"] if ends else "interrupted"
    if status == "failed":
        raise TrainingError(f"The distributed run failed: see {output_dir / 'events.jsonl'}.",
                            "read the error event, fix it, and run again (it resumes).")
    return FitResult(output_dir=output_dir, model_dir=model_dir if model_dir.is_dir() else None,
                     status=status, metrics=ends[-1].get("metrics", {}) if ends else {}, history=events,
                     best_checkpoint=output_dir / BEST_DIR if (output_dir / BEST_DIR).is_dir() else None,
                     label_names=labels)
