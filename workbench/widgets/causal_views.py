"""What the pickers show for a causal LM: config facts, full / LoRA / QLoRA memory, chat data.

The pickers (workbench.widgets.pickers) decide *when* these views appear; this module
decides *what* they show. The numbers come from workbench.sources.models (``causal_facts``) and
workbench.sources.vram_causal (``check_causal_fit``), the token preview from the causal-LM task's
own ``encode_chat``, so the highlighted tokens are exactly the ones a run trains on.

    ChatDataView    format and column choosers plus the rendered example (DatasetPicker)
    causal_model_html / causal_estimate_html    the model picker's facts and memory table
"""

from __future__ import annotations

import contextlib
import html
import sys
from dataclasses import replace
from typing import Any

import ipywidgets as widgets
import traitlets

from workbench.config import DatasetChoice, ModelChoice, TrainConfig
from workbench.errors import DataError
from workbench.sources import models, vram_causal
from workbench.tasks.causal_lm import CausalLMTask
from workbench.tasks.causal_lm_data import IGNORE, detect_format, encode_chat, to_messages
from workbench.widgets.html_blocks import WARNING, note_html

GiB = 2**30
CHAT_FORMATS = ("messages", "prompt_completion", "text")
# Loss-carrying tokens: a green background, as in most loss-mask visualisations.
LOSS_STYLE = "background:#c8e6c9"
CUT_STYLE = "color:#999;text-decoration:line-through"
MODE_NAMES = {"full": "Full", "lora": "LoRA", "qlora": "QLoRA"}


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


# ---------------------------------------------------------------- model


def causal_model_html(info: models.ModelInfo, facts: models.CausalFacts) -> str:
    """The model picker's details for a causal LM: today's summary line plus the decoder facts."""
    template = {True: "yes", False: "no (choose chat_template='simple' for chat data)",
                None: "unknown (no local tokenizer files)"}[facts.chat_template]
    rows = [("Layers", facts.num_layers), ("Attention heads", facts.num_heads),
            ("KV heads", f"{facts.num_kv_heads}" + (" (grouped-query)" if facts.num_kv_heads < facts.num_heads
                                                    else "")),
            ("Context length", facts.context_length or "unknown"),
            ("Tied embeddings", "yes" if facts.tied_embeddings else "no"),
            ("Chat template", template)]
    body = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"
                   for k, v in rows)
    return (f"<div>{html.escape(info.summary())}</div>"
            f"<table class='wb-causal-facts'><tbody>{body}</tbody></table>")


def _verdict(check: vram_causal.CausalFitCheck, mode: str) -> str:
    plain, checkpointed = check.fits(mode, False), check.fits(mode, True)
    if plain is None:
        return "no GPU"
    if plain:
        return "fits"
    return "fits with checkpointing" if checkpointed else "does not fit"


