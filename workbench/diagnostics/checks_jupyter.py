"""Check of Jupyter's authentication: a server with no token and no password lets anyone
who reaches its port run code as this user."""

from __future__ import annotations

from workbench.diagnostics.facts import JupyterFacts
from workbench.diagnostics.report import ERROR, OK, WARN, CheckResult


def check_jupyter(j: JupyterFacts) -> CheckResult:
    name = "jupyter auth"
    open_servers = [s for s in j.servers if not s.has_token and not s.has_password]
    if open_servers:
        listed = ", ".join(f"{s.url} (pid {s.pid})" for s in open_servers)
        return CheckResult(
            name, ERROR,
            f"Jupyter server {listed} runs with no token and no password: anyone who can reach "
            "its port can run code as this user.",
            "Stop it and start it with `workbench lab` (sets a token), or set JUPYTER_TOKEN "
            "(e.g. export JUPYTER_TOKEN=$(openssl rand -hex 32)) before starting; never publish "
            "port 8888 without a token.",
        )
    if j.in_kernel and j.token_env:
        return CheckResult(
            name, WARN,
            "JUPYTER_TOKEN is in this kernel's environment: a cell that prints os.environ "
            "(or `!env`) saves the token into the notebook.",
            "Start JupyterLab with `workbench lab` or the workbench image, which keep the token "
            "out of kernels and terminals; if it was saved in a notebook, change the token.",
        )
    weak = [s for s in j.servers if s.weak_token]
    if weak:
        listed = ", ".join(f"{s.url} (pid {s.pid})" for s in weak)
        return CheckResult(
            name, WARN, f"Jupyter server {listed} has a short or predictable token.",
            "Restart it with a random token: export JUPYTER_TOKEN=$(python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))'), or let `workbench lab` generate one.",
        )
    if j.servers:
        where = " (read from the server's runtime file: kernels do not get JUPYTER_TOKEN)" if j.in_kernel else ""
        return CheckResult(name, OK, f"{len(j.servers)} running server(s), each with a token or password{where}")
    if j.token_file and not j.token_file_ok:
        return CheckResult(
            name, WARN, f"JUPYTER_TOKEN_FILE={j.token_file} is missing or empty.",
            "Write a token into that file (openssl rand -hex 32 > FILE) or unset JUPYTER_TOKEN_FILE.",
        )
    if j.token_env or j.token_file:
        via = "JUPYTER_TOKEN" if j.token_env else "JUPYTER_TOKEN_FILE"
        return CheckResult(name, OK, f"a token is configured ({via}); no running server found")
    note = f" ({j.error})" if j.error else ""
    return CheckResult(
        name, OK, f"no running Jupyter server found{note}; a server started without JUPYTER_TOKEN "
        "generates a random token (`workbench lab` sets one)",
    )
