"""Preference tuning of a causal LM on (prompt, chosen, rejected) pairs: DPO, IPO, SimPO, ORPO.

What a LLaMA-class user does after supervised fine-tuning: make the chosen answers more likely
than the rejected ones. ``PreferenceTask`` is ``CausalLMTask`` (the same model loading, LoRA /
QLoRA, chat templates, saving, merging and export) with its own rows (``preference_data.py``),
loss (``preference_loss.py``) and metrics.

**The reference model, without a second copy.** DPO and IPO compare each answer's
log-probability under the policy with its log-probability under the model as it was before
this training. With LoRA or QLoRA that model is the same weights with the adapter switched off
(peft's ``disable_adapter()``): one extra forward pass without gradients per step, no memory
for a second model. Full fine-tuning keeps a frozen copy of the starting weights (twice the
weights' memory; said when the run starts). SimPO and ORPO need no reference.

**A batch** holds each pair's chosen and rejected rows padded to one length; both go through
the model as one batch of twice the rows, logits only at the answers' tokens (the sparse LM
head of the causal-LM task). The engine's micro-batch splitting after an out-of-memory cuts
by pairs. Packing and the fused loss do not apply: the losses read per-answer sums.

**Metrics** (each evaluation): ``eval_loss`` (the preference loss), ``eval_reward_accuracy``
(the share of held-out pairs whose chosen answer gets the higher reward; ties count half),
``eval_rewards_chosen`` / ``eval_rewards_rejected`` / ``eval_reward_margin`` and the policy's
mean log-probabilities of the answers, ``eval_logps_chosen`` / ``eval_logps_rejected`` (the
"finished run whose chosen answers became no more likely" shows there). The verdict judges the
held-out reward accuracy against chance (0.5) by two standard errors; ``best/`` is chosen by it.
"""

from __future__ import annotations

import contextlib
import copy
import math

import torch
import torch.nn.functional as F

from workbench.config import ModelChoice
from workbench.errors import ConfigError, DataError
from workbench.sources.data_checks import SPLITS, require_dataset_dict, split_with_rows
from workbench.sources.data_files import ROW_COLUMN, RowLocator
from workbench.tasks import lora
from workbench.tasks import preference_loss as losses
from workbench.tasks import preference_reference as reference
from workbench.tasks.base import fingerprint
from workbench.tasks.causal_lm import CausalLMTask, _unwrap, supervised_logits, template_failure
from workbench.tasks.causal_lm_data import CHECK_ROWS_SHOWN, duplicate_notes
from workbench.tasks.preference_data import (
    PairCollator,
    PreferenceDataset,
    answer_tokens,
    both_halves,
    detect_pair_format,
    encode_pair,
    split_pair,
)

# Written beside the loss in each train event: the means over the train pairs since the last log.
TRAIN_METRICS = ("reward_accuracy", "rewards_chosen", "rewards_rejected", "reward_margin",
                 "logps_chosen", "logps_rejected")


