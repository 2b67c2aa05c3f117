"""The training engine: one run, from settings to a saved model, in a notebook, a terminal or torchrun.

Start reading at ``train.py``: ``fit`` reads top to bottom (set-up, the loop, the finish).
What only the loop uses sits beside it, one job a module:

    inputs.py       fit's inputs (model, data, settings) -> a TrainConfig and loaded splits
    setup.py        building the run: tokenizer, model, batches, optimizer, schedule, event log -> Run
    batching.py     the length-grouped sampler, the loader, the windows of one optimizer step
    precision.py    fp32 / fp16 / bf16: what the device supports, what "auto" picks, and why
    cpu_bf16.py     what bf16 on a CPU needs beyond autocast: attention computed in fp32
    optim.py        AdamW and transformers' learning-rate schedules
    compile.py      compile=True/"auto": the repeated blocks compiled in place, aligned or bucketed lengths, eager fallback
    fuse_adapters.py  a pass on the compiled blocks' graphs: sibling LoRA adapters as one matrix product
    batch_size.py   batch_size="auto": the micro-batch whose estimated peak fills 85% of free GPU memory; 16 on CPU
    memory.py       out-of-memory: recognise it, free memory, halve the micro-batch
    divergence.py   a run whose loss went far above its start stops before anything diverged is saved
    verdict.py      did the run learn anything? its evaluation against chance, the majority class,
                    the base model; decides best/ and ends every completed run
    distributed.py  Accelerate, agreement across ranks, launching processes from a notebook
    checkpoint.py   atomic checkpoints and model folders, the run record, resume
    async_checkpoint.py  async_checkpoints: a snapshot on the training thread, the files from a writer thread
    run_lock.py     one run per output folder; whether a run is alive, asked of its lock
    stopping.py     signals: save and stop
    events.py       events.jsonl, the run's log that every view reads
    progress.py     headless views of the events: run history, console lines, the chart
    watcher.py      ``watch``: follow a run's events.jsonl from another process
    run_folder.py   ``read_run``: one run folder as a record (status, verdict, metrics, settings)
    runs.py         ``runs``: every run under a folder as a table (``workbench runs DIR``)
    benchmarks.py   the benchmark scores ``workbench.evaluate`` saved in a run folder, read back
    safe_read.py    reading run folders someone else made: regular files only, bounded
    results.py      FitResult, and rebuilding it from a run folder
    runtime.py      the one answer to "am I in a Jupyter kernel?"
    train_cli.py    ``workbench train --config FILE``

Imports: the engine asks a task (``workbench.tasks``) for everything task-specific and
reads models and data through ``workbench.sources``; ``checkpoint.py`` writes each saved model
folder's card through ``workbench.shipping.card``. It never imports a view
(``workbench.widgets``, ipywidgets, IPython.display) or the server (``workbench.server``):
views are listeners on its events (``workbench.frontend`` attaches them).
"""
