"""The workbench's Jupyter identity provider: the token never works from another web site.

jupyter_server lets a token-authenticated request skip the origin check and echoes its
Origin in ``Access-Control-Allow-Origin`` (``IdentityProvider.should_check_origin``,
``JupyterHandler.set_cors_headers``): a page on any site that has the token (from a
shared link, a screenshot, a log) can drive the API and open kernel websockets. Here a
request that carries an Origin other than the server's own (or the one exact
``ServerApp.allow_origin``) is refused with 403 before any credential is looked at, for
every handler, websockets included. Requests without an Origin (scripts, curl, the
health check, top-level navigation) are judged on their credentials as before.

Also: the login cookie is ``SameSite=Strict`` whatever ``cookie_options`` say, and the
token is compared in constant time. The server configuration selects this class and
``workbench.server.guard`` refuses to start with any other.
"""

from __future__ import annotations

import hmac
import typing as t

from jupyter_server.auth.identity import PasswordIdentityProvider, User
from tornado import web

from workbench.server.origins import origin_allowed


class WorkbenchIdentityProvider(PasswordIdentityProvider):
    """PasswordIdentityProvider that refuses foreign origins whatever the credentials."""

    def get_user(self, handler: web.RequestHandler) -> User | None | t.Awaitable[User | None]:
        headers = handler.request.headers
        # Version-8 websocket clients send Sec-Websocket-Origin instead of Origin.
        origin = headers.get("Origin", headers.get("Sec-Websocket-Origin"))
        if origin is not None and not origin_allowed(
            origin, handler.request.host, handler.settings.get("allow_origin", "")
        ):
            self.log.warning(
                "workbench: refused a cross-origin request to %s (Origin %r, Host %r)",
                handler.request.path, origin[:200], handler.request.host[:200],
            )
            raise web.HTTPError(403, "cross-origin requests are refused")
        return super().get_user(handler)

    def should_check_origin(self, handler: web.RequestHandler) -> bool:
        # jupyter_server skips its own origin checks for token-authenticated requests; never.
        return True

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
        self.cookie_options = {**saved, "samesite": "Strict"}
        try:
            super().set_login_cookie(handler, user)
        finally:
            self.cookie_options = saved