class PreferenceTask(CausalLMTask):
    """Preference tuning (``preference_loss``: dpo | ipo | simpo | orpo) of any AutoModelForCausalLM."""

    name = "preference"

    def __init__(self, settings=None, **overrides):
        super().__init__(settings, **overrides)
        self.pair_format: str | None = None
        self.columns: list[str] = []
        self.reference_model = None  # full fine-tuning only: the frozen starting weights
        self.cut: dict[str, int] = {}  # rows whose answers lost tokens to max_length
        self._train_pairs = 0
        self._tally: torch.Tensor | None = None  # train-side sums since the last log (TRAIN_METRICS)
        self.reference_table: reference.ReferenceTable | None = None  # precomputed (preference_reference.py)
        self._autocast = contextlib.nullcontext  # the run's mixed precision, for the frozen reference copy

    # ---------------------------------------------------------------- data
    def check_data(self, splits) -> None:
        """Every pair can teach a preference; else a DataError naming the rows in the user's file."""
        s = self.settings
        if s.finetune == "qlora":
            lora.require_qlora_support()
        require_dataset_dict(splits)
        for split in SPLITS:
            ds = split_with_rows(splits.get(split), split,
                                 "pass a DatasetDict with 'train' and 'validation' splits (held-out pairs "
                                 "measure the reward accuracy).")
            columns = [c for c in ds.column_names if c != ROW_COLUMN]
            fmt = detect_pair_format(columns, ds[0], s)
            if self.pair_format is not None and fmt != self.pair_format:
                raise DataError(f"The train split holds {self.pair_format} pairs but {split} holds {fmt} pairs.",
                                "give both splits the same columns.")
            self.pair_format = fmt
            self.columns = [c for c in (s.prompt_column, s.chosen_column, s.rejected_column) if c in columns]
            self._check_pairs(splits, split)
        # The chat template is needed for every format but raw text (CausalLMTask.load_tokenizer reads it).
        self.format = "text" if self.pair_format == "implicit_text" else "messages"
        self.data_fingerprint = fingerprint(splits["train"], self.columns)
        self.notes += duplicate_notes(splits, self.columns)

    def _check_pairs(self, splits, split: str) -> None:
        ds, locate = splits[split], RowLocator(splits, split)
        problems = []
        for i, row in enumerate(ds.select_columns(self.columns)):
            problem = split_pair(row, self.pair_format, self.settings)[3]
            if problem:
                problems.append((locate.position(i), i, problem))
        _refuse(problems, len(ds), split, locate)

    # ---------------------------------------------------------------- tokens
    def datasets(self, splits, tokenizer, max_length: int, model=None):
        self.set_end_ids(tokenizer, model)
        if self.pair_format is None:
            self.check_data(splits)
        train = self._encode_split(splits, "train", tokenizer, max_length)
        self._train_pairs = len(train)
        self.eval_dataset = self._encode_split(splits, "validation", tokenizer, max_length)
        self.padding_free = False  # the losses read each answer's sum: no packing
        return train, self.eval_dataset

    def _encode_split(self, splits, split: str, tokenizer, max_length: int) -> PreferenceDataset:
        ds, locate = splits[split], RowLocator(splits, split)
        pairs, problems, dropped, cut = [], [], [], 0
        for i, row in enumerate(ds.select_columns(self.columns)):
            prompt, chosen, rejected, _ = split_pair(row, self.pair_format, self.settings)
            try:
                c_ids, c_labels, r_ids, r_labels, problem = encode_pair(tokenizer, prompt, chosen, rejected,
                                                                        self.pair_format, self.end_ids)
            except Exception as exc:  # noqa: BLE001 - template_failure re-raises what is not the template's
                raise template_failure(exc, locate(i)) from None
            if problem:
                problems.append((locate.position(i), i, problem))
                continue
            if max(len(c_ids), len(r_ids)) > max_length:
                cut += 1
                c_ids, c_labels, r_ids, r_labels = (x[:max_length] for x in (c_ids, c_labels, r_ids, r_labels))
                if not answer_tokens(c_labels) or not answer_tokens(r_labels) or c_ids == r_ids:
                    dropped.append(i)  # nothing of one answer left, or nothing left that differs
                    continue
            pairs.append((c_ids, c_labels, r_ids, r_labels))
        _refuse(problems, len(ds), split, locate)
        self.dropped[split], self.cut[split] = len(dropped), cut
        if not pairs:
            raise DataError(f"Every pair of the {split} split loses an answer to truncation at "
                            f"max_length={max_length} tokens (e.g. {locate(dropped[0])}).",
                            "raise max_length, or shorten the prompts.")
        if cut:
            where = ", ".join(locate(i) for i in sorted(dropped, key=locate.position)[:CHECK_ROWS_SHOWN])
            left_out = (f"; {len(dropped)} of them were left out, nothing of an answer or of their difference "
                        f"being left ({where}{', ...' if len(dropped) > CHECK_ROWS_SHOWN else ''})" if dropped else "")
            self.notes.append((f"{cut} of {len(ds)} {split} pairs are longer than max_length={max_length} tokens: "
                               f"their answers were cut at the end{left_out}. Raise max_length to keep them whole.",
                               "warn"))
        # pair_index: train pairs first, held-out ones after them (the reference table's rows).
        return PreferenceDataset(pairs, first_index=0 if split == "train" else self._train_pairs)

    def collator(self, tokenizer):
        return PairCollator(tokenizer.pad_token_id, pad_to_multiple_of=8 if torch.cuda.is_available() else None)

    # ---------------------------------------------------------------- model
    def build_model(self, choice: ModelChoice, tokenizer, config=None):
        model = super().build_model(choice, tokenizer, config)
        s = self.settings
        if losses.needs_reference(s.preference_loss) and s.finetune == "full":
            # The starting weights, frozen: the reference of DPO/IPO. LoRA needs none (adapter off).
            self.reference_model = copy.deepcopy(model).eval().requires_grad_(False)
            weights = sum(p.numel() * p.element_size() for p in self.reference_model.parameters())
            self.notes.append((f"finetune='full' with preference_loss={s.preference_loss!r}: a frozen copy of the "
                               f"starting model is the reference ({weights / 2**20:,.0f} MiB more memory, released "
                               "once its log-probabilities of every pair are precomputed). With finetune='lora' the "
                               "reference is the same weights with the adapter off.", "info"))
        return model

    def before_training(self, accelerator, model, train_dataset, collate, *, batch_size: int, rows_trained: int,
                        run_dir, record: dict, halving) -> list[tuple[str, str]]:
        """The reference's log-probabilities of the pairs, precomputed or read from the run folder
        (``preference_reference.py``); returns the messages that say which."""
        s = self.settings
        # The run's autocast, made without holding the accelerator (whose hooks hold this task: a
        # cycle would keep its DataLoader workers alive after fit returns).
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(str(accelerator.mixed_precision))
        device_type = accelerator.device.type
        self._autocast = (lambda: torch.autocast(device_type, dtype=dtype)) if dtype else contextlib.nullcontext
        if not losses.needs_reference(s.preference_loss):
            return []
        datasets = {"train": train_dataset, "validation": self.eval_dataset}
        wanted = reference.wanted(s.precompute_reference, len(train_dataset), rows_trained,
                                  full_copy=self.reference_model is not None)
        if not any(wanted.values()):
            return []
        key = reference.identity(datasets, {k: record.get(k) for k in ("model", "model_content", "precision")}
                                 | {"finetune": s.finetune, "load_in_4bit": s.finetune == "qlora"})
        table = reference.load(run_dir, key, accelerator.device)
        where = f"{reference.FILE} in the run folder"
        if table is not None and all(table.cached.get(split, False) or not want for split, want in wanted.items()):
            said = f"read from {where}"
        else:
            was_training = model.training
            model.eval()  # no dropout: the numbers do not depend on the random stream
            try:
                table, seconds = reference.compute(accelerator, lambda batch: self._reference_forward(model, batch),
                                                   datasets, collate, batch_size, wanted, halving=halving)
            finally:
                model.train(was_training)
            if accelerator.is_main_process:
                reference.save(run_dir, key, table)
            accelerator.wait_for_everyone()
            said = f"computed in {seconds:.1f} s, kept in {where}"
        self.reference_table = table
        counted = " and ".join(f"{len(datasets[split]):,} {'train' if split == 'train' else 'held-out'}"
                               for split in reference.SPLITS if table.cached.get(split))
        messages = [(f"Reference log-probabilities of {counted} pairs {said} (precompute_reference="
                     f"{s.precompute_reference!r}); each step runs the policy only.", "info")]
        if not table.cached.get("train"):
            messages[0] = (messages[0][0].replace("each step runs the policy only",
                                                  "train steps compute theirs (the run sees the train pairs "
                                                  "less than twice: a pass would cost about what it saves)"),
                           "info")
        if self.reference_model is not None and all(table.cached.get(split) for split in reference.SPLITS):
            self.reference_model = None  # every pair's reference is in the table: one model in memory, not two
            messages.append(("The frozen reference copy was released: training holds one model.", "info"))
        return messages

    def choose_loss(self, model):
        self.loss_path = None  # the preference losses need each answer's sum: the sparse head, never fused
        return None

    # ---------------------------------------------------------------- steps
    def rows(self, batch: dict) -> int:
        return int(batch["chosen_input_ids"].shape[0])

    def split(self, batch: dict, size: int) -> list[dict]:
        """Micro-batches of at most ``size`` pairs (after an out-of-memory)."""
        return [{k: v[i:i + size] for k, v in batch.items()} for i in range(0, self.rows(batch), size)]

    def units(self, batch: dict) -> int:
        """Pairs: the loss is a mean over them (the shape is known on the host: no sync)."""
        return self.rows(batch)

    def _logps(self, model, batch: dict) -> losses.PairLogps:
        """Summed log-probabilities of each answer's tokens, and their counts."""
        joined = both_halves(batch)
        logits, targets, keep = supervised_logits(model, joined)
        token_logps = -F.cross_entropy(logits.float(), targets, reduction="none")
        rows = keep.shape[0]
        row_of = torch.repeat_interleave(torch.arange(rows, device=keep.device), keep.sum(1),
                                         output_size=token_logps.shape[0])
        sums = torch.zeros(rows, device=token_logps.device).index_add_(0, row_of, token_logps)
        counts = keep.sum(1).float()
        half = rows // 2
        return losses.PairLogps(sums[:half], sums[half:], counts[:half], counts[half:])

    def _reference_logps(self, model, batch: dict, split: str) -> losses.PairLogps | None:
        if not losses.needs_reference(self.settings.preference_loss):
            return None
        if self.reference_table is not None and (cached := self.reference_table.lookup(batch, split)) is not None:
            return cached
        return self._reference_forward(model, batch)

    def _reference_forward(self, model, batch: dict) -> losses.PairLogps:
        """The reference's log-probabilities of the batch's answers: the frozen copy, or the adapter off."""
        with torch.no_grad():
            if self.reference_model is not None:
                device = batch["chosen_input_ids"].device
                if next(self.reference_model.parameters()).device != device:
                    self.reference_model.to(device)
                with self._autocast():  # the policy's forward runs under it (Accelerate wraps it); the copy's not
                    return self._logps(self.reference_model, batch)
            with _adapter_off(model):
                return self._logps(model, batch)

    def _pair_losses(self, model, batch: dict, split: str):
        s = self.settings
        reference = self._reference_logps(model, batch, split)  # first: the policy's graph is built after it
        policy = self._logps(model, batch)
        pair = losses.pair_losses(s.preference_loss, policy, reference, beta=s.preference_beta, gamma=s.simpo_gamma)
        return pair, policy, reference

    def loss(self, model, batch: dict) -> torch.Tensor:
        pair, policy, reference = self._pair_losses(model, batch, "train")
        if not model.training:  # the start-loss measurement (divergence.py), not a train step
            return pair.mean()
        with torch.no_grad():  # the train-side metrics, on the device: read once per log interval
            chosen, rejected = losses.rewards(self.settings.preference_loss, policy, reference,
                                              beta=self.settings.preference_beta)
            mean_chosen, mean_rejected = policy.means()
            sums = torch.stack([torch.full((), float(pair.shape[0]), device=pair.device),  # a fill: no copy, no sync
                                losses.reward_accuracy(chosen, rejected).sum(), chosen.sum(), rejected.sum(),
                                (chosen - rejected).sum(), mean_chosen.sum(), mean_rejected.sum()]).float()
            # A step retried after an out-of-memory counts its first try's pairs too: a mean over
            # a few more pairs of the same step, not a wrong figure.
            self._tally = sums if self._tally is None else self._tally + sums
        return pair.mean()

    def take_train_tally(self) -> tuple[tuple[str, ...], torch.Tensor] | None:
        """The train pairs' reward accuracy, rewards, margin and log-probabilities since the last call."""
        tally, self._tally = self._tally, None
        return None if tally is None else (TRAIN_METRICS, tally)

    def eval_outputs(self, model, batch: dict) -> tuple[torch.Tensor, ...]:
        """Per pair: (loss, reward chosen, reward rejected, policy mean log-prob chosen, rejected)."""
        pair, policy, reference = self._pair_losses(model, batch, "validation")
        chosen, rejected = losses.rewards(self.settings.preference_loss, policy, reference,
                                          beta=self.settings.preference_beta)
        mean_chosen, mean_rejected = policy.means()
        return pair, chosen, rejected, mean_chosen, mean_rejected

    def metrics(self, outputs: list[tuple[torch.Tensor, ...]]) -> dict[str, float]:
        pair, chosen, rejected, mean_chosen, mean_rejected = (torch.cat(parts).double()
                                                               for parts in zip(*outputs, strict=True))
        return {"eval_loss": pair.mean().item(),
                "eval_reward_accuracy": losses.reward_accuracy(chosen, rejected).mean().item(),
                "eval_rewards_chosen": chosen.mean().item(), "eval_rewards_rejected": rejected.mean().item(),
                "eval_reward_margin": (chosen - rejected).mean().item(),
                "eval_logps_chosen": mean_chosen.mean().item(), "eval_logps_rejected": mean_rejected.mean().item()}

    def baselines(self, outputs) -> dict:
        """A model that learned no preference: a coin flip between the answers (reward accuracy 0.5;
        for DPO also the loss at the reference, ln 2)."""
        rows = sum(int(parts[0].shape[0]) for parts in outputs)
        chance = {"eval_reward_accuracy": 0.5}
        if self.settings.preference_loss == "dpo":
            chance["eval_loss"] = math.log(2)
        return {"rows": rows, "baselines": [{"name": "chance", "detail": "no preference between the answers",
                                             "metrics": chance}]}

    def generation_metrics(self, model, tokenizer) -> dict[str, float]:
        return {}

    def num_classes(self) -> int | None:
        """None: the divergence guard's floor is 0, as for a language model (a preference loss has
        no uniform-guess level to end at but DPO's ln 2, which is where every run starts)."""
        return None

    def identity(self) -> dict:
        s = self.settings
        facts = super().identity()
        facts.update(data_format=self.pair_format, loss_on="completion", padding_free=False,
                     preference={"loss": s.preference_loss, "beta": s.preference_beta,
                                 "simpo_gamma": s.simpo_gamma if s.preference_loss == "simpo" else None,
                                 "reference": _reference_name(s), "cut_rows": dict(self.cut)})
        return facts


def _reference_name(settings) -> str | None:
    if not losses.needs_reference(settings.preference_loss):
        return None
    if settings.finetune == "full":
        return "a frozen copy of the starting model"
    return "the base model (the same weights with the adapter off)"


@contextlib.contextmanager
def _adapter_off(model):
    inner = _unwrap(model)
    if not lora.is_peft(inner):
        raise ConfigError("finetune", "full", "lora or qlora (a reference without a second model)",
                          fix="internal: a full fine-tuning run needs its frozen reference copy")
    with inner.disable_adapter():
        yield


def _refuse(problems: list, total: int, split: str, locate) -> None:
    if not problems:
        return
    bad = [f"{locate(i)}: {problem}" for _, i, problem in sorted(problems)[:CHECK_ROWS_SHOWN]]
    more = f" (and {len(problems) - len(bad)} more)" if len(problems) > len(bad) else ""
    raise DataError(f"{len(problems)} of {total} {split} pairs cannot be trained on: " + "; ".join(bad) + f"{more}.",
                    "fix or drop those rows in the file (datasets: ds.filter(...)) before training.")
