"""Who is in the class: every hub user and their groups, asked of the hub's API.

The teacher wants to see who has not started, not only who has sent something, so the page
lists the hub's users too. The service's token needs two scopes for it (its role in the
hub's config, ``hub_config.SERVICE_SCOPES``): ``list:users`` (the list) and
``read:users:groups`` (each user's name and groups; nothing else of theirs).

The answer is kept :data:`MAX_AGE_S` seconds: the page refreshes every few seconds, the class
changes rarely. A hub that cannot be asked (down, or the role missing) gives ``None`` and a
warning in the service's log; the page then shows the students who have sent results.
"""

from __future__ import annotations

import json
import logging
import time

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

MAX_AGE_S = 30.0
PAGE = 200  # JupyterHub's largest page (api_page_max_limit)
_PAGINATION = "application/jupyterhub-pagination+json"
log = logging.getLogger("workbench.classroom")


class Roster:
    def __init__(self, api_url: str, token: str, max_age_s: float = MAX_AGE_S):
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.max_age_s = max_age_s
        self._cached: tuple[float, dict[str, list[str]] | None] | None = None

    async def users(self) -> dict[str, list[str]] | None:
        """user name -> groups, for every user of the hub; None if the hub did not answer."""
        if self._cached and time.monotonic() - self._cached[0] < self.max_age_s:
            return self._cached[1]
        try:
            found = await self._fetch()
        except (OSError, HTTPClientError, ValueError, KeyError) as error:
            log.warning("workbench classroom: the class list is unavailable (%s); showing the "
                        "students who sent results. Fix: give the service's role the scopes "
                        "list:users and read:users:groups (docs/classroom.md).", error)
            found = None
        self._cached = (time.monotonic(), found)
        return found

    async def _fetch(self) -> dict[str, list[str]]:
        client = AsyncHTTPClient()
        users: dict[str, list[str]] = {}
        offset = 0
        while True:
            response = await client.fetch(HTTPRequest(
                f"{self.api_url}/users?offset={offset}&limit={PAGE}", request_timeout=10,
                headers={"Authorization": f"token {self.token}", "Accept": _PAGINATION}))
            body = json.loads(response.body)
            for user in body["items"]:
                users[user["name"]] = sorted(user.get("groups") or [])
            following = body["_pagination"]["next"]
            if not following:
                return users
            offset = following["offset"]
