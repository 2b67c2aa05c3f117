# A class on one big GPU server: plain JupyterHub with DockerSpawner, one workbench container
# per student. docs/classroom.md ("On one big GPU server") has the set-up commands:
#
#   pip install jupyterhub dockerspawner oauthenticator jupyterhub-idle-culler
#   pip install --no-deps workbench-0.1.0-py3-none-any.whl   # the class service (no ML libraries)
#   npm install -g configurable-http-proxy
#   WORKBENCH_HUB_GPUS=0,1,2,3 jupyterhub -f environment/hub/jupyterhub_config.py
#
# Each student gets: the workbench image (the same as on Kubernetes; its entrypoint copies the
# course notebooks into a new workspace and runs the hub-authenticated server), a Docker volume
# for the workspace, the shared model cache read-only, a memory limit, and one GPU (or one MIG
# slice) of the machine, the same one at every login. The class service (workbench/classroom/)
# runs next to the hub: the check cells report to it, teachers see who passed.
# tests/test_cluster_manifests.py loads this file and runs its spawn hook; tests/test_classroom.py
# checks its class service.
#
# Environment read here:
#   WORKBENCH_HUB_IMAGE          the image (default workbench:latest; docker/build.sh builds it)
#   WORKBENCH_HUB_GPUS           GPUs to hand out, comma-separated: indexes ("0,1") or MIG
#                                UUIDs ("MIG-..." from `nvidia-smi -L`); empty: CPU only
#   WORKBENCH_HUB_USERS_PER_GPU  students sharing one GPU (default 1; see "Size it" in docs/classroom.md)
#   WORKBENCH_HUB_MEM_LIMIT      memory per student (default 16G; the kernel is killed above it)
#   WORKBENCH_HUB_CPU_LIMIT      CPUs per student (default 4)
#   WORKBENCH_HUB_SHM_SIZE       /dev/shm per student (default 2g: DataLoader workers)
#   WORKBENCH_HUB_HF_CACHE       host folder of the shared model cache (default /srv/workbench/hf-cache)
#   WORKBENCH_HUB_STATE          folder for the hub's database, the GPU assignments and the class's
#                                results (default /srv/jupyterhub)
#   WORKBENCH_HUB_CONNECT_IP     the hub's address on the Docker bridge (default 172.17.0.1)
import json
import os
from pathlib import Path

c = get_config()  # noqa: F821 -- provided by traitlets when JupyterHub loads this file

STATE = Path(os.environ.get("WORKBENCH_HUB_STATE", "/srv/jupyterhub"))
HUB_CONNECT_IP = os.environ.get("WORKBENCH_HUB_CONNECT_IP", "172.17.0.1")
GPUS = [g.strip() for g in os.environ.get("WORKBENCH_HUB_GPUS", "").split(",") if g.strip()]
USERS_PER_GPU = int(os.environ.get("WORKBENCH_HUB_USERS_PER_GPU", "1"))
ASSIGNMENTS = STATE / "gpu-assignments.json"

c.JupyterHub.bind_url = "http://:8000"  # put TLS in front (nginx/caddy), or set ssl_cert/ssl_key
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
# The containers reach the hub on the Docker bridge, not on 127.0.0.1.
c.JupyterHub.hub_ip = "0.0.0.0"
c.JupyterHub.hub_connect_ip = HUB_CONNECT_IP

# CHANGE-ME: the school's login (oauthenticator: GitHub, Google, generic OIDC), or PAM for
# accounts of this machine. The dummy authenticator below accepts any name with the password.
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = os.environ.get("WORKBENCH_HUB_PASSWORD", "")
c.Authenticator.admin_users = {"teacher"}
c.Authenticator.allow_all = True

