"""Sweeps: one notebook run once per combination of settings, ``workbench sweep NOTEBOOK --grid k=v1,v2``.

Each combination is the notebook executed by papermill with the combination's values
injected after its ``parameters`` cell, into its own folder ``outputs/<sweep>/<combination>/``
(the executed notebook, and the run itself: ``output_dir`` is set to that folder), so
``workbench.runs("outputs/<sweep>")`` is the sweep's table. Start reading at ``runner.py``:

    grid.py     ``--grid learning_rate=1e-5,2e-5`` -> the combinations and their folder names
    plan.py     the sweep's plan file (sweep.json) and each combination's status file
    runner.py   run the combinations here: one at a time on CPU, one per GPU on N GPUs; resume
    worker.py   the process that executes one combination (dies with the sweep)
    slurm.py    the same combinations as a Slurm array job, one combination per array task
    cli.py      ``workbench sweep``

Imports: papermill and jupyter_client (through ``workbench.notebook_regression``'s worker),
``workbench.engine.runs`` to read the runs and ``workbench.engine.run_lock`` for the one-sweep-
per-folder lock; never torch: the training happens in the notebooks' kernels.
"""
