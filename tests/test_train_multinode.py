"""Two torchrun "nodes" on localhost: c10d rendezvous, gloo, `workbench train --config`.

Each node is its own launcher process (`torchrun --nnodes 2 --nproc-per-node 1
--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT`), as on two machines of a Slurm job or
two pods of a PyTorchJob; only the network between them is the loopback. The tests drive the
public CLI and read the results from disk (model/, checkpoints/, events.jsonl), so they hold
whatever the engine does inside.

Why the single-process reference uses gradient accumulation: with 2 ranks and batch_size B,
one optimizer step sees the sampler's batches 2k (rank 0) and 2k+1 (rank 1) (Accelerate
hands each rank every other batch of the same length-grouped order) and DDP averages the two
ranks' mean-loss gradients. One process with batch_size B and gradient_accumulation_steps 2
takes the same two batches per step and weights each micro-batch's mean loss by its share of
the rows, 1/2 when the batches are equal in size, which they are here (the row count is a
multiple of 2B). A single batch of 2B would NOT be the same: length grouping would form
other batches and padding would differ. Dropout is set to 0, since two ranks draw their
dropout masks from two RNG streams and one process from one. What remains is arithmetic:
DDP computes (g0 + g1) / 2, accumulation g0 / 2 + g1 / 2, and halving is exact in binary
floating point, so on 2 ranks the runs agree bit for bit (measured: max difference 0). The
1e-6 tolerance leaves room for all-reduces that sum in another order (NCCL rings, more ranks).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from lab_helpers import free_port

from workbench.config import DatasetChoice, ModelChoice, RunSpec, TrainConfig
from workbench.sources.synthetic import write_csv

# More than 30 s on 2 cores (real processes); CI runs them (scripts/test.sh selects no marker).
pytestmark = pytest.mark.slow

BATCH = 4
ROWS = 128  # a multiple of 2 * BATCH: every batch is full (see the module docstring)
STEPS = 24  # 16 batches per rank and epoch: 1.5 epochs, so an epoch boundary is crossed
SAVE_EVERY = 3
TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def no_dropout_bert(tiny_bert, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("models") / "tiny-bert-no-dropout"
    shutil.copytree(tiny_bert, path)
    config = json.loads((path / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout=0.0)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


@pytest.fixture(scope="module")
def run_config(no_dropout_bert, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("multinode")
    data = tmp / "data"
    write_csv(data / "train.csv", ROWS, seed=0)
    write_csv(data / "validation.csv", 32, seed=1)
    spec = RunSpec(
        model=ModelChoice(str(no_dropout_bert)),
        data=DatasetChoice(source="files", path=str(data), text_columns=("text",), label_column="label"),
        train=TrainConfig(output_dir=str(tmp / "unused"), learning_rate=1e-3, batch_size=BATCH, max_steps=STEPS,
                          save_every=SAVE_EVERY, eval_every=12, log_every=1, num_workers=0, keep_checkpoints=STEPS // SAVE_EVERY,
                          precision="fp32"),
    )
    return spec.save(tmp / "run.yaml")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WORKBENCH_TEST_", "RANK", "LOCAL_RANK",
                                                                     "WORLD_SIZE", "MASTER_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    # As in environment/cluster/ (Slurm, PyTorchJob): without it, torchrun's workers share the
    # rendezvous store across restarts, and after one node dies a restarted gloo/NCCL group
    # can read the dead workers' addresses from the previous round ("Gloo connectFullMesh
    # failed ... Connection refused"): the restart fails about one time in two here.
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return env


def _node(config: Path, output_dir: Path, port: int, host: bool, log: Path, max_restarts: int = 0,
          extra: tuple[str, ...] | list[str] = ()):
    """One "node": a torchrun agent with one worker. ``host``: this node runs the c10d store."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "workbench-test",
           "--rdzv-conf", f"is_host={int(host)},join_timeout=120", "--max-restarts", str(max_restarts),
           "--monitor-interval", "0.5",
           "-m", "workbench", "train", "--config", str(config), "--output-dir", str(output_dir),
           "--progress", "none", *extra]
    handle = open(log, "wb")  # noqa: SIM115 -- closed by _wait
    proc = subprocess.Popen(cmd, env=_env(), stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    proc.log_handle, proc.log_path = handle, log
    return proc


def _wait(procs, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            proc.wait(max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        raise
    finally:
        for proc in procs:
            proc.log_handle.close()
    logs = "\n".join(f"--- {p.log_path.name} (rc {p.returncode}):\n{p.log_path.read_text()[-3000:]}" for p in procs)
    assert all(p.returncode == 0 for p in procs), logs


def _two_nodes(config: Path, output_dir: Path, tmp: Path, max_restarts: int = 0):
    port = free_port()
    return [_node(config, output_dir, port, True, tmp / "node0.log", max_restarts),
            _node(config, output_dir, port, False, tmp / "node1.log", max_restarts)]


def _events(output_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (output_dir / "events.jsonl").read_text().splitlines()]


def _weights(output_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted((output_dir / "model").glob("*.safetensors"))
    assert files, f"no weights in {output_dir / 'model'}"
    weights = {}
    for file in files:
        weights.update(load_file(file))
    return weights


def _max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def two_node_run(run_config, tmp_path_factory) -> Path:
    """The uninterrupted two-node run (shared by both tests)."""
    tmp = tmp_path_factory.mktemp("two-nodes")
    out = tmp / "run"
    _wait(_two_nodes(run_config, out, tmp), timeout=240)
    return out


def test_two_nodes_equal_one_process_with_the_same_global_batch(run_config, two_node_run, tmp_path):
    single = tmp_path / "single"
    proc = subprocess.run(
        [sys.executable, "-m", "workbench", "train", "--config", str(run_config), "--output-dir", str(single),
         "--set", "train.gradient_accumulation_steps=2", "--progress", "none"],
        env=_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    events = _events(two_node_run)
    start = next(e for e in events if e["kind"] == "start")
    assert start["world_size"] == 2 and start["total_steps"] == STEPS
    assert sum(e["kind"] == "start" for e in events) == 1  # one writer across both nodes
    assert events[-1]["kind"] == "end" and events[-1]["status"] == "completed"
    assert next(e for e in _events(single) if e["kind"] == "start")["world_size"] == 1

    difference = _max_difference(_weights(two_node_run), _weights(single))
    print(f"two nodes vs one process with accumulation: max |w1 - w2| = {difference:.3g}")
    assert difference < TOLERANCE, f"two nodes vs one process: max |w1 - w2| = {difference:.3g}"
    # The comparison can fail: one more step of training moves the weights far more than that.
    assert _max_difference(_weights(two_node_run), _initial_weights(run_config)) > 100 * TOLERANCE


def _initial_weights(run_config: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    model = Path(RunSpec.load(run_config).model.name_or_path)
    return load_file(next(model.glob("*.safetensors")))


def test_a_node_dies_and_the_job_resumes_from_the_last_complete_checkpoint(run_config, two_node_run, tmp_path):
    import psutil

    out = tmp_path / "run"
    nodes = _two_nodes(run_config, out, tmp_path, max_restarts=1)
    # Kill the worker of global rank 0, the one that writes (not its torchrun agent, which
    # restarts it), once training is past its second checkpoint: the job must restart both
    # workers and continue from a complete checkpoint.
    events_file = out / "events.jsonl"
    deadline = time.monotonic() + 180
    killed_after = None
    while time.monotonic() < deadline and killed_after is None:
        if any(n.poll() is not None for n in nodes):
            break
        if events_file.is_file():
            done = [e["step"] for e in _events(out) if e["kind"] == "checkpoint"]
            if len(done) >= 2:
                workers = [w for n in nodes for w in psutil.Process(n.pid).children()]
                writer = [w for w in workers if w.environ().get("RANK") == "0"]
                assert len(writer) == 1, [w.environ().get("RANK") for w in workers]
                writer[0].send_signal(signal.SIGKILL)
                killed_after = max(done)
        time.sleep(0.05)
    assert killed_after is not None and killed_after < STEPS, \
        f"the run ended before a worker could be killed mid-run (checkpoints at kill: {killed_after})"
    _wait(nodes, timeout=240)

    events = _events(out)
    starts = [i for i, e in enumerate(events) if e["kind"] == "start"]
    assert len(starts) == 2, f"expected one restart, got {len(starts)} start events"
    # The newest checkpoint complete before the restart: what the second start must resume from.
    # Its "checkpoint" event is written after the folder is committed, so the kill can land
    # between the two (the poll above reads the log, then kills): the one checkpoint after the
    # last logged one may be complete without its event. Never an older one, never a later one.
    saved_before = [e["step"] for e in events[:starts[1]] if e["kind"] == "checkpoint"]
    resumed = events[starts[1]]["resumed_from_step"]
    assert resumed in (max(saved_before), max(saved_before) + SAVE_EVERY), (resumed, saved_before, killed_after)
    assert max(saved_before) >= killed_after, (saved_before, killed_after)
    assert (out / "checkpoints" / f"step-{resumed:06d}").is_dir()
    # After the restart, training goes on from the next step to the end, once each.
    after = [e["step"] for e in events[starts[1]:] if e["kind"] == "train"]
    assert after == list(range(resumed + 1, STEPS + 1))
    assert events[-1]["kind"] == "end" and events[-1]["status"] == "completed"
    # And it ends where the uninterrupted run ended.
    difference = _max_difference(_weights(out), _weights(two_node_run))
    print(f"killed after checkpoint {killed_after}, resumed from {resumed}: max |w1 - w2| = {difference:.3g}")
    assert difference < TOLERANCE, f"resumed vs uninterrupted: max |w1 - w2| = {difference:.3g}"


def test_an_output_folder_that_is_not_shared_is_refused_instead_of_hanging(run_config, tmp_path):
    """Each node writes to its own folder, as when output_dir is on a node-local disk.

    The first run completes (only rank 0 writes, into node 0's folder). The second run (a
    requeued job, 6 more steps) finds a checkpoint on node 0 and none on node 1: rank 0 resumes
    at step 24, rank 1 starts at step 0, and the ranks wait on each other's collectives
    forever. Wanted: every rank stops at once with an error naming the shared file system.
    """
    port = free_port()
    first = [_node(run_config, tmp_path / f"node{i}", port, i == 0, tmp_path / f"first{i}.log") for i in (0, 1)]
    _wait(first, timeout=240)
    # Each process writes its RNG state into the checkpoint, but only rank 0 completes one:
    # node 1's folder holds no valid checkpoint.
    from workbench.engine import checkpoint

    assert checkpoint.list_checkpoints(tmp_path / "node1") == []
    assert checkpoint.list_checkpoints(tmp_path / "node0")
    port = free_port()
    longer = ["--set", f"train.max_steps={STEPS + 6}"]
    second = [_node(run_config, tmp_path / f"node{i}", port, i == 0, tmp_path / f"second{i}.log", extra=longer)
              for i in (0, 1)]
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and any(p.poll() is None for p in second):
        time.sleep(1)
    hung = any(p.poll() is None for p in second)
    for proc in second:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        proc.log_handle.close()
    logs = "".join(p.log_path.read_text() for p in second)
    assert not hung, "the job hung: rank 0 resumed from node 0's checkpoint, rank 1 found none on node 1"
    assert all(p.returncode != 0 for p in second)
    assert "shared" in logs and "output_dir" in logs, logs[-3000:]
