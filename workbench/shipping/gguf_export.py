"""``workbench.export(run, gguf="q8_0")`` and ``workbench export RUN --gguf q8_0``.

Reads top to bottom: find the model (a run folder refuses to export unless it finished; its
LoRA adapter is merged first, into ``model_merged/``, reused when it is newer than the
adapter) -> measure its chat template -> write the GGUF file, the Ollama Modelfile and the model
card into a temporary folder -> read the file back and compare it with the model
(``verify.py``) -> only then rename the folder into place, ``<run>/gguf-<type>/``:

    <name>-<type>.gguf   the model, tokenizer and chat template (llama.cpp, Ollama, LM Studio)
    Modelfile            ollama create NAME -f Modelfile
    README.md            the model card, with the round-trip figures
    export.json          what was written and the figures, for scripts

An export that fails its check leaves nothing behind and raises ExportError with the figures.
No network, no C++ build: the ``gguf`` package writes the file.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from workbench.errors import ExportError
from workbench.shipping import card as cards
from workbench.shipping.chat_template import analyse, end_of_turn_id, stop_strings
from workbench.shipping.gguf_writer import TYPES, GGUFFacts, write_gguf
from workbench.shipping.modelfile import MODELFILE, modelfile_text
from workbench.shipping.verify import (
    Verification,
    check_header,
    quiet_loading,
    read_header,
    require,
    round_trip,
)

REPORT = "export.json"
MERGED_DIR = "model_merged"  # = workbench.tasks.causal_lm.MERGED_DIR


@dataclass
class ExportResult:
    """What ``export`` wrote; ``verification`` holds the round-trip figures (None with verify=False)."""

    folder: Path
    gguf: Path
    modelfile: Path
    card: Path
    facts: GGUFFacts
    verification: Verification | None
    ollama_name: str
    seconds: float

    def summary(self) -> str:
        lines = [f"{self.gguf} ({self.facts.size_bytes / 1e6:,.1f} MB, {self.facts.type}, "
                 f"{self.facts.architecture}, {self.facts.tensors} tensors) in {self.seconds:.0f} s"]
        if self.verification is not None:
            lines.append("round trip: " + self.verification.summary())
        lines += [f"Ollama:    cd {self.folder} && ollama create {self.ollama_name} -f {MODELFILE} && "
                  f"ollama run {self.ollama_name}",
                  f"llama.cpp: llama-cli -m {self.gguf} -cnv"]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"ExportResult({str(self.gguf)!r})\n{self.summary()}"


# ----------------------------------------------------------------------------- the source
def _status_problem(run_dir: Path, folder_name: str) -> str | None:
    """Why a run's model may not be exported (None: it may): not finished, failed or diverged."""
    from workbench.engine.events import read_events
    from workbench.engine.run_folder import read_run

    run = read_run(run_dir)
    if run.status == "completed" or (folder_name == "best" and run.status == "interrupted"):
        return None
    if run.status == "running":
        return "is still training"
    if run.status == "failed":
        errors = [e.get("text", "") for e in read_events(run_dir) if e.get("kind") == "message"
                  and e.get("level") == "error"]
        last = errors[-1] if errors else ""
        if "diverged" in last:
            return "diverged (its loss went to chance level): its weights are not a model worth shipping"
        return f"failed{': ' + last.splitlines()[0][:200] if last else ''}"
    if run.status == "interrupted":
        return f"is not finished (stopped at step {run.step} of {run.total_steps or '?'}); run it again to finish it"
    return f"cannot be read ({run.problem or run.status})"


def find_source(path: str | Path) -> tuple[Path, Path | None]:
    """(the model folder to export, its run folder or None) for a run folder or a model folder."""
    path = Path(path).expanduser()
    if not path.exists():
        raise ExportError(f"{path} does not exist.", "pass a run folder (the output_dir of a run) or a model folder.")
    is_run = lambda p: (p / "events.jsonl").is_file() or (p / "run.json").is_file()  # noqa: E731
    if is_run(path):
        run_dir, folder = path, path / "model"
    elif (path / "config.json").is_file() or (path / "adapter_config.json").is_file():
        run_dir, folder = (path.parent if is_run(path.parent) else None), path
    else:
        raise ExportError(f"{path} is neither a run folder (events.jsonl) nor a model folder (config.json).",
                          "pass the output_dir of a finished run, or a folder saved with save_pretrained.")
    if run_dir is not None:
        problem = _status_problem(run_dir, folder.name)
        if problem:
            raise ExportError(f"The run in {run_dir} {problem}, so it is not exported.",
                              "export a run that completed (`workbench runs` shows each run's status).")
    if not folder.is_dir():
        raise ExportError(f"The run in {run_dir} has no {folder.name}/ folder.",
                          "a completed run writes model/; was it moved or deleted?")
    return folder, run_dir


