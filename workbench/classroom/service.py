"""The class service: a JupyterHub-managed web service that the check cells report to.

Routes, under the service's prefix (``/services/classroom/``):

=====================  ======  ==========================================================
``api/results``        POST    a kernel's results; the hub token in the Authorization header
``""`` (the page)      GET     the teacher's page (static HTML and JS, no data inside)
``api/progress``       GET     the class table as JSON (the page polls it every few seconds)
``progress.csv``       GET     the same table for a spreadsheet (``?group=`` filters)
``oauth_callback``     GET     the end of the hub's OAuth login (JupyterHub's own handler)
``static/...``         GET     the page's script and style sheet
=====================  ======  ==========================================================

Who may do what, all decided by the hub (``jupyterhub.services.auth``, nothing hand-rolled):

* **posting**: a token the hub knows, with the scope ``access:services!service=<name>``
  (the students' server tokens get it, ``hub_config.py``). The student's name and groups are
  the hub's answer for that token (``GET /hub/api/user``), never the request body. Only the
  header counts: a browser's cookie cannot post for a student (``HubAuth``, not ``HubOAuth``).
* **reading**: the hub's OAuth login (a cookie of this service), then membership of the
  teachers group as the hub reports it. Everyone else gets 403. The hub's answer is cached
  :data:`AUTH_CACHE_S` seconds, so removing someone from the group takes effect within that.

The page holds no data: the script fetches ``api/progress`` and writes every name with
``textContent``, so an exercise named ``<script>`` by a student stays text. Frames are
refused (``frame-ancestors 'none'``, as JupyterHub 4.1+ does for its own pages): the page
opens in a tab of its own.
"""

from __future__ import annotations

import html
import json
import logging
import os
import secrets
from dataclasses import dataclass
from importlib import resources
from urllib.parse import urlparse

from jupyterhub.services.auth import (
    HubAuth,
    HubAuthenticated,
    HubOAuth,
    HubOAuthCallbackHandler,
    HubOAuthenticated,
    UserNotAllowed,
)
from tornado import web

from workbench.classroom.record import RecordError, from_json
from workbench.classroom.roster import Roster
from workbench.classroom.store import ClassStore, class_table, table_csv
from workbench.errors import ClassroomError

log = logging.getLogger("workbench.classroom")
AUTH_CACHE_S = 60  # how long the hub's answer for a token or login is trusted
MAX_BODY = 256 * 1024  # a batch of 200 results is ~40 KB
MAX_RESULTS = 200  # per POST
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
       "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


@dataclass
class Settings:
    """What the service needs, from the hub's environment and the command line."""

    db: str  # the SQLite file
    prefix: str  # /services/<name>/
    host: str  # where to listen
    port: int
    teachers_group: str = "teachers"

    @classmethod
    def from_environment(cls, db: str | None, ip: str | None = None, port: int | None = None,
                         teachers_group: str = "teachers", environ=None) -> Settings:
        env = os.environ if environ is None else environ
        needed = ("JUPYTERHUB_API_TOKEN", "JUPYTERHUB_API_URL", "JUPYTERHUB_SERVICE_URL",
                  "JUPYTERHUB_SERVICE_PREFIX")
        missing = [name for name in needed if not env.get(name)]
        if missing:
            raise ClassroomError(
                f"{', '.join(missing)} not set: the class service runs as a JupyterHub service, "
                "and the hub sets these when it starts it.",
                "add it to c.JupyterHub.services (workbench.classroom.hub_config.configure does, "
                "see docs/classroom.md), with a url; do not start it by hand.")
        if not db:
            raise ClassroomError("no database file given.",
                                 "pass --db /srv/jupyterhub/classroom.sqlite (next to the hub's own database).")
        bind = urlparse(env["JUPYTERHUB_SERVICE_URL"])
        return cls(db=db, prefix=env["JUPYTERHUB_SERVICE_PREFIX"], host=ip or bind.hostname or "127.0.0.1",
                   port=port or bind.port or 80, teachers_group=teachers_group)


