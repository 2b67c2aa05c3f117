"""The workbench's Jupyter identity provider: the token never works from another web site.

jupyter_server lets a token-authenticated request skip the origin check and echoes its
Origin in ``Access-Control-Allow-Origin`` (``IdentityProvider.should_check_origin``,
``JupyterHandler.set_cors_headers``): a page on any site that has the token (from a
shared link, a screenshot, a log) can drive the API and open kernel websockets. Here a
request that carries an Origin other than the server's own (or the one exact
``ServerApp.allow_origin``) is refused with 403 before any credential is looked at, for
every handler, websockets included. Requests without an Origin (scripts, curl, the
health check, top-level navigation) are judged on their credentials as before.

Also: the login cookie is ``SameSite=Strict`` whatever ``cookie_options`` say, lasts at
most :data:`COOKIE_MAX_AGE_DAYS`, and is signed with a secret derived from the token, so
that a new token ends every session made with the old one; the token is compared in
constant time. The server configuration selects this class and ``workbench.server.guard``
refuses to start with any other. In JupyterHub single-user mode the hub's identity provider
gets the same origin rule (:func:`refuse_foreign_origins`).
"""

from __future__ import annotations

import hashlib
import hmac
import typing as t

from jupyter_server.auth.identity import PasswordIdentityProvider, User
from tornado import web
from traitlets import default, validate

from workbench.server.origins import origin_allowed

# A login cookie older than this is refused, and the browser drops it then too: a cookie
# copied from a browser (or a backup of its profile) stops working within a day, and a
# day covers a working session. An expired cookie only means entering the token again;
# kernels and training runs are not affected.
COOKIE_MAX_AGE_DAYS = 1


def check_request_origin(provider, handler: web.RequestHandler) -> None:
    """403 for a request whose Origin is neither the server's own nor the one allowed origin."""
    headers = handler.request.headers
    # Version-8 websocket clients send Sec-Websocket-Origin instead of Origin.
    origin = headers.get("Origin", headers.get("Sec-Websocket-Origin"))
    if origin is not None and not origin_allowed(
        origin, handler.request.host, handler.settings.get("allow_origin", "")
    ):
        provider.log.warning(
            "workbench: refused a cross-origin request to %s (Origin %r, Host %r)",
            handler.request.path, origin[:200], handler.request.host[:200],
        )
        raise web.HTTPError(403, "cross-origin requests are refused")


class RefuseForeignOrigins:
    """Mixin for an identity provider: foreign origins are refused before any credential counts."""

    def get_user(self, handler: web.RequestHandler) -> User | None | t.Awaitable[User | None]:
        check_request_origin(self, handler)
        return super().get_user(handler)  # type: ignore[misc]

    def should_check_origin(self, handler: web.RequestHandler) -> bool:
        # jupyter_server skips its own origin checks for token-authenticated requests; never.
        return True


def refuse_foreign_origins(provider) -> None:
    """Give a running identity provider (JupyterHub's) the origin rule of the standalone server.

    The class is swapped for a subclass with :class:`RefuseForeignOrigins` first and the same
    name, so the provider keeps its state and what checks it by name still recognises it.
    """
    cls = type(provider)
    if issubclass(cls, RefuseForeignOrigins):
        return
    provider.__class__ = type(cls.__name__, (RefuseForeignOrigins, cls), {"__module__": cls.__module__})


class WorkbenchIdentityProvider(RefuseForeignOrigins, PasswordIdentityProvider):
    """PasswordIdentityProvider that refuses foreign origins whatever the credentials."""

    def cookie_secret_hook(self, h: hmac.HMAC) -> hmac.HMAC:
        # jupyter_server signs cookies with HMAC(persisted secret, password hash); adding the
        # token means a restart with a new token invalidates every cookie made with the old one.
        h = super().cookie_secret_hook(h)
        h.update(b"\0workbench-token\0" + hashlib.sha256((self.token or "").encode()).digest())
        return h

    @default("get_secure_cookie_kwargs")
    def _default_cookie_age(self) -> dict[str, t.Any]:
        return {"max_age_days": COOKIE_MAX_AGE_DAYS}

    @validate("get_secure_cookie_kwargs")
    def _cap_cookie_age(self, proposal) -> dict[str, t.Any]:
        # A config may ask for less, never for more (tornado's default is 31 days).
        asked = float(proposal.value.get("max_age_days", COOKIE_MAX_AGE_DAYS))
        return {**proposal.value, "max_age_days": min(asked, COOKIE_MAX_AGE_DAYS)}

    async def get_user_token(self, handler: web.RequestHandler) -> User | None:
        token = t.cast("str | None", handler.token)  # type:ignore[attr-defined]
        if not token:
            return None
        given = self.get_token(handler) or ""
        # Constant time: a byte-by-byte comparison leaks how much of a guess was right.
        if not hmac.compare_digest(given.encode(), token.encode()):
            return None
        user = self.get_user_cookie(handler)
        if isinstance(user, t.Awaitable):
            user = await user
        return user if user is not None else self.generate_anonymous_user(handler)

    def set_login_cookie(self, handler: web.RequestHandler, user: User) -> None:
        # SameSite=Strict: the browser sends the login cookie only on requests this
        # server's own pages make, not on links, forms or fetches from other sites.
        saved = self.cookie_options
        self.cookie_options = {**saved, "samesite": "Strict", "expires_days": COOKIE_MAX_AGE_DAYS}
        try:
            super().set_login_cookie(handler, user)
        finally:
            self.cookie_options = saved
