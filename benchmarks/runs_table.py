"""How long ``workbench.runs(DIR)`` takes over many runs: the goal is under 1 s for 200 run
folders of 1,000 events each (the issue's figure), read cold from the page cache.

    .venv/bin/python benchmarks/runs_table.py                 # 200 x 1,000, 5 repeats
    .venv/bin/python benchmarks/runs_table.py --runs 50 --events 200 --repeats 3

The logs are written the way the engine writes them (``EventLog``, so the same JSON
layout): per run a start, train events every step, an eval and a checkpoint every 50
steps, an end; settings that differ in learning rate and seed. It times the table
(``runs``), the DataFrame (``to_frame``) and the text table (``format``), and for
comparison the same 200 logs read whole with ``read_events`` (what a table that parsed
every line would cost). Reading is I/O- and parse-bound; the CPU time of the process is
reported beside the wall time, which on a loaded machine includes waiting for a core.
Results go to benchmarks/results/runs_table.json with the machine's load average.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.engine.events import EventLog, read_events  # noqa: E402
from workbench.engine.runs import runs  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "runs_table.json"


def write_run(folder: Path, events: int, lr: float, seed: int) -> None:
    config = {"task": "classification", "output_dir": str(folder), "learning_rate": lr, "seed": seed,
              "batch_size": 16, "max_steps": events, "best_metric": None}
    log = EventLog(folder, tensorboard=False)
    log.write("start", model="bert-base-uncased", total_steps=events, config=config, world_size=1,
              precision="fp32", device="cpu", resumed_from_step=0, label_names=["neg", "pos"])
    written, step = 1, 0
    while written < events - 1:
        step += 1
        log.write("train", step=step, epoch=round(step / 500, 4), loss=1 / step, lr=lr, samples_per_s=400.0,
                  gpu_mem_bytes=None, eta_s=10.0, skipped_steps=0, micro_batch_size=16)
        written += 1
        if step % 50 == 0 and written < events - 3:
            log.write("eval", step=step, epoch=round(step / 500, 4), eval_loss=1 / step, eval_accuracy=0.9,
                      eval_f1=0.9)
            log.write("checkpoint", step=step, path=str(folder / "checkpoints" / f"step-{step:06d}"))
            written += 2
    log.write("end", status="completed", step=step, metrics={"eval_loss": 0.1, "eval_accuracy": 0.9})
    log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="runs-table-") as tmp:
        root = Path(tmp) / "outputs"
        for i in range(args.runs):
            write_run(root / f"sweep-{i // 20}" / f"run-{i:03d}", args.events, lr=(1e-5, 2e-5, 5e-5)[i % 3],
                      seed=i % 2)
        size = sum(p.stat().st_size for p in root.rglob("events.jsonl"))
        timings: dict[str, list[float]] = {"runs": [], "runs (CPU time)": [], "to_frame": [], "format": [],
                                           "read_events (all lines)": []}
        for _ in range(args.repeats):
            t0, cpu0 = time.perf_counter(), time.process_time()
            table = runs(root)
            t1, cpu1 = time.perf_counter(), time.process_time()
            timings["runs (CPU time)"].append(cpu1 - cpu0)
            table.to_frame()
            t2 = time.perf_counter()
            table.format()
            t3 = time.perf_counter()
            for run in table:
                read_events(run.path)
            t4 = time.perf_counter()
            timings["runs"].append(t1 - t0)
            timings["to_frame"].append(t2 - t1)
            timings["format"].append(t3 - t2)
            timings["read_events (all lines)"].append(t4 - t3)
        assert len(table) == args.runs and all(r.status == "completed" for r in table)
    medians = {name: statistics.median(values) for name, values in timings.items()}
    print(f"{args.runs} runs x {args.events} events ({size / 2**20:.0f} MiB of logs), "
          f"median of {args.repeats}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs:")
    for name, value in medians.items():
        print(f"  {name:<26} {value * 1000:8.0f} ms")
    total = medians["runs"] + medians["to_frame"]
    print(f"  table + DataFrame          {total * 1000:8.0f} ms  (goal: under 1,000 ms)")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({
        "runs": args.runs, "events_per_run": args.events, "log_mib": round(size / 2**20, 1),
        "median_s": {k: round(v, 4) for k, v in medians.items()}, "table_and_frame_s": round(total, 4),
        "load_average_1min": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
        "python": platform.python_version(), "machine": platform.machine(),
    }, indent=2) + "\n")


if __name__ == "__main__":
    main()
