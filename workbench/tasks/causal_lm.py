"""Fine-tune a causal language model on instructions, chats or plain text (full, LoRA or QLoRA).

What the training loop asks of a task (the same methods as ``ClassificationTask``):
check the data, load tokenizer and model, tokenize the splits, pad batches, the loss,
eval outputs and metrics, save, and the checkpoint state. The rows themselves (formats,
their checks, chat templates, which tokens carry loss, the dataset and its padding
collator) are read by ``causal_lm_data.py``; this module is the task object around them.

**Batches.** Padded (``causal_lm_data.PaddingCollator``), or packed: a batch's conversations
end to end in one row, positions restarting at each, attention kept within each
(``TrainConfig.packing``; when "auto" turns it on and how: ``causal_lm_packing.py``).

**Loss.** The LM head over a 49k-152k vocabulary costs as much as several
transformer layers, and in chat data most positions are prompt tokens whose logits
would be thrown away. So the model is asked for logits only at the positions that
carry loss (``logits_to_keep`` with a boolean mask: transformers gathers those
hidden states before the head), through the model's own forward so that DDP,
FSDP and peft hooks all run. The result equals ``model(**batch).loss``.

Why ~590 lines: after ``causal_lm_data.py`` took the data, this is one Task class (model,
LoRA/QLoRA loading, loss, evaluation with generation, saving and merging). The next split:
generation metrics and the merge-on-finish into ``causal_lm_finish.py``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from workbench.config import ModelChoice, TrainConfig
from workbench.errors import ConfigError, DataError
from workbench.sources.data_checks import SPLITS, require_dataset_dict, split_with_rows
from workbench.sources.data_files import ROW_COLUMN, RowLocator
from workbench.tasks import causal_lm_loss as loss_choice
from workbench.tasks import causal_lm_packing as packing
from workbench.tasks import lora
from workbench.tasks.base import (
    enable_gradient_checkpointing,
    fingerprint,
    load_full_state,
    load_pretrained,
)
from workbench.tasks.causal_lm_data import (
    CHECK_ROWS_SHOWN,
    IGNORE,
    SIMPLE_TEMPLATE,
    CausalLMDataset,
    PaddingCollator,
    TemplateProblem,
    detect_format,
    duplicate_notes,
    encode_chat,
    encode_text,
    format_fix,
    normalize_messages,
    prompt_and_reference,
    row_problem,
    to_messages,
)

MERGED_DIR = "model_merged"  # beside model/ (the adapter) when merge_adapter is set


# --------------------------------------------------------------------------- losses
def _loss_positions(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask of positions whose next token carries loss, those next tokens in row-major order)."""
    next_labels = labels[:, 1:]
    supervised = next_labels != IGNORE
    keep = torch.zeros_like(labels, dtype=torch.bool)
    keep[:, :-1] = supervised
    return keep, next_labels[supervised]


def _model_inputs(batch: dict) -> dict:
    # Everything the collators produce except labels: the loss is computed here, not by the model.
    return {k: v for k, v in batch.items() if k != "labels"}


def supervised_logits(model, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits at the positions that carry loss [N, V], their targets [N], the keep mask [B, T])."""
    keep, targets = _loss_positions(batch["labels"])
    out = model(**_model_inputs(batch), logits_to_keep=keep, use_cache=False)
    logits = out.logits
    if logits.dim() != 2:  # an architecture that ignores a tensor logits_to_keep: gather here
        logits = logits[keep] if logits.shape[1] == keep.shape[1] else logits.reshape(-1, logits.shape[-1])
    return logits, targets, keep


def token_loss(model, batch: dict) -> torch.Tensor:
    """Mean cross-entropy over the batch's supervised tokens, logits only where they carry loss."""
    logits, targets, _ = supervised_logits(model, batch)
    # fp32 softmax: under bf16 autocast the log-sum-exp over 49k+ classes loses digits.
    return F.cross_entropy(logits.float(), targets, reduction="mean")


