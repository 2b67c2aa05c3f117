"""Compilation: the repeated blocks of a model compiled in place, bucketed lengths, the eager fallback.

The loop calls this module through one seam, ``prepare`` in ``setup.prepare``; with
``compile=False`` (or ``"auto"`` where it does not pay) nothing here touches the model and
the run is the eager reference every test compares against.

- **Regional compilation.** A transformer is one block class repeated (30
  ``LlamaDecoderLayer`` in SmolLM2-135M, 12 ``BertLayer`` in bert-base). Each block is
  compiled in place (``module.compile()``): every instance runs the same code, so dynamo
  compiles it once and the other 29 reuse it (parameters are graph inputs, not constants);
  twice under LoRA, since the first block's input comes from the frozen embeddings and needs
  no gradient, the others' do (tested). The tasks' forwards pass ``use_cache=False``: a KV
  cache would give every block a guard of its own (its layer index), and the blocks past
  dynamo's recompile limit would run eagerly (measured: 20 graphs, the limit, on 30 layers;
  2 without the cache). Dynamo only logs that; the run turns it into a warning of its own
  (``_RecompileLimitWatch``), so slow steps come with their reason.
  Compiling the whole model instead costs minutes and its graph breaks on the sparse LM
  head (``logits_to_keep`` with a mask). In place, because ``torch.compile(module)`` returns
  an ``OptimizedModule`` whose state-dict keys gain ``_orig_mod.``: checkpoints, adapters and
  a resume would no longer match an eager run's. That is also why accelerate's
  ``compile_regions`` is not used (it returns such wrappers); its in-place
  ``compile_regions_fsdp2`` also compiles every leaf outside the blocks (embeddings, the
  head), which buys nothing and compiles more. Its ``is_repeated_blocks`` finds the blocks.
- **Lengths.** Under CUDA graphs (``reduce-overhead``) each batch is padded up to the next
  of a few lengths, 8, 16, 24, 32, 48, 64, 96, 128, ... (each at most 1.5x the one before) and
  ``max_length`` (``Bucketed``: the task's own collator pads, to the bucket instead of its
  longest row): a graph is recorded per shape, so shapes must be few, and a batch carries at
  most ~1/3 more padding than its longest row needs. In the other modes dynamo makes the
  length symbolic after its second one, so any length reuses the graph: batches are only
  padded to a multiple of 8 (``Aligned``), which the kernels want (padded to its longest row,
  a batch of 93 tokens made inductor compile again for 20 s; aligned, none did). Buckets there
  padded the LoRA stand-in's 70-104-token chats to 96 and 128: 8% fewer steps/s than a
  multiple of 8 (benchmarks/step_overhead.py). A single multiple of 64, tried first, ran
  short rows (SST-2's are ~10-25 tokens) at 3-6x their length. The recompile limit is raised
  to cover the shapes (training and evaluation are separate graphs: grad mode and dropout).
  Under CUDA graphs each training step starts with ``torch.compiler.cudagraph_mark_step_begin``
  (``Compiled.step_begins``): the memory of a step's graph outputs is reused by the next step,
  and torch otherwise guesses where a step begins (at any compiled call with no backward
  pending); the loop knows.
- **Fallback.** Compile errors surface at the first forward pass that meets the block, not
  at ``module.compile()``. The model's outermost forward is wrapped: on a dynamo or
  inductor error the blocks are put back to eager, the reason is kept for a message, and
  the same forward runs again, eagerly. The backward graph is lowered with the forward
  (``force_non_lazy_backward_lowering``), so its errors surface there too.
- **Random numbers on a CPU.** Inductor's C++ kernels set up a Philox generator for every
  number they draw; there the blocks draw with aten's generator instead (``compile_arguments``):
  faster, and the compiled blocks' dropout masks are the eager ones from the same seed.
- **Generation** stays eager (``eager()``): token-by-token decoding with a growing KV cache
  meets a new shape and new cache objects at every token, which compiled blocks would
  recompile for and not win back on a few greedy answers.
"""

from __future__ import annotations

