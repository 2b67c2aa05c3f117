"""server/tensorboard.py without a server: the command binds 127.0.0.1 under the lab's path, and
should jupyter-server-proxy's open /proxy/<port> be turned on, its routes go (the config keeping
it off: tests/test_lab_config.py; the probes against a real server: tests/test_lab_probes.py)."""

from __future__ import annotations

import pytest
from tornado.web import Application

from workbench.server import tensorboard


def test_command_binds_loopback_under_the_lab_path(tmp_path):
    command = tensorboard.command(tensorboard.logdir_for(tmp_path))
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert command[command.index("--logdir") + 1] == str((tmp_path / "outputs").resolve())
    assert command[command.index("--path_prefix") + 1] == "{base_url}tensorboard"
    assert "--bind_all" not in command
    process = tensorboard.server_process(tmp_path / "outputs")
    assert process.absolute_url and process.launcher_entry.title == "TensorBoard"


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
