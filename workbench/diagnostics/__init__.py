"""Environment diagnostics (`workbench doctor`, ``workbench.doctor()``): find the traps that
waste days, name each one, give the fix.

The traps: an NVIDIA driver older than torch's CUDA build, a GPU too old for the
kernels torch ships, a 64 MB /dev/shm that kills DataLoader workers, checkpoints
written inside a container layer that is deleted with the container, a Jupyter
server anyone can use.

Three layers, so every check can be tested with plain inputs:

* ``gather_*()`` collect *facts* (dataclasses) from torch, ``workbench.gpu``
  (the only NVML user), ``os`` and ``/proc``. They never raise for a missing
  GPU, driver or package: the absence is a fact.
* ``check_*()`` are pure functions from facts to a :class:`CheckResult`
  (level ``ok`` / ``warn`` / ``error``, a message, and the fix).
* :class:`DoctorReport` renders the results: a text table for terminals, an
  HTML table in notebooks (``workbench.doctor()`` as the last line of a cell),
  JSON for machines.

Modules, one job each:

    values.py           version strings and byte sizes
    report.py           CheckResult, DoctorReport and its text/HTML/JSON rendering (JSON schema)
    mounts.py           /proc/self/mountinfo parsing and container detection
    facts.py            the facts dataclasses and gather_*() for Python, torch, GPUs, the CPU
                        (its bf16 support, from workbench.engine.precision), /dev/shm,
                        directories, Hugging Face and Jupyter
    checks_software.py  Python, packages, torch build, torch.cuda
    checks_gpu.py       driver vs CUDA build, GPU arch coverage, bf16, MIG (the rules)
    checks_system.py    the CPU's bf16 support (what precision="auto" picks on CPU), /dev/shm
                        and the output directory (writable, space, volume)
    checks_hub.py       Hugging Face cache, offline mode, hub reachability
    checks_jupyter.py   Jupyter token/password
    diagnose.py         gather_facts(), build_report(), doctor()
    cli.py              add_arguments()/run_cli() for `workbench doctor`

Import a name from the module that defines it (``from workbench.diagnostics.checks_gpu
import check_driver``): this package re-exports nothing. The public entry is
``workbench.doctor()``, which ``workbench`` loads from diagnose.py.
"""