import bisect
import contextlib
import copy
import logging
import time
import weakref
from dataclasses import dataclass, field

import torch

SMALLEST_BUCKET = 8  # tokens: tensor-core friendly; every bucket is a multiple of it (but max_length)
ALIGNMENT = 8  # tokens: what lengths are padded to a multiple of when they need not be few
CUDA_GRAPH_MODES = ("reduce-overhead",)  # the modes that record a CUDA graph per shape


def wanted(setting, device_type: str) -> tuple[bool, str]:
    """(compile or not, why): the one owner of what ``compile="auto"`` means."""
    if setting is True:
        return True, "compile=True"
    if setting is False:
        return False, "compile=False"
    if device_type == "cuda":
        return True, ("compile='auto' on CUDA: a step there is bound by kernel launches, which "
                      "compiled blocks fuse (benchmarks/step_overhead.py)")
    return False, (f"compile='auto' on {device_type}: the first steps would spend minutes compiling on "
                   "a few CPU cores, which short CPU runs never win back; compile=True forces it")


def choose_mode(mode: str, device_type: str, bucketed: bool) -> str:
    """torch.compile's mode. ``auto``: CUDA graphs (``reduce-overhead``) on CUDA when batch
    lengths can be bucketed (a graph is recorded per shape, so shapes must be few), else ``default``."""
    if mode != "auto":
        return mode
    return "reduce-overhead" if device_type == "cuda" and bucketed else "default"


