"""The run's event log: ``<output_dir>/events.jsonl``, one JSON object per line.

The training loop writes what happens (start, train steps, evals, checkpoints,
messages, end); the notebook progress display, ``workbench watch`` and the charts
read it. A plain append-only text file is the interface because it works across
processes and machines (torchrun, a terminal, a closed browser tab) and survives
a crash: each event is written with one ``write`` call and flushed, so a reader
sees every complete line the moment it is written, and a half-written last line
(the process was killed mid-write) is skipped by the readers.

A resumed run appends to the same file; its new ``start`` event marks the resume.
When ``tensorboard`` is importable the same scalars also go to TensorBoard event
files in ``<output_dir>/tensorboard`` (train/loss, train/lr, eval/accuracy, ...).

Only rank 0 writes: other ranks create ``EventLog(..., enabled=False)``, which
writes nothing and calls no listener.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from workbench.engine.safe_read import UnreadableFileError, open_regular, read_bounded
from workbench.errors import NoEventLogError, WorkbenchError

EVENTS_FILE = "events.jsonl"
# What a reader takes in at most (engine/safe_read.py): a log of 256 MiB is about a million
# events; a larger "log" is a sparse file or a link to a device, not a run's.
MAX_LOG_BYTES = 256 << 20
MAX_LINE_BYTES = 16 << 20  # one event; a longer "line" is not an event log
_FOLLOW_CHUNK = 16 << 20  # read per poll by follow()
TENSORBOARD_DIR = "tensorboard"
KINDS = ("start", "train", "eval", "checkpoint", "message", "end")

log = logging.getLogger(__name__)

Event = dict
Listener = Callable[[Event], None]


def events_path(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / EVENTS_FILE


def _to_json(value: object) -> object:
    """json.dumps fallback for what a training loop naturally passes in."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    item = getattr(value, "item", None)  # numpy / torch scalars
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError, RuntimeError):
            pass
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


class EventLog:
    """Append events to ``<output_dir>/events.jsonl`` and hand them to listeners.

    ``tensorboard``: None writes TensorBoard scalars when tensorboard is installed,
    False never does, True requires it.
    """

    def __init__(
        self,
        output_dir: str | os.PathLike,
        enabled: bool = True,
        *,
        tensorboard: bool | None = None,
    ):
        self.output_dir = Path(output_dir)
        self.path = events_path(output_dir)
        self.enabled = enabled
        self._listeners: list[Listener] = []
        self._failed_listeners: set[int] = set()
        self._lock = threading.Lock()
        self._file = None
        self._tb = None
        self._tb_wanted = False
        if not enabled:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        if self._file.tell() > 0 and not _ends_with_newline(self.path):
            # A crash left half a line: end it so the next event starts on its own
            # line; readers skip the broken one.
            self._file.write("\n")
            self._file.flush()
        # The TensorBoard writer opens at the first event, so that a resumed run's
        # "start" can tell it which steps to drop from the interrupted run's files.
        self._tb_wanted = tensorboard is not False and _tensorboard_available(required=bool(tensorboard))

    # -- writing ---------------------------------------------------------------

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(event)`` after each event is written (the progress display)."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def write(self, kind: str, **fields) -> Event:
        """Write one event and return it (with ``time``, unix seconds, and ``kind`` added)."""
        if kind not in KINDS:
            raise ValueError(f"unknown event kind {kind!r}: use one of {', '.join(KINDS)}")
        event: Event = {"time": round(time.time(), 3), "kind": kind, **fields}
        if kind == "start":
            # Lets `watch` tell a crashed run (writer gone, no "end") from a slow one.
            event.setdefault("pid", os.getpid())
            event.setdefault("host", socket.gethostname())
        if not self.enabled:
            return event
        line = json.dumps(event, default=_to_json, ensure_ascii=False) + "\n"
        with self._lock:
            if self._file is None:
                raise RuntimeError(f"EventLog for {self.path} is closed; create a new one to write")
            # One write call per line, then flush: readers never see a line in pieces
            # unless the process dies inside this call.
            self._file.write(line)
            self._file.flush()
            if self._tb_wanted and self._tb is None:
                self._tb_wanted = False
                self._tb = _open_tensorboard(self.output_dir / TENSORBOARD_DIR, event)
            if self._tb is not None:
                self._write_scalars(event)
        for listener in list(self._listeners):
            self._notify(listener, event)
        return event

    def _notify(self, listener: Listener, event: Event) -> None:
        # A broken display must never stop a training run: log once and go on.
        try:
            listener(event)
        except Exception:
            if id(listener) not in self._failed_listeners:
                self._failed_listeners.add(id(listener))
                log.warning("event listener %r failed; training continues", listener, exc_info=True)

    def _write_scalars(self, event: Event) -> None:
        step = event.get("step")
        if step is None:
            return
        try:
            for tag, value in _scalars(event):
                self._tb.add_scalar(tag, value, global_step=int(step), walltime=event["time"])
            if event["kind"] in ("eval", "end"):
                self._tb.flush()  # evals are rare and the ones people look for
        except Exception:  # TensorBoard is a convenience; the JSON log is the record
            log.warning("writing TensorBoard scalars failed; disabling them", exc_info=True)
            self._tb = None

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
            if self._tb is not None:
                try:
                    self._tb.close()
                except Exception:
                    log.warning("closing the TensorBoard writer failed", exc_info=True)
                self._tb = None

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "enabled" if self.enabled else "disabled"
        return f"EventLog({str(self.output_dir)!r}, {state})"


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def _tensorboard_available(required: bool) -> bool:
    try:
        import tensorboard  # noqa: F401
        import torch.utils.tensorboard  # noqa: F401
    except ImportError as exc:
        if required:
            raise WorkbenchError(
                f"TensorBoard logging was requested but cannot be imported ({exc}).",
                "install it with `pip install tensorboard`, or pass tensorboard=None.",
            ) from exc
        return False
    return True


