"""Fine-tune a model, headless: ``fit(model, data, **settings) -> FitResult``.

Reads top to bottom: check everything that can be wrong (settings, data, output
folder) -> build the run (task, Accelerator, model, batches, optimizer, schedule,
resume) -> the loop -> finish (final model, ``end`` event). What depends on the
task (classification, causal LM) comes from a ``workbench.tasks`` object;
precision, checkpoints, out-of-memory handling, distribution and signals are each
a module beside this one. Views are listeners on the event log (``listeners=``): no
notebook front end is imported here, so it runs the same under torchrun, papermill and
CI; ``workbench.fit`` (``workbench.frontend``) attaches the view for where it runs.

Building the run (tokenizer, model, batches, optimizer, schedule, event log: ``Run``) is
``setup.py``'s. Why ~540 lines: the loop is meant to read top to bottom in one file (step,
evaluation, save, finish), as nanoGPT's does; everything that is not the loop's own order
already lives beside it. The next split: the finish (``_fit_run``'s end: final model, verdict,
``end`` event) into ``finish.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from workbench.config import ModelChoice, TrainConfig
from workbench.engine import batch_size as auto_batch
from workbench.engine import (
    batching,
    checkpoint,
    distributed,
    inputs,
    run_lock,
    setup,
)
from workbench.engine.divergence import measure_start
from workbench.engine.memory import free_memory, with_halving
from workbench.engine.precision import choose_precision, device_facts
from workbench.engine.results import BEST_DIR, MODEL_DIR, FitResult
from workbench.engine.setup import Run
from workbench.engine.stopping import HARD_STOP_AFTER, stop_on_signals
from workbench.engine.verdict import final_verdict, judge, reference
from workbench.errors import CheckpointError, TrainingError
from workbench.sources import model_checks
from workbench.tasks import make_task
from workbench.tasks.base import split_batch


# -------------------------------------------------------------------- entry point
def fit(
    model: str | ModelChoice,
    data,
    config: TrainConfig | None = None,
    *,
    text_columns: Sequence[str] | None = None,
    label_column: str | None = None,
    listeners: Sequence[Callable[[dict], None]] = (),
    **overrides,
) -> FitResult:
    """Fine-tune ``model`` on ``data``; every event of the run goes to ``listeners``.

    ``data``: a DatasetDict with "train" and "validation" splits, a DatasetChoice,
    or a path to local files. ``overrides`` are TrainConfig fields
    (``fit("bert-base-uncased", ds, output_dir="runs/a", num_epochs=1)``).
    Re-running the same call continues from the newest valid checkpoint
    (``resume="auto"``). SIGINT/SIGTERM save a checkpoint and return
    ``status="interrupted"``.
    """
    # Everything that can be wrong is checked here, before any training starts.
    config = inputs.make_config(config, overrides)
    # task="auto": the data's columns pick it; every later step (and the run record) sees the real one.
    config = dataclasses.replace(config, task=inputs.resolve_task(data, text_columns, label_column, config))
    model_choice = model if isinstance(model, ModelChoice) else ModelChoice(str(model))
    model_checks.check_model_source(model_choice.name_or_path)
    splits, columns, label = inputs.resolve_data(data, text_columns, label_column, config.task)
    data_facts = inputs.describe_data(data)  # for the run record: the model card names the data
    task = make_task(config, columns, label)
    task.check_data(splits)
    task.check_model(model_choice)  # settings that depend on the model's layers (LoRA targets)
    precision = choose_precision(config.precision, device_facts())
    inputs.check_output_dir(Path(config.output_dir))
    # One run per folder: the main process (global rank 0) holds the lock for all of them.
    lock = run_lock.acquire(config.output_dir) if int(os.environ.get("RANK", "0")) == 0 else None
    try:
        resume_from = checkpoint.resolve_resume(config.output_dir, config.resume)
        # batch_size="auto": an int from here on (engine/batch_size.py); a resumed run keeps its checkpoint's.
        config, batch_choice = auto_batch.resolve_batch_size(
            config, model_choice.name_or_path, precision=precision.precision, rows=_train_rows(splits),
            checkpoint_record=checkpoint.read_record(resume_from) if resume_from is not None else None)
        if batch_choice is not None and hasattr(task, "settings"):  # the causal LM's packing choice reads it
            task.settings = dataclasses.replace(task.settings, batch_size=config.batch_size)
        with stop_on_signals() as stop:
            run = setup.prepare(model_choice, splits, task, config, precision, stop, listeners, data_facts,
                           batch_choice)
            if lock is not None and lock.note:
                run.notes.insert(0, (lock.note, "warn"))
            history: list[dict] = []
            if run.log.enabled:
                run.log.add_listener(history.append)
            try:
                return _fit_run(run, resume_from, history)
            finally:
                _close(run)
    finally:
        if lock is not None:
            lock.release()


def _train_rows(splits) -> int | None:
    try:
        return len(splits["train"])
    except (KeyError, TypeError):
        return None


def _fit_run(run: Run, resume_from: Path | None, history: list[dict]) -> FitResult:
    acc, config = run.accelerator, run.config
    messages = list(run.notes)
    if acc.is_main_process:  # under the lock: no other run's save is in progress here
        for folder in (checkpoint.checkpoints_dir(run.output_dir), run.output_dir):
            messages += [(text, "warn") for text in checkpoint.remove_stale_temporaries(folder)]
    acc.wait_for_everyone()  # nobody saves into a folder that is being cleaned
    # With an output_dir that is not one folder for all nodes, rank 0 would resume at step N, the rest at 0.
    if distributed.differs_across_processes(acc, checkpoint.step_of(resume_from)):
        raise CheckpointError(f"output_dir {run.output_dir} is not the same folder on every node: the "
                              "processes found different checkpoints to resume from.",
                              "put output_dir on a shared file system every node mounts (NFS, Lustre, a "
                              "ReadWriteMany volume), the same path on each.")
    messages += _resume(run, resume_from) if resume_from is not None else []
    if hasattr(run.task, "before_training"):  # the preference task's reference log-probabilities
        messages += run.task.before_training(
            acc, run.model, run.train_dataset, run.collate, batch_size=config.batch_size * 2,  # evaluation's batches
            rows_trained=run.total_steps * config.batch_size * config.gradient_accumulation_steps * acc.num_processes,
            run_dir=run.output_dir, record=run.record, halving=with_halving)
    if run.guard.start is None:  # a fresh run: the training loss before any update (divergence.py)
        start = measure_start(acc, run.model, run.task, run.train_dataset, run.collate,
                              run.state.micro_batch_size, config.seed)
        # Not finite (weights that are NaN from the start): the first step's loss stops the run instead.
        run.guard.start = run.state.start_loss = start if math.isfinite(start) else None
    steps_per_epoch = math.ceil(run.batches_per_epoch / config.gradient_accumulation_steps)
    run.log.write("start", model=run.record.get("model"), total_steps=run.total_steps, num_epochs=round(run.total_steps / steps_per_epoch, 3),
                  config=asdict(config), world_size=acc.num_processes, precision=run.precision.precision,
                  precision_reason=run.precision.reason, compile=run.compiled.describe(),
                  async_checkpoints=run.checkpoints.describe(),
                  device=str(acc.device), resumed_from_step=run.state.step,
                  batch_size=config.batch_size, batch_size_auto=run.record.get("batch_size_auto"),
                  label_names=run.task.identity().get("labels", []),
                  divergence={"start": run.guard.start, "bound": run.guard.limit, "window": run.guard.window})
    if acc.is_main_process:  # what the model card, an evaluation and an export read about the run
        checkpoint.write_run_record(run.output_dir, run.record)
    for text, level in messages:
        _message(run, text, level)
    try:
        try:
            status = _train(run)
        except KeyboardInterrupt:
            if run.stop.presses >= HARD_STOP_AFTER:
                raise  # Ctrl-C three times: stop without saving
            # Raised by something other than our handler (a display, a thread) in the middle of
            # a step: drop that step's gradients and give back the random numbers it drew, or
            # the resumed run would not see the dropout masks an uninterrupted one sees.
            status = "interrupted"
            run.optimizer.zero_grad(set_to_none=True)
            if run.rng_before_step is not None:
                checkpoint.set_rng_state(run.rng_before_step)
        if status == "interrupted":
            path = _save_checkpoint(run)
            _checkpoints_committed(run, wait=True)
            text = (f"Interrupted at step {run.state.step}/{run.total_steps}: checkpoint saved in {path}; "
                    "run the same fit again to continue.")
            _message(run, text, "warn")
            run.log.write("end", status="interrupted", step=run.state.step, metrics=run.state.metrics)
            return _result(run, "interrupted", None, history)
        _checkpoints_committed(run, wait=True)  # the last save is on disk before the final model
        verdict = final_verdict(f"eval_{config.selection_metric}", run.state,
                                best_written=(run.output_dir / BEST_DIR).is_dir())
        if acc.is_main_process:  # in the run record before model/ is saved: its model card reads it there
            checkpoint.write_run_record(run.output_dir, {**run.record, "verdict": verdict})
        model_dir = _save_model(run, run.output_dir / MODEL_DIR)
        if acc.is_main_process:
            with checkpoint.no_hf_progress_bars():
                finished = run.task.finish(model_dir, checkpoint.carded_writer(run.output_dir))
            for text, level in finished:
                _message(run, text, level)
        _message(run, _verdict_message(run, verdict), "info" if verdict["outcome"] == "better" else "warn")
        run.log.write("end", status="completed", step=run.state.step, metrics=run.state.metrics, verdict=verdict)
        return _result(run, "completed", model_dir, history, verdict)
    except BaseException as exc:
        if not isinstance(exc, KeyboardInterrupt):  # stopped without saving: no more output
            with contextlib.suppress(Exception):  # a save in flight still commits (and is logged)
                _checkpoints_committed(run, wait=True)
            run.log.write("message", text=str(exc), level="error")
            run.log.write("end", status="failed", step=getattr(exc, "step", None) or run.state.step,
                          metrics=run.state.metrics)
        raise


# ------------------------------------------------------------------------ the loop
def _train(run: Run) -> str:
    """Optimizer steps until the end or a stop request. Returns "completed" or "interrupted"."""
    cfg, state = run.config, run.state
    windows = batching.step_windows(run.train_loader, run.sampler, run.accelerator, run.state,
                                    run.config.gradient_accumulation_steps)
    run.model.train()  # from_pretrained returns a model in eval mode: dropout would be off
    if cfg.eval_before_training and state.step == 0:  # not on a resume: step 0 is already in the log
        _evaluate(run, candidate=False)
    run.last_log = (time.perf_counter(), state.step, 0)
    try:
        while state.step < run.total_steps:
            batches = next(windows)
            step = state.step + 1
            run.rng_before_step = checkpoint.rng_state()  # ~20 us: an interrupted step can give its draws back
            loss = run.compiled.timed_first_step(_step_with_oom_retry, run, batches, step)
            _compile_notes(run)  # compile time after the first step; a fallback to eager, whenever it happens
            run.rng_before_step = None  # the step is done: its draws are part of the run
            run.pending_losses.append((step, loss))
            run.samples += sum(run.task.rows(b) for b in batches)
            state.step = step
            state.batch_in_epoch += len(batches)
            if run.checkpoints.pending:  # a save written in the background: its event once it is committed
                _checkpoints_committed(run, wait=False)
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
            # No cache clearing at epoch ends: the next epoch needs the same blocks right back (an
            # empty_cache makes it re-allocate them), and gc.collect over a loaded transformers
            # heap costs ~0.2 s, which on a GPU is an epoch of a small dataset. After an OOM and
            # at the end of the run (memory.py, _close) memory is freed.
            if _stop_requested(run, step):
                return "interrupted"
    finally:
        windows.close()  # ends the loader iterator: DataLoader workers exit
    return "completed"


def _optimizer_step(run: Run, batches: list[dict], step: int) -> torch.Tensor:
    """Forward/backward over the window in micro-batches, then one optimizer step.

    Each micro-batch's mean loss is weighted by its share of the window's units (rows,
    or supervised tokens), so the gradient is that of the whole window's mean loss
    however it is split. Returns the window's mean loss as a device tensor (no host sync).
    """
    acc, model, task = run.accelerator, run.model, run.task
    run.compiled.step_begins()  # CUDA graphs: a new iteration (engine/compile.py)
    pieces = [piece for b in batches for piece in split_batch(task, b, run.state.micro_batch_size)]
    weights = [task.units(p) for p in pieces] if len(pieces) > 1 else None
    total = sum(weights) if weights else None
    step_loss = None
    for i, piece in enumerate(pieces):
        # Gradients are all-reduced only on the last backward of the step (DDP).
        sync = contextlib.nullcontext() if i == len(pieces) - 1 else acc.no_sync(model)
        with sync:
            loss = task.loss(model, piece)
            if weights:
                loss = loss * (weights[i] / total)
            acc.backward(loss)
        step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
    if run.config.max_grad_norm is not None:
        acc.clip_grad_norm_(run.parameters, run.config.max_grad_norm)
    run.optimizer.step()  # with fp16, Accelerate's GradScaler skips the step on inf/NaN gradients
    if acc.scaler is not None and acc.optimizer_step_was_skipped:
        run.state.skipped_steps += 1
        run.state.consecutive_skips += 1
    else:
        run.state.consecutive_skips = 0
        run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    return step_loss


def _step_with_oom_retry(run: Run, batches: list[dict], step: int) -> torch.Tensor:
    """Retry the same step with half the micro-batch (twice the accumulation) on out-of-memory."""
    def halved(size: int) -> None:
        run.optimizer.zero_grad(set_to_none=True)
        run.state.micro_batch_size = size
        _message(run, f"Out of GPU memory at step {step}: retrying with micro-batch {size} x "
                      f"{run.config.batch_size // size} accumulation (same effective batch).", "warn")

    return with_halving(lambda size: _optimizer_step(run, batches, step), run.state.micro_batch_size,
                        on_halve=halved, give_up=lambda: TrainingError(
                            f"CUDA out of memory at step {step} even with a micro-batch of 1.",
                            "use a shorter max_length, gradient_checkpointing=True, bf16/fp16 precision, "
                            "a smaller model, or distributed='fsdp' across several GPUs.", step=step))


def _stop_requested(run: Run, step: int) -> bool:
    stop = run.stop.reason is not None
    if run.accelerator.num_processes > 1:
        # Every rank must stop at the same step, or DDP waits forever for the others.
        # Agreeing costs a collective and a host sync, so ranks ask only every log_every steps.
        if step % run.config.log_every:
            return False
        stop = distributed.any_process(run.accelerator, stop)
    return stop


# ------------------------------------------------------------- logging and checks
def _check_losses(run: Run) -> float | None:
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
            good = checkpoint.list_checkpoints(run.output_dir)
            kept = f"The last good checkpoint is kept in {good[-1]}." if good else "No checkpoint was saved before it."
            raise TrainingError(
                f"The loss became {value} at step {step}; the weights are no longer usable. {kept}",
                f"lower learning_rate ({_lower_rate(run.config)}), keep max_grad_norm set, or use "
                "precision='bf16' instead of fp16.", step=step)
        run.guard.observe(step, value)
    run.state.start_loss = run.guard.start
    _check_divergence(run, partial=run.state.step >= run.total_steps)
    return sum(values) / len(values)


def _check_divergence(run: Run, partial: bool = False) -> None:
    """TrainingError when the loss has gone to chance level and stayed there (engine/divergence.py)."""
    found = run.guard.diverged(partial=partial)
    if found is None:
        return
    first, last, loss = found
    good = checkpoint.list_checkpoints(run.output_dir)
    kept = (f"The newest checkpoint, {good[-1].name}, may already be diverged; best/ holds the best model "
            "from before, if any." if good else "Nothing was saved from this run.")
    raise TrainingError(
        f"The loss diverged: from step {first} to {last} it stayed around {loss:.2f}, far above "
        f"{run.guard.describe()}. The model is ruined (its loss is far worse than where it started), so "
        f"it is not saved as model/ or best/. {kept}",
        f"lower learning_rate ({_lower_rate(run.config)}), keep warmup_ratio and max_grad_norm "
        "set, and start again in a new output_dir (or delete this one's checkpoints): a rerun here resumes "
        "the diverged checkpoint.", step=last)


def _lower_rate(config: TrainConfig) -> str:
    """A learning rate to try instead: a tenth, or the task's default when the rate is far above it."""
    default = dataclasses.replace(config, learning_rate=None).lr
    if config.lr > 10 * default:
        return f"it is {config.lr:g}; try the default, {default:g}"
    return f"it is {config.lr:g}; try {config.lr / 10:g}"