def bucket_lengths(max_length: int) -> tuple[int, ...]:
    """The lengths batches are padded up to: 8, 16, then 1.5x and 2x steps (24, 32, 48, 64, 96,
    128, ...) below ``max_length``, and ``max_length`` itself (the model's positions may end there)."""
    lengths, n = [], SMALLEST_BUCKET
    while n < max_length:
        lengths.append(n)
        n = 2 * n if n < 2 * SMALLEST_BUCKET else (n * 3 // 2 if n & (n - 1) == 0 else n * 4 // 3)
    return (*lengths, max_length)


def bucket_for(longest: int, lengths: tuple[int, ...]) -> int:
    """The shortest bucket that holds a row of ``longest`` tokens (rows are cut at max_length)."""
    return lengths[min(bisect.bisect_left(lengths, longest), len(lengths) - 1)]


class Aligned:
    """The task's collator, padding each batch to a multiple of ``ALIGNMENT`` tokens (or more,
    if the task's own collator pads to more). A class, not a closure: a DataLoader's workers get
    it pickled."""

    def __init__(self, collate):
        self.multiple = max(ALIGNMENT, collate.pad_to_multiple_of or 0)
        self.collate = copy.copy(collate)  # the task's own stays as it was: the eager reference
        self.collate.pad_to_multiple_of = self.multiple

    def __call__(self, features: list[dict]):
        return self.collate(features)


class Bucketed:
    """The task's collator, padding each batch to its bucket length instead of its longest row.

    The task's collators pad to a multiple of ``pad_to_multiple_of``; set to the bucket (which is
    at least the batch's longest row), that multiple is the bucket. A class, not a closure: a
    DataLoader's workers get it pickled."""

    def __init__(self, collate, max_length: int):
        self.collate, self.lengths = collate, bucket_lengths(max_length)

    def __call__(self, features: list[dict]):
        longest = max((len(v) for f in features for v in f.values()
                       if isinstance(v, (list, tuple)) or getattr(v, "ndim", 0) >= 1), default=1)
        self.collate.pad_to_multiple_of = bucket_for(longest, self.lengths)
        return self.collate(features)


def compile_arguments(mode: str, device_type: str) -> dict:
    """``torch.compile``'s arguments for ``mode`` on ``device_type``: the mode's own inductor options
    (torch.compile takes a mode or options, not both; a mode is a set of options) and two of ours.

    - Sibling low-rank adapters are fused (``fuse_adapters``: q, k, v's LoRA products as one).
    - On a CPU, in the default mode, inductor draws random numbers with aten's generator
      (``fallback_random``) instead of its own kernels: those set up a Philox generator for every
      number they draw (``normalized_rand_cpu``), and the compiled bert stand-in's dropouts cost
      more than its eager ones (docs/benchmarks.md). On CUDA inductor's fused Philox dropout is the
      fast one and stays.

    Both are this compile's options, not torch's process-wide settings, so other compiled code is
    untouched.
    """
    from torch._inductor import list_mode_options

    from .fuse_adapters import FUSE_SIBLING_ADAPTERS

    options = {**list_mode_options(mode), "pre_grad_custom_pass": FUSE_SIBLING_ADAPTERS}
    if device_type == "cpu" and mode == "default":
        options["fallback_random"] = True
    return {"options": options}


def repeated_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules of the model's outermost lists of one repeated class (its layers)."""
    from accelerate.utils.other import is_repeated_blocks

    found: list[torch.nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():
        if id(module) in inside:
            continue
        if is_repeated_blocks(module):
            found.extend(module)
            inside.update(id(m) for block in module for m in block.modules())
    return found


@dataclass
class Compiled:
    """What was compiled, and what became of it; ``on`` False: the eager run, untouched."""

    on: bool
    reason: str
    mode: str | None = None
    blocks: list = field(default_factory=list)
    block_name: str = ""
    buckets: tuple[int, ...] | None = None  # the lengths batches are padded up to; None: not bucketed
    multiple: int | None = None  # or the multiple their lengths are padded to; None: as the task pads
    collate: object = None  # the collator to load batches with (bucketed, aligned, or the task's own)
    failure: str | None = None  # why it fell back to eager, once it did
    notes: list = field(default_factory=list)  # (text, level) for the run's messages
    first_step_s: float | None = None
    limit_hit: bool = False  # dynamo's recompile limit was hit (noted once)

    def describe(self) -> dict:
        """The start event's ``compile`` field."""
        return {"on": self.on, "reason": self.reason, "mode": self.mode, "blocks": len(self.blocks),
                "block": self.block_name,
                "buckets": list(self.buckets) if self.buckets else None, "multiple": self.multiple}

    def step_begins(self) -> None:
        """Called before each training step: under CUDA graphs, a new iteration of their memory."""
        if self.on and self.mode in CUDA_GRAPH_MODES:
            torch.compiler.cudagraph_mark_step_begin()

    def restore_eager(self, error: BaseException) -> None:
        for block in self.blocks:
            block._compiled_call_impl = None  # what module.compile() set: back to the eager __call__
        torch._dynamo.reset()
        cause = getattr(error, "inner_exception", None) or error.__cause__ or error  # the compiler's own error
        lines = str(cause).strip().splitlines()
        self.failure = f"{type(cause).__name__}: {lines[0] if lines else ''}"
        self.notes.append((f"Compilation failed ({self.failure[:300]}); training continues eagerly, as with "
                           "compile=False. Set compile=False to skip the attempt.", "warn"))
        self.on = False

    @contextlib.contextmanager
    def eager(self):
        """Compiled blocks run eagerly inside (generation: see the module's docstring)."""
        if not self.on:
            yield
            return
        with torch.compiler.set_stance("force_eager"):
            yield

    def timed_first_step(self, step_fn, *args):
        """``step_fn(*args)``; the first time, noting how long it took (compiling included)."""
        if not self.on or self.first_step_s is not None:
            return step_fn(*args)
        start = time.perf_counter()
        result = step_fn(*args)
        self.first_step_s = time.perf_counter() - start
        if self.on:  # not fallen back during the step
            self.notes.append((f"Compiled {len(self.blocks)} {self.block_name} blocks ({self.mode} mode): the first "
                               f"step took {self.first_step_s:.1f} s, compiling included; later steps reuse it. "
                               "compile=False skips it.", "info"))
        return result


class _RecompileLimitWatch(logging.Handler):
    """Dynamo's "hit config.recompile_limit" warning, as a note of the run that is compiling.

    Past the limit dynamo runs the frame eagerly and only logs it: the blocks after the limit
    would train eagerly with nothing in the run's messages to say why its steps are slow.
    Not ``fail_on_recompile_limit_hit``: that would throw away the blocks already compiled."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.watched = lambda: None  # a weak reference: a finished run's model is not kept alive by this

    def watch(self, compiled: Compiled) -> None:
        self.watched = weakref.ref(compiled)

    def emit(self, record: logging.LogRecord) -> None:
        compiled = self.watched()
        if compiled is None or not compiled.on or compiled.limit_hit or not str(record.msg).startswith(
                "torch._dynamo hit config."):
            return
        try:
            limit_type, limit, function, reason = record.args[:4]
        except (TypeError, ValueError):
            limit_type, limit, function, reason = "recompile_limit", "?", "?", record.getMessage()
        compiled.limit_hit = True
        compiled.notes.append((
            f"compile: dynamo hit its {limit_type} ({limit}) on {function}, so the calls past the limit "
            f"run eagerly: steps are slower than fully compiled ones. Each new graph came from a guard that "
            f"differs between {compiled.block_name} blocks or batches (last: {str(reason)[:200]}); "
            "TORCH_LOGS=recompiles lists them. compile=False skips compiling.", "warn"))


_LIMIT_WATCH = _RecompileLimitWatch()
logging.getLogger("torch._dynamo.convert_frame").addHandler(_LIMIT_WATCH)  # dynamo's logger for the warning


def is_compile_error(exc: BaseException) -> bool:
    """An error of dynamo or inductor (a failed compilation), not of the model or the data."""
    module = type(exc).__module__ or ""
    return module.startswith(("torch._dynamo", "torch._inductor", "torch._functorch"))


def _guard_forward(model: torch.nn.Module, compiled: Compiled) -> None:
    """Wrap the outermost forward: a compile error restores the eager blocks and runs it again."""
    forward = model.forward

    def forward_with_fallback(*args, **kwargs):
        if not compiled.on:
            return forward(*args, **kwargs)
        try:
            return forward(*args, **kwargs)
        except Exception as exc:
            if not is_compile_error(exc):
                raise
            compiled.restore_eager(exc)
        return forward(*args, **kwargs)

    model.forward = forward_with_fallback  # an instance attribute: the state dict is untouched


def prepare(model: torch.nn.Module, collate, setting, mode: str, device_type: str, max_length: int) -> Compiled:
    """Compile ``model``'s repeated blocks in place and bucket or align ``collate``'s lengths; or nothing.
    Batches are loaded with the returned ``Compiled.collate``."""
    on, reason = wanted(setting, device_type)
    if not on:
        return Compiled(on=False, reason=reason, collate=collate)
    blocks = repeated_blocks(model)
    if not blocks:
        return Compiled(on=False, reason=f"{type(model).__name__} has no repeated blocks to compile", collate=collate,
                        notes=[(f"compile: {type(model).__name__} has no list of repeated layers to compile; "
                                "the run is eager.", "warn")])
    bucketable = hasattr(collate, "pad_to_multiple_of")  # the task's collator pads; flattened batches have none
    chosen = choose_mode(mode, device_type, bucketed=bucketable)
    buckets = multiple = None
    if bucketable and chosen in CUDA_GRAPH_MODES:
        collate = Bucketed(collate, max_length)
        buckets = collate.lengths
    elif bucketable:
        collate = Aligned(collate)
        multiple = collate.multiple
    # Each bucket's length, for training and for evaluation, plus a margin before dynamo gives up
    # (otherwise dynamo makes the length symbolic after its second one, so 8 is plenty).
    shapes = len(buckets) if buckets else 8
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 2 * shapes + 4)
    # Lower the backward with the forward, so a failing backward compile is caught by the forward's fallback.
    torch._functorch.config.force_non_lazy_backward_lowering = True
    for block in blocks:
        block.compile(**compile_arguments(chosen, device_type))
    compiled = Compiled(on=True, reason=reason, mode=chosen, blocks=blocks, block_name=type(blocks[0]).__name__,
                        buckets=buckets, multiple=multiple, collate=collate)
    _guard_forward(model, compiled)
    _LIMIT_WATCH.watch(compiled)  # the run now compiling (one per process at a time)
    return compiled