class ClassService:
    """The store, the class list and the two ways the hub authenticates, shared by the handlers."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.store = ClassStore(settings.db)
        # Tokens only (kernels). HubAuth reads JUPYTERHUB_API_URL/_TOKEN and the access
        # scope (access:services!service=<name>) from the environment the hub gave.
        self.token_auth = HubAuth(cache_max_age=AUTH_CACHE_S)
        # Browsers (teachers): the hub's OAuth, then a cookie of this service.
        self.oauth = HubOAuth(cache_max_age=AUTH_CACHE_S)
        self.roster = Roster(self.token_auth.api_url, self.token_auth.api_token)


class _Base(web.RequestHandler):
    """Security headers, the hub's identity without blocking, errors as JSON.

    Subclasses put JupyterHub's mixin first (``HubAuthenticated`` before this class), so its
    ``get_login_url`` and ``check_hub_user`` are the ones tornado calls."""

    def initialize(self, service: ClassService) -> None:
        self.service = service

    def set_default_headers(self) -> None:
        self.set_header("Content-Security-Policy", CSP)
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Referrer-Policy", "no-referrer")
        self.set_header("Cache-Control", "no-store")

    async def prepare(self) -> None:
        """Ask the hub who this is without blocking the server (get_user(sync=False));
        tornado's ``current_user`` is then the hub's model, or None."""
        self.hub_auth = self._auth()
        model = await self.hub_auth.get_user(self, sync=False)
        if model is not None:
            try:
                model = self.check_hub_user(model)
            except UserNotAllowed:
                raise web.HTTPError(403, "this account may not use the class service") from None
        self.current_user = model

    def write_error(self, status_code: int, **kwargs) -> None:
        error = kwargs.get("exc_info", (None, None))[1]
        message = getattr(error, "log_message", None) or self._reason
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": status_code, "message": message}))


class ResultsHandler(HubAuthenticated, _Base):
    """POST api/results: ``{"results": [CheckRecord, ...]}`` from a kernel."""

    def _auth(self) -> HubAuth:
        return self.service.token_auth

    def check_xsrf_cookie(self) -> None:
        return None  # the token is in a header; no cookie is ever read here

    @web.authenticated  # no user: HubAuth has no login page, so 403
    def post(self) -> None:
        user = self.current_user
        if user.get("kind") != "user":
            raise web.HTTPError(403, "only a student's token can send results")
        if len(self.request.body) > MAX_BODY:
            raise web.HTTPError(413, f"more than {MAX_BODY} bytes: send at most {MAX_RESULTS} results at once")
        try:
            items = json.loads(self.request.body)["results"]
        except (ValueError, KeyError, TypeError):
            items = None
        if not isinstance(items, list) or len(items) > MAX_RESULTS:
            raise web.HTTPError(400, f'expected {{"results": [...]}} with at most {MAX_RESULTS} results')
        records, refused = [], []
        for index, item in enumerate(items):
            try:
                records.append((index, from_json(item)))
            except RecordError as error:
                refused.append((index, str(error)))
        outcome = self.service.store.add(user["name"], user.get("groups") or [], [r for _, r in records])
        # store.add numbers what it refused within ``records``; map back to the request's indexes.
        refused += [(records[i][0], why) for i, why in outcome.refused]
        self.finish({"student": user["name"], "stored": outcome.stored,
                     "duplicates": outcome.duplicates,
                     "refused": [{"index": i, "error": why} for i, why in sorted(refused)]})


class _TeacherBase(HubOAuthenticated, _Base):
    def _auth(self) -> HubOAuth:
        return self.service.oauth

    def write_error(self, status_code: int, **kwargs) -> None:
        if self.request.path.endswith("/api/progress"):
            return super().write_error(status_code, **kwargs)
        error = kwargs.get("exc_info", (None, None))[1]
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(f"{status_code}: {getattr(error, 'log_message', None) or self._reason}\n")

    def require_teacher(self) -> dict:
        user = self.current_user
        if self.service.settings.teachers_group not in (user.get("groups") or []):
            raise web.HTTPError(403, f"{user['name']} is not in the group "
                                f"'{self.service.settings.teachers_group}': this page is for teachers")
        return user

    async def table(self) -> dict:
        roster = await self.service.roster.users()
        return class_table(self.service.store, roster, self.service.settings.teachers_group)


class PageHandler(_TeacherBase):
    @web.authenticated  # no login yet: redirected to the hub's OAuth, and back
    def get(self) -> None:
        self.require_teacher()
        # The page's script sends this back: JupyterHub's XSRF check on cookie-authenticated
        # requests from scripts (this call also sets the matching _xsrf cookie).
        token = self.xsrf_token
        token = token.decode("ascii") if isinstance(token, bytes) else token
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(_static("teacher.html").replace("{{xsrf}}", html.escape(token, quote=True)))


class ProgressHandler(_TeacherBase):
    async def get(self) -> None:
        if self.current_user is None:  # an expired login: the page tells the teacher to reload
            raise web.HTTPError(403, "not logged in: reload the page")
        teacher = self.require_teacher()
        table = await self.table()
        table["teacher"] = teacher["name"]
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(table))


class CsvHandler(_TeacherBase):
    @web.authenticated
    async def get(self) -> None:
        self.require_teacher()
        group = self.get_argument("group", "") or None
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        name = f"class-progress{'-' + group if group else ''}.csv"
        self.set_header("Content-Disposition", f'attachment; filename="{_safe_filename(name)}"')
        self.finish(table_csv(await self.table(), group))


class OAuthCallback(HubOAuthCallbackHandler):
    def initialize(self, service: ClassService) -> None:
        self.hub_auth = service.oauth


def _safe_filename(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _static(name: str) -> str:
    return resources.files("workbench.classroom").joinpath("static", name).read_text(encoding="utf-8")


def make_app(service: ClassService) -> web.Application:
    prefix = service.settings.prefix
    static = str(resources.files("workbench.classroom").joinpath("static"))
    args = {"service": service}
    return web.Application([
        (prefix.rstrip("/"), web.RedirectHandler, {"url": prefix}),
        (prefix, PageHandler, args),
        (prefix + "api/results", ResultsHandler, args),
        (prefix + "api/progress", ProgressHandler, args),
        (prefix + "progress.csv", CsvHandler, args),
        (prefix + "oauth_callback", OAuthCallback, args),
        (prefix + "static/(teacher\\.js|teacher\\.css)", web.StaticFileHandler, {"path": static}),
    ], cookie_secret=secrets.token_bytes(32),  # OAuth state only: a restart means one more redirect
       xsrf_cookies=False)  # nothing here changes state from a cookie: the only POST takes a token


async def serve(settings: Settings) -> None:
    """Run the service until the hub stops it."""
    import asyncio

    service = ClassService(settings)
    app = make_app(service)
    app.listen(settings.port, settings.host, max_body_size=MAX_BODY * 2, xheaders=True)
    log.info("workbench classroom: listening on %s:%s%s, database %s, teachers group '%s'",
             settings.host, settings.port, settings.prefix, settings.db, settings.teachers_group)
    await asyncio.Event().wait()
