"""The reference model's log-probabilities of each pair's answers: computed once, kept with the run.

DPO and IPO read, for every pair, the summed log-probabilities of its chosen and rejected
answers under the reference model. Those are fixed numbers (the reference does not train),
yet computing them inside each step costs a forward pass per step (about a quarter of a LoRA
step's compute) and, at every evaluation, the same pass again over the same held-out pairs.
``precompute_reference`` (TRL's ``precompute_ref_log_probs``) computes them once, before the
first step, in one pass without gradients, and writes them to ``reference_logps.pt`` in the
run folder; a resumed run reads that file, so it uses exactly the numbers the uninterrupted
run used (bit-exact resume) and does not pay for the pass again.

``"auto"``: the held-out pairs always (every evaluation reads the same ones); the train pairs
when the run goes through them at least twice, or once with full fine-tuning. Measured
(``benchmarks/preference_vs_trl.py``, SmolLM2-135M, LoRA, 2 CPU cores): the pass costs about what
the per-step forwards it replaces cost over one epoch (26.8 s against 18.0 s saved in the steps),
so it pays from the second epoch on; with full fine-tuning it pays at once in memory, since
once both splits are cached the frozen reference copy is released (training holds one model,
not two). ``True``: both; ``False``: neither (each step and each evaluation computes its own,
as TRL does by default).

The pass runs in eval mode (no dropout: the numbers do not depend on the random stream), with
the adapter off (or on the frozen copy), under the run's mixed precision, in the evaluation's
length-ordered batches. Under DDP each process computes every N-th batch and a sum over the
processes gives each the whole table. The file is named by what its numbers depend on (the
model and its content, the precision, ``finetune``, and every pair's token ids): a file from
other settings is not read, and is replaced.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from workbench.tasks.preference_loss import PairLogps

FILE = "reference_logps.pt"
SPLITS = ("train", "validation")


@dataclass
class ReferenceTable:
    """Per pair (train pairs first, then held-out ones, by ``pair_index``): the reference's
    summed log-probabilities and token counts of the chosen and rejected answers."""

    values: torch.Tensor  # [pairs, 4]: chosen sum, rejected sum, chosen tokens, rejected tokens
    cached: dict[str, bool] = field(default_factory=dict)  # split -> its pairs are in ``values``

    def lookup(self, batch: dict, split: str) -> PairLogps | None:
        if not self.cached.get(split):
            return None
        rows = self.values[batch["pair_index"]]  # a gather on the device: no host sync
        return PairLogps(rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3])


def wanted(setting, train_pairs: int, rows_trained: int, full_copy: bool = False) -> dict[str, bool]:
    """Which splits to cache: ``setting`` True/False, or "auto" (module docstring); ``full_copy``:
    the reference is a frozen copy of the model (full fine-tuning), released once all is cached."""
    if setting == "auto":
        return {"train": rows_trained >= (1 if full_copy else 2) * train_pairs, "validation": True}
    return dict.fromkeys(SPLITS, bool(setting))


def identity(datasets: dict, facts: dict) -> str:
    """A hash of what the reference's numbers depend on: ``facts`` and every pair's tokens."""
    digest = hashlib.sha256(repr(sorted(facts.items())).encode())
    for split in SPLITS:
        for pair in datasets[split].pairs:
            for part in pair:
                digest.update(torch.tensor(part, dtype=torch.int64).numpy().tobytes())
                digest.update(b"|")
        digest.update(split.encode())
    return digest.hexdigest()[:24]


def load(run_dir: Path, key: str, device) -> ReferenceTable | None:
    """The table saved in ``run_dir`` by a run with the same ``key``, or None."""
    path = Path(run_dir) / FILE
    if not path.is_file():
        return None
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - a torn or foreign file: computed again, then replaced
        return None
    if not isinstance(saved, dict) or saved.get("key") != key:
        return None
    return ReferenceTable(saved["values"].to(device), dict(saved["cached"]))


def save(run_dir: Path, key: str, table: ReferenceTable) -> None:
    path = Path(run_dir) / FILE
    temporary = path.with_name(f".{FILE}.tmp")
    torch.save({"key": key, "values": table.values.cpu(), "cached": table.cached}, temporary)
    os.replace(temporary, path)  # a kill mid-write leaves the old file or none, never half of one


def compute(accelerator, forward, datasets: dict, collate, batch_size: int, cached: dict[str, bool], *,
            halving, progress: bool = True) -> tuple[ReferenceTable, float]:
    """One pass without gradients over the pairs of each split ``cached`` names.

    ``forward(batch) -> PairLogps`` is the reference's forward; returns the table and the
    seconds the pass took. ``halving`` is the engine's ``with_halving`` (passed in: tasks do
    not import the engine): an out-of-memory halves the batch and starts the pass again.
    """
    from tqdm.auto import tqdm

    from workbench.errors import TrainingError

    total = sum(len(datasets[s]) for s in SPLITS)
    rank, world = accelerator.process_index, accelerator.num_processes
    began = time.perf_counter()

    def attempt(size: int) -> torch.Tensor:
        values = torch.zeros(total, 4, device=accelerator.device)
        work = [(split, indices) for split in SPLITS if cached[split]
                for indices in _longest_first(datasets[split].lengths, size)]
        mine = work[rank::world]
        bar = tqdm(mine, desc="reference log-probabilities", unit="batch", leave=False,
                   disable=not (progress and accelerator.is_main_process) or len(mine) < 20)
        with torch.no_grad(), accelerator.autocast():
            for split, indices in bar:
                batch = collate([datasets[split][i] for i in indices])
                batch = {k: v.to(accelerator.device) for k, v in batch.items()}
                logps = forward(batch)
                values[batch["pair_index"]] = torch.stack(
                    [logps.chosen, logps.rejected, logps.chosen_tokens, logps.rejected_tokens], 1).float()
        if world > 1:
            values = accelerator.reduce(values, "sum")  # each pair was computed by one process
        return values

    values = halving(attempt, max(1, batch_size), on_halve=lambda size: None,
                          give_up=lambda: TrainingError(
                              "CUDA out of memory computing the reference log-probabilities even with batches of 1.",
                              "use a shorter max_length, or precompute_reference=False.", step=0))
    return ReferenceTable(values, dict(cached)), time.perf_counter() - began


def _longest_first(lengths: list[int], size: int) -> list[list[int]]:
    """Batches of ``size`` indices by decreasing length: little padding, and an out-of-memory
    shows at the first batch rather than the last."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return [order[i:i + size] for i in range(0, len(order), size)]