def _verdict_message(run: Run, verdict: dict) -> str:
    if verdict["outcome"] in ("better", "unknown"):
        return verdict["text"]
    config = run.config
    default = dataclasses.replace(config, learning_rate=None).lr
    if verdict["outcome"] == "worse":
        return f"{verdict['text']} What to try: a lower learning_rate ({_lower_rate(config)})."
    return (f"{verdict['text']} What to try: a longer run (this one had {run.total_steps} steps), another "
            f"learning_rate (it is {config.lr:g}; the default is {default:g}), and a look at the data: labels "
            "that do not follow from the text teach nothing, and a model that predicts one class scores the "
            "majority-class baseline.")


def _log_train(run: Run) -> None:
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
        skipped_steps=state.skipped_steps, micro_batch_size=state.micro_batch_size, **_train_metrics(run),
    )


def _train_metrics(run: Run) -> dict[str, float]:
    """The task's own train-side means since the last log (Task.take_train_tally), over every process."""
    take = getattr(run.task, "take_train_tally", None)
    tally = take() if take is not None else None
    if tally is None:
        return {}
    names, sums = tally
    if run.accelerator.num_processes > 1:
        sums = run.accelerator.reduce(sums, "sum")
    rows, *values = sums.tolist()  # host sync, once per log interval as for the losses
    return {name: round(value / rows, 6) for name, value in zip(names, values, strict=True)} if rows else {}


