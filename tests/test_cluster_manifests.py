"""The class and cluster files: environment/hub/ (Zero to JupyterHub, one-server hub, model
cache) and environment/cluster/ (Slurm, PyTorchJob).

No Kubernetes, Slurm or GPU here, so each file is checked as far as this machine allows: core
Kubernetes objects (including the pods KubeSpawner and the Training Operator would create
from them) against the Kubernetes schemas with kubernetes-validate; the values file for the
keys the Zero to JupyterHub chart reads; the one-server hub config loaded by traitlets with
its GPU hook run; the Slurm script through shellcheck and then run for real on this machine
(one "node", with stand-ins for srun and scontrol), training the tiny model through torchrun.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import kubernetes_validate
import pytest
import yaml
from lab_helpers import free_port

REPO = Path(__file__).resolve().parents[1]
HUB = REPO / "environment" / "hub"
CLUSTER = REPO / "environment" / "cluster"
K8S_VERSION = "1.32.0"  # the oldest Kubernetes the Zero to JupyterHub chart 4.x supports
MIG_RESOURCE = re.compile(r"^nvidia\.com/mig-\d+g\.\d+gb$")  # device plugin, MIG strategy "mixed"

# The keys the Zero to JupyterHub chart (4.x) reads, from its values.yaml: anything else in
# these sections is a typo the chart's schema would refuse at `helm install`.
Z2JH_TOP = {"fullnameOverride", "nameOverride", "enabled", "imagePullSecrets", "imagePullSecret", "hub",
            "rbac", "proxy", "singleuser", "scheduling", "ingress", "httpRoute", "prePuller", "cull",
            "debug", "global", "custom", "cloudMetadata"}
Z2JH_SINGLEUSER = {"podNameTemplate", "extraTolerations", "nodeSelector", "extraNodeAffinity", "extraPodAffinity",
                   "extraPodAntiAffinity", "networkTools", "cloudMetadata", "networkPolicy", "events",
                   "extraAnnotations", "extraLabels", "extraFiles", "extraEnv", "lifecycleHooks", "initContainers",
                   "extraContainers", "allowPrivilegeEscalation", "uid", "fsGid", "serviceAccountName", "storage",
                   "image", "startTimeout", "cpu", "memory", "extraResource", "cmd", "defaultUrl", "extraPodConfig",
                   "profileList"}
Z2JH_STORAGE = {"type", "extraLabels", "extraVolumes", "extraVolumeMounts", "static", "capacity", "homeMountPath",
                "dynamic"}
Z2JH_CULL = {"enabled", "users", "adminUsers", "removeNamedServers", "timeout", "every", "concurrency", "maxAge"}
# KubeSpawner traits a profile may override here.
KUBESPAWNER_OVERRIDES = {"cpu_guarantee", "cpu_limit", "mem_guarantee", "mem_limit", "extra_resource_limits",
                         "extra_resource_guarantees", "node_selector", "tolerations", "image"}


def _documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _validate(obj: dict) -> None:
    """kubernetes-validate, strict: unknown fields are errors too."""
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        raise AssertionError(f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}: {exc.message} "
                             f"at {list(exc.path)}") from None


def test_the_validator_catches_a_wrong_field():
    """The checks below can fail: a misspelt field in a pod is refused."""
    bad = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
           "spec": {"containers": [{"name": "c", "image": "i", "volumeMount": []}]}}
    with pytest.raises(AssertionError, match="volumeMount"):
        _validate(bad)


# ------------------------------------------------------------------ Zero to JupyterHub
@pytest.fixture(scope="module")
def values() -> dict:
    return yaml.safe_load((HUB / "z2jh-values.yaml").read_text())


def test_values_use_only_keys_the_chart_reads(values):
    assert set(values) <= Z2JH_TOP, set(values) - Z2JH_TOP
    single = values["singleuser"]
    assert set(single) <= Z2JH_SINGLEUSER, set(single) - Z2JH_SINGLEUSER
    assert set(single["storage"]) <= Z2JH_STORAGE
    assert set(values["cull"]) <= Z2JH_CULL


def test_values_serve_the_workbench_image_as_the_class_needs(values):
    single = values["singleuser"]
    assert single["image"]["name"].endswith("/workbench") and single["image"]["tag"]
    # The image's entrypoint (not KubeSpawner's default command) starts the server: it seeds
    # the notebooks and runs workbench.server.hub_singleuser.
    assert "cmd" in single and single["cmd"] is None
    assert single["uid"] == 1000 and single["fsGid"] == 1000
    storage = single["storage"]
    assert storage["type"] == "dynamic" and storage["homeMountPath"] == "/workspace"
    assert re.fullmatch(r"\d+Gi", storage["capacity"])
    volumes = {v["name"]: v for v in storage["extraVolumes"]}
    mounts = {m["mountPath"]: m for m in storage["extraVolumeMounts"]}
    shm = volumes[mounts["/dev/shm"]["name"]]["emptyDir"]
    assert shm["medium"] == "Memory" and re.fullmatch(r"\d+Gi", shm["sizeLimit"])
    cache = mounts["/models/hf"]
    assert cache["readOnly"] and volumes[cache["name"]]["persistentVolumeClaim"]["readOnly"]
    assert single["extraEnv"]["HF_HUB_CACHE"].startswith("/models/hf/")
    assert single["extraEnv"]["WORKBENCH_NOTEBOOK_DIR"] == storage["homeMountPath"]
    cull = values["cull"]
    assert cull["enabled"] and 0 < cull["timeout"] <= 4 * 3600 and cull["every"] < cull["timeout"]
    assert single["memory"]["limit"] and single["cpu"]["limit"]


def test_profiles_cpu_gpu_and_mig_slice(values):
    profiles = {p["slug"]: p for p in values["singleuser"]["profileList"]}
    assert set(profiles) == {"cpu", "gpu", "mig"}
    assert profiles["cpu"].get("default") and "kubespawner_override" not in profiles["cpu"]
    for slug in ("gpu", "mig"):
        override = profiles[slug]["kubespawner_override"]
        assert set(override) <= KUBESPAWNER_OVERRIDES, set(override) - KUBESPAWNER_OVERRIDES
        assert override["mem_limit"] and override["cpu_limit"] and override["node_selector"]
    assert profiles["gpu"]["kubespawner_override"]["extra_resource_limits"] == {"nvidia.com/gpu": "1"}
    (mig,) = profiles["mig"]["kubespawner_override"]["extra_resource_limits"]
    assert MIG_RESOURCE.match(mig), mig
    assert profiles["mig"]["kubespawner_override"]["node_selector"]["nvidia.com/mig.config"].endswith(
        mig.split("mig-")[1])


def _to_bytes(quantity: str) -> int:
    units = {"K": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    number, unit = re.fullmatch(r"([\d.]+)([KMG]i?)?", str(quantity)).groups()
    return int(float(number) * units.get(unit or "", 1))


# ids without the bare word "gpu": conftest.py skips tests with that keyword on machines without one.
@pytest.mark.parametrize("slug", ["cpu", "gpu", "mig"], ids=["cpu-profile", "one-gpu-profile", "mig-profile"])
def test_each_profile_renders_to_a_valid_pod(values, slug):
    """The pod KubeSpawner makes for a profile (volumes, mounts, limits, placement) is valid."""
    single = values["singleuser"]
    profile = next(p for p in single["profileList"] if p["slug"] == slug)
    override = profile.get("kubespawner_override", {})
    mem_limit = override.get("mem_limit", single["memory"]["limit"])
    limits = {"memory": mem_limit, "cpu": str(override.get("cpu_limit", single["cpu"]["limit"])),
              **override.get("extra_resource_limits", {})}
    requests = {"memory": override.get("mem_guarantee", single["memory"]["guarantee"]),
                "cpu": str(override.get("cpu_guarantee", single["cpu"]["guarantee"]))}
    container = {
        "name": "notebook", "image": f"{single['image']['name']}:{single['image']['tag']}",
        "env": [{"name": k, "value": v} for k, v in single["extraEnv"].items()],
        "resources": {"limits": limits, "requests": requests},
        "securityContext": values["hub"]["config"]["KubeSpawner"]["container_security_context"],
        "volumeMounts": [{"name": "home", "mountPath": single["storage"]["homeMountPath"]},
                         *single["storage"]["extraVolumeMounts"]],
    }
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"jupyter-student-{slug}"},
           "spec": {"containers": [container],
                    "securityContext": {"fsGroup": single["fsGid"]},
                    "volumes": [{"name": "home", "persistentVolumeClaim": {"claimName": "claim-student"}},
                                *single["storage"]["extraVolumes"]],
                    "nodeSelector": override.get("node_selector", {}),
                    "tolerations": override.get("tolerations", [])}}
    _validate(pod)
    # /dev/shm is memory: it must fit in the memory limit with room for the kernel itself.
    shm = next(v for v in single["storage"]["extraVolumes"] if v["name"] == "shm")["emptyDir"]["sizeLimit"]
    assert _to_bytes(shm) <= _to_bytes(mem_limit) // 2, (slug, shm, mem_limit)


def test_model_cache_objects_are_valid():
    docs = _documents(HUB / "hf-cache.yaml")
    assert [d["kind"] for d in docs] == ["PersistentVolumeClaim", "Job"]
    for doc in docs:
        _validate(doc)
    assert docs[0]["spec"]["accessModes"] == ["ReadWriteMany"]
    values = yaml.safe_load((HUB / "z2jh-values.yaml").read_text())
    claims = {v["persistentVolumeClaim"]["claimName"] for v in values["singleuser"]["storage"]["extraVolumes"]
              if "persistentVolumeClaim" in v}
    assert docs[0]["metadata"]["name"] in claims


# --------------------------------------------------------------------- one-server hub
def test_one_server_hub_config_loads_and_gives_each_student_one_gpu(tmp_path, monkeypatch):
    from traitlets.config.loader import PyFileConfigLoader

    monkeypatch.setenv("WORKBENCH_HUB_STATE", str(tmp_path))
    monkeypatch.setenv("WORKBENCH_HUB_GPUS", "0,MIG-5d1e7c5a-0000-4c2c-a3b1-1a2b3c4d5e6f")
    monkeypatch.setenv("WORKBENCH_HUB_MEM_LIMIT", "24G")
    config = PyFileConfigLoader("jupyterhub_config.py", str(HUB)).load_config()
    docker = config.DockerSpawner
    assert config.JupyterHub.spawner_class == "dockerspawner.DockerSpawner"
    assert docker.cmd is None and docker.mem_limit == "24G" and docker.notebook_dir == "/workspace"
    assert docker.extra_host_config["shm_size"] and docker.extra_host_config["cap_drop"] == ["ALL"]
    assert {"bind": "/models/hf", "mode": "ro"} in docker.volumes.values()
    assert any(s["name"] == "idle-culler" for s in config.JupyterHub.services)

    hook = config.Spawner.pre_spawn_hook

    def spawn(name: str) -> str | None:
        spawner = SimpleNamespace(user=SimpleNamespace(name=name), extra_host_config=dict(docker.extra_host_config),
                                  log=SimpleNamespace(info=lambda *a: None))
        hook(spawner)
        requests = spawner.extra_host_config.get("device_requests")
        assert spawner.extra_host_config["shm_size"]  # the rest of the host config is kept
        return requests[0]["DeviceIDs"][0] if requests else None

    first, second = spawn("alice"), spawn("bob")
    assert {first, second} == {"0", "MIG-5d1e7c5a-0000-4c2c-a3b1-1a2b3c4d5e6f"}
    assert spawn("alice") == first  # the same GPU at every login
    with pytest.raises(RuntimeError, match="WORKBENCH_HUB_USERS_PER_GPU"):
        spawn("carol")  # one student per GPU by default: the third one is told why, not squeezed in
    assert json.loads((tmp_path / "gpu-assignments.json").read_text()) == {"alice": first, "bob": second}


# ----------------------------------------------------------------------------- PyTorchJob
@pytest.fixture(scope="module")
def pytorchjob() -> dict[str, dict]:
    return {d["kind"]: d for d in _documents(CLUSTER / "pytorchjob.yaml")}


def _option(args: list[str], name: str) -> str:
    return next(a.split("=", 1)[1] for a in args if a.startswith(f"--{name}="))


def test_pytorchjob_core_objects_and_pod_template_are_valid(pytorchjob):
    assert set(pytorchjob) == {"ConfigMap", "PersistentVolumeClaim", "PyTorchJob"}
    _validate(pytorchjob["ConfigMap"])
    _validate(pytorchjob["PersistentVolumeClaim"])
    job = pytorchjob["PyTorchJob"]
    assert job["apiVersion"] == "kubeflow.org/v1"
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    # The operator turns this template into each replica's pod: validate it as Kubernetes would.
    _validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "workbench-train-worker"},
               "template": worker["template"]})


def test_pytorchjob_runs_workbench_train_under_torchrun_c10d(pytorchjob, tmp_path):
    from workbench.config import RunSpec

    job = pytorchjob["PyTorchJob"]
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    (container,) = worker["template"]["spec"]["containers"]
    assert container["name"] == "pytorch"
    args = container["args"]
    assert args[0] == "torchrun"
    assert args[args.index("-m") + 1:args.index("-m") + 3] == ["workbench", "train"]
    assert _option(args, "rdzv-backend") == "c10d" == job["spec"]["elasticPolicy"]["rdzvBackend"]
    nodes = int(_option(args, "nnodes"))
    assert nodes == worker["replicas"] == job["spec"]["elasticPolicy"]["minReplicas"] \
        == job["spec"]["elasticPolicy"]["maxReplicas"]
    gpus = container["resources"]["limits"]["nvidia.com/gpu"]
    assert _option(args, "nproc-per-node") == gpus == job["spec"]["nprocPerNode"]
    assert _option(args, "rdzv-endpoint") == f"{job['metadata']['name']}-worker-0:29400"
    assert int(_option(args, "max-restarts")) >= 1
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NCCL_SOCKET_IFNAME"] and env["NCCL_DEBUG"] and env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in worker["template"]["spec"]["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    # The run file in the ConfigMap is a real RunSpec whose output is on the shared volume.
    config_path = _option(args, "config")
    config_mount = str(Path(config_path).parent)
    run_yaml = pytorchjob["ConfigMap"]["data"][Path(config_path).name]
    assert volumes[mounts[config_mount]]["configMap"]["name"] == pytorchjob["ConfigMap"]["metadata"]["name"]
    (tmp_path / "run.yaml").write_text(run_yaml)
    spec = RunSpec.load(tmp_path / "run.yaml")
    runs_mount = next(p for p in mounts if spec.train.output_dir.startswith(p + "/"))
    claim = volumes[mounts[runs_mount]]["persistentVolumeClaim"]["claimName"]
    assert claim == pytorchjob["PersistentVolumeClaim"]["metadata"]["name"]
    assert pytorchjob["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteMany"]
    assert spec.train.resume == "auto"


# ----------------------------------------------------------------------------------- Slurm
SLURM = CLUSTER / "train.slurm"


def test_slurm_script_passes_shellcheck():
    shellcheck = Path(sys.executable).with_name("shellcheck")
    proc = subprocess.run([str(shellcheck), "--shell=bash", str(SLURM)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    directives = dict(re.findall(r"^#SBATCH --([a-z-]+)(?:=(\S+))?", SLURM.read_text(), re.M))
    assert directives["ntasks-per-node"] == "1"  # one torchrun agent per node
    assert "requeue" in directives and directives["nodes"] == "2"


@pytest.mark.slow  # a real torchrun training run
def test_slurm_script_trains_on_this_machine_as_one_node(tiny_bert, tmp_path):
    """srun and scontrol are stand-ins; torchrun (c10d), workbench and the checks are real."""
    from workbench.config import DatasetChoice, ModelChoice, RunSpec, TrainConfig
    from workbench.sources.synthetic import write_csv

    data = tmp_path / "data"
    write_csv(data / "train.csv", 32, seed=0)
    write_csv(data / "validation.csv", 16, seed=1)
    out = tmp_path / "shared" / "run"
    spec = RunSpec(model=ModelChoice(str(tiny_bert)),
                   data=DatasetChoice(source="files", path=str(data), text_columns=("text",), label_column="label"),
                   train=TrainConfig(output_dir=str(out), batch_size=8, max_steps=2, num_workers=0, log_every=1))
    config = spec.save(tmp_path / "run.yaml")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # srun: drop its own --options and run the command here (one task: this machine is the node).
    (bin_dir / "srun").write_text('#!/usr/bin/env bash\nwhile [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n')
    (bin_dir / "scontrol").write_text('#!/usr/bin/env bash\necho 127.0.0.1\n')
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_"))}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", PYTHON=sys.executable, SLURM_JOB_ID="4242",
               SLURM_JOB_NODELIST="node-a", SLURM_NNODES="1", SLURM_GPUS_PER_NODE="1", RDZV_PORT=str(free_port()),
               OMP_NUM_THREADS="1")
    proc = subprocess.run(["bash", str(SLURM), str(config)], env=env, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "rendezvous at 127.0.0.1:" in proc.stdout
    assert "workbench train: completed" in proc.stdout
    assert (out / "model" / "config.json").is_file()  # output_dir came from the run file
    assert not list(out.glob(".slurm-*"))  # the shared-folder probe cleaned up after itself
    start = next(json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()
                 if json.loads(line)["kind"] == "start")
    assert start["world_size"] == 1


def test_slurm_script_refuses_an_output_folder_other_nodes_cannot_see(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # This srun plays a second node that does not see the folder: `test -f` fails there.
    (bin_dir / "srun").write_text('#!/usr/bin/env bash\nexit 1\n')
    (bin_dir / "scontrol").write_text('#!/usr/bin/env bash\necho node-a\n')
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": sys.executable,
           "SLURM_JOB_ID": "4243", "SLURM_JOB_NODELIST": "node-[a-b]", "SLURM_NNODES": "2"}
    proc = subprocess.run(["bash", str(SLURM), "run.yaml", str(tmp_path / "local-only")], env=env,
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2
    assert "not visible from every node" in proc.stderr and "Fix:" in proc.stderr
    assert not list((tmp_path / "local-only").glob(".slurm-*"))