def _open_tensorboard(log_dir: Path, first_event: Event):
    from torch.utils.tensorboard import SummaryWriter

    # A resume from step N: TensorBoard hides the interrupted run's points from step
    # N+1 on, which the resumed run is about to write again.
    resumed = first_event.get("resumed_from_step") if first_event["kind"] == "start" else None
    purge_step = resumed + 1 if isinstance(resumed, int) and resumed > 0 else None
    try:
        return SummaryWriter(log_dir=str(log_dir), flush_secs=30, purge_step=purge_step)
    except Exception:  # e.g. a read-only folder: the JSON log is the record
        log.warning("cannot write TensorBoard files in %s", log_dir, exc_info=True)
        return None


# event field -> TensorBoard tag
_TRAIN_TAGS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "samples_per_s": "train/samples_per_s",
    "gpu_mem_bytes": "train/gpu_mem_bytes",
    # a preference run's train pairs (tasks/preference.py TRAIN_METRICS)
    **{name: f"train/{name}" for name in ("reward_accuracy", "rewards_chosen", "rewards_rejected",
                                          "reward_margin", "logps_chosen", "logps_rejected")},
}


def _scalars(event: Event) -> Iterator[tuple[str, float]]:
    if event["kind"] == "train":
        pairs = ((tag, event.get(name)) for name, tag in _TRAIN_TAGS.items())
    elif event["kind"] == "eval":
        pairs = (
            ("eval/" + name.removeprefix("eval_"), value)
            for name, value in event.items()
            if name.startswith("eval_")
        )
    else:
        return
    for tag, value in pairs:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            yield tag, float(value)


# -- reading -----------------------------------------------------------------------


def _parse(line: bytes) -> Event | None:
    """One complete line -> event, or None for a blank or broken line."""
    line = line.strip()
    if not line:
        return None
    try:
        event = json.loads(line.decode("utf-8", errors="replace"))
    except ValueError:
        log.debug("skipping a broken event line: %r", line[:200])
        return None
    return event if isinstance(event, dict) and "kind" in event else None


def read_events(output_dir: str | os.PathLike) -> list[Event]:
    """All complete events of a run, oldest first ([] when there is no log yet).

    A last line without its newline is a write in progress or a crash's leftover,
    and is left out.
    """
    path = events_path(output_dir)
    try:
        data = read_bounded(path, MAX_LOG_BYTES)
    except FileNotFoundError:
        return []
    except UnreadableFileError as exc:
        raise unreadable_log(path, exc) from None
    lines = data.split(b"\n")[:-1]  # the piece after the last newline is incomplete
    return [e for e in map(_parse, lines) if e is not None]


