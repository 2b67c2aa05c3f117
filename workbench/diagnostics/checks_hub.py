"""Checks of the Hugging Face set-up: the cache directory, offline mode, and whether the hub
answers (the doctor's only network request)."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request

from workbench.diagnostics.facts import HubFacts
from workbench.diagnostics.report import ERROR, OK, WARN, CheckResult

HUB_TIMEOUT_S = 2.0


def check_hub_cache(h: HubFacts) -> CheckResult:
    name = "hf cache"
    if not h.installed:
        return CheckResult(name, ERROR, "huggingface_hub is not installed.",
                           "pip install huggingface_hub (in a workbench checkout: bash scripts/setup.sh)")
    c = h.cache
    if c is not None and not c.writable:
        return CheckResult(
            name, WARN, f"the Hugging Face cache {h.hub_cache} is not writable ({c.write_error}): "
            "downloads will fail.", "Point HF_HOME at a writable directory, e.g. export HF_HOME=$PWD/.hf",
        )
    message = f"cache {h.hub_cache or 'unknown'} (HF_HOME={h.home or 'unknown'})"
    if c is not None and c.mount and c.mount.mount_point == "/" and c.container:
        return CheckResult(
            name, OK, message + "; inside the container's filesystem, so models are downloaded "
            "again in every new container",
            "Mount a volume for it: docker run -v hf-cache:/root/.cache/huggingface ... "
            "or set HF_HOME to a directory on a mounted volume.",
        )
    return CheckResult(name, OK, message)


def check_hub_offline(h: HubFacts) -> CheckResult:
    if h.offline:
        return CheckResult("hf offline", OK, "HF_HUB_OFFLINE is set: only local folders and cached models load")
    return CheckResult("hf offline", OK, f"online mode: models download from {h.endpoint}")


def _head(url: str, timeout: float) -> tuple[bool, str]:
    request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": "workbench-doctor"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return True, f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return True, f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, str(reason) or type(exc).__name__


def probe_url(url: str, timeout: float = HUB_TIMEOUT_S) -> tuple[bool, str]:
    """HEAD ``url``: (reachable, detail). Any HTTP answer, even 4xx/5xx, counts as reachable.

    The request runs in a daemon thread so a hanging DNS lookup, which the socket
    timeout does not cover, cannot hold the doctor up for longer than ``timeout``.
    """
    answer: list[tuple[bool, str]] = []
    thread = threading.Thread(target=lambda: answer.append(_head(url, timeout)), daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    return answer[0] if answer else (False, f"no answer within {timeout:g} s")


def check_hub_reachable(url: str | None, offline: bool, timeout: float = HUB_TIMEOUT_S) -> CheckResult:
    """Does a HEAD request to the hub answer within ``timeout``? Skipped in offline mode."""
    name = "hf hub reachable"
    if offline:
        return CheckResult(name, OK, "skipped: offline mode (HF_HUB_OFFLINE) is set")
    if not url:
        return CheckResult(name, OK, "skipped: no hub endpoint configured")
    reachable, detail = probe_url(url, timeout)
    if reachable:
        return CheckResult(name, OK, f"{url} answered ({detail})")
    return CheckResult(
        name, WARN, f"{url} is unreachable ({detail}): models and datasets cannot be downloaded.",
        "Use local folders or already-cached models with HF_HUB_OFFLINE=1, or set HTTPS_PROXY; "
        "HF_ENDPOINT points at a mirror.",
    )
