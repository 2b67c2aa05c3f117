"""The round-trip check of a GGUF export: read the file back, load it through transformers, compare.

Three checks, each against what was meant to be written:

1. **The file.** ``gguf.GGUFReader`` reads the header back: architecture, tensor count and types,
   the tokenizer keys (model, pre-tokenizer, tokens, merges, BOS/EOS/end-of-turn ids) and the
   chat template, byte for byte.
2. **The tokenizer.** transformers rebuilds a tokenizer from the file (``gguf_file=``); on the
   fixed prompts, rendered with the chat template, its token ids must equal the original's.
3. **The weights.** transformers de-quantizes the file into a model; its logits on the same ids
   are compared with the source model's (fp32 both): the largest absolute difference, and the
   share of positions whose most likely next token is the same. f16 rounds each weight to 11
   significant bits, so its logits stay close; q8_0 keeps 8 bits per weight and a scale per 32,
   so an occasional near-tie may flip, but the top-1 token agrees almost everywhere.

The thresholds below were set from SmolLM2-135M (docs/evaluate-and-ship.md has its figures) with
room to spare; a wrong tensor permutation, a missing merge or a shifted vocabulary misses them
by orders of magnitude, which is what the check is for.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from workbench.errors import ExportError

PROMPTS = (
    [{"role": "user", "content": "What is the capital of France?"},
     {"role": "assistant", "content": "The capital of France is Paris."}],
    [{"role": "user", "content": "Write one sentence about the sea, please."}],
)
# type -> (max |logit difference| / the logits' span, share of positions with the same top-1 token)
LIMITS = {"f16": (0.02, 0.98), "q8_0": (0.10, 0.90)}


@dataclass
class Verification:
    """The figures of the round trip; ``passed`` when every check holds, ``problems`` says which did not."""

    type: str
    prompts: int = 0
    positions: int = 0
    token_ids_identical: bool = False
    max_abs_logit_diff: float = float("nan")
    logit_range: float = float("nan")
    top1_agreement: float = float("nan")
    header: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}

    def summary(self) -> str:
        return (f"{self.type}: token ids identical on {self.prompts} prompts: {self.token_ids_identical}; "
                f"max |logit diff| {self.max_abs_logit_diff:.4g} (logits span {self.logit_range:.3g}); "
                f"same top-1 token at {self.top1_agreement:.1%} of {self.positions} positions")


@contextlib.contextmanager
def reuse_parsed_files():
    """Parse each GGUF file once while transformers loads it.

    ``from_pretrained(..., gguf_file=)`` builds a ``gguf.GGUFReader`` three times (config,
    tokenizer, weights) and a ``TensorNameMap`` once per module (~400 for a 30-layer model);
    with a 49k-token vocabulary that is ~8 s per reader on two busy cores, ~45 s in all. Both are
    read-only and depend only on their arguments, so within this block the same path (and the
    same architecture and layer count) gets the same object. Put back on exit.
    """
    import gguf

    readers: dict = {}
    name_maps: dict = {}
    real_reader, real_name_map = gguf.GGUFReader, gguf.get_tensor_name_map

    def reader(path, *args, **kwargs):
        key = (os.path.realpath(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = real_reader(path, *args, **kwargs)
        return readers[key]

    def name_map(arch, n_blocks):
        if (arch, n_blocks) not in name_maps:
            name_maps[arch, n_blocks] = real_name_map(arch, n_blocks)
        return name_maps[arch, n_blocks]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = real_reader, real_name_map


def read_header(path: str | os.PathLike) -> dict:
    """The facts of a GGUF file's header, as plain values (``gguf.GGUFReader``)."""
    import gguf

    reader = gguf.GGUFReader(path)
    fields = reader.fields

    def value(key):
        f = fields.get(key)
        return None if f is None else f.contents()

    types: dict[str, int] = {}
    for tensor in reader.tensors:
        types[tensor.tensor_type.name] = types.get(tensor.tensor_type.name, 0) + 1
    return {
        "architecture": value("general.architecture"), "name": value("general.name"),
        "file_type": value("general.file_type"), "tensors": len(reader.tensors), "tensor_types": types,
        "tokenizer_model": value("tokenizer.ggml.model"), "tokenizer_pre": value("tokenizer.ggml.pre"),
        "tokens": len(value("tokenizer.ggml.tokens") or []), "merges": len(value("tokenizer.ggml.merges") or []),
        "bos_id": value("tokenizer.ggml.bos_token_id"), "eos_id": value("tokenizer.ggml.eos_token_id"),
        "eot_id": value("tokenizer.ggml.eot_token_id"), "add_bos": value("tokenizer.ggml.add_bos_token"),
        "chat_template": value("tokenizer.chat_template"),
    }


