"""Where a run starts: which models and datasets exist, loading them, and checks that explain.

Start reading at ``data.py`` (datasets: hub ids, local files, splits, the checks that name
a bad row) and ``models.py`` (model facts, memory estimates, what fits a GPU):

    paths.py          is a string a local path or a hub id? (one answer for data and models)
    hub.py            the Hugging Face hub's offline switch, read one way everywhere
    data.py           load and check datasets; errors point at the user's file and row
    models.py         model facts (size, layers, heads), VRAM estimates, check_fit
    model_checks.py   checks on a loaded model and tokenizer (a new head, truncation...)
    gguf.py           GGUF files (llama.cpp's format) converted once to a model folder
    synthetic.py, synthetic_llm.py   tiny offline stand-ins for tests and CI notebooks

Imports: ``workbench.config``, ``workbench.errors``, ``workbench.gpu`` (free memory) and
``workbench.engine.precision`` (what "auto" precision resolves to). Nothing here imports
a view or the server; torch and transformers are imported inside functions, so the
pickers can list models without loading them.
"""
