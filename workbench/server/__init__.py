"""The Jupyter server: ``workbench lab``, the image's entry point and JupyterHub single-user mode.

Start reading at ``jupyter_config/jupyter_server_config.py``, the one server configuration
every way of starting a server loads, then ``guard.py``, the extension that refuses to let
an unsafe server start:

    lab.py              ``workbench lab``: the command line, its option allow-list, the launch
    jupyter_config/     the server configuration (also /etc/jupyter's in the image)
    guard.py            the server extension: pinned on, checks the effective settings, log redaction
    floor.py            the security floor: every setting the server refuses, with its fix
    credentials.py      the token (or password hash): where it comes from, whether it is strong
    origins.py          which web origins may talk to the server
    identity.py         the identity provider: foreign origins refused even with the token
    integrity.py        the guard's own code and the ServerApp hooks checked against the installed files
    processes.py        every process the server starts, and how each imports nothing from the notebook folder
    kernels.py          the server's kernels (and papermill's) start that way: nothing planted beside a notebook runs
    tensorboard.py      TensorBoard at <lab>/tensorboard/, the only thing proxied
    tensorboard_process.py  the TensorBoard process: -P, a Unix socket in a private folder, no TCP port
    hub_singleuser.py   the same server spawned by JupyterHub (the hub authenticates)

Imports: ``workbench.errors`` and jupyter_server / tornado only. Nothing of the engine,
the tasks or torch: starting the lab stays fast and small (``tests/test_import_graph.py``).
``tensorboard_process.py`` imports TensorBoard, in its own process only.
"""