def check_header(header: dict, facts) -> list[str]:
    """What in the header differs from what was written (``facts``: gguf_writer.GGUFFacts)."""
    expected = {"architecture": facts.architecture, "tensors": facts.tensors, "tensor_types": facts.tensor_types,
                "tokenizer_model": facts.tokenizer_model, "tokenizer_pre": facts.tokenizer_pre,
                "tokens": facts.vocab_size, "bos_id": facts.bos_id, "eos_id": facts.eos_id, "eot_id": facts.eot_id,
                "add_bos": facts.add_bos, "chat_template": facts.chat_template}
    problems = [f"{key}: {header.get(key)!r} in the file, {want!r} written"
                for key, want in expected.items() if want is not None and header.get(key) != want]
    if not header.get("merges"):
        problems.append("the file has no BPE merges: every word would be split into single bytes")
    return problems


def round_trip(gguf_path: str | os.PathLike, source_dir: str | os.PathLike, facts, *, source_model=None,
               tokenizer=None, prompts=PROMPTS) -> Verification:
    """Read ``gguf_path`` back and compare it with the model in ``source_dir`` (see the module doc).

    ``source_model``/``tokenizer``: the source, already loaded (fp32), to save loading it twice.
    """
    import time

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    gguf_path, source_dir = Path(gguf_path), Path(source_dir)
    check = Verification(type=facts.type)
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(source_dir)
    folder, name = str(gguf_path.parent), gguf_path.name
    with reuse_parsed_files(), quiet_loading():
        check.header = read_header(gguf_path)
        check.problems += check_header(check.header, facts)
        try:
            back_tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            back = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        except Exception as exc:  # noqa: BLE001 - whatever transformers objects to is the finding
            check.problems.append(f"transformers cannot load the file back: {type(exc).__name__}: {exc}")
            check.seconds = time.perf_counter() - started
            return check
    model = source_model or AutoModelForCausalLM.from_pretrained(source_dir, dtype=torch.float32)
    model.eval()
    back.eval()
    identical, diffs, spans, agree, positions = True, [], [], 0, 0
    with torch.inference_mode():
        for messages in prompts:
            generation = messages[-1]["role"] != "assistant"
            text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation)
            ids = tokenizer(text, add_special_tokens=True)["input_ids"]
            identical &= back_tokenizer(text, add_special_tokens=True)["input_ids"] == ids
            tensor = torch.tensor([ids])
            want = model(input_ids=tensor).logits[0].float()
            got = back(input_ids=tensor).logits[0].float()
            diffs.append((want - got).abs().max().item())
            spans.append((want.max() - want.min()).item())
            agree += int((want.argmax(-1) == got.argmax(-1)).sum())
            positions += len(ids)
    check.prompts, check.positions, check.token_ids_identical = len(prompts), positions, identical
    check.max_abs_logit_diff, check.logit_range = max(diffs), max(spans)
    check.top1_agreement = agree / positions if positions else float("nan")
    diff_limit, top1_limit = LIMITS[facts.type]
    if not identical:
        check.problems.append("the tokenizer read back from the file gives other token ids than the model's own")
    if not check.max_abs_logit_diff <= diff_limit * check.logit_range:
        check.problems.append(f"the logits differ by up to {check.max_abs_logit_diff:.4g}, more than "
                              f"{diff_limit:.0%} of their span ({check.logit_range:.3g})")
    if not check.top1_agreement >= top1_limit:
        check.problems.append(f"the most likely next token agrees at only {check.top1_agreement:.1%} of the "
                              f"positions (at least {top1_limit:.0%} expected for {facts.type})")
    check.seconds = time.perf_counter() - started
    return check


@contextlib.contextmanager
def quiet_loading():
    """No "Converting and de-quantizing GGUF tensors" / "Loading weights" bars: in a notebook or a
    CI log they are hundreds of lines; the export reports its own steps. transformers' GGUF
    loader draws its bar with tqdm unconditionally, so its module's ``tqdm`` is a pass-through here."""
    from transformers import modeling_gguf_pytorch_utils as gguf_loading
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    real_tqdm = getattr(gguf_loading, "tqdm", None)
    hf_logging.disable_progress_bar()
    if real_tqdm is not None:
        gguf_loading.tqdm = lambda iterable=None, *args, **kwargs: iterable
    try:
        yield
    finally:
        if real_tqdm is not None:
            gguf_loading.tqdm = real_tqdm
        if was_enabled:
            hf_logging.enable_progress_bar()


def require(check: Verification, path: Path) -> None:
    """ExportError with the figures when the round trip failed."""
    if check.passed:
        return
    raise ExportError(f"The GGUF file {path.name} did not pass its round-trip check: " + "; ".join(check.problems)
                      + f". Figures: {check.summary()}.",
                      "this is a bug in the export for this model, not in your run: please report it with "
                      "these figures; meanwhile convert with llama.cpp's convert_hf_to_gguf.py.", report=check)
