"""Checkpoints written off the training thread: ``async_checkpoints=True/"auto"``.

A synchronous save (``checkpoint.save_checkpoint``) stops training while Accelerate writes
the weights and the optimizer state: seconds for a few hundred MB on a GPU, time the GPU
sits idle. Here the training thread only takes a *snapshot*: every tensor the checkpoint
holds is copied to CPU memory (on CUDA: pinned, non-blocking copies and one synchronize),
and every RNG stream is read at that moment. One background thread then writes the
snapshot in exactly the layout ``accelerator.save_state`` writes (Accelerate's own
``save_accelerator_state``, given the snapshot), replaces the RNG file with the snapshot's
streams (the function reads them itself, at the time the thread runs, when training has
drawn more), and commits the folder as a synchronous save does (``checkpoint._finish``:
fsync, manifest last, atomic rename), then prunes. ``load_checkpoint`` and ``resume`` read
it unchanged.

At most one save is in flight: the next save, and the end of ``fit``, wait for it. An error
in the writer is raised on the training thread at that wait (``CheckpointError`` for a
failed write, as a synchronous save raises). The thread never writes events: the training
thread writes the ``checkpoint`` event once the folder is committed (``completed``).

"auto" turns it on only on CUDA with one process and no FSDP: on a CPU the writer would
compete with training for the same cores; with several processes or FSDP every rank holds
part of the state and the saves must agree across ranks (collectives), which a thread per
rank does not do. ``True`` forces it (tests use it on CPU) except in those two cases.
"""

from __future__ import annotations

import copy
import shutil
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workbench.engine import checkpoint
from workbench.errors import CheckpointError


def choose(setting: bool | str, device_type: str, world_size: int, distributed: str) -> tuple[bool, str, str | None]:
    """(on, reason, note): whether saves run off the training thread, why, and an info message
    when ``True`` could not be honoured (``None`` otherwise). Pure: tests call it directly."""
    multi = (f"{world_size} processes" if world_size > 1 else None) or ("FSDP" if distributed == "fsdp" else None)
    if setting is False:
        return False, "async_checkpoints=False", None
    if multi:
        reason = f"synchronous with {multi}: every rank's part of a checkpoint is saved together"
        note = (f"async_checkpoints=True: checkpoints are written synchronously with {multi} (every rank "
                "saves its part of the state together with the others).") if setting is True else None
        return False, reason, note
    if setting is True:
        return True, "async_checkpoints=True", None
    if device_type == "cuda":
        return True, "auto: CUDA, one process", None
    return False, f"auto: off on {device_type} (a writer thread would compete with training for the cores)", None


def unsupported(accelerator) -> str | None:
    """Why this accelerator's state cannot be snapshotted here (None: it can)."""
    from accelerate.data_loader import IterableDatasetShard
    from accelerate.utils import DistributedType

    if accelerator.distributed_type not in (DistributedType.NO, DistributedType.MULTI_GPU):
        return f"Accelerate's {accelerator.distributed_type} saves its own state"
    if accelerator._custom_objects:
        return "objects registered for checkpointing"
    for loader in accelerator._dataloaders:
        if getattr(loader, "use_stateful_dataloader", False) or isinstance(loader.dataset, IterableDatasetShard):
            return "a data loader whose state is saved"
    return None


# ------------------------------------------------------------------------ snapshot
class _Frozen:
    """Stands in for an optimizer, scheduler or scaler: ``state_dict()`` is the snapshot."""

    def __init__(self, state: Any):
        self._state = state

    def state_dict(self) -> Any:
        return self._state


@dataclass
class Snapshot:
    weights: list  # one state dict per model, as the save-state hooks (keep_task_weights) left it
    optimizers: list
    schedulers: list
    scaler: Any  # the fp16 scaler's state dict, or None
    rng: dict  # random_states_<rank>.pkl, as Accelerate writes it
    process_index: int
    step: int  # Accelerate's own step counter
    save_on_each_node: bool


