"""Sampler: a daemon thread that keeps a bounded history of Snapshots.

It owns timing and survival only (what to read is a callable, by default a
GpuReader's ``read``), so the panel's thread cannot die silently and a lost
GPU costs one traceback, not one per retry.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from workbench.errors import ConfigError
from workbench.gpu.nvml import describe_error
from workbench.gpu.reader import GpuReader
from workbench.gpu.samples import Snapshot

log = logging.getLogger(__name__)


class Sampler:
    """A daemon thread that calls ``read()`` every ``interval`` seconds into a bounded history.

    The thread never dies silently: an exception from ``read`` is logged, kept
    in ``errors`` and ``last_error``, the last snapshot is re-published marked
    stale, and the next attempt waits longer (doubling up to ``backoff_max``).
    ``on_sample`` is called with each snapshot from the sampler thread.
    """

    def __init__(
        self,
        read: Callable[[], Snapshot] | None = None,
        interval: float = 1.0,
        history_seconds: float = 300.0,
        on_sample: Callable[[Snapshot], None] | None = None,
        backoff_max: float = 30.0,
        nvml: Any = None,
    ):
        if not interval > 0:
            raise ConfigError("interval", interval, "a number of seconds > 0",
                              "use e.g. GPUPanel(interval=1.0)")
        self.read = read or GpuReader(nvml).read
        self.interval = float(interval)
        self.backoff_max = backoff_max
        self.on_sample = on_sample
        self.history: collections.deque[Snapshot] = collections.deque(
            maxlen=max(2, math.ceil(history_seconds / self.interval)))
        self.errors: collections.deque[tuple[float, str]] = collections.deque(maxlen=50)
        self.samples_taken = 0
        self._logged: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def latest(self) -> Snapshot | None:
        return self.history[-1] if self.history else None

    @property
    def last_error(self) -> str | None:
        return self.errors[-1][1] if self.errors else None

    def start(self) -> None:
        with self._lock:
            if self.running:
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="workbench-gpu-sampler",
                                            daemon=True)  # never keeps a kernel alive
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def sample_once(self) -> Snapshot:
        """Take one sample now, in this thread (also what the thread does each tick)."""
        snapshot = self.read()
        self.history.append(snapshot)
        self.samples_taken += 1
        return snapshot

    def _run(self) -> None:
        delay, error_delay = 0.0, 0.0
        while not self._stop.wait(delay):
            started = time.monotonic()
            try:
                snapshot = self.sample_once()
                error_delay = 0.0
                delay = max(0.0, self.interval - (time.monotonic() - started))
            except Exception as exc:
                self._log_error("reading failed; retrying with back-off", exc)
                snapshot = self._stale(describe_error(exc))
                error_delay = min(self.backoff_max, max(self.interval, error_delay * 2))
                delay = error_delay
            if self.on_sample is not None and snapshot is not None:
                try:
                    self.on_sample(snapshot)
                except Exception as exc:  # a drawing bug must not stop sampling
                    self._log_error("display failed", exc, prefix="display: ")

    def _log_error(self, what: str, exc: BaseException, prefix: str = "") -> None:
        """Record every error; log a traceback the first time each one is seen.

        A GPU that stays lost fails at every retry; one traceback says it, and a
        log line every 30 s in the notebook would bury the user's own output.
        """
        message = prefix + describe_error(exc)
        if message not in self._logged:
            self._logged.add(message)
            log.warning("GPU sampler: %s: %s", what, message, exc_info=exc)
        else:
            log.debug("GPU sampler: %s again: %s", what, message)
        self.errors.append((time.time(), message))

    def _stale(self, reason: str) -> Snapshot | None:
        last = self.latest
        if last is None:
            return None
        snapshot = replace(last, error=reason, stale=True,
                           gpus=tuple(replace(g, stale=True) for g in last.gpus))
        self.history.append(snapshot)
        return snapshot