def fused_token_loss(model, batch: dict) -> torch.Tensor:
    """``token_loss`` through the fused linear cross-entropy (``causal_lm_loss.py``): the hidden
    states at the same positions and the head's weight, no logits tensor."""
    keep, targets = _loss_positions(batch["labels"])
    inner = _unwrap(model)
    hidden = loss_choice.hidden_at_loss_positions(model, inner, _model_inputs(batch), keep)
    return loss_choice.fused_linear_ce(hidden, inner.get_output_embeddings().weight, targets)


# ------------------------------------------------------------------------- the task
class CausalLMTask:
    """Causal-LM fine-tuning (full, LoRA, QLoRA) with any AutoModelForCausalLM."""

    name = "causal_lm"

    def __init__(self, settings: TrainConfig | None = None, **overrides):
        """``settings``: the run's TrainConfig (its causal_lm fields); ``overrides``: fields to change."""
        self.settings = dataclasses.replace(settings or TrainConfig(task=self.name), task=self.name,
                                            **overrides)
        self.format: str | None = None
        self.model_name: str | None = None
        self.template_source: str | None = None  # tokenizer | simple | custom
        self.end_ids: set[int] = set()
        self.padding_free = False
        self.packing: packing.PackingChoice | None = None  # chosen in datasets(): the lengths decide "auto"
        self.loss_path: loss_choice.LossChoice | None = None  # chosen in build_model(): the head decides "auto"
        self.dropped: dict[str, int] = {}  # rows whose supervised tokens were all truncated away
        self.parameters: dict[str, int] = {}
        self.vocab_size: int | None = None  # the LM head's outputs: ln of it is a uniform guess's loss
        self.targets: list[str] = []
        self.notes: list[tuple[str, str]] = []  # (text, level) from set-up, logged after "start"
        self.data_fingerprint: str | None = None
        self.eval_dataset: CausalLMDataset | None = None  # for the generation check

    # ---------------------------------------------------------------- data
    def check_data(self, splits) -> None:
        """Everything that can be wrong with the rows, found before any model is loaded.

        A QLoRA run on a machine that cannot do it is refused here too: before any folder is
        made or any model downloaded."""
        if self.settings.finetune == "qlora":
            lora.require_qlora_support()
        require_dataset_dict(splits)
        for split in SPLITS:
            ds = split_with_rows(splits.get(split), split)
            columns = [c for c in ds.column_names if c != ROW_COLUMN]  # not the file-row index we added
            fmt = detect_format(columns, self.settings)
            if self.format is not None and fmt != self.format:
                raise DataError(f"The train split holds {self.format} rows but {split} holds {fmt} rows.",
                                "give both splits the same columns.")
            self.format = fmt
            needed = {"messages": [self.settings.messages_column], "text": [self.settings.text_column],
                      "prompt_completion": [self.settings.prompt_column, self.settings.completion_column]}[fmt]
            missing = [c for c in needed if c not in columns]
            if missing:
                raise DataError(f"The {split} split has no column {missing[0]!r} for data_format={fmt!r}; "
                                f"its columns: {', '.join(columns)}.", format_fix(columns, self.settings, fmt))
            self._check_rows(splits, split, needed)
        self._check_generation()
        self.notes += self._system_prompt_notes(splits["train"])
        self.data_fingerprint = fingerprint(splits["train"], needed)  # resume checks it is the same data
        self.notes += duplicate_notes(splits, needed)

    def _check_rows(self, splits, split: str, needed: list[str]) -> None:
        """Every row of ``split`` can be trained on; else a DataError naming the rows in the user's file."""
        ds = splits[split]
        locate = RowLocator(splits, split)
        # The other formats' columns, when the file has them: a row of another format says so.
        others = [c for c in (self.settings.messages_column, self.settings.prompt_column,
                              self.settings.completion_column, self.settings.text_column)
                  if c in ds.column_names and c not in needed]
        problems = []  # (position in the file, row, problem)
        for i, row in enumerate(ds.select_columns(needed + others)):
            problem = row_problem(row, self.format, self.settings)
            if problem:
                problems.append((locate.position(i), i, problem))
        count = len(problems)
        bad = [f"{locate(i)}: {problem}" for _, i, problem in sorted(problems)[:CHECK_ROWS_SHOWN]]
        if bad:
            more = f" (and {count - len(bad)} more)" if count > len(bad) else ""
            raise DataError(f"{count} of {len(ds)} {split} rows cannot be trained on: " + "; ".join(bad)
                            + f"{more}.", "fix or drop those rows in the file (datasets: ds.filter(...)) "
                            "before training.")

    def _system_prompt_notes(self, ds) -> list[tuple[str, str]]:
        """Where system_prompt goes in chat rows: first, in each conversation without a system message."""
        s = self.settings
        if not s.system_prompt:
            return []
        if self.format == "text":
            raise ConfigError("system_prompt", s.system_prompt, "None for plain-text (text column) data",
                              fix="remove system_prompt: text rows are trained as they are, with no chat "
                                  "template to put a system message in; use messages or prompt/completion "
                                  "rows to train with one.")

        def has_system(value) -> bool:
            return isinstance(value, list) and any(m["role"] == "system" for m in normalize_messages(value)[0])

        own = sum(map(has_system, ds[s.messages_column if self.format == "messages" else s.prompt_column]))
        text = (f"system_prompt is put first in {len(ds) - own} of {len(ds)} train conversations"
                + (f"; {own} have a system message of their own, which is kept instead." if own else "."))
        return [(text, "info")]

    def _check_generation(self) -> None:
        """eval_generate needs a prompt to answer and a reference answer: chat or pair rows."""
        s = self.settings
        if not s.eval_generate:
            return
        if self.format == "text":
            raise ConfigError("eval_generate", s.eval_generate, "0 for plain-text (text column) data",
                              fix="set eval_generate: 0: text rows have no prompt to answer and no reference "
                                  "answer, so exact match cannot be measured (it would be nan); eval_loss "
                                  "and eval_perplexity are reported as usual.")
        if s.loss_on == "all":
            raise ConfigError("eval_generate", s.eval_generate, "0 with loss_on='all'",
                              fix="set eval_generate: 0, or loss_on: completion (exact match compares the "
                                  "answer to the supervised tokens, which are every token with loss_on='all').")

    def check_model(self, choice: ModelChoice) -> None:
        """Settings that depend on the model's layers, checked on an empty (meta-device) copy of it
        built from its config: no weights are read, so a wrong ``lora_target_modules`` is refused in
        well under a second, before anything is written or loaded. Skipped when the config cannot
        be read here (a hub id not cached, a .gguf not converted yet): the real load checks again."""
        if self.settings.finetune == "full" or not self.settings.lora_target_modules:
            return
        try:
            from transformers import AutoConfig, AutoModelForCausalLM

            config = AutoConfig.from_pretrained(str(choice.name_or_path), revision=choice.revision,
                                                local_files_only=True)
            with torch.device("meta"):
                skeleton = AutoModelForCausalLM.from_config(config)
        except Exception:  # noqa: BLE001 - any failure here is reported by the real load
            return
        lora.check_targets(skeleton, list(self.settings.lora_target_modules))

    def load_tokenizer(self, choice: ModelChoice):
        from transformers import AutoTokenizer

        tokenizer = load_pretrained(AutoTokenizer, choice)
        if tokenizer.pad_token is None:  # padding is masked by the attention mask and labels anyway
            tokenizer.pad_token = tokenizer.eos_token
        chosen = self.settings.chat_template
        if chosen == "simple":
            tokenizer.chat_template, self.template_source = SIMPLE_TEMPLATE, "simple"
        elif chosen:
            tokenizer.chat_template, self.template_source = chosen, "custom"
        elif tokenizer.chat_template:
            self.template_source = "tokenizer"
        elif self.format in ("messages", "prompt_completion"):
            raise DataError(
                f"The tokenizer of {choice.name_or_path!r} has no chat template, so {self.format} rows "
                "cannot be rendered the way the model will be prompted.",
                "pick an instruct/chat model, or set chat_template='simple' (### User / ### Assistant "
                "headers) or your own Jinja template, or train on a text column (data_format='text').")
        return tokenizer

    def datasets(self, splits, tokenizer, max_length: int, model=None):
        self.set_end_ids(tokenizer, model)
        if self.format is None:
            self.check_data(splits)
        train, self.eval_dataset = (self._encode_split(splits, s, tokenizer, max_length)
                                    for s in ("train", "validation"))
        s = self.settings  # the attention the model runs now (engine/cpu_bf16.py may have swapped it)
        self.packing = packing.choose_packing(
            s.packing, attn_implementation=getattr(getattr(model, "config", None), "_attn_implementation", None),
            cuda=torch.cuda.is_available(), lengths=train.lengths, batch_size=s.batch_size,
            group_by_length=s.group_by_length)
        self.padding_free = self.packing.on
        if self.packing.on:  # padded is the reference: said only when the run departs from it
            self.notes.append((self.packing.reason, "info"))
        return train, self.eval_dataset

    def set_end_ids(self, tokenizer, model) -> None:
        """The tokens that end an answer: EOS and the generation config's stop tokens."""
        self.end_ids = {tokenizer.eos_token_id}
        generation = getattr(model, "generation_config", None)
        stop = getattr(generation, "eos_token_id", None)
        self.end_ids |= set(stop if isinstance(stop, (list, tuple)) else [stop] if stop is not None else [])
        self.end_ids.discard(None)

    def _encode_split(self, splits, split: str, tokenizer, max_length: int) -> CausalLMDataset:
        settings, fmt, ds = self.settings, self.format, splits[split]
        locate = RowLocator(splits, split)
        all_ids, all_labels, dropped, cut = [], [], [], 0
        for i, row in enumerate(ds):
            try:
                if fmt == "text":
                    ids, labels = encode_text(tokenizer, row[settings.text_column], max_length=max_length,
                                              end_ids=self.end_ids)
                else:
                    ids, labels = encode_chat(tokenizer, to_messages(row, fmt, settings), max_length=max_length,
                                              loss_on=settings.loss_on, end_ids=self.end_ids)
            except Exception as exc:  # noqa: BLE001 - template_failure re-raises what is not the template's
                raise template_failure(exc, locate(i)) from None
            if all(t == IGNORE for t in labels[1:]):
                dropped.append(i)  # the answer lies beyond max_length: a row with no loss teaches nothing
                continue
            # Cut inside an answer: the end-of-turn token is gone, the model never learns to stop there.
            cut += fmt != "text" and len(ids) == max_length and labels[-1] not in (IGNORE, *self.end_ids)
            all_ids.append(ids)
            all_labels.append(labels)
        self.dropped[split] = len(dropped)
        if not all_ids:
            raise DataError(f"Every row of the {split} split loses its answer to truncation at "
                            f"max_length={max_length} tokens (e.g. {locate(dropped[0])}).",
                            "raise max_length, or shorten the prompts.")
        if dropped:
            where = ", ".join(locate(i) for i in sorted(dropped, key=locate.position)[:CHECK_ROWS_SHOWN])
            self.notes.append((f"{len(dropped)} of {len(ds)} {split} rows were left out: their answer starts "
                               f"after max_length={max_length} tokens ({where}{', ...' if len(dropped) > 3 else ''}"
                               "). Raise max_length to keep them.", "warn"))
        if cut and cut * 2 >= len(all_ids):
            cut_short = (f"every {split} answer is cut at max_length={max_length} tokens before its" if cut == len(all_ids)
                         else f"{cut} of {len(all_ids)} {split} answers are cut at max_length={max_length} tokens "
                              "before their")
            self.notes.append((f"{cut_short} end-of-turn token: the model learns to start answers but not to stop "
                               f"them. Raise max_length (longest row here: {max(map(len, all_ids))}+ tokens).", "warn"))
        return CausalLMDataset(all_ids, all_labels)

    def collator(self, tokenizer):
        if self.padding_free:  # one row per batch, no pad tokens, no cross-example attention
            return packing.packed_collator(self.packing.flash)
        return PaddingCollator(tokenizer.pad_token_id, pad_to_multiple_of=8 if torch.cuda.is_available() else None)

    # ---------------------------------------------------------------- model
    def build_model(self, choice: ModelChoice, tokenizer, config=None):
        """The model ready to train: adapters on a frozen base (lora/qlora), or all weights (full)."""
        from transformers import AutoModelForCausalLM

        settings = self.settings
        checkpointing = bool(getattr(config, "gradient_checkpointing", False))
        kwargs: dict[str, Any] = {"dtype": torch.float32}
        if settings.finetune == "qlora":
            lora.require_qlora_support()
            compute = _half_dtype()
            kwargs = {"dtype": compute, "quantization_config": lora.quantization_config(compute),
                      "device_map": {"": torch.cuda.current_device()}}
        elif settings.finetune == "lora" and _frozen_base_dtype(getattr(config, "precision", "auto")):
            # The base is frozen: no master weights or AdamW state needed, so 16-bit halves its memory;
            # on a CPU it also spares autocast re-casting every frozen weight at each forward (which
            # makes token-by-token generation ~1.6x slower than with a bf16 base). Adapters stay fp32.
            kwargs["dtype"] = _frozen_base_dtype(config.precision)
        model = load_pretrained(AutoModelForCausalLM, choice, **kwargs)
        self.model_name = choice.name_or_path
        head = model.get_output_embeddings()
        self.vocab_size = int(head.weight.shape[0]) if head is not None else getattr(model.config, "vocab_size", None)
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        if checkpointing:
            model.config.use_cache = False  # the KV cache is useless in training and conflicts with recomputation
            if settings.finetune != "qlora":  # prepare_model_for_kbit_training does it for QLoRA
                enable_gradient_checkpointing(model)
        if settings.finetune == "full":
            self.targets = []
        else:
            model = lora.wrap(model, r=settings.lora_r, alpha=settings.lora_alpha,
                              dropout=settings.lora_dropout,
                              targets=list(settings.lora_target_modules or []) or None,
                              quantized=settings.finetune == "qlora", gradient_checkpointing=checkpointing)
            self.targets = sorted(model.peft_config["default"].target_modules)
            if checkpointing:
                # Frozen embeddings give the first checkpointed segment no input that needs grad;
                # reentrant checkpointing would then drop the adapters' gradients.
                model.enable_input_require_grads()
        self.choose_loss(model)
        self.parameters = {"total": sum(p.numel() for p in model.parameters()),
                           "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad)}
        return model

    def choose_loss(self, model) -> loss_choice.LossChoice:
        """Fused linear cross-entropy or the sparse head (``TrainConfig.fused_loss``), said once in the messages."""
        cuda = torch.cuda.is_available()
        self.loss_path = loss_choice.choose_loss(
            self.settings.fused_loss, cuda=cuda, liger=cuda and loss_choice.liger_available(),
            head_issue=loss_choice.head_problem(model), distributed=self.settings.distributed)
        if self.loss_path.fused or (cuda and self.settings.fused_loss == "auto"):  # silent on the reference path
            self.notes.append((self.loss_path.reason, "info"))  # on a CPU, where it could never run
        return self.loss_path

    # ---------------------------------------------------------------- steps
    def rows(self, batch: dict) -> int:
        if packing.is_packed(batch):  # one row holding every example
            return int((batch["position_ids"] == 0).sum())
        return int(batch["input_ids"].shape[0])

    def split(self, batch: dict, size: int) -> list[dict]:
        """Micro-batches of at most ``size`` examples (after an out-of-memory).

        A padded batch is cut by rows. A flattened one (one row, examples end to end) is cut
        at example boundaries, with the FlashAttention sequence offsets recomputed per piece.
        """
        if not packing.is_packed(batch):
            return [{k: v[i:i + size] for k, v in batch.items()} for i in range(0, self.rows(batch), size)]
        positions = batch["position_ids"][0]
        starts = [*(positions == 0).nonzero()[:, 0].tolist(), positions.numel()]
        pieces = []
        for first in range(0, len(starts) - 1, size):
            bounds = starts[first:first + size + 1]
            left, right = bounds[0], bounds[-1]
            piece = {k: batch[k][:, left:right] for k in ("input_ids", "labels", "position_ids")}
            if "cu_seq_lens_q" in batch:
                offsets = torch.tensor([b - left for b in bounds], dtype=torch.int32,
                                       device=batch["cu_seq_lens_q"].device)
                longest = max(b - a for a, b in zip(bounds, bounds[1:], strict=False))
                piece.update(cu_seq_lens_q=offsets, cu_seq_lens_k=offsets,
                             max_length_q=longest, max_length_k=longest)
            pieces.append(piece)
        return pieces

    def units(self, batch: dict) -> torch.Tensor:
        """Supervised tokens: what the loss averages over, so accumulation weights by them.

        A tensor on the batch's device, not an int: .item() here would cost a host sync per micro-batch.
        """
        return (batch["labels"][:, 1:] != IGNORE).sum()

    def loss(self, model, batch: dict) -> torch.Tensor:
        if self.loss_path is not None and self.loss_path.fused:
            return fused_token_loss(model, batch)
        return token_loss(model, batch)

    def eval_outputs(self, model, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-row (summed loss, supervised token count), for a token-weighted mean across processes."""
        logits, targets, keep = supervised_logits(model, batch)
        losses = F.cross_entropy(logits.float(), targets, reduction="none")
        if packing.is_packed(batch):
            row_of, rows = packing.example_of(batch, keep)  # per conversation of the packed row
        else:
            rows = keep.shape[0]
            # The row of each kept position, in row-major order as logits_to_keep gathered them. Not
            # keep.nonzero(): its size is known only on the device (a host sync per eval batch), while
            # output_size, the logits' row count, is already known here.
            row_of = torch.repeat_interleave(torch.arange(rows, device=keep.device), keep.sum(1),
                                             output_size=losses.shape[0])
        summed = torch.zeros(rows, device=losses.device).index_add_(0, row_of, losses)
        counts = torch.zeros(rows, device=losses.device).index_add_(0, row_of, torch.ones_like(losses))
        return summed, counts

    def metrics(self, outputs: list[tuple[torch.Tensor, ...]]) -> dict[str, float]:
        summed, counts = (torch.cat(parts).double() for parts in zip(*outputs, strict=True))
        loss = (summed.sum() / counts.sum().clamp(min=1)).item()
        return {"eval_loss": loss, "eval_perplexity": math.exp(min(loss, 50.0))}  # exp(50): overflow guard

    def generation_metrics(self, model, tokenizer) -> dict[str, float]:
        """``eval_exact_match`` on ``eval_generate`` eval rows; {} when that is 0 (the default)."""
        if not self.settings.eval_generate or self.eval_dataset is None:
            return {}
        return self.generation_check(model, tokenizer, self.eval_dataset)

    def generation_check(self, model, tokenizer, dataset: CausalLMDataset, limit: int | None = None,
                         max_new_tokens: int | None = None) -> dict[str, float]:
        """``eval_exact_match``: greedy answers to the first ``limit`` eval prompts vs the references.

        The prompt is each row up to its first supervised token (the role header
        included, as at inference); the reference is the supervised text without
        special tokens. Both are compared after stripping whitespace. One row at a
        time: no left padding to get right, and ``limit`` keeps it cheap.
        """
        limit = self.settings.eval_generate if limit is None else limit
        max_new_tokens = max_new_tokens or self.settings.eval_max_new_tokens
        model = _unwrap(model)
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        hits = rows = 0
        with torch.inference_mode():
            for index in range(min(limit, len(dataset))):
                prompt, reference = prompt_and_reference(dataset[index])
                if prompt is None:
                    continue
                ids = torch.tensor([prompt], device=device)
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)
                answer = tokenizer.decode(out[0, len(prompt):], skip_special_tokens=True)
                hits += answer.strip() == tokenizer.decode(reference, skip_special_tokens=True).strip()
                rows += 1
        model.train(was_training)
        return {"eval_exact_match": hits / rows if rows else float("nan")}

    # ---------------------------------------------------------------- saving
    def save_model(self, model, tokenizer, directory: str | os.PathLike,
                   state_dict: dict | None = None) -> Path:
        """LoRA: the adapter folder (PeftModel.from_pretrained loads it); full: a whole model folder.

        ``state_dict`` (Accelerate's gathered one under FSDP) may hold the whole peft
        model: PeftModel.save_pretrained keeps only the adapter's entries of it.
        """
        directory = Path(directory)
        _unwrap(model).save_pretrained(directory, state_dict=state_dict)
        tokenizer.save_pretrained(directory)
        return directory

    def finish(self, model_dir: Path, write_dir) -> list[tuple[str, str]]:
        """With ``merge_adapter``: ``model_merged/`` beside ``model_dir``, the base with the adapter merged in."""
        if not self.settings.merge_adapter:
            return []
        if self.settings.finetune == "full":
            return [(f"merge_adapter: finetune='full' trains every weight, so {model_dir} is already a "
                     "plain model; nothing to merge.", "info")]
        merged = model_dir.parent / MERGED_DIR
        # 16-bit on a GPU (as the base trained), fp32 on the CPU
        dtype = _half_dtype() if torch.cuda.is_available() else torch.float32
        write_dir(merged, lambda tmp: lora.merge_adapter_folder(model_dir, tmp, dtype=dtype))
        return [(f"Merged model (base + adapter) saved in {merged}: "
                 f"pipeline('text-generation', model={str(merged)!r}) loads it.", "info")]

    def merge_and_save(self, model, tokenizer, directory: str | os.PathLike) -> Path:
        """A plain model folder with the adapter merged in; ``pipeline("text-generation", model=...)`` loads it."""
        model = _unwrap(model)
        if not lora.is_peft(model):
            return self.save_model(model, tokenizer, directory)
        return lora.merge_and_save(model, tokenizer, directory)

    def model_state(self, model) -> dict[str, torch.Tensor]:
        """The trainable weights only: the adapter for LoRA (a few MB), every weight for full."""
        model = _unwrap(model)
        if lora.is_peft(model):
            return lora.adapter_state(model)
        return model.state_dict()

    def load_model_state(self, model, state: dict[str, torch.Tensor]) -> None:
        model = _unwrap(model)
        if lora.is_peft(model):
            lora.load_adapter_state(model, state)
            return
        load_full_state(model, state, "resume with the model and finetune setting the run was started with.")

    def num_classes(self) -> int | None:
        """The vocabulary the LM head predicts over (its output size, padding rows included)."""
        return self.vocab_size

    def identity(self) -> dict:
        """Facts that make a run this run, for the run record (and a resume check)."""
        s = self.settings
        facts = {"task": self.name, "model": self.model_name, "finetune": s.finetune,
                 "data_fingerprint": self.data_fingerprint,
                 "data_format": self.format, "loss_on": s.loss_on, "chat_template": self.template_source,
                 "parameters": dict(self.parameters), "padding_free": self.padding_free,
                 "dropped_rows": dict(self.dropped)}
        if s.finetune != "full":
            facts["lora"] = {"r": s.lora_r, "alpha": s.lora_alpha, "dropout": s.lora_dropout,
                             "target_modules": list(self.targets)}
        return facts


# -------------------------------------------------------------------------- helpers
def template_failure(exc: Exception, where: str) -> Exception:
    """What to raise when encoding the row at ``where`` raised ``exc``: the template's own failures
    (TemplateProblem; jinja2's TemplateError, raise_exception() in a template) with the row named,
    anything else as it is."""
    if isinstance(exc, TemplateProblem):
        return TemplateProblem(f"{exc.message} (first seen on {where})", exc.fix)
    if "jinja" not in type(exc).__module__ and "TemplateError" not in type(exc).__name__:
        return exc
    return DataError(f"The chat template fails on {where}: {exc}",
                     "fix that row (many templates require user/assistant turns to alternate and "
                     "allow one system message, first), or use another chat_template.")


def _frozen_base_dtype(precision: str) -> torch.dtype | None:
    """The dtype of a frozen LoRA base for a run in ``precision`` (as resolved: the engine passes
    what runs); None: fp32. On a GPU 16-bit unless fp32 was asked for; on a CPU bf16 when bf16 runs."""
    if precision == "fp32":
        return None
    if torch.cuda.is_available():
        return _half_dtype()
    return torch.bfloat16 if precision == "bf16" else None


def _half_dtype() -> torch.dtype:
    return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float16


def _unwrap(model):
    # DDP/FSDP/torch.compile wrappers keep the real model in .module / ._orig_mod
    while hasattr(model, "module") or hasattr(model, "_orig_mod"):
        model = getattr(model, "module", None) or model._orig_mod
    return model
