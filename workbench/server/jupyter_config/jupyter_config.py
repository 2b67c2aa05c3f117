# The image's /etc/jupyter/jupyter_config.py: the first Python config file of every Jupyter
# server in the image, so that no other one runs.
#
# Jupyter config files are Python and run inside the server. jupyter_core runs the
# jupyter_config.py of every config folder, lowest priority first (this system folder comes
# first), *before* any jupyter_server_config.py -- so a ~/.jupyter/jupyter_config.py written by
# a notebook would run before the workbench configuration, and could hide itself from the
# guard's later check and patch what the guard does not look at. This file stops a server
# whose config folders (or --config file) hold any Python config file other than the
# workbench's two, before any of them runs. `workbench lab`, the entry point, hub mode and the
# image's `jupyter lab` / `jupyter server` (docker/jupyter-start.sh) give the server a config
# folder of its own and pass this check; `python -m jupyterlab` typed by hand passes it too when
# no other config file is there. Other Jupyter programs (nbconvert, jupyter kernelspec...) are
# not checked. See docs/security.md.
import sys

from workbench.server import guard, integrity

_serverapp = sys.modules.get("jupyter_server.serverapp")
if _serverapp is not None and _serverapp.ServerApp.initialized():  # a server is loading its config
    with guard.refuse_to_start_on_error():
        integrity.check_config_files(_serverapp.ServerApp.instance())
        integrity.check_import_path()
