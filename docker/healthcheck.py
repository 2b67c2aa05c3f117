#!/usr/bin/env python3
"""Docker HEALTHCHECK of the workbench image: does the Jupyter server answer?

GET /api needs no token (it returns only the server version) and the Host header
127.0.0.1 passes the server's Host check. urllib, not curl: the base image may lack curl.
Exit 0 = healthy, 1 = unhealthy (Docker's convention).
"""

import json
import os
import sys
import urllib.request


def main() -> int:
    url = f"http://127.0.0.1:{os.environ.get('WORKBENCH_PORT', '8888')}/api"
    # No proxy: an http_proxy set for downloads must not swallow a loopback request.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=5) as response:
            version = json.load(response)["version"]
    except Exception as exc:  # any failure is "unhealthy", with the reason in `docker inspect`
        print(f"unhealthy: {url}: {exc}")
        return 1
    print(f"healthy: jupyter_server {version} at {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
