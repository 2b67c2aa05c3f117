"""How long an epoch of fine-tuning takes on this CPU: the model picker's estimate when there is no GPU.

The work of one training row is counted from the model's shape, the rate from this CPU::

    matmul weights  N = parameters - vocabulary x hidden (the token embeddings are a lookup)
    FLOPs per token 6 N for a full fine-tune (2 N forward, 4 N backward: input and weight
                    gradients); 4 N for LoRA/QLoRA (the frozen weights need no weight gradient)
                    + 12 L s h for attention (QK^T and AV, forward and backward)
    seconds/row     tokens x FLOPs per token / (matmul rate x EFFICIENCY)
    tokens          a row's mean text length / 4 characters + 3 special tokens when the data
                    is known (dynamic padding trains on about that), else max_length

The matmul rate is measured here, once per process (~30 ms), in the precision the run
will use: fp32, or bf16 autocast where ``precision="auto"`` picks it because the CPU
computes bf16 natively (``workbench.engine.precision``). EFFICIENCY is the share of that
rate a real training step reaches, from issue 28's measurement on 2 AMD EPYC cores: a
MiniLM step at batch 32 x 64 tokens (134 GFLOP) took 840 ms in fp32 and 405 ms under bf16
autocast, against a measured 190 / 400 GFLOP/s for the matmul: 0.84 and 0.83.

An estimate to plan by (within a factor of about 1.5 on an idle machine, more where the
characters per token differ from English); other processes on the same cores slow the run,
not the estimate.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

EFFICIENCY = 0.8  # a training step's share of the matmul rate (see above)


@dataclass(frozen=True)
class CpuTimeEstimate:
    """Seconds per training row on this CPU, in the precision a run would use."""

    precision: str  # fp32 | bf16: what the run would compute in
    reason: str  # why: "auto: bf16, this CPU computes it natively (AVX512-BF16)"
    seq_len: int
    row_tokens: int  # tokens of a typical row (seq_len when the data is not known)
    flops_per_row: float
    seconds_per_row: float
    fp32_seconds_per_row: float  # the same in fp32, for comparison
    rows: int | None = None  # training rows per epoch, when a dataset is chosen

    @property
    def epoch_seconds(self) -> float | None:
        return None if not self.rows else self.rows * self.seconds_per_row

    def describe(self) -> str:
        if self.rows:
            amount = f"about {_duration(self.epoch_seconds)} per epoch of {self.rows:,} rows"
            fp32 = self.rows * self.fp32_seconds_per_row
        else:
            amount = f"about {_duration(1000 * self.seconds_per_row)} per 1,000 training rows"
            fp32 = 1000 * self.fp32_seconds_per_row
        length = f"about {self.row_tokens}" if self.row_tokens < self.seq_len else f"up to {self.seq_len}"
        text = f"On this CPU in {self.precision} ({self.reason}): {amount} of {length} tokens"
        if self.precision != "fp32":
            text += f"; fp32 would take about {_duration(fp32)}"
        return text + "."


def _duration(seconds: float) -> str:
    if seconds < 0.1:
        return "under 0.1 s"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def tokens_from_chars(chars: float, seq_len: int) -> int:
    """Tokens of a row of ``chars`` characters, at most ``seq_len`` (``seq_len`` when 0: unknown)."""
    return seq_len if chars <= 0 else max(1, min(seq_len, round(chars / 4) + 3))


def mean_text_chars(dataset, columns: list[str], sample: int = 500) -> float:
    """Mean characters of ``columns`` together over the first ``sample`` rows (0.0 without columns)."""
    columns = [c for c in columns if c in dataset.column_names]
    if not columns or not dataset.num_rows:
        return 0.0
    rows = dataset.select(range(min(sample, dataset.num_rows)))
    return sum(len(str(row[c])) for row in rows for c in columns) / rows.num_rows


def flops_per_row(info: Any, seq_len: int, finetune: str = "full") -> float:
    """Training FLOPs of one row of ``seq_len`` tokens (the module docstring's count)."""
    hidden, layers = info.hidden_size or 0, info.num_layers or 0
    weights = max(info.num_parameters - (info.vocab_size or 0) * hidden, info.num_parameters // 10)
    per_token = (6 if finetune == "full" else 4) * weights + 12 * layers * seq_len * hidden
    return float(per_token * seq_len)


@functools.lru_cache(maxsize=2)
def cpu_rate(bf16: bool) -> float:
    """FLOP/s a matmul reaches on this CPU (fp32 or bf16 autocast), measured once per process."""
    from workbench.engine.precision import matmul_rate

    return matmul_rate(bf16)


def estimate_cpu_time(info: Any, *, seq_len: int, precision: str = "auto", rows: int | None = None,
                      row_tokens: int | None = None, finetune: str = "full", facts: Any = None,
                      rate=None) -> CpuTimeEstimate:
    """Time per epoch (``rows`` given) or per 1,000 rows of fine-tuning ``info`` (a ModelInfo) here,
    rows of ``row_tokens`` tokens (default ``seq_len``).

    ``precision`` is resolved as a run on this CPU resolves it (``facts``: a DeviceFacts for
    another CPU, tests); ``rate(bf16) -> FLOP/s`` is measured here unless given.
    """
    from workbench.engine.precision import DeviceFacts, choose_precision, cpu_bf16

    if facts is None:
        cpu = cpu_bf16()
        facts = DeviceFacts(cuda=False, bf16=cpu.native, evidence=cpu.evidence)
    choice = choose_precision(precision, facts)
    rate = rate or cpu_rate
    row_tokens = min(row_tokens or seq_len, seq_len)
    work = flops_per_row(info, row_tokens, finetune)
    fp32 = work / (rate(False) * EFFICIENCY)
    seconds = fp32 if choice.precision == "fp32" else work / (rate(True) * EFFICIENCY)
    return CpuTimeEstimate(precision=choice.precision, reason=choice.reason, seq_len=seq_len, row_tokens=row_tokens,
                           flops_per_row=work, seconds_per_row=seconds, fp32_seconds_per_row=fp32,
                           rows=rows or None)