def unreadable_log(path: Path, exc: OSError) -> WorkbenchError:
    return WorkbenchError(f"{path} cannot be read as a run's event log: {exc.strerror or exc}.",
                          f"this is not a log the workbench wrote; remove or replace {path.name}, or look at another run.")


def writer_alive(start_event: Event, output_dir: str | os.PathLike | None = None) -> bool | None:
    """Whether the process that wrote ``start_event`` still runs; None when unknowable
    (another machine or container, or an old log without a pid).

    With ``output_dir``, the run's lock answers first (``run_lock.probe``): held means alive on
    any host that shares locks, and a lock file nobody holds is what a killed run leaves, dead
    whatever process now has its PID. Only a folder without a lock file (a writer that never
    took one) falls back to the PID.
    """
    if output_dir is not None:
        from workbench.engine.run_lock import lock_path, probe

        held = probe(output_dir)
        if held:
            return True
        if held is False and lock_path(output_dir).exists():
            return False
    pid, host = start_event.get("pid"), start_event.get("host")
    if not isinstance(pid, int) or host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return None
    return True


def follow(
    output_dir: str | os.PathLike,
    poll_s: float = 1.0,
    stop_when_ended: bool = True,
    *,
    wait_for_log_s: float | None = 60.0,
    stop_when_writer_exits: bool = True,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[Event]:
    """Yield the run's events, the existing ones first, then new ones as they are written.

    Stops after an ``end`` event when nothing follows it (a resumed run's earlier
    ``end`` does not stop it), or, with ``stop_when_writer_exits``, when the
    writing process is known to have died without writing ``end`` (a crash or a
    kill). Raises WorkbenchError when ``output_dir`` does not exist, or when no log
    appears there within ``wait_for_log_s`` seconds (None: wait as long as it takes).
    """
    output_dir = Path(output_dir)
    path = events_path(output_dir)
    if not output_dir.is_dir():
        raise WorkbenchError(
            f"There is no run folder at {output_dir}.",
            "pass the output_dir of a run (the folder that holds events.jsonl); "
            "check the path and the current directory.",
        )
    waited = 0.0
    while not path.exists():
        if wait_for_log_s is not None and waited >= wait_for_log_s:
            raise NoEventLogError(output_dir, waited_s=waited)
        sleep(poll_s)
        waited += poll_s

    position = 0
    pending = b""  # bytes after the last newline: a line still being written
    last_start: Event | None = None
    last_kind = None
    idle_polls = 0
    while True:
        chunk, size = b"", 0
        try:
            # A regular file only, opened without blocking (a FIFO would wait for a writer forever),
            # read a bounded piece per poll (a link to /dev/zero or a sparse file never ends).
            fd = open_regular(path)
        except FileNotFoundError:
            fd = None
        except UnreadableFileError as exc:
            raise unreadable_log(path, exc) from None
        if fd is not None:
            with os.fdopen(fd, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < position:  # the file was replaced or truncated: start over
                    position, pending = 0, b""
                if size > position:
                    f.seek(position)
                    chunk = f.read(min(size - position, _FOLLOW_CHUNK))
            position += len(chunk)
        if chunk:
            idle_polls = 0
            *lines, pending = (pending + chunk).split(b"\n")
            if len(pending) > MAX_LINE_BYTES:
                raise unreadable_log(path, OSError(0, f"a line of more than {MAX_LINE_BYTES:,} bytes"))
            for line in lines:
                event = _parse(line)
                if event is None:
                    continue
                last_kind = event["kind"]
                if last_kind == "start":
                    last_start = event
                yield event
            if stop_when_ended and last_kind == "end" and position >= size:
                return
        else:
            idle_polls += 1
            # Check the writer only after a quiet spell: it costs a syscall, and a
            # live run writes often enough that this stays rare.
            if (
                stop_when_writer_exits
                and last_kind != "end"
                and last_start is not None
                and idle_polls * poll_s >= 2.0
                and writer_alive(last_start, output_dir) is False
            ):
                return
        if position >= size:  # caught up; otherwise the next piece of a long log at once
            sleep(poll_s)