def merged_is_current(adapter_dir: Path, merged_dir: Path) -> bool:
    """True when ``merged_dir`` holds a merged model written after the adapter's weights were.

    Only the weights count: a card rewritten in the adapter folder (after an evaluation) does
    not make the merged model stale."""
    try:
        adapter = max((adapter_dir / n).stat().st_mtime for n in ("adapter_model.safetensors", "adapter_config.json")
                      if (adapter_dir / n).is_file())
        merged = min(p.stat().st_mtime for p in merged_dir.iterdir()
                     if p.name == "config.json" or p.name.startswith("model"))
    except (OSError, ValueError):  # a missing folder or file: not current
        return False
    return merged >= adapter


def merged_folder(folder: Path, run_dir: Path | None, log: Callable[[str], None]) -> Path:
    """A plain model folder for ``folder``: itself, or (a LoRA adapter) the base with it merged in.

    The run's ``model_merged/`` is reused when it is at least as new as the adapter; otherwise
    it is (re)written, with its card, as the run would have written it."""
    if not (folder / "adapter_config.json").is_file():
        return folder
    from workbench.engine.checkpoint import carded_writer, write_dir_atomically
    from workbench.tasks import lora

    target = (run_dir / MERGED_DIR) if run_dir is not None and folder.name == "model" else \
        folder.with_name(folder.name + "_merged")
    if merged_is_current(folder, target):
        log(f"using the merged model in {target}")
        return target
    log(f"merging the LoRA adapter of {folder} into its base model -> {target}")
    writer = carded_writer(run_dir) if run_dir is not None else write_dir_atomically
    return writer(target, lambda tmp: lora.merge_adapter_folder(folder, tmp))


def ollama_name(text: str) -> str:
    """A name ``ollama create`` accepts: lowercase letters, digits, '-', '_', '.'."""
    name = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")
    return name or "workbench-model"


