"""The class service: check cells report to a JupyterHub service, the teacher sees who passed.

Two sides that meet over HTTP, with JupyterHub in between for every identity:

    record.py      one check result (exercise, passed, attempt, time, version): the fields
                   and their checks, shared by both sides; never code, data or a name
    client.py      in the student's kernel: a local file always; under a hub, an outbox
                   posted with the kernel's hub token in a background thread (never fails
                   or holds up the cell; nothing is sent standalone, headless or in CI)
    service.py     the hub-managed web service: POST results (name and groups from the hub
                   for the token), the teachers-only page behind the hub's OAuth, JSON, CSV
    store.py       SQLite next to the hub: one row per student × exercise, WAL, one
                   transaction per post; the class table and its CSV
    roster.py      the hub's users and groups (the service's token), for "not yet" rows
    hub_config.py  the service entry, its role and the students' token scopes for a hub config
    cli.py         `workbench classroom serve | export | reset`
    static/        the teacher's page: HTML, script and style sheet (no data inside)

Imports: the kernel side (``record.py``, ``client.py``) uses the standard library and
``workbench.engine.runtime`` (is this kernel headless?), never tornado or jupyterhub; the
service side adds tornado and ``jupyterhub.services.auth``. Neither side imports torch,
transformers or any ML library, nor ``tasks``, ``sources``, ``widgets`` or ``server``: the
service runs next to the hub, on a machine without them (``tests/test_import_graph.py``).
"""