def _to_cpu(obj: Any, pinned: bool, memo: dict) -> Any:
    """A copy of ``obj`` with every tensor copied to CPU; tensors that share memory (tied
    weights) stay shared, so safetensors drops the duplicate as it does for the live ones."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        key = None
        if t.numel() and t.device.type != "meta":
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
            if key in memo:
                return memo[key]
        if pinned and t.device.type == "cuda":
            out = torch.empty_like(t, device="cpu", pin_memory=True)
            out.copy_(t, non_blocking=True)
        else:
            out = t.to("cpu", copy=True)
        if key is not None:
            memo[key] = out
        return out
    if isinstance(obj, dict):
        items = [(k, _to_cpu(v, pinned, memo)) for k, v in obj.items()]
        return OrderedDict(items) if isinstance(obj, OrderedDict) else dict(items)
    if isinstance(obj, list):
        return [_to_cpu(v, pinned, memo) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_to_cpu(v, pinned, memo) for v in obj)
    return copy.deepcopy(obj)


def _rng_states(step: int) -> dict:
    """What ``save_accelerator_state`` puts in random_states_<rank>.pkl, read now."""
    import random

    from accelerate.utils import get_torch_accelerator_backend

    states = {"step": step, "random_state": random.getstate(), "numpy_random_seed": np.random.get_state(),
              "torch_manual_seed": torch.get_rng_state()}
    device_type, device_module = get_torch_accelerator_backend()
    if device_type is not None:  # the same branches as Accelerate's
        key = f"torch_{device_type}_manual_seed"
        if device_module is torch.accelerator:
            if hasattr(torch.accelerator, "random"):
                states[key] = torch.accelerator.random.get_rng_state()
            else:
                states[key] = torch.get_device_module(device_type).get_rng_state()
        elif device_type == "mps":
            states[key] = device_module.get_rng_state()
        else:
            states[key] = device_module.get_rng_state_all()
    return states


def snapshot(accelerator, tmp: Path) -> Snapshot:
    """Everything ``accelerator.save_state(tmp)`` would write, copied now. Training thread only."""
    acc = accelerator
    rng = _rng_states(acc.step)  # first: nothing below draws random numbers, but nothing may
    weights = [None] * len(acc._models)
    if not acc._save_model_state_pre_hook:  # without keep_task_weights: what save_state saves
        weights = [acc.get_state_dict(model, unwrap=False) for model in acc._models]
    for hook in acc._save_model_state_pre_hook.values():  # keep_task_weights: all, or the adapter's
        hook(acc._models, weights, str(tmp))
    pinned = torch.cuda.is_available() and torch.cuda.is_initialized()
    memo: dict = {}
    snap = Snapshot(
        weights=[_to_cpu(w, pinned, memo) for w in weights],
        optimizers=[_to_cpu(opt.state_dict(), pinned, memo) for opt in acc._optimizers],
        schedulers=[copy.deepcopy(s.state_dict()) for s in acc._schedulers],
        scaler=_to_cpu(acc.scaler.state_dict(), pinned, memo) if acc.scaler is not None else None,
        rng=rng, process_index=acc.state.process_index, step=acc.step,
        save_on_each_node=acc.project_configuration.save_on_each_node)
    if pinned:
        torch.cuda.synchronize()  # the non-blocking copies have landed before the thread reads them
    acc.project_configuration.iteration += 1  # as save_state does
    return snap


def write_snapshot(snap: Snapshot, tmp: Path) -> None:
    """The files ``accelerator.save_state(tmp)`` writes, from ``snap``. Any thread."""
    from accelerate.checkpointing import save_accelerator_state
    from accelerate.utils import RNG_STATE_NAME

    save_accelerator_state(str(tmp), snap.weights, [_Frozen(s) for s in snap.optimizers],
                           [_Frozen(s) for s in snap.schedulers], [], snap.process_index, snap.step,
                           _Frozen(snap.scaler) if snap.scaler is not None else None,
                           save_on_each_node=snap.save_on_each_node, safe_serialization=True)
    # save_accelerator_state read the RNG streams as they are now; the checkpoint's are the snapshot's.
    torch.save(snap.rng, tmp / f"{RNG_STATE_NAME}_{snap.process_index}.pkl")


# -------------------------------------------------------------------------- writer
@dataclass
class Writer:
    """At most one checkpoint being written by a background thread."""

    on: bool
    reason: str
    _thread: threading.Thread | None = None
    _pending: tuple[int, Path] | None = None  # (step, final folder) of the save in flight
    _error: BaseException | None = None
    _done: list = field(default_factory=list)  # (step, folder) committed, not yet reported

    def describe(self) -> dict:
        """The start event's ``async_checkpoints`` field."""
        return {"on": self.on, "reason": self.reason}

    def save(self, accelerator, output_dir, step: int, state: dict, record: dict, keep: int | None) -> Path:
        """Snapshot now, write in the background; waits for the previous save first. Returns
        the folder the checkpoint will be committed as (``completed`` says when it is)."""
        self._wait()
        root = checkpoint.checkpoints_dir(output_dir)
        final = root / checkpoint.step_dir_name(step)
        tmp = root / f".tmp-{final.name}"  # the synchronous save's name
        snap = snapshot(accelerator, tmp)
        state, record = copy.deepcopy(state), copy.deepcopy(record)

        def write() -> None:
            try:
                root.mkdir(parents=True, exist_ok=True)
                if tmp.exists():
                    shutil.rmtree(tmp)
                tmp.mkdir()
                write_snapshot(snap, tmp)
                checkpoint._finish(tmp, final, step, state, record)
                if keep is not None:
                    checkpoint.prune(output_dir, keep)
                self._done.append((step, final))
            except OSError as exc:
                shutil.rmtree(tmp, ignore_errors=True)
                self._error = CheckpointError(f"Could not write checkpoint for step {step} in {root}: {exc}.",
                                              "free disk space or choose another output_dir.")
                self._error.__cause__ = exc
            except BaseException as exc:  # raised on the training thread at the next wait
                shutil.rmtree(tmp, ignore_errors=True)
                self._error = exc

        self._pending = (step, final)
        self._thread = threading.Thread(target=write, name=f"workbench-checkpoint-{step}", daemon=True)
        self._thread.start()
        return final

    @property
    def pending(self) -> bool:
        return self._thread is not None

    def _wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread, self._pending = None, None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def completed(self, *, wait: bool) -> list[tuple[int, Path]]:
        """(step, folder) of the saves committed since the last call; with ``wait``, after
        the one in flight is. Raises the writer's error, once."""
        if not wait and self._thread is not None and self._thread.is_alive():
            return []  # still writing: its folder is not committed yet
        self._wait()
        done, self._done = self._done, []
        return done

    def close(self) -> None:
        """Wait for the save in flight, whatever became of it (the run is ending anyway)."""
        if self._thread is not None:
            self._thread.join()
        self._thread, self._pending, self._error = None, None, None