def causal_estimate_html(check: vram_causal.CausalFitCheck, finetune: str, gradient_checkpointing: bool) -> str:
    """Full / LoRA / QLoRA side by side, with and without gradient checkpointing, against free memory.

    The chosen mode's row is bold; its verdict opens the text so it reads like the
    classifier's estimate ("Fits: ..." / "Will not fit: ...").
    """
    head = ("<tr><th>Mode</th><th>Base weights</th><th>Trainable parameters</th><th>Grads + AdamW (+ adapters)</th>"
            "<th>Activations</th><th>Activations (checkpointing)</th><th>Total</th>"
            "<th>Total (checkpointing)</th><th>Fits?</th></tr>")
    rows = []
    for mode in vram_causal.FINETUNE_MODES:
        plain, ckpt = check.estimates[(mode, False)], check.estimates[(mode, True)]
        state = plain.trainable_weights_bytes + plain.gradients_bytes + plain.optimizer_bytes
        cells = [f"{MODE_NAMES[mode]} ({plain.precision})", _gib(plain.base_weights_bytes),
                 f"{plain.trainable_parameters:,}", _gib(state), _gib(plain.activations_bytes + plain.logits_bytes),
                 _gib(ckpt.activations_bytes + ckpt.logits_bytes), _gib(plain.total_bytes), _gib(ckpt.total_bytes),
                 _verdict(check, mode)]
        weight = "font-weight:bold" if mode == finetune else ""
        rows.append(f"<tr class='wb-mode-{mode}' style='{weight}'>"
                    + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    chosen = check.estimates[(finetune, gradient_checkpointing)]
    fits = check.fits(finetune, gradient_checkpointing)
    if fits is None:
        verdict, color = f"Estimated need: {chosen.describe()}. No GPU: nothing to compare with.", "#333"
    else:
        where = f"{check.gpu_name or 'the GPU'} has {_gib(check.free_bytes)} free"
        verdict = f"{'Fits' if fits else 'Will not fit'}: needs about {chosen.describe()}; {where}."
        color = "#1b5e20" if fits else "#b00020"
        modes = ", ".join(MODE_NAMES[m] for m in check.fitting_modes) or "none of them"
        verdict += f"\nModes that fit: {modes}."
    table = f"<table class='wb-causal-estimate'><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>"
    text = html.escape(verdict).replace("\n", "<br>")
    return (f"<div style='color:{color}'>{text}</div>{table}<div><small>Activations include the LM head's "
            "logits; totals include the CUDA context and allocator slack. Batch "
            f"{chosen.batch_size} x {chosen.seq_len} tokens.</small></div>")


# ---------------------------------------------------------------- data


def find_chat_columns(ds) -> dict[str, str] | None:
    """TrainConfig column settings for chat-shaped data; None for anything else.

    A column of {role, content} lists (``messages`` preferred, any name accepted), or
    ``prompt`` + ``completion`` columns. A lone text column is not claimed: it is what
    classification data looks like too.
    """
    columns = list(ds.column_names)
    first = ds[0] if len(ds) else {}

    def is_chat(value: Any) -> bool:
        return (isinstance(value, list) and bool(value)
                and all(isinstance(m, dict) and "role" in m and "content" in m for m in value))

    chats = [c for c in columns if is_chat(first.get(c))]
    if chats:
        return {"data_format": "messages", "messages_column": "messages" if "messages" in chats else chats[0]}
    if "prompt" in columns and "completion" in columns:
        return {"data_format": "prompt_completion", "prompt_column": "prompt", "completion_column": "completion"}
    return None


def load_preview_tokenizer(name_or_path: str, settings: TrainConfig) -> tuple[Any, set[int]]:
    """(tokenizer, end-of-turn ids) as a run loads them: the task's template rules, the model's stop tokens.

    Raises what the run would raise (no chat template for chat data, a model that
    cannot be loaded), so the picker can say it before training does.
    """
    from transformers import AutoConfig, GenerationConfig

    task = CausalLMTask(settings)
    task.format = settings.data_format
    tokenizer = task.load_tokenizer(ModelChoice(name_or_path))
    # The run reads model.generation_config; without generation_config.json transformers
    # builds it from config.json, so that is the fallback here too.
    stop = None
    for reader in (GenerationConfig, AutoConfig):
        try:
            stop = getattr(reader.from_pretrained(name_or_path), "eos_token_id", None)
        except Exception:  # no such file (or offline): try the next source
            continue
        if stop is not None:
            break
    end_ids = {tokenizer.eos_token_id}
    end_ids |= set(stop if isinstance(stop, (list, tuple)) else [stop] if stop is not None else [])
    end_ids.discard(None)
    return tokenizer, end_ids


def loss_preview_html(tokenizer, messages: list[dict], *, max_length: int, loss_on: str,
                      end_ids: set[int]) -> str:
    """One conversation rendered by the chat template, tokens that carry loss highlighted.

    Runs of tokens are decoded together (byte-level tokenizers split characters
    across tokens), each run in a span: ``wb-loss`` (trains), ``wb-prompt`` (label
    -100), ``wb-cut`` (beyond max_length: truncated away).
    """
    # encode_chat cuts at max_length as its last step; encoding uncut and cutting here
    # gives the same tokens and shows what truncation removes.
    ids, labels = encode_chat(tokenizer, messages, max_length=sys.maxsize, loss_on=loss_on, end_ids=end_ids)
    kinds = ["wb-cut" if i >= max_length else "wb-prompt" if label == IGNORE else "wb-loss"
             for i, label in enumerate(labels)]
    styles = {"wb-loss": LOSS_STYLE, "wb-prompt": "", "wb-cut": CUT_STYLE}
    spans, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or kinds[i] != kinds[start]:
            text = tokenizer.decode(ids[start:i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            spans.append(f"<span class='{kinds[start]}' style='{styles[kinds[start]]}'>{html.escape(text)}</span>")
            start = i
    kept = min(len(ids), max_length)
    loss = kinds.count("wb-loss")
    note = f"{loss} of {kept} tokens carry loss (highlighted); the rest are prompt and template."
    if len(ids) > max_length:
        note += f" {len(ids) - max_length} tokens past max_length={max_length} are cut (grey)."
    if loss == 0:
        note += " This row has no token with loss: the run drops it."
    return (f"<div>{html.escape(note)}</div>"
            f"<pre class='wb-chat' style='white-space:pre-wrap'>{''.join(spans)}</pre>")


def chat_html(messages: list[dict]) -> str:
    """The conversation as plain role: text lines (no model chosen yet, or its tokenizer failed)."""
    lines = "".join(
        f"<div class='wb-msg wb-{html.escape(str(m.get('role')))}'><b>{html.escape(str(m.get('role')))}</b>: "
        f"{html.escape(str(m.get('content'))).replace(chr(10), '<br>')}</div>"
        for m in messages)
    return f"<div class='wb-chat-plain'>{lines}</div>"


class ChatDataView(widgets.VBox):
    """Which columns hold the chats, and one example rendered as the run will see it.

    State (traitlets): ``data_format`` (messages | prompt_completion | text) and the
    column of each. ``train_fields`` gives them as TrainConfig fields for the export.
    """

    data_format = traitlets.Unicode("messages")
    messages_column = traitlets.Unicode("messages")
    prompt_column = traitlets.Unicode("prompt")
    completion_column = traitlets.Unicode("completion")
    text_column = traitlets.Unicode("text")

    COLUMN_TRAITS = ("messages_column", "prompt_column", "completion_column", "text_column")
    SHOWN_FOR = {"messages": ("messages_column",), "prompt_completion": ("prompt_column", "completion_column"),
                 "text": ("text_column",)}

    def __init__(self, settings: TrainConfig | None = None, **kwargs: Any):
        # loss_on, system_prompt and chat_template change the rendering: the run's values
        self.settings = settings or TrainConfig(task="causal_lm")
        self.rows = None  # the train split
        self.model_name: str | None = None  # whose tokenizer renders the example
        self.tokenizer, self.end_ids = None, set()
        self.tokenizer_note = ""
        self.max_length = 256
        self.format_box = widgets.Dropdown(description="Format", options=[
            ("chat messages", "messages"), ("prompt + completion", "prompt_completion"),
            ("plain text", "text")])
        self.column_boxes = {name: widgets.Dropdown(description=name.replace("_column", "").capitalize())
                             for name in self.COLUMN_TRAITS}
        self.preview = widgets.HTML()
        for box in (self.format_box, *self.column_boxes.values()):
            box.style.description_width = "110px"
        super().__init__([self.format_box, widgets.HBox(list(self.column_boxes.values())), self.preview],
                         **kwargs)
        widgets.link((self.format_box, "value"), (self, "data_format"))
        for name, box in self.column_boxes.items():
            box.observe(lambda c, name=name: c["new"] and setattr(self, name, c["new"]), "value")
        self.observe(lambda _: self.render(), ["data_format", *self.COLUMN_TRAITS])
        self._show_boxes()

    # -- public

    @property
    def train_fields(self) -> dict[str, str]:
        """The TrainConfig fields this choice sets (data_format and every column name)."""
        return {"data_format": self.data_format, **{name: getattr(self, name) for name in self.COLUMN_TRAITS}}

    @property
    def columns(self) -> tuple[str, ...]:
        """The data columns the run reads, in the format's order."""
        return tuple(getattr(self, name) for name in self.SHOWN_FOR[self.data_format])

    def set_rows(self, ds) -> None:
        """New data: offer its columns, take what ``find_chat_columns`` recognises, render."""
        self.rows = ds
        names = [n for n in ds.column_names if n != "__workbench_row__"]  # load_splits' file-row index
        found = find_chat_columns(ds) or {}
        with self.hold_trait_notifications():
            for name, box in self.column_boxes.items():
                box.options = names
                value = found.get(name, getattr(self, name))
                box.value = value if value in names else None
                if box.value:
                    setattr(self, name, box.value)
            if found:
                self.data_format = found["data_format"]
            else:  # a text column, if the names say so; the user corrects it in the boxes
                with contextlib.suppress(DataError):
                    self.data_format = detect_format(names, replace(self._settings(), data_format="auto"))
        self.render()

    def use_model(self, name_or_path: str) -> None:
        """Render with this model's tokenizer (loaded once per model; "" for none)."""
        name = name_or_path.strip()
        if name == self.model_name:
            self.render()
            return
        self.model_name, self.tokenizer, self.end_ids, self.tokenizer_note = name, None, set(), ""
        if name:
            try:
                self.tokenizer, self.end_ids = load_preview_tokenizer(name, self._settings())
            except Exception as e:  # no chat template, not loadable: plain chat and the reason
                self.tokenizer_note = f"Plain preview: {getattr(e, 'message', e)}"
        self.render()

    def check(self, choice: DatasetChoice):
        """The splits loaded as a causal-LM run loads them, every row checked by the task; raises DataError."""
        from workbench.sources import data

        splits = data.load_splits(choice)
        CausalLMTask(self._settings()).check_data(splits)
        return splits

    def render(self) -> None:
        """The first train row: tokens with loss highlighted, or a plain chat without a tokenizer."""
        self._show_boxes()
        if self.rows is None or len(self.rows) == 0:
            self.preview.value = ""
            return
        settings = self._settings()
        row = self.rows[0]
        try:
            missing = [c for c in self.columns if c not in row]
            if missing:
                raise KeyError(missing[0])
            if self.data_format == "text":
                messages = None
                plain = f"<pre style='white-space:pre-wrap'>{html.escape(str(row[settings.text_column]))}</pre>"
            else:
                messages = to_messages(row, self.data_format, settings)
                plain = chat_html(messages)
        except Exception as e:  # a column that does not hold this format: say so, keep the widget alive
            self.preview.value = note_html(f"The first row cannot be read as {self.data_format} "
                                           f"({type(e).__name__}: {e}): choose the format and columns above.",
                                           WARNING)
            return
        reason = self.tokenizer_note
        if messages is not None and self.tokenizer is not None:
            try:
                self.preview.value = "<b>Example, as the model sees it</b>" + loss_preview_html(
                    self.tokenizer, messages, max_length=self.max_length, loss_on=settings.loss_on,
                    end_ids=self.end_ids)
                return
            except Exception as e:  # a template that cannot mark turns: plain chat and the reason
                reason = f"Plain preview: {getattr(e, 'message', e)}"
        note = note_html(reason, WARNING) if reason else \
            "<div><small>Choose a model to see the rendered tokens.</small></div>"
        self.preview.value = "<b>Example</b>" + plain + (note if messages is not None else "")

    # -- internals

    def _settings(self) -> TrainConfig:
        return replace(self.settings, task="causal_lm", **self.train_fields)

    def _show_boxes(self) -> None:
        shown = self.SHOWN_FOR.get(self.data_format, ())
        for name, box in self.column_boxes.items():
            box.layout.display = None if name in shown else "none"