def _compile_notes(run: Run) -> None:
    while run.compiled.notes:
        _message(run, *run.compiled.notes.pop(0))


def _message(run: Run, text: str, level: str = "info") -> None:
    run.log.write("message", text=text, level=level)
    if run.log.enabled and not run.display:  # no view attached: still say it
        print(f"workbench: {text}", file=sys.stderr if level != "info" else sys.stdout, flush=True)


def _evaluate(run: Run, candidate: bool = True) -> dict[str, float]:
    """Evaluate, log an ``eval`` event, keep the weights in best/ when they beat the best so far.

    ``candidate=False`` (the step-0 evaluation): logged like any other, never kept as best:
    the untrained start is the baseline the run is measured against, not a result of it.
    """
    acc, model, task = run.accelerator, run.model, run.task
    _check_losses(run)  # never evaluate (and maybe keep as best) weights a NaN loss has ruined
    # Eval batches start at twice the training micro-batch (no activations kept for a
    # backward pass) and are halved on out-of-memory like training steps.
    run.eval_micro_batch = min(run.eval_micro_batch or 2 * run.config.batch_size, 2 * run.state.micro_batch_size)

    def outputs_of(batch, size):
        parts = [task.eval_outputs(model, piece) for piece in split_batch(task, batch, size)]
        return tuple(torch.cat(tensors) for tensors in zip(*parts, strict=True))

    def halved(size):
        run.eval_micro_batch = size
        _message(run, f"Out of GPU memory in evaluation: retrying with eval batches of {size}.", "warn")

    model.eval()
    outputs = []
    # Under the training's autocast: the prepared model's forward has it already, but
    # generation (peft's generate calls the base model's forward) would otherwise run in fp32.
    with torch.no_grad(), acc.autocast():
        for batch in run.eval_loader:
            outputs.append(acc.gather_for_metrics(with_halving(
                lambda size, batch=batch: outputs_of(batch, size), run.eval_micro_batch, on_halve=halved,
                give_up=lambda: TrainingError("CUDA out of memory in evaluation even with batches of 1.",
                                              "use a shorter max_length or a smaller model.",
                                              step=run.state.step))))
        with run.compiled.eager():  # token-by-token decoding does not pay for compiled blocks (compile.py)
            generated = run.task.generation_metrics(model, run.tokenizer)
    model.train()
    metrics = {**run.task.metrics(outputs), **generated}
    run.state.metrics = metrics
    if hasattr(task, "baselines"):  # what a model that learned nothing scores here (engine/verdict.py)
        run.state.baselines = task.baselines(outputs)
    step = run.state.step
    run.log.write("eval", step=step,
                  epoch=round(run.state.epoch + run.state.batch_in_epoch / run.batches_per_epoch, 4), **metrics)
    if not candidate:
        run.state.base_metrics = {**metrics, "step": step}
        return metrics
    run.state.first_metrics = run.state.first_metrics or {**metrics, "step": step}
    name = f"eval_{run.config.selection_metric}"
    value, best = metrics[name], run.state.best_value
    better = best is None or (value < best if name == "eval_loss" else value > best)
    baseline = reference(name, run.state, for_best=True)
    beats_baseline = baseline is None or judge(name, value, baseline) == "better"
    if math.isfinite(value) and better and beats_baseline and checkpoint.weights_finite(acc, model):
        run.state.best_value, run.state.best_step = value, step
        _save_model(run, run.output_dir / BEST_DIR, extra={"step": step, "metrics": metrics})
    elif better and not beats_baseline and run.state.best_refused_step is None:
        run.state.best_refused_step = step  # said once: every evaluation at the baseline would repeat it
        _message(run, f"Evaluation at step {step}: {name} {value:.4g} is not better than {baseline['value']:.4g} "
                      f"for {baseline['name']} ({baseline['detail']}), so it is not kept as best/; later "
                      "evaluations are, once they beat it.", "warn")
    return metrics