# ----------------------------------------------------------------------------- export
def export(run: str | Path, gguf: str = "q8_0", *, output_dir: str | Path | None = None, name: str | None = None,
           verify: bool = True, log: Callable[[str], None] = print) -> ExportResult:
    """Export a run's final model (or a model folder) to a GGUF file with its Modelfile and card.

    ``gguf``: "f16" (lossless for fp16/bf16 models) or "q8_0" (about half of f16, near-lossless).
    ``output_dir``: default ``<run>/gguf-<type>`` (``<folder>-gguf-<type>`` beside a model folder).
    ``verify``: read the file back through transformers and compare logits (see ``verify.py``);
    the export fails when the figures do not hold. ``log``: where the steps are said.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.engine.checkpoint import write_dir_atomically

    if gguf not in TYPES:
        raise ExportError(f"gguf={gguf!r} is not one of {', '.join(TYPES)}.",
                          "use 'f16' (lossless for 16-bit models) or 'q8_0' (half the size, near-lossless).")
    started = time.perf_counter()
    folder, run_dir = find_source(run)
    source = merged_folder(folder, run_dir, log)
    base_name = run_dir.name if run_dir is not None else folder.name
    name = name or base_name
    tag = ollama_name(name)
    out = Path(output_dir) if output_dir else (run_dir / f"gguf-{gguf}" if run_dir is not None
                                               else folder.with_name(f"{folder.name}-gguf-{gguf}"))
    tokenizer = AutoTokenizer.from_pretrained(source)
    shape = analyse(tokenizer)
    eot = end_of_turn_id(tokenizer, shape) if shape.ok else tokenizer.eos_token_id
    record = cards.read_record(run_dir) if run_dir is not None else {}
    system = (record.get("config") or {}).get("system_prompt") or shape.default_system
    file_name = f"{tag}-{gguf}.gguf"
    result: dict = {}

    def write(tmp: Path) -> None:
        log(f"writing {file_name} ({gguf}) from {source}")
        facts = write_gguf(source, tmp / file_name, gguf, name=name, tokenizer=tokenizer, eot_id=eot,
                           description=f"Exported by workbench from {base_name}",
                           base_model=record.get("model"))
        check = None
        if verify:
            log("checking the round trip: reading the file back through transformers and comparing logits")
            with quiet_loading():
                model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
            check = round_trip(tmp / file_name, source, facts, source_model=model, tokenizer=tokenizer)
            del model
            log(("passed: " if check.passed else "FAILED: ") + check.summary())
            require(check, tmp / file_name)
        else:  # still read the header back: a file that does not say what was written never ships
            problems = check_header(read_header(tmp / file_name), facts)
            if problems:
                raise ExportError(f"{file_name} does not read back as written: " + "; ".join(problems) + ".",
                                  "this is a bug in the export: please report it.")
        drop = tokenizer.bos_token if facts.add_bos and tokenizer.bos_token else ""
        (tmp / MODELFILE).write_text(modelfile_text(
            file_name, shape=shape if shape.ok else None, system=system,
            stops=stop_strings(tokenizer, shape, eot), title=f"{name}: exported by workbench from {base_name}",
            drop_leading=drop), encoding="utf-8")
        export_facts = _card_facts(facts, check, tag)
        cards.write_card(tmp, run_dir or folder.parent, kind="gguf", export=export_facts, location=out)
        report = {"source": str(source), "run": str(run_dir) if run_dir else None, "facts": _jsonable(asdict(facts)),
                  "verification": check.to_dict() if check else None, "modelfile_template": shape.ok,
                  "template_problems": shape.problems, "system_prompt": system, "ollama_name": tag}
        (tmp / REPORT).write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
        result.update(facts=facts, check=check)

    write_dir_atomically(out, write)
    facts = result["facts"]
    facts.path = out / file_name
    if not shape.ok:
        log("note: the chat template could not be measured (" + "; ".join(shape.problems) + "): the Modelfile "
            "has no TEMPLATE, so Ollama uses the template stored in the GGUF file.")
    exported = ExportResult(folder=out, gguf=out / file_name, modelfile=out / MODELFILE, card=out / cards.CARD_FILE,
                            facts=facts, verification=result["check"], ollama_name=tag,
                            seconds=time.perf_counter() - started)
    log(exported.summary())
    return exported


def _card_facts(facts: GGUFFacts, check: Verification | None, tag: str) -> dict:
    from importlib import metadata

    return {"file": facts.path.name, "type": facts.type, "size_mb": facts.size_bytes / 1e6,
            "architecture": facts.architecture, "tensors": facts.tensors, "tokenizer_model": facts.tokenizer_model,
            "tokenizer_pre": facts.tokenizer_pre, "vocab_size": facts.vocab_size, "bos_id": facts.bos_id,
            "eos_id": facts.eos_id, "eot_id": facts.eot_id, "gguf_version": metadata.version("gguf"),
            "ollama_name": tag, "verification": check.to_dict() if check else None}


def _jsonable(value):
    return json.loads(json.dumps(value, default=str))


# ----------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="a run folder (its final model; a LoRA adapter is merged "
                        "first) or a model folder")
    parser.add_argument("--gguf", choices=TYPES, default="q8_0",
                        help="f16 (lossless for 16-bit models) or q8_0 (half the size, near-lossless; default)")
    parser.add_argument("--output", metavar="DIR", help="where to write (default: RUN/gguf-TYPE)")
    parser.add_argument("--name", help="the model's name (the GGUF general.name and the Ollama model name)")
    parser.add_argument("--no-verify", action="store_true",
                        help="skip the round trip through transformers (the file is still read back)")


def run_cli(args: argparse.Namespace) -> int:
    export(args.run, args.gguf, output_dir=args.output, name=args.name, verify=not args.no_verify,
           log=lambda text: print(f"workbench export: {text}", flush=True))
    return 0
