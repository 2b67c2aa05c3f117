"""Build one run: tokenizer, model, batches, optimizer, schedule and event log -> ``Run``.

``train.fit`` checks everything that can be wrong first, then calls ``prepare`` once; the loop
(``train.py``) touches only what the ``Run`` holds. The order here matters where a library's
does: the model is loaded in the precision that runs, compiled (``compile.py``) before
Accelerate wraps it, and the optimizer is made from the unwrapped model and prepared with it
in one call (FSDP2 swaps its parameters there: ``distributed.fsdp_plugin``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from workbench.config import TrainConfig
from workbench.engine import async_checkpoint, batching, checkpoint, cpu_bf16, distributed
from workbench.engine import batch_size as auto_batch
from workbench.engine.compile import Compiled
from workbench.engine.compile import prepare as prepare_compile
from workbench.engine.divergence import DivergenceGuard
from workbench.engine.events import EventLog
from workbench.engine.optim import make_optimizer, make_scheduler
from workbench.engine.precision import PrecisionChoice
from workbench.engine.stopping import StopRequest
from workbench.errors import TrainingError
from workbench.sources import gguf, model_checks
from workbench.tasks.base import Task


@dataclass
class Run:
    """Everything the loop touches, built once by ``prepare``."""

    config: TrainConfig
    task: Task
    accelerator: Any
    model: Any
    # The prepared model's parameters, listed once: clipping reads them every step, and walking
    # the module tree for them (model.parameters()) cost ~5 ms a step on the LoRA stand-in.
    # No default: an empty list would clip nothing, silently.
    parameters: list
    optimizer: Any
    scheduler: Any
    train_loader: Any
    eval_loader: Any
    sampler: batching.LengthGroupedBatchSampler
    tokenizer: Any
    log: EventLog
    record: dict
    precision: PrecisionChoice  # what runs (.precision: fp32 | fp16 | bf16) and why (.reason)
    total_steps: int
    batches_per_epoch: int
    state: checkpoint.TrainState
    stop: StopRequest
    notes: list = field(default_factory=list)  # (text, level) from set-up, logged after "start"
    display: bool = False  # a listener shows messages; otherwise they are printed
    pending_losses: list = field(default_factory=list)  # (step, device tensor) since last log
    last_log: tuple[float, int, int] = (0.0, 0, 0)  # (time, step, samples) at the last train event
    samples: int = 0  # rows seen by this process since the start of this call
    rng_before_step: dict | None = None  # RNG states while a step is in progress
    eval_micro_batch: int = 0  # rows per eval forward pass (halved on out-of-memory)
    guard: DivergenceGuard | None = None  # stops a run whose loss went far above its start (finite weights)
    train_dataset: Any = None  # the tokenized training rows and their collator: the guard measures
    collate: Any = None  # the start on them (divergence.measure_start)
    compiled: Compiled = field(default_factory=lambda: Compiled(on=False, reason="not prepared"))  # engine/compile.py
    checkpoints: async_checkpoint.Writer = field(  # checkpoints written off the training thread, or not
        default_factory=lambda: async_checkpoint.Writer(on=False, reason="not prepared"))

    @property
    def output_dir(self) -> Path:
        return Path(self.config.output_dir)



def prepare(model_choice, splits, task: Task, config: TrainConfig, precision: PrecisionChoice,
             stop: StopRequest, listeners: Sequence[Callable], data_facts: dict | None = None,
             batch_choice: auto_batch.BatchChoice | None = None) -> Run:
    from accelerate.utils import set_seed

    # bf16/fp16: Accelerate runs the model's forward under torch.autocast and keeps the weights,
    # gradients and AdamW state in fp32 (the 16-bit copies are made per op, or cached per step).
    accelerator = distributed.make_accelerator(config, precision.precision)
    if batch_choice is not None and distributed.differs_across_processes(accelerator, config.batch_size):
        raise TrainingError(f"batch_size auto chose different micro-batches on different GPUs ({batch_choice.reason})",
                            "set batch_size to a number: every process must use the same one.")
    set_seed(config.seed)  # the new head's initial weights depend on it
    tokenizer = task.load_tokenizer(model_choice)
    # The task sees the precision that runs ("bf16"), not "auto": a frozen LoRA base is loaded in it.
    model = task.build_model(model_choice, tokenizer, dataclasses.replace(config, precision=precision.precision))
    if precision.precision == "bf16" and not torch.cuda.is_available():
        cpu_bf16.attention_in_fp32(model)  # CPU flash attention is 2-2.6x slower in bf16 than in fp32
    notes = []
    max_length, note = model_checks.effective_max_length(config.max_length, model.config, model_choice.name_or_path)
    if note:  # capped to the model's positions, before tokenizing and recording the run
        config = dataclasses.replace(config, max_length=max_length)
        notes.append((note, "warn"))
    with accelerator.local_main_process_first():  # datasets' cache is written once per node
        train_ds, eval_ds = task.datasets(splits, tokenizer, config.max_length, model)
    notes = [*task.notes, *notes]  # the task's, from checking and encoding the data and loading the model
    if batch_choice is not None:
        notes.append((batch_choice.reason, "info"))
    if precision.warning:
        notes.append((precision.warning, "warn"))
    collate = task.collator(tokenizer)
    # Compiled blocks (or nothing: compile=False, "auto" on a CPU), and the collator padding to buckets.
    compiled = prepare_compile(model, collate, config.compile, config.compile_mode, accelerator.device.type,
                               config.max_length)
    collate = compiled.collate
    sampler = batching.LengthGroupedBatchSampler(train_ds.lengths, config.batch_size, seed=config.seed,
                                                 group_by_length=config.group_by_length)
    eval_sampler = batching.LengthGroupedBatchSampler(eval_ds.lengths, config.batch_size * 2, shuffle=False)
    train_loader = batching.make_loader(train_ds, sampler, collate, config.num_workers, config.seed)
    eval_loader = batching.make_loader(eval_ds, eval_sampler, collate, config.num_workers, config.seed)
    # Made from the unwrapped model and prepared with it in one call: under FSDP2 Accelerate swaps
    # the optimizer's parameters for the sharded ones there (distributed.fsdp_plugin says why).
    optimizer = make_optimizer(model, config)
    distributed.shard_blocks(accelerator, model)
    model, optimizer, train_loader, eval_loader = accelerator.prepare(model, optimizer, train_loader, eval_loader)

    batches_per_epoch = len(train_loader)  # this process's share
    steps_per_epoch = math.ceil(batches_per_epoch / config.gradient_accumulation_steps)
    total_steps = config.max_steps or math.ceil(config.num_epochs * steps_per_epoch)
    scheduler = make_scheduler(config.scheduler, optimizer, int(config.warmup_ratio * total_steps), total_steps)
    scheduler = accelerator.prepare(scheduler)  # saved and restored with the accelerator's state
    checkpoint.keep_task_weights(accelerator, task)
    on, reason, note = async_checkpoint.choose(config.async_checkpoints, accelerator.device.type,
                                               accelerator.num_processes, config.distributed)
    if on and (why := async_checkpoint.unsupported(accelerator)):
        on, reason, note = False, f"synchronous: {why}", f"async_checkpoints: synchronous saves ({why})."
    notes += [(note, "info")] if note else []

    log = EventLog(config.output_dir, enabled=accelerator.is_main_process)
    for listener in listeners if accelerator.is_main_process else ():
        log.add_listener(listener)
    record = checkpoint.run_record(asdict(config), seed=config.seed, precision=precision.precision,
                                   world_size=accelerator.num_processes,
                                   extra={"precision_reason": precision.reason,
                                          "model": model_choice.name_or_path,
                                          "model_content": gguf.content_identity(model_choice.name_or_path),
                                          "data": data_facts or {}, **task.identity(),
                                          "batch_size_auto": batch_choice.record() if batch_choice else None})
    return Run(config=config, task=task, accelerator=accelerator, model=model, parameters=list(model.parameters()),
                optimizer=optimizer, scheduler=scheduler, train_loader=train_loader, eval_loader=eval_loader, sampler=sampler,
                tokenizer=tokenizer, log=log, record=record, precision=precision, total_steps=total_steps,
                batches_per_epoch=batches_per_epoch, state=checkpoint.TrainState(micro_batch_size=config.batch_size),
                stop=stop, notes=notes + compiled.notes, display=bool(listeners), train_dataset=train_ds,
                collate=collate, compiled=compiled, checkpoints=async_checkpoint.Writer(on=on, reason=reason),
                guard=DivergenceGuard(task.num_classes(), total_steps, language_model=task.name == "causal_lm",
                                      rows_per_step=config.batch_size * config.gradient_accumulation_steps
                                      * accelerator.num_processes))
