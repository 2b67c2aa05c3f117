"""``workbench evaluate MODEL... --tasks arc_easy``: ``workbench.evaluate`` from a terminal.

Each MODEL is a run folder, a model folder, an adapter folder or a hub id; ``NAME=MODEL`` names
its column (``base=Qwen/Qwen2.5-0.5B-Instruct tuned=outputs/05_llm_lora``). Prints the table;
a run's results also go into its folder (``evaluation/``), its card and ``workbench runs``.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("models", metavar="MODEL", nargs="+",
                        help="a run folder, model folder, adapter folder or hub id; NAME=MODEL names it")
    parser.add_argument("--tasks", default="heldout",
                        help="comma-separated harness tasks (arc_easy,hellaswag), local task names with "
                             "--include-path, or heldout (the run's held-out split; default)")
    parser.add_argument("--include-path", action="append", metavar="DIR", help="a folder of task YAMLs (repeatable)")
    parser.add_argument("--limit", type=float, help="examples per task (a fraction below 1): for quick looks")
    parser.add_argument("--num-fewshot", type=int, help="few-shot examples (default: each task's own)")
    parser.add_argument("--apply-chat-template", action="store_true", help="render prompts with the chat template")
    parser.add_argument("--system-instruction", help="a system prompt for every request")
    parser.add_argument("--batch-size", default="8", help="rows per forward pass, or 'auto' (default 8)")
    parser.add_argument("--device", help="cuda, cuda:1, cpu (default: cuda when there is one)")
    parser.add_argument("--dtype", default="auto", help="auto (the checkpoint's own, as lm_eval's CLI), float32, "
                        "bfloat16, float16")
    parser.add_argument("--checkpoint", choices=("final", "best"), default="final", help="which model of a run")
    parser.add_argument("--log-samples", action="store_true", help="also save every prompt and answer")
    parser.add_argument("--data", help="for heldout: the run's data when it trained on an in-memory dataset; "
                        "for a classifier: a labelled file to score")
    parser.add_argument("--text-columns", help="the classifier's text column(s), comma-separated")
    parser.add_argument("--label-column", help="the classifier's label column")
    parser.add_argument("--no-save", action="store_true", help="do not write into the run folders")


def _models(values: list[str]):
    if len(values) == 1 and "=" not in values[0]:
        return values[0]
    named = {}
    for value in values:
        name, sep, model = value.partition("=")
        if not sep or Path(value).exists():
            name, model = Path(value).name or value, value
        named[name] = model
    return named


def run_cli(args: argparse.Namespace) -> int:
    from workbench.evaluation.harness import evaluate
    from workbench.evaluation.progress import ConsoleProgress

    limit = args.limit
    if limit is not None and limit >= 1:
        limit = int(limit)
    batch = int(args.batch_size) if str(args.batch_size).isdigit() else args.batch_size
    view = ConsoleProgress()
    result = evaluate(_models(args.models), [t.strip() for t in args.tasks.split(",") if t.strip()],
                      include_path=args.include_path, limit=limit, num_fewshot=args.num_fewshot,
                      apply_chat_template=args.apply_chat_template, system_instruction=args.system_instruction,
                      batch_size=batch, device=args.device, dtype=args.dtype, checkpoint=args.checkpoint,
                      log_samples=args.log_samples, data=args.data,
                      text_columns=args.text_columns.split(",") if args.text_columns else None,
                      label_column=args.label_column, save_results=not args.no_save, listeners=[view])
    print(result.format())
    return 0
