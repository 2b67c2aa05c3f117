"""Where a run starts: which models and datasets exist, loading them, and checks that explain.

Start reading at ``data.py`` (a dataset choice into train and validation splits) and
``models.py`` (which models exist, their facts), then what each calls:

    paths.py          is a string a local path or a hub id? (one answer for data and models)
    hub.py            the Hugging Face hub's offline switch, read one way everywhere
    data.py           a dataset choice -> train + validation: hub or files, the split, row caps
    data_files.py     local files: the folder convention, checks before reading, reading, and
                      the file and line each row came from (a new file format goes here)
    span_files.py     CoNLL text files and SQuAD's nested JSON, read as they are, with the place
                      of each row (what data_files.py reads them with)
    data_checks.py    columns, texts, labels and splits checked; column facts for the picker;
                      which task the columns say (detect_task)
    models.py         which models exist (folders, packages, cache); facts from their config
    vram.py           GPU memory a classifier fine-tuning run needs, check_fit, the free-memory reading
    vram_causal.py    the same for causal LMs: full, LoRA, QLoRA, preference pairs; check_causal_fit
    cpu_time.py       time per epoch on this CPU, in the precision "auto" picks here (the picker's)
    model_checks.py   checks on a loaded model and tokenizer (a new head, truncation...)
    gguf.py           GGUF files (llama.cpp's format) converted once to a model folder
    synthetic.py, synthetic_llm.py, synthetic_spans.py   offline stand-ins for tests and CI
                      notebooks (reviews and a tiny BERT; chats; CoNLL sentences and SQuAD biographies)

Imports: ``workbench.config`` and ``workbench.errors``; ``vram.py`` (and ``vram_causal.py``) also reads ``workbench.gpu``
(free memory), ``workbench.engine.precision`` (what "auto" precision resolves to; ``cpu_time.py``
too, and its matmul timing) and
``workbench.tasks.lora`` (which layers LoRA targets), inside its functions. Nothing here imports
a view or the server; torch and transformers are imported inside functions, so the
pickers can list models without loading them.
"""
