"""checkpoint.write_dir_atomically / remove_stale_temporaries: a kill between the two renames."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from workbench.engine import checkpoint

# Saves <out>/best twice, like two evaluations that each found a better model. During
# the second save, os.rename is wrapped (here, in the test's own process only) so that
# the process SIGKILLs itself right after the first rename: best/ has been moved aside
# to .old-best-<pid> and the new copy is not in place yet.
KILLED_BETWEEN_RENAMES = """
import os, signal, sys
from pathlib import Path
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from workbench.engine.checkpoint import write_dir_atomically

model_dir, out = sys.argv[1], Path(sys.argv[2])
model = AutoModelForSequenceClassification.from_pretrained(model_dir)
tokenizer = AutoTokenizer.from_pretrained(model_dir)

def save(version):
    def write(tmp):
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "version.txt").write_text(version)
    write_dir_atomically(out / "best", write)

save("first")
real_rename = os.rename
def rename_then_die(src, dst):
    real_rename(src, dst)
    os.kill(os.getpid(), signal.SIGKILL)
os.rename = rename_then_die
model.base_model.embeddings.word_embeddings.weight.data.add_(1.0)  # the "better" model
save("second")
print("not killed")
"""


def test_kill_between_the_renames_of_best_is_recovered_at_start(tiny_bert, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", KILLED_BETWEEN_RENAMES, str(tiny_bert), str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    # The kill came exactly between the renames: no best/, the old copy aside, the new one unplaced.
    names = sorted(p.name for p in out.iterdir())
    assert "best" not in names
    assert any(n.startswith(".old-best-") for n in names), names
    assert any(n.startswith(".tmp-best-") for n in names), names

    recovered = checkpoint.remove_stale_temporaries(out)

    assert sorted(p.name for p in out.iterdir()) == ["best"]
    assert len(recovered) == 1 and str(out / "best") in recovered[0]
    assert (out / "best" / "version.txt").read_text() == "first"
    from transformers import AutoModelForSequenceClassification, pipeline

    restored = AutoModelForSequenceClassification.from_pretrained(out / "best")
    original = AutoModelForSequenceClassification.from_pretrained(tiny_bert)
    for (name, a), (_, b) in zip(restored.state_dict().items(), original.state_dict().items(), strict=True):
        assert a.equal(b), name
    assert pipeline("text-classification", model=str(out / "best"))("a great film")[0]["label"]


def test_leftovers_beside_a_complete_folder_are_removed(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "weights").write_text("new")
    for name in (".old-model-123", ".tmp-model-456", ".tmp-step-000010-77"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "weights").write_text("stale")
    assert checkpoint.remove_stale_temporaries(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    assert (tmp_path / "model" / "weights").read_text() == "new"


def test_the_newest_of_several_old_copies_is_recovered(tmp_path):
    for name, content, mtime in ((".old-best-11", "older", 1_000), (".old-best-22", "newer", 2_000)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "weights").write_text(content)
        os.utime(tmp_path / name, (mtime, mtime))
    recovered = checkpoint.remove_stale_temporaries(tmp_path)
    assert "from .old-best-22" in recovered[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best"]
    assert (tmp_path / "best" / "weights").read_text() == "newer"


def test_a_failed_second_rename_puts_the_old_folder_back(tmp_path, monkeypatch):
    final = tmp_path / "best"
    checkpoint.write_dir_atomically(final, lambda tmp: (tmp / "weights").write_text("first"))
    real_rename, calls = os.rename, []

    def rename(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.write_dir_atomically(final, lambda tmp: (tmp / "weights").write_text("second"))
    monkeypatch.undo()
    assert (final / "weights").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best"]
