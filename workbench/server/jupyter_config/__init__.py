"""Package data: the one Jupyter server configuration of the workbench.

``jupyter_server_config.py`` here is a traitlets config file, not a module to
import: `workbench lab` passes its path with ``--config`` and the image copies it to
``/etc/jupyter/``. It ships inside the package so that an installed wheel finds it
(:func:`workbench.server.lab.find_server_config`).
"""