c.JupyterHub.spawner_class = "dockerspawner.DockerSpawner"
c.DockerSpawner.image = os.environ.get("WORKBENCH_HUB_IMAGE", "workbench:latest")
# None: the image's ENTRYPOINT + CMD, whose JupyterHub branch seeds the notebooks and runs
# jupyterhub-singleuser with the workbench configuration (docker/entrypoint.sh).
c.DockerSpawner.cmd = None
c.DockerSpawner.remove = True  # containers are throw-away; the workspace is a volume
c.DockerSpawner.notebook_dir = "/workspace"
c.DockerSpawner.volumes = {
    "workbench-{username}": "/workspace",
    os.environ.get("WORKBENCH_HUB_HF_CACHE", "/srv/workbench/hf-cache"): {"bind": "/models/hf", "mode": "ro"},
}
c.DockerSpawner.environment = {
    "HF_HUB_CACHE": "/models/hf/hub",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "WORKBENCH_CULL_IDLE_S": "1200",
}
c.DockerSpawner.mem_limit = os.environ.get("WORKBENCH_HUB_MEM_LIMIT", "16G")
c.DockerSpawner.cpu_limit = float(os.environ.get("WORKBENCH_HUB_CPU_LIMIT", "4"))
c.DockerSpawner.extra_host_config = {
    "shm_size": os.environ.get("WORKBENCH_HUB_SHM_SIZE", "2g"),
    # The image's hardening, as in docker/compose.yaml.
    "cap_drop": ["ALL"],
    "security_opt": ["no-new-privileges:true"],
}
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 300  # the first start pulls or loads a large CUDA image
c.Spawner.http_timeout = 120


def assign_gpu(username: str, running_users: set[str] | None = None) -> str | None:
    """The GPU (index or MIG UUID) this student uses, the same at every login.

    A new student gets the GPU with the fewest students, as long as it has fewer than
    USERS_PER_GPU; assignments are kept in ASSIGNMENTS (a JSON file), so a student's
    checkpoints and CUDA caches always meet the same card.
    """
    if not GPUS:
        return None
    assignments = json.loads(ASSIGNMENTS.read_text()) if ASSIGNMENTS.is_file() else {}
    gpu = assignments.get(username)
    if gpu in GPUS:
        return gpu
    load = {g: sum(1 for v in assignments.values() if v == g) for g in GPUS}
    gpu = min(GPUS, key=lambda g: (load[g], GPUS.index(g)))
    if load[gpu] >= USERS_PER_GPU:
        raise RuntimeError(
            f"every GPU already has {USERS_PER_GPU} student(s) assigned ({len(assignments)} in "
            f"{ASSIGNMENTS}), so {username} gets none. Fix: raise WORKBENCH_HUB_USERS_PER_GPU, add "
            "GPUs or MIG slices to WORKBENCH_HUB_GPUS, or remove students who left from that file."
        )
    assignments[username] = gpu
    ASSIGNMENTS.parent.mkdir(parents=True, exist_ok=True)
    tmp = ASSIGNMENTS.with_suffix(".tmp")
    tmp.write_text(json.dumps(assignments, indent=2, sort_keys=True))
    tmp.replace(ASSIGNMENTS)  # atomic: a crash never leaves half a file
    return gpu


def give_gpu(spawner) -> None:
    """pre_spawn_hook: only the student's GPU is visible in the container (Docker device request)."""
    gpu = assign_gpu(spawner.user.name)
    host_config = dict(spawner.extra_host_config)
    if gpu is None:
        host_config.pop("device_requests", None)
    else:
        host_config["device_requests"] = [
            {"Driver": "nvidia", "DeviceIDs": [gpu], "Capabilities": [["gpu"]]},
        ]
    spawner.extra_host_config = host_config
    spawner.log.info("workbench: %s gets GPU %s", spawner.user.name, gpu or "none (CPU only)")


c.Spawner.pre_spawn_hook = give_gpu

# Stop servers idle for an hour: their GPU memory goes back to the class.
c.JupyterHub.services = [{
    "name": "idle-culler",
    "command": ["python3", "-m", "jupyterhub_idle_culler", "--timeout=3600", "--cull-every=300"],
}]
c.JupyterHub.load_roles = [{
    "name": "idle-culler",
    "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
    "services": ["idle-culler"],
}]

# The class service (docs/classroom.md, "The teacher's view"): results in classroom.sqlite
# next to the hub's database, on the Docker bridge where the containers and the proxy reach it.
# It adds its role, `access:services!service=classroom` to the `user` role and to the servers'
# tokens (workbench/classroom/hub_config.py says why each scope), and the kernels' variable.
from workbench.classroom.hub_config import configure as add_class_service  # noqa: E402

c.JupyterHub.load_groups = {"teachers": {"users": ["teacher"]}}  # CHANGE-ME: the teachers' hub names
CLASSROOM = f"http://{HUB_CONNECT_IP}:10101"
c.DockerSpawner.environment.update(add_class_service(
    c, url=CLASSROOM, kernel_url=f"{CLASSROOM}/services/classroom/", db=str(STATE / "classroom.sqlite")))
