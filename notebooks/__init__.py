"""The workbench's notebooks, shipped inside the package as ``workbench._notebooks``.

This file only makes the folder a package: pyproject.toml maps ``workbench._notebooks``
onto it, so a wheel carries the notebooks and `workbench regress` finds them with
importlib.resources when no checkout is at hand (in the editable install of a checkout,
the package *is* this folder). Nothing here is code to import.
"""