# ------------------------------------------------------------------------- saving
def _save_checkpoint(run: Run) -> Path:
    """Every process saves its part (Accelerate); the main process makes it atomic."""
    _check_losses(run)  # never checkpoint weights that a NaN loss has already ruined
    if not checkpoint.weights_finite(run.accelerator, run.model):
        raise TrainingError(f"The weights contain NaN/inf at step {run.state.step}.",
                            "lower learning_rate or use precision='bf16'.", step=run.state.step)
    if run.checkpoints.on:  # a snapshot now, the files from a thread (engine/async_checkpoint.py)
        _checkpoints_committed(run, wait=True)  # at most one save in flight
        return run.checkpoints.save(run.accelerator, run.output_dir, run.state.step, asdict(run.state),
                                    run.record, keep=run.config.keep_checkpoints)
    path = checkpoint.save_checkpoint(run.accelerator, run.output_dir, run.state.step, asdict(run.state),
                                      run.record, keep=run.config.keep_checkpoints)
    run.log.write("checkpoint", step=run.state.step, path=str(path))
    return path


def _checkpoints_committed(run: Run, wait: bool) -> None:
    """The ``checkpoint`` event of each background save once its folder is committed, written
    from this thread; the writer's error (a CheckpointError for a failed write) is raised here."""
    for step, path in run.checkpoints.completed(wait=wait):
        run.log.write("checkpoint", step=step, path=str(path))


