"""The hub's side of the class service: the service, its role, and the students' scopes.

``environment/hub/jupyterhub_config.py`` and the hub test call :func:`configure`, so what is
tested is what ships; ``environment/hub/z2jh-values.yaml`` writes the same in the chart's
keys (``tests/test_classroom.py`` compares them).

The scopes, and why each is needed (JupyterHub RBAC, 2.0+):

* the service's role, :data:`SERVICE_SCOPES`: ``list:users`` and ``read:users:groups``, to
  list the class for the teacher's page (students with no result yet included) with each
  student's groups for the filter. Nothing else: identifying a token that comes with a
  result needs no scope of the service's own (``GET /hub/api/user`` is asked *with that
  token*, and any token may identify its owner, name and groups included). No admin, no
  servers, no tokens.
* the ``user`` role gains :data:`ACCESS_SCOPE`, ``access:services!service=classroom``:
  without it neither a student's token nor a teacher's login is let into the service. It
  grants nothing else (it is not ``access:services``, which would open every service).
* the single-user server's token (``JUPYTERHUB_API_TOKEN``, which the kernels inherit) gets
  :data:`ACCESS_SCOPE` too (``Spawner.server_token_scopes``), on top of the ``server`` role's
  defaults (``users:activity!user`` to report activity, ``access:servers!server`` for the
  server's own OAuth). A token gets only scopes its owner holds, hence the ``user`` role.
* teachers are members of the ``teachers`` group (``JupyterHub.load_groups``, or your
  authenticator's groups); the service checks the membership the hub reports.
"""

from __future__ import annotations

import sys

SERVICE = "classroom"
ACCESS_SCOPE = f"access:services!service={SERVICE}"
SERVICE_SCOPES = ["list:users", "read:users:groups"]
SERVER_ROLE_SCOPES = ["users:activity!user", "access:servers!server"]  # JupyterHub's `server` role
SERVER_TOKEN_SCOPES = [*SERVER_ROLE_SCOPES, ACCESS_SCOPE]
PREFIX = f"/services/{SERVICE}/"


def service_spec(url: str, db: str, *, python: str = sys.executable, ip: str | None = None,
                 teachers_group: str = "teachers") -> dict:
    """The entry for ``c.JupyterHub.services``: a hub-managed service at ``url`` (the proxy
    routes /services/classroom/ there), started with the hub and restarted if it exits."""
    command = [python, "-m", "workbench", "classroom", "serve", f"--db={db}",
               f"--teachers-group={teachers_group}"]
    if ip:
        command.append(f"--ip={ip}")  # e.g. 0.0.0.0 where url names a host, not an interface
    return {
        "name": SERVICE,
        "url": url,
        "command": command,
        "display": True,  # listed in the hub's Services menu; it opens in its own tab
        "oauth_no_confirm": True,  # the hub's admin installed it: no "authorize?" page for teachers
    }


def configure(c, *, url: str, kernel_url: str, db: str, python: str = sys.executable,
              ip: str | None = None, teachers_group: str = "teachers") -> dict[str, str]:
    """Add the class service to a JupyterHub config ``c``; keep what is there.

    ``url``: where the service listens, as the proxy reaches it; ``kernel_url``: the
    service's address as the students' kernels reach it (the proxy's /services/classroom/, or
    the service directly). Returns the environment the spawner must give the servers
    (``WORKBENCH_CLASSROOM_URL``): merge it into ``c.Spawner.environment`` (or DockerSpawner's).
    """
    c.JupyterHub.services = [*_get(c.JupyterHub, "services", []),
                             service_spec(url, db, python=python, ip=ip, teachers_group=teachers_group)]
    roles = list(_get(c.JupyterHub, "load_roles", []))
    roles.append({"name": SERVICE, "description": "the class service: the class list with groups",
                  "scopes": SERVICE_SCOPES, "services": [SERVICE]})
    user = next((r for r in roles if r.get("name") == "user"), None)
    if user is None:
        roles.append({"name": "user", "scopes": ["self", ACCESS_SCOPE]})
    else:
        user["scopes"] = [*user.get("scopes", ["self"]), ACCESS_SCOPE]
    c.JupyterHub.load_roles = roles
    token_scopes = _get(c.Spawner, "server_token_scopes", None) or SERVER_ROLE_SCOPES
    c.Spawner.server_token_scopes = [*token_scopes, ACCESS_SCOPE]
    return {"WORKBENCH_CLASSROOM_URL": kernel_url}


def _get(section, name: str, default):
    return section.get(name, default)  # not section[name]: traitlets would make an empty entry
