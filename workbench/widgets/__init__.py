"""Notebook views. The only package that imports ipywidgets and IPython.display."""
