"""What starting the lab costs: `workbench lab` to its first answer, a kernel to its first reply,
TensorBoard to its first page. The goal is that the security work keeps these where they were.

    .venv/bin/python benchmarks/lab_startup.py            # 5 starts of each, ~2 min on 2 idle cores
    .venv/bin/python benchmarks/lab_startup.py --quick    # 1 of each: a smoke run

Each start is a real process in a throw-away folder: `workbench lab` on a free port with a
token (until ``GET /api`` answers), a Python kernel through ``POST /api/kernels`` (until its
``kernel_info`` reply; this is where the kernel launcher of ``server/kernels.py`` runs), and
TensorBoard through ``GET /tensorboard/`` (started on first use by ``server/tensorboard.py``).
Reported per item: the median wall time and the median **CPU time** (user + system, read from
``/proc/<pid>/stat`` of that process once it answered). CPU time is what to compare on a shared
machine: the wall time includes waiting for a core. Results go to
benchmarks/results/lab_startup.json with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "lab_startup.json"
WORKBENCH = str(Path(sys.executable).with_name("workbench"))
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (its own, not its children's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(check, timeout: float = 180.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            result = check()
        except requests.RequestException:
            result = None
        if result:
            return result
        time.sleep(0.05)
    raise TimeoutError("no answer in time")


def one_start(tmp: Path) -> dict[str, float]:
    """One lab, one kernel, one TensorBoard; returns their wall and CPU seconds."""
    root = tmp / "workspace"
    (root / "outputs").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "WORKBENCH_"))}
    for name, sub in {"HOME": "home", "JUPYTER_RUNTIME_DIR": "runtime", "JUPYTER_DATA_DIR": "data",
                      "IPYTHONDIR": "ipython", "MPLCONFIGDIR": "mpl"}.items():
        (tmp / sub).mkdir(mode=0o700)
        env[name] = str(tmp / sub)
    token = secrets.token_urlsafe(32)
    env["JUPYTER_TOKEN"] = token
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    session = requests.Session()
    session.trust_env = False
    auth = {"Authorization": f"token {token}"}
    log = open(tmp / "server.log", "wb")  # noqa: SIM115 -- closed below
    t0 = time.monotonic()
    server = subprocess.Popen([WORKBENCH, "lab", "--port", str(port), "--notebook-dir", str(root)], env=env,
                              cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: session.get(f"{url}/api", timeout=2).status_code == 200)
        figures = {"lab_wall_s": time.monotonic() - t0, "lab_cpu_s": cpu_seconds(server.pid)}

        before = set(children(server.pid))
        t0 = time.monotonic()
        kernel = session.post(f"{url}/api/kernels", json={"name": "python3"}, headers=auth).json()["id"]
        from jupyter_client import BlockingKernelClient

        client = BlockingKernelClient(connection_file=str(tmp / "runtime" / f"kernel-{kernel}.json"))
        client.load_connection_file()
        client.start_channels(hb=False)
        client.wait_for_ready(timeout=180)
        figures["kernel_wall_s"] = time.monotonic() - t0
        (kernel_pid,) = set(children(server.pid)) - before
        figures["kernel_cpu_s"] = cpu_seconds(kernel_pid)
        client.stop_channels()

        before = set(children(server.pid))
        t0 = time.monotonic()
        wait_for(lambda: session.get(f"{url}/tensorboard/", headers=auth, timeout=120).status_code == 200)
        figures["tensorboard_wall_s"] = time.monotonic() - t0
        (tensorboard_pid,) = set(children(server.pid)) - before
        figures["tensorboard_cpu_s"] = cpu_seconds(tensorboard_pid)
        return figures
    finally:
        os.killpg(server.pid, 15)
        server.wait(30)
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one start of each")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    starts = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="lab-startup-") as tmp:
            starts.append(one_start(Path(tmp)))
    medians = {name: statistics.median(s[name] for s in starts) for name in starts[0]}
    print(f"median of {repeats} starts, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs:")
    for item in ("lab", "kernel", "tensorboard"):
        print(f"  {item:<12} wall {medians[item + '_wall_s']:6.2f} s   CPU {medians[item + '_cpu_s']:6.2f} s")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({
        "repeats": repeats, "median_s": {k: round(v, 3) for k, v in medians.items()},
        "each": [{k: round(v, 3) for k, v in s.items()} for s in starts],
        "load_average_1min": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
        "python": platform.python_version(), "machine": platform.machine(),
    }, indent=2) + "\n")


if __name__ == "__main__":
    main()
