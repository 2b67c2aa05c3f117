"""The workbench exception family.

Every message says what went wrong *and what to do next*; the classes carry the
data a caller (a widget, the CLI, a test) needs to act on the error.
"""

from __future__ import annotations


class WorkbenchError(Exception):
    """Base class. ``fix`` is the next step for the user, shown after the message."""

    def __init__(self, message: str, fix: str | None = None):
        self.message = message
        self.fix = fix
        super().__init__(f"{message} Fix: {fix}" if fix else message)


class ConfigError(WorkbenchError, ValueError):
    """A configuration field has a wrong value. Names the field and what is allowed."""

    def __init__(self, field: str, value: object, allowed: str, fix: str | None = None):
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}={value!r} is not valid: allowed {allowed}.", fix)


class ConfigFileError(ConfigError):
    """A parameter file (``--config run.yaml``) cannot be used: where and why.

    ``path`` and ``line`` (1-based; None when unknown) locate the problem; ``field`` is
    the section or field concerned ("config" for a syntax error).
    """

    def __init__(self, path, line: int | None, problem: str, fix: str | None = None, *,
                 field: str = "config", value: object = None, allowed: str = ""):
        self.path = path
        self.line = line
        self.problem = problem
        self.field, self.value, self.allowed = field, value, allowed
        where = f"{path}, line {line}" if line else f"{path}"
        WorkbenchError.__init__(self, f"{where}: {problem}", fix)


class DataError(WorkbenchError, ValueError):
    """A dataset cannot be used as given (missing file or column, bad labels...)."""


class ModelError(WorkbenchError):
    """A model id or folder cannot be resolved or loaded."""


class TrainingError(WorkbenchError, RuntimeError):
    """Training stopped: NaN loss, out of memory at micro-batch 1, ... ``step`` is where."""

    def __init__(self, message: str, fix: str | None = None, step: int | None = None):
        self.step = step
        super().__init__(message, fix)


class CheckpointError(WorkbenchError):
    """A checkpoint cannot be written or read."""


class NoEventLogError(WorkbenchError):
    """A run folder holds no ``events.jsonl`` (yet). ``waited_s``: how long a reader waited."""

    def __init__(self, output_dir, waited_s: float | None = None):
        self.output_dir = output_dir
        self.waited_s = waited_s
        waited = f" after waiting {waited_s:.0f} s" if waited_s else ""
        super().__init__(
            f"{output_dir} has no event log (events.jsonl){waited}.",
            "start the run with this output_dir first (fit(...) or `workbench train`), "
            "or point watch at the run's output folder.",
        )


class LabConfigError(WorkbenchError):
    """The Jupyter server configuration is unsafe; the server refuses to start."""


class RegressionError(WorkbenchError):
    """A notebook failed or a metric regressed in `workbench regress`."""


class OutputDirLockedError(WorkbenchError):
    """Another live run holds ``output_dir``. ``holder``: its pid, host, start time, command."""

    def __init__(self, message: str, fix: str | None = None, *, output_dir=None, holder: dict | None = None):
        self.output_dir = output_dir
        self.holder = holder or {}
        super().__init__(message, fix)


class ClassroomError(WorkbenchError):
    """The class service (``workbench classroom``) cannot start or cannot use its database."""


class EvaluationError(WorkbenchError):
    """A model cannot be evaluated as asked: an unknown task, a dataset not cached offline, ..."""


class ExportError(WorkbenchError):
    """A model cannot be exported, or its export did not pass the round-trip check.

    ``report``: the verification figures when the check failed (None otherwise).
    """

    def __init__(self, message: str, fix: str | None = None, *, report=None):
        self.report = report
        super().__init__(message, fix)
