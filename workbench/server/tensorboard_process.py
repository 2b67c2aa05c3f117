"""The TensorBoard process the lab starts: TensorBoard's own app, served on a Unix socket only.

``python -P -m workbench.server.tensorboard_process SOCKET [TENSORBOARD FLAGS...]``, started by
jupyter-server-proxy for ``server/tensorboard.py`` (docs/security.md says why each part matters):

* **-P, and its working folder is the socket's folder.** jupyter-server-proxy starts it in the
  server's working folder, the notebook folder, which every notebook can write: with ``python
  -m tensorboard.main`` a ``tensorboard/`` package or a ``packaging.py`` planted there would run
  at the first TensorBoard tab and could read the server's token.
* **A Unix socket in a folder only this user can open, no TCP port.** TensorBoard has no login
  and no Host check; on ``127.0.0.1:<port>`` every user of the machine could read its runs, and
  a web page could reach it by DNS rebinding. The socket lives in the mode-700 folder that
  jupyter-server-proxy makes for it (``unix_socket=True``); only the lab, with its token or
  cookie, proxies to it, and a browser cannot reach a Unix socket at all.

TensorBoard 2.21 has no Unix-socket option of its own, but takes a server class
(``program.TensorBoard(server_class=...)``); werkzeug's server, which TensorBoard uses, serves
``unix://`` addresses. This module imports TensorBoard only when run; the server never imports it.
"""

from __future__ import annotations

import os
import sys

USAGE = "usage: python -P -m workbench.server.tensorboard_process SOCKET [TENSORBOARD FLAGS...]"


def unix_socket_server(socket_path: str):
    """A TensorBoard server class that listens on ``socket_path`` (a Unix socket) and nowhere else."""
    from tensorboard import program
    from werkzeug import serving

    class UnixSocketServer(serving.ThreadedWSGIServer, program.TensorBoardServer):
        daemon_threads = True

        def __init__(self, wsgi_app, flags):
            self._prefix = (flags.path_prefix or "").rstrip("/")
            super().__init__("unix://" + socket_path, 0, wsgi_app, program._WSGIRequestHandler)
            os.chmod(socket_path, 0o600)  # its folder is already 700; the socket need not be more

        def get_url(self) -> str:
            return f"http+unix://{socket_path}{self._prefix}/"

    return UnixSocketServer


def main(argv: list[str]) -> int:
    if not argv or not os.path.isabs(argv[0]):
        print(USAGE, file=sys.stderr)
        return 2
    socket_path, flags = argv[0], argv[1:]
    os.chdir(os.path.dirname(socket_path))  # not the notebook folder, even as a working folder
    from tensorboard import default, main_lib, program

    main_lib.global_init()
    board = program.TensorBoard(plugins=default.get_plugins(), server_class=unix_socket_server(socket_path))
    # TensorBoard would record its port in /tmp/.tensorboard-info/ for `%tensorboard` to find:
    # there is no port, and that folder is shared by every user of the machine.
    board._register_info = lambda server: None
    board.configure(argv=["tensorboard", *flags])
    return board.main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
