"""server/tensorboard.py without a server: the command serves a Unix socket under the lab's path,
started without the working folder on sys.path, and should jupyter-server-proxy's open
/proxy/<port> be turned on, its routes go (the config keeping it off: tests/test_lab_config.py;
the probes against a real server: tests/test_lab_probes.py; the TensorBoard process of a real
server, its socket and what it imports: tests/test_processes.py)."""

from __future__ import annotations

import sys

import pytest
from tornado.web import Application

from workbench.server import tensorboard


def test_command_serves_a_unix_socket_under_the_lab_path_without_the_working_folder(tmp_path):
    command = tensorboard.command(tensorboard.logdir_for(tmp_path))
    assert command[1:4] == ["-P", "-m", "workbench.server.tensorboard_process"] or sys.version_info < (3, 11)
    assert command[command.index("workbench.server.tensorboard_process") + 1] == "{unix_socket}"
    assert command[command.index("--logdir") + 1] == str((tmp_path / "outputs").resolve())
    assert command[command.index("--path_prefix") + 1] == "{base_url}tensorboard"
    assert not {"--host", "--port", "--bind_all"} & set(command)
    process = tensorboard.server_process(tmp_path / "outputs")
    assert process.unix_socket is True and process.absolute_url and process.launcher_entry.title == "TensorBoard"


def test_the_launcher_refuses_a_relative_socket_path(capsys):
    from workbench.server import tensorboard_process

    assert tensorboard_process.main(["tb.sock"]) == 2
    assert "usage:" in capsys.readouterr().err


def test_the_open_proxy_routes_are_removed_when_something_turns_them_on():
    from jupyter_server_proxy.config import ServerProxy
    from jupyter_server_proxy.handlers import setup_handlers

    app = Application([], base_url="/")
    setup_handlers(app, ServerProxy())

    def targets():
        return [r.target for host in app.default_router.rules for r in getattr(host.target, "rules", [])]

    assert any("ProxyHandler" in getattr(t, "__name__", "") for t in targets())
    assert tensorboard.remove_open_proxy(app) == 4
    assert not any("ProxyHandler" in getattr(t, "__name__", "") for t in targets())


@pytest.mark.parametrize("name", ["_jupyter_server_extension_points"])
def test_is_a_server_extension(name):
    assert getattr(tensorboard, name)() == [{"module": "workbench.server.tensorboard"}]
