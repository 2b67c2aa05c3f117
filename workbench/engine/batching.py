"""From tokenized rows to batches: sampling, loading, and the windows of one optimizer step.

Tasks tokenize once, up front, without padding (``tasks/classification_data.py``).
Each batch is padded only to its own longest row (dynamic padding, by
transformers' ``DataCollatorWithPadding``), and with
``group_by_length`` rows of similar length are batched together, so little
compute is spent on pad tokens. The sampler's order depends only on (seed, epoch),
so a resumed run sees exactly the batches the interrupted one would have.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import DataLoader, Sampler

MEGABATCH_FACTOR = 50  # length grouping sorts within windows of 50 batches: random, yet little padding


# -------------------------------------------------------------------------- sampling
class LengthGroupedBatchSampler(Sampler[list[int]]):
    """Shuffled batches of indices whose order depends only on (seed, epoch).

    With ``group_by_length``, indices are shuffled, cut into windows of
    ``MEGABATCH_FACTOR`` batches, sorted by length inside each window, batched, and
    the batches shuffled again; the batch holding the longest row comes first so
    an out-of-memory shows up at the first step, not an hour in.
    Without ``shuffle`` (evaluation) batches are taken in length order.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, *, seed: int = 0,
                 shuffle: bool = True, group_by_length: bool = True):
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.drop_last = False  # read by Accelerate when it shards batches across processes
        self.seed = seed
        self.shuffle = shuffle
        self.group_by_length = group_by_length
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return math.ceil(len(self.lengths) / self.batch_size)

    def _batches(self, order: list[int]) -> list[list[int]]:
        return [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]

    def __iter__(self) -> Iterator[list[int]]:
        n, lengths = len(self.lengths), self.lengths
        if not self.shuffle:
            order = sorted(range(n), key=lambda i: -lengths[i]) if self.group_by_length else list(range(n))
            yield from self._batches(order)
            return
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(n, generator=generator).tolist()
        if not self.group_by_length:
            yield from self._batches(order)
            return
        window = self.batch_size * MEGABATCH_FACTOR
        batches: list[list[int]] = []
        for start in range(0, n, window):
            chunk = sorted(order[start:start + window], key=lambda i: -lengths[i])
            batches.extend(self._batches(chunk))
        batch_order = torch.randperm(len(batches), generator=generator).tolist()
        batches = [batches[i] for i in batch_order]
        longest = max(range(len(batches)), key=lambda b: lengths[batches[b][0]])
        batches[0], batches[longest] = batches[longest], batches[0]
        yield from batches


# --------------------------------------------------------------------------- loading
def default_num_workers(num_workers: int | None) -> int:
    if num_workers is not None:
        return num_workers
    # On a GPU, workers collate the next batches while the GPU computes. On a CPU they
    # compete with the model for the same cores and their fork costs seconds.
    return 2 if torch.cuda.is_available() else 0


def make_loader(dataset, batch_sampler, collate, num_workers: int | None, seed: int) -> DataLoader:
    """A DataLoader over ``batch_sampler``'s batches; ``num_workers=None``: 2 on CUDA, 0 on CPU."""
    workers = default_num_workers(num_workers)
    return DataLoader(
        dataset, batch_sampler=batch_sampler, collate_fn=collate, num_workers=workers,
        # Workers are forked once for the run, not once per epoch (each fork copies a
        # process that holds the model); they end with the loader when fit returns.
        persistent_workers=workers > 0,
        pin_memory=torch.cuda.is_available(),  # page-locked memory: faster, asynchronous copies
        # Worker seeds come from this generator, not the global RNG, so creating a
        # loader never shifts the dropout random stream (exact resume).
        generator=torch.Generator().manual_seed(seed),
    )


def step_windows(loader, sampler, accelerator, state, accumulation: int):
    """Lists of loader batches, one list per optimizer step, continuing from ``state``
    (its ``epoch`` and ``batch_in_epoch``, which the loop advances).

    The sampler order depends only on (seed, epoch) and already-seen batches are
    skipped, so a resumed run gets the same batches as an uninterrupted one.
    """
    while True:
        sampler.set_epoch(state.epoch)
        loader.set_epoch(state.epoch)
        batches = accelerator.skip_first_batches(loader, state.batch_in_epoch) if state.batch_in_epoch else loader
        window = []
        for batch in batches:
            window.append(batch)
            if len(window) == accumulation:
                yield window
                window = []
        if window:
            yield window
