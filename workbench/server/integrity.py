"""Checks a server makes about its own process at start: where its code came from.

Run by the guard extension (``server/guard.py``) and by JupyterHub single-user mode
(``server/hub_singleuser.py``) before they judge the settings:

* :func:`check_config_files`: Jupyter config files are Python; only the workbench's own may run.
* :func:`check_unpatched`: the guard's modules and the identity provider are the installed code.
* ``floor.check_import_path``: no folder a notebook can write is on the import path.

Code that runs inside the server can always do more than these checks see; what keeps it
out is that `workbench lab`, the image's entry point and hub mode start the server with a
config folder of its own and without the current folder on sys.path. These checks make a
server started some other way (or a common patch) fail loudly instead of running unguarded.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
import types
from pathlib import Path

from workbench.errors import LabConfigError
from workbench.server import floor


def check_startup(serverapp) -> None:
    # The most specific first: a config file or the import path names the culprit.
    check_config_files(serverapp)
    check_import_path()
    check_unpatched(serverapp)


def check_import_path() -> None:
    """This process was not started with the current folder on its import path (floor.check_import_path)."""
    floor.check_import_path(sys.path, os.getcwd(), bool(sys.flags.safe_path), os.environ.get("PYTHONPATH", ""))


# --- config files are Python: only the workbench's own may run ---------------------------------


# The workbench's Python config files: the server configuration, and the image's
# /etc/jupyter/jupyter_config.py that refuses any other before it runs.
WORKBENCH_CONFIG_FILES = ("jupyter_server_config.py", "jupyter_config.py")


def _workbench_config_digests() -> set[str]:
    folder = Path(__file__).with_name("jupyter_config")
    return {hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in WORKBENCH_CONFIG_FILES}


def python_config_files(serverapp) -> list[str]:
    """The Python config files this server runs: ``jupyter_*config.py`` in its config folders.

    (Found on disk rather than from traitlets' ``loaded_config_files``, which jupyter_server's
    apps leave empty.) Every jupyter_<app>_config.py there is run by the app of that name,
    jupyter_config.py by all of them; the ``--config`` file too.
    """
    return config_files_in(serverapp.config_file_paths, serverapp.config_file)


def config_files_in(folders, config_file: str | None = None) -> list[str]:
    files = []
    for folder in folders:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        files += [os.path.join(folder, n) for n in names if n.startswith("jupyter_") and n.endswith("config.py")]
    if config_file:
        files.append(config_file)
    return list(dict.fromkeys(files))


def foreign_config_files(files) -> list[str]:
    """Those of ``files`` that are not a copy of one of the workbench's config files."""
    ours = _workbench_config_digests()
    foreign = []
    for name in files:
        try:
            digest = hashlib.sha256(Path(name).read_bytes()).hexdigest()
        except OSError:
            digest = ""
        if digest not in ours:
            foreign.append(name)
    return foreign


def check_config_files(serverapp) -> None:
    """Refuse a server that runs a Python config file other than the workbench configuration.

    A ``jupyter_config.py`` or ``jupyter_lab_config.py`` is code: it runs inside the server and
    can patch anything. `workbench lab` and the image give the server a config folder of its
    own, so none is found there; this catches the rest (JUPYTER_CONFIG_PATH, ~/.jupyter when
    the server is started some other way). Run by the guard, the code has already run: it may
    have patched what checks it (see :func:`check_unpatched`), so that refusal is a safety net.
    What runs it earlier: `workbench lab` and hub mode before they start the server
    (``lab.check_config_path``), and in the image /etc/jupyter/jupyter_config.py, the first
    config file every server loads (``jupyter_config/jupyter_config.py``). JSON config files
    only set traits, which the floor judges. A copy of a workbench config file (/etc/jupyter's
    in the image) is accepted by its content.
    """
    foreign = foreign_config_files(python_config_files(serverapp))
    if foreign:
        raise foreign_config_error(foreign[0])


def foreign_config_error(name: str) -> LabConfigError:
    return LabConfigError(
        f"the server would run the Python config file {name}, which is not the workbench "
        "configuration: a config file is code that runs inside the server and can "
        "switch its checks off.",
        f"remove or rename {name} (JSON config files are fine); start the server with "
        "`workbench lab`, which gives it a config folder of its own.",
    )


# --- the guard's code is the installed code ---------------------------------------------------

_GUARDED_MODULES = ("workbench.server.guard", "workbench.server.integrity", "workbench.server.floor",
                    "workbench.server.identity", "workbench.server.origins", "workbench.server.credentials",
                    "workbench.server.hub_singleuser", "workbench.server.kernels",
                    "workbench.server.processes", "workbench.server.tensorboard")


def _functions(namespace: dict) -> dict[str, types.CodeType]:
    codes = {}
    for name, value in namespace.items():
        value = value.__func__ if isinstance(value, classmethod | staticmethod) else value
        if isinstance(value, types.FunctionType):
            codes[name] = value.__code__
        elif isinstance(value, property) and value.fget is not None:
            codes[name] = value.fget.__code__
    return codes


def fresh_namespace(module: types.ModuleType) -> dict:
    """The module's file executed anew (not imported: sys.modules is left alone)."""
    source = Path(module.__spec__.origin).read_text(encoding="utf-8")
    namespace = {"__name__": module.__name__, "__file__": module.__spec__.origin,
                 "__package__": module.__package__}
    exec(compile(source, module.__spec__.origin, "exec"), namespace)  # noqa: S102 -- the installed file
    return namespace


def check_unpatched(serverapp=None) -> None:
    """Refuse a server in which the guard's functions or the identity provider were replaced.

    Each function and method of the guard's modules must be the code of the installed file:
    a config file or a planted module that ran first could otherwise monkeypatch the checks
    (or ``WorkbenchIdentityProvider.get_user``) into no-ops; nor may the identity provider
    instance carry methods of its own. Code that runs inside the server can always do
    more; this makes the common patches fail loudly, and the config folder and import path
    rules keep such code from loading.
    """
    for name in _GUARDED_MODULES:
        module = sys.modules.get(name) or importlib.import_module(name)
        fresh = fresh_namespace(module)
        live_codes = _functions(vars(module))
        for attr, code in _functions(fresh).items():
            if live_codes.get(attr) != code:
                raise replaced(f"{name}.{attr}")
        for attr, value in fresh.items():
            if not isinstance(value, type) or value.__module__ != name:
                continue
            live_cls = getattr(module, attr, None)
            if not isinstance(live_cls, type) or _functions(vars(live_cls)) != _functions(vars(value)):
                raise replaced(f"{name}.{attr}")
    identity = getattr(serverapp, "identity_provider", None)
    if identity is not None:
        overridden = sorted(k for k, v in vars(identity).items() if callable(v) and not k.startswith("_trait"))
        if overridden:
            raise replaced(f"the identity provider's {', '.join(overridden)}")


def replaced(what: str) -> LabConfigError:
    return LabConfigError(
        f"{what} is not the installed workbench code: something that ran inside the server "
        "before the guard (a config file, a planted module) replaced it.",
        "look for jupyter_*config.py files and for Python files in the notebook folder and the "
        "current folder; reinstall the workbench (`bash scripts/setup.sh`).",
    )
