"""Each variant of a benchmark in a process of its own, and its result read back.

Compilation caches, thread pools and allocator state stay apart between variants that way, so
one variant's warm-up does not pay for the next. The child ends by printing one line
``RESULT {json}`` (:func:`report`); the driver runs it and reads that line (:func:`run_child`).
"""

import json
import subprocess
import sys

PREFIX = "RESULT "


def report(result: dict) -> None:
    """In the child: the variant's result, as the one line the driver reads."""
    print(PREFIX + json.dumps(result), flush=True)


def run_child(command: list[str], name: str) -> dict | None:
    """Run ``command`` (the benchmark itself, asked for one variant) and return its result;
    None, with the end of its output on stderr, when it failed or reported nothing."""
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(PREFIX)]
    if done.returncode or not lines:
        print(f"{name} failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}",
              file=sys.stderr)
        return None
    return json.loads(lines[-1][len(PREFIX):])
