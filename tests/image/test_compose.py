"""docker/compose.yaml, brought up with podman-compose on the built image, smoke-checked.

What the compose file asks for that cannot run on this machine is taken out by an
override file (compose's `!reset` / `!override` tags), each for a reason:

- `deploy.resources.reservations.devices` (the NVIDIA GPUs): there is no GPU, and no
  NVIDIA Container Toolkit / CDI spec to hand one to podman;
- `ports` (127.0.0.1:8888): this VM's podman runs containers on the host network
  (`netns = "host"`, docker/test_image.sh); publishing a port needs a bridge network
  (netavark or CNI with iptables), which is not set up here. The server listens on a free
  port of the host instead (WORKBENCH_PORT);
- the `uid=`/`gid=` options of the /run/workbench tmpfs: podman 4.3 rejects them; its `U`
  option (chown to the container's user) does the same job;
- `build` stays (podman-compose 1.6 cannot `!reset` it) but does not run: the image it
  names exists (the one docker/build.sh just built, which is what the build test covers).

`restart: unless-stopped` is kept but not exercised (no systemd here to restart containers
after a reboot), and the HEALTHCHECK's schedule does not run without systemd: the check
runs through `podman healthcheck run`, as in test_container.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest
from image_helpers import IMAGE, Lab, free_port, podman

REPO = Path(__file__).resolve().parents[2]
COMPOSE = os.environ.get("WORKBENCH_TEST_COMPOSE", "")

OVERRIDE = """\
services:
  lab:
    image: {image}
    network_mode: host
    ports: !reset []
    environment:
      WORKBENCH_PORT: "{port}"
    tmpfs: !override
      - /tmp:rw,exec,nosuid,nodev,mode=1777,size=1g
      - /run/workbench:rw,noexec,nosuid,nodev,mode=0700,U,size=64m
    deploy: !reset {{}}
"""


class Project:
    def __init__(self, tmp_path: Path, token_file: Path):
        self.name = f"wbtest-compose-{uuid.uuid4().hex[:8]}"
        self.port = free_port()
        self.override = tmp_path / "compose.override.yaml"
        self.override.write_text(OVERRIDE.format(image=IMAGE, port=self.port))
        self.env = {**os.environ, "WORKBENCH_TOKEN_FILE": str(token_file)}

    def compose(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        command = [COMPOSE, "-p", self.name, "-f", str(REPO / "docker" / "compose.yaml"),
                   "-f", str(self.override), *args]
        done = subprocess.run(command, capture_output=True, text=True, env=self.env, timeout=300)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(command)} -> {done.returncode}\n{done.stdout}\n{done.stderr}")
        return done

    def container(self) -> str:
        names = podman("ps", "-a", "--filter", f"label=io.podman.compose.project={self.name}",
                       "--format", "{{.Names}}").stdout.split()
        assert len(names) == 1, names
        return names[0]


@pytest.fixture
def project(tmp_path, token_file):
    if not COMPOSE:
        pytest.fail("WORKBENCH_TEST_COMPOSE is not set: docker/test_image.sh installs podman-compose")
    project = Project(tmp_path, token_file[0])
    yield project
    project.compose("down", "-v", "-t", "10", check=False)


def test_compose_up_token_healthcheck_secret_and_volumes(project, token_file):
    project.compose("up", "-d")
    name = project.container()
    lab = Lab(name, project.port, token_file[1], {})
    lab.wait_ready()
    assert lab.request("/api/contents", token=False)[0] == 403
    assert lab.request("/api/contents")[0] == 200

    health = podman("healthcheck", "run", name, check=False)
    assert health.returncode == 0, health.stdout + health.stderr

    # The token is the compose secret (a file), never an environment variable.
    inspect = podman("inspect", name).stdout
    assert token_file[1] not in inspect
    assert lab.exec("cat", "/run/secrets/jupyter_token").stdout.strip() == token_file[1]
    config = json.loads(inspect)[0]
    assert config["HostConfig"]["ReadonlyRootfs"] is True
    assert "no-new-privileges" in " ".join(config["HostConfig"]["SecurityOpt"])
    assert config["HostConfig"]["PidsLimit"] == 4096
    mounts = {m["Destination"]: m for m in config["Mounts"]}
    for target in ("/workspace", "/workspace/notebooks/outputs", "/cache"):
        assert mounts[target]["Type"] == "volume", mounts.get(target)
        assert mounts[target]["Name"].startswith(project.name), mounts[target]

    # The volumes outlive the container: down (volumes kept), up again, the file is there.
    status, _ = lab.request("/api/contents/notebooks/outputs/kept.txt", method="PUT",
                            body={"type": "file", "format": "text", "content": "kept by the outputs volume"})
    assert status in (200, 201)
    project.compose("down", "-t", "10")
    project.compose("up", "-d")
    lab = Lab(project.container(), project.port, token_file[1], {})
    lab.wait_ready()
    status, body = lab.request("/api/contents/notebooks/outputs/kept.txt?content=1")
    assert status == 200 and json.loads(body)["content"] == "kept by the outputs volume"