def _save_model(run: Run, directory: Path, extra: dict | None = None) -> Path:
    return checkpoint.save_model(run.accelerator, run.task, run.model, run.tokenizer, directory, extra,
                                 run_dir=run.output_dir)


def _resume(run: Run, path: Path) -> list[tuple[str, str]]:
    """Load everything from ``path`` (refused when it is another run's); returns messages to log."""
    state, messages = checkpoint.resume(run.accelerator, path, run.record)
    run.state = checkpoint.TrainState(**state)
    run.guard.start = run.state.start_loss if run.state.start_loss is not None else run.guard.start
    if not 1 <= run.state.micro_batch_size <= run.config.batch_size:
        run.state.micro_batch_size = run.config.batch_size
    return messages


def _result(run: Run, status: str, model_dir: Path | None, history: list[dict],
            verdict: dict | None = None) -> FitResult:
    best = run.output_dir / BEST_DIR
    return FitResult(output_dir=run.output_dir, model_dir=model_dir, status=status,
                     metrics=dict(run.state.metrics), history=history,
                     best_checkpoint=best if best.is_dir() else None,
                     label_names=list(run.task.identity().get("labels", [])), verdict=verdict)


def _close(run: Run) -> None:
    run.checkpoints.close()  # never release the folder while a save is being written into it
    run.log.close()
    if run.accelerator.num_processes == 1:
        # Leave the kernel as we found it: accelerate.notebook_launcher refuses to start
        # while an Accelerator's state exists in the process.
        distributed.reset_accelerate_state()
    free_memory()
