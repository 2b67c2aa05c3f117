"""A playground for a fine-tuned causal LM: one prompt, the base and the fine-tuned answers side by side.

    from workbench.widgets.playground import Playground
    Playground.from_adapter("outputs/llm/model")     # a saved LoRA adapter folder
    Playground(model, tokenizer)                     # a PeftModel still in the kernel after training
    Playground(tuned_model, tokenizer, base=base_model)  # two plain models (full fine-tuning)
    Playground.from_adapter("outputs/dpo/model", earlier={"pretrained": pretrained_model},
                            titles=("SFT (adapter off)", "preference-tuned"))   # three columns

With a PeftModel one model serves both columns: the base answer is generated with
the adapter switched off (``disable_adapter()``), so no second copy of the weights
is loaded. That switch is global to the model, so the two answers are generated
one after the other, each streamed token by token (``TextIteratorStreamer``) into
its column. Generation runs in a background thread so the notebook stays usable;
ipykernel 7 sends widget updates from any thread (see ``gpu_panel``).

The prompt goes through the tokenizer's chat template as a user message when the
tokenizer has one (how the model was fine-tuned), as plain text otherwise.
Temperature 0 means greedy decoding.

``earlier`` adds columns to the left, each a plain model answering the same prompt: after
preference tuning, the pretrained model before supervised fine-tuning, the SFT model (the
adapter off) and the preference-tuned one read left to right. Every column's answer is in
``answers`` (title -> Textarea); ``base_answer`` and ``tuned_answer`` are the last two.
"""

from __future__ import annotations

import contextlib
import html
import threading
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import torch

from workbench.tasks import lora


class Playground:
    """Prompt box, generation settings, and the answers (base, fine-tuned) streamed side by side."""

    def __init__(self, model, tokenizer, *, base=None, earlier: dict | None = None, max_new_tokens: int = 128,
                 temperature: float = 0.7, top_p: float = 0.9, titles: tuple[str, str] = ("base model", "fine-tuned")):
        self.model, self.tokenizer, self.base = model, tokenizer, base
        self.earlier = dict(earlier or {})  # title -> plain model, columns left of the base answer
        if len(titles) != 2 or any(t in self.earlier for t in titles):
            raise ValueError(f"titles must be two names for the base and fine-tuned columns, other than "
                             f"earlier's {list(self.earlier)}; got {titles!r}")
        self.prompt = widgets.Textarea(placeholder="Ask something...", layout=widgets.Layout(width="100%"))
        self.max_new_tokens = widgets.IntSlider(value=max_new_tokens, min=1, max=1024, description="max tokens")
        self.temperature = widgets.FloatSlider(value=temperature, min=0.0, max=2.0, step=0.05,
                                               description="temperature")
        self.top_p = widgets.FloatSlider(value=top_p, min=0.05, max=1.0, step=0.05, description="top-p")
        self.button = widgets.Button(description="Generate", button_style="primary")
        self.status = widgets.HTML()
        self.answers = {title: widgets.Textarea(layout=widgets.Layout(width="100%", height="200px"), disabled=True)
                        for title in [*self.earlier, *titles]}
        self.base_answer, self.tuned_answer = (self.answers[t] for t in titles)
        self.errors: list[str] = []
        self._thread: threading.Thread | None = None
        self.button.on_click(lambda _: self.generate())
        width = f"{100 / len(self.answers):.0f}%"
        columns = widgets.HBox([
            widgets.VBox([widgets.HTML(f"<b>{html.escape(title)}</b>"), answer], layout=widgets.Layout(width=width))
            for title, answer in self.answers.items()
        ])
        self.widget = widgets.VBox([self.prompt, widgets.HBox([self.max_new_tokens, self.temperature, self.top_p]),
                                    widgets.HBox([self.button, self.status]), columns])

    @classmethod
    def from_adapter(cls, adapter_dir: str | Path, **settings) -> Playground:
        """Load a saved LoRA adapter folder (and the base model it names) for the playground."""
        from peft import AutoPeftModelForCausalLM
        from transformers import AutoTokenizer

        adapter_dir = Path(adapter_dir)
        with lora.quiet_peft():
            model = AutoPeftModelForCausalLM.from_pretrained(adapter_dir)
        tokenizer = AutoTokenizer.from_pretrained(adapter_dir)
        return cls(model, tokenizer, **settings)

    def _ipython_display_(self):  # displaying the object shows its widget
        from IPython.display import display

        display(self.widget)

    # ------------------------------------------------------------------ generation
    def _inputs(self, prompt: str) -> dict[str, torch.Tensor]:
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                      add_generation_prompt=True, return_tensors="pt",
                                                      return_dict=True)
        return self.tokenizer(prompt, return_tensors="pt")

    def _settings(self) -> dict[str, Any]:
        settings: dict[str, Any] = {"max_new_tokens": self.max_new_tokens.value}
        if self.temperature.value > 0:
            settings.update(do_sample=True, temperature=self.temperature.value, top_p=self.top_p.value)
        else:
            settings.update(do_sample=False, temperature=None, top_p=None)
        return settings

    def _stream(self, model, inputs, target: widgets.Textarea, adapter_off: bool) -> None:
        from transformers import TextIteratorStreamer

        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        device = next(model.parameters()).device
        inputs = {k: v.to(device) for k, v in inputs.items()}
        failure: list[BaseException] = []

        def run():
            switch = model.disable_adapter() if adapter_off else contextlib.nullcontext()
            try:
                with switch, torch.inference_mode():
                    model.generate(**inputs, **self._settings(), streamer=streamer,
                                   pad_token_id=self.tokenizer.pad_token_id)
            except BaseException as exc:  # shown in the status line; the streamer must still end
                failure.append(exc)
                streamer.end()

        producer = threading.Thread(target=run, daemon=True)
        producer.start()
        target.value = ""
        for piece in streamer:
            target.value += piece
        producer.join()
        if failure:
            raise failure[0]

    def _run(self, prompt: str) -> None:
        try:
            inputs = self._inputs(prompt)
            peft = hasattr(self.model, "disable_adapter")
            was_training = self.model.training
            self.model.eval()
            for title, model in self.earlier.items():
                self.status.value = f"{html.escape(title)}..."
                model.eval()
                self._stream(model, inputs, self.answers[title], adapter_off=False)
            self.status.value = "base model..."
            if self.base is not None:
                self._stream(self.base, inputs, self.base_answer, adapter_off=False)
            elif peft:
                self._stream(self.model, inputs, self.base_answer, adapter_off=True)
            else:
                self.base_answer.value = "(no base model: pass base=... or a PeftModel)"
            self.status.value = "fine-tuned model..."
            self._stream(self.model, inputs, self.tuned_answer, adapter_off=False)
            self.model.train(was_training)
            self.status.value = "done"
        except Exception as exc:  # never raise into the notebook from the worker thread
            self.errors.append(f"{type(exc).__name__}: {exc}")
            self.status.value = f"<span style='color:#b00'>{html.escape(self.errors[-1])}</span>"
        finally:
            self.button.disabled = False

    def generate(self, prompt: str | None = None, *, wait: bool = False) -> threading.Thread:
        """Answer ``prompt`` (default: the prompt box) with both models; ``wait`` blocks until done."""
        if prompt is not None:
            self.prompt.value = prompt
        if self._thread is not None and self._thread.is_alive():
            self.status.value = "still generating: wait for it to finish"
            return self._thread
        self.button.disabled = True
        self._thread = threading.Thread(target=self._run, args=(self.prompt.value,), daemon=True)
        self._thread.start()
        if wait:
            self._thread.join()
        return self._thread
