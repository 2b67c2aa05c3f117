"""TensorBoard inside JupyterLab, through the same authenticated server: ``<lab>/tensorboard/``.

A server extension (enabled by ``jupyter_config/jupyter_server_config.py``, standalone and in
JupyterHub mode) that uses jupyter-server-proxy's machinery for exactly one named server:
TensorBoard, started on first use with ``--logdir`` = the server root's ``outputs/`` (where the
notebooks' runs write ``<run>/tensorboard/``), and reached only as ``/tensorboard/...`` on the
lab's own address with its token or cookie. A launcher tile "TensorBoard" opens it in a
JupyterLab tab. A ``%tensorboard`` iframe would point at the browser's own localhost instead,
which is not the server in a container or on a remote GPU box.

The TensorBoard process (``server/tensorboard_process.py``) starts with ``python -P`` (the
server's working folder is the notebook folder: a planted ``tensorboard/`` package must not
run) and listens on a Unix socket in a folder only this user can open, never on a TCP port:
TensorBoard itself has no login and no Host check (docs/security.md: why a socket rather than
a secret header).

What is *not* served: jupyter-server-proxy's own server extension adds ``/proxy/<port>``
and ``/proxy/<host>:<port>``, an authenticated tunnel to any port on the machine (a
database, another user's notebook server, a cloud metadata endpoint behind a local
forwarder). The workbench keeps that extension off (the config file sets it False, after
the ``jupyter_server_config.d`` file its package installs turned it on; hub mode keeps that)
and this module registers only the TensorBoard route; should something turn the extension
back on, its generic routes are removed from the server at load time (``remove_open_proxy``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from workbench.server.processes import safe_module_argv

EXTENSION = "workbench.server.tensorboard"
PROXY_EXTENSION = "jupyter_server_proxy"  # its generic /proxy/<port> routes stay off
NAME = "tensorboard"  # the URL path: <base_url>tensorboard/
LOGDIR = "outputs"  # under the server's root folder, as the notebooks write their runs
START_TIMEOUT_S = 90.0  # TensorBoard imports a lot; two busy cores take a while


def _jupyter_server_extension_points():
    return [{"module": EXTENSION}]


def logdir_for(root_dir: str | os.PathLike) -> Path:
    return Path(root_dir).expanduser().resolve() / LOGDIR


def command(logdir: Path) -> list[str]:
    """TensorBoard on a Unix socket only; ``{unix_socket}`` and ``{base_url}`` are filled in by jupyter-server-proxy."""
    return [*safe_module_argv(sys.executable, "workbench.server.tensorboard_process"), "{unix_socket}",
            "--logdir", str(logdir), "--path_prefix", "{base_url}" + NAME,
            # The Python reader: the fast (Rust) one starts a second server on a TCP port.
            "--load_fast", "false", "--reload_interval", "5"]


def server_process(logdir: Path):
    from jupyter_server_proxy.config import ServerProcess

    # unix_socket=True: a socket in a new folder of mode 700 (tempfile.mkdtemp).
    # A dict, not a LauncherEntry: jupyter-server-proxy overwrites an entry's title with the name.
    return ServerProcess(
        name=NAME, command=command(logdir), unix_socket=True, absolute_url=True, timeout=START_TIMEOUT_S,
        launcher_entry={"enabled": True, "title": "TensorBoard", "path_info": NAME + "/", "category": "Other"},
        new_browser_tab=False)


def _open_proxy_rule_lists(web_app):
    """(rules, open rules) of each router of ``web_app`` that holds jupyter-server-proxy's generic routes."""
    from jupyter_server_proxy.handlers import LocalProxyHandler, RemoteProxyHandler

    open_kinds = (LocalProxyHandler, RemoteProxyHandler)
    for host_rule in web_app.default_router.rules:
        rules = getattr(getattr(host_rule, "target", None), "rules", None)
        if isinstance(rules, list):
            yield rules, [r for r in rules if getattr(r, "target", None) in open_kinds]


def open_proxy_routes(web_app) -> list[str]:
    """The URL patterns of jupyter-server-proxy's generic ``/proxy/...`` routes in ``web_app`` ([] when closed)."""
    return [str(getattr(r.matcher, "regex", r.matcher).pattern) for _, found in _open_proxy_rule_lists(web_app)
            for r in found]


def remove_open_proxy(web_app) -> int:
    """Drop jupyter-server-proxy's generic ``/proxy/...`` routes from ``web_app``; returns how many."""
    removed = 0
    for rules, found in list(_open_proxy_rule_lists(web_app)):
        rules[:] = [r for r in rules if r not in found]
        removed += len(found)
    return removed


def _load_jupyter_server_extension(serverapp) -> None:
    from jupyter_server.utils import url_path_join
    from jupyter_server_proxy.api import IconHandler, ServersInfoHandler
    from jupyter_server_proxy.config import make_handlers

    web_app = serverapp.web_app
    base_url = web_app.settings["base_url"]
    logdir = logdir_for(serverapp.root_dir)
    process = server_process(logdir)
    handlers = make_handlers(base_url, [process])
    # What the launcher tile asks for (the JupyterLab side ships with jupyter-server-proxy).
    handlers += [(url_path_join(base_url, "server-proxy/servers-info"), ServersInfoHandler,
                  {"server_processes": [process]}),
                 (url_path_join(base_url, "server-proxy/icon/(.*)"), IconHandler, {"icons": {}})]
    web_app.add_handlers(".*", handlers)
    removed = remove_open_proxy(web_app)
    if removed:
        serverapp.log.warning("workbench: removed %d open /proxy/<port> routes of %s: only TensorBoard is "
                              "proxied (set ServerApp.jpserver_extensions.%s = False to silence this)",
                              removed, PROXY_EXTENSION, PROXY_EXTENSION)
    serverapp.log.info("workbench: TensorBoard at %s%s/ (logdir %s, started on first use)", base_url, NAME, logdir)


load_jupyter_server_extension = _load_jupyter_server_extension
