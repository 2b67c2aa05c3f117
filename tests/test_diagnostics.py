"""workbench.diagnostics (`workbench doctor`): each check from real inputs (temporary dirs, mountinfo text, a local HTTP
server, Jupyter server info files, the fake NVML scenarios), and the report renderers."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from workbench.diagnostics.checks_gpu import check_bf16, check_driver, check_gpu_arch, check_mig
from workbench.diagnostics.checks_hub import (
    check_hub_cache,
    check_hub_offline,
    check_hub_reachable,
    probe_url,
)
from workbench.diagnostics.checks_jupyter import check_jupyter
from workbench.diagnostics.checks_software import (
    check_cuda_available,
    check_package,
    check_python,
    check_torch_build,
)
from workbench.diagnostics.checks_system import (
    check_cpu_bf16,
    check_output_space,
    check_output_volume,
    check_output_writable,
    check_shm,
)
from workbench.diagnostics.diagnose import _plain, build_report, doctor, gather_facts
from workbench.diagnostics.facts import (
    CpuFacts,
    DirFacts,
    ShmFacts,
    TorchFacts,
    _format_cudnn,
    gather_cpu,
    gather_dir,
    gather_hub,
    gather_jupyter,
    gather_python,
    gather_shm,
    gather_torch,
)
from workbench.diagnostics.mounts import detect_container, find_mount, parse_mountinfo
from workbench.diagnostics.report import CheckResult, DoctorReport
from workbench.gpu import NvmlStatus, list_devices, nvml_status

try:
    from tests.fake_nvml import FakeDevice, FakeNVML, scenario
except ImportError:  # tests/ itself on sys.path (pytest's rootdir insertion)
    from fake_nvml import FakeDevice, FakeNVML, scenario


GiB = 1024**3
VOLTA_PLUS = ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]


def one_device(**kwargs):
    fake = FakeNVML(devices=[FakeDevice(**kwargs)])
    (device,) = list_devices(fake)
    return device


# ---------------------------------------------------------------- driver vs torch's CUDA build


def test_driver_for_cuda_11_8_with_torch_cu124_is_an_error():
    status = nvml_status(FakeNVML(driver="520.61.05", cuda_driver=11080))
    result = check_driver(status, "12.4")
    assert result.level == "error"
    assert "11.8" in result.message and "12.4" in result.message
    assert "550.54.14" in result.fix  # the CUDA 12.4 driver
    assert "whl/cu118" in result.fix  # or a torch build the driver can run


def test_driver_too_old_for_any_torch_wheel_says_upgrade():
    status = nvml_status(FakeNVML(driver="470.57.02", cuda_driver=11040))
    result = check_driver(status, "12.4")
    assert result.level == "error" and "525.60.13" in result.message
    assert "no recent torch wheels for CUDA <= 11.4" in result.fix


def test_older_major_but_cuda_working_means_forward_compat_and_warns():
    status = nvml_status(FakeNVML(driver="520.61.05", cuda_driver=11080))
    result = check_driver(status, "12.4", cuda_available=True)
    assert result.level == "warn"
    assert "cuda-compat" in result.message


def test_same_major_older_minor_runs_under_minor_version_compatibility():
    status = nvml_status(FakeNVML(driver="535.54.03", cuda_driver=12020))
    result = check_driver(status, "12.4")
    assert result.level == "warn"
    assert "minor-version" in result.message
    assert "550.54.14" in result.fix


def test_same_major_but_driver_below_the_major_floor_is_an_error():
    status = NvmlStatus(True, None, "470.57.02", "12.0", 1)
    result = check_driver(status, "12.4")
    assert result.level == "error"
    assert "525.60.13" in result.message


@pytest.mark.parametrize(
    "cuda_driver, build", [(12040, "12.4"), (12040, "12.1"), (13000, "12.8"), (12090, "11.8")]
)
def test_driver_at_or_above_the_build_is_ok(cuda_driver, build):
    status = nvml_status(FakeNVML(cuda_driver=cuda_driver))
    assert check_driver(status, build).level == "ok"


def test_cpu_only_torch_has_nothing_to_compare():
    result = check_driver(nvml_status(FakeNVML()), None)
    assert result.level == "ok" and "CPU-only" in result.message


@pytest.mark.parametrize("name", ["no_library", "driver_not_loaded", "version_mismatch"])
def test_no_driver_is_a_plain_warning_with_the_reason(name):
    status = nvml_status(scenario(name))
    result = check_driver(status, "12.4")
    assert result.level == "warn"
    assert result.message.startswith("no NVIDIA driver: ")
    assert status.reason and status.reason in result.message
    assert "--gpus all" in result.fix


# ---------------------------------------------------------------- torch.cuda availability


def test_gpu_visible_but_cpu_only_torch_is_an_error():
    torch_facts = TorchFacts(version="2.13.0+cpu", cuda_build=None)
    result = check_cuda_available(torch_facts, nvml_status(scenario("one_gpu")))
    assert result.level == "error"
    assert "CPU-only" in result.message and "requirements-gpu.txt" in result.fix


def test_no_driver_and_no_cuda_warns():
    torch_facts = TorchFacts(version="2.13.0+cpu", cuda_build=None)
    result = check_cuda_available(torch_facts, nvml_status(scenario("no_library")))
    assert result.level == "warn" and "CPU" in result.message


def test_cuda_visible_devices_hiding_every_gpu_is_named():
    torch_facts = TorchFacts(version="2.13.0+cu124", cuda_build="12.4", cuda_visible_devices="")
    result = check_cuda_available(torch_facts, nvml_status(scenario("one_gpu")))
    assert result.level == "error" and "CUDA_VISIBLE_DEVICES" in result.message


def test_driver_without_any_gpu_says_so():
    status = nvml_status(scenario("no_gpus"))
    result = check_driver(status, "12.4")
    assert result.level == "warn" and result.message.startswith("no usable NVIDIA GPU: ")
    assert "--gpus all" in result.fix


def test_torch_failure_reason_is_passed_on():
    reason = "CUDA initialization: The NVIDIA driver on your system is too old (found version 11080)."
    torch_facts = TorchFacts(version="2.13.0+cu124", cuda_build="12.4", cuda_error=reason)
    result = check_cuda_available(torch_facts, nvml_status(scenario("one_gpu")))
    assert result.level == "error" and reason in result.message


def test_cuda_working_is_ok():
    torch_facts = TorchFacts(version="2.13.0+cu124", cuda_build="12.4", cuda_available=True,
                                device_count=2)
    result = check_cuda_available(torch_facts, nvml_status(scenario("two_gpus")))
    assert result.level == "ok" and "2 device(s)" in result.message


def test_gather_torch_reads_the_installed_torch():
    import torch

    facts = gather_torch()
    assert facts.version == torch.__version__
    assert facts.cuda_build == torch.version.cuda
    assert facts.cuda_available == torch.cuda.is_available()
    assert facts.arch_list == torch.cuda.get_arch_list()
    result = check_torch_build(facts)
    assert result.level == "ok" and torch.__version__ in result.message


def test_cudnn_version_numbers_are_decoded():
    assert _format_cudnn(90100) == "9.1.0"
    assert _format_cudnn(8902) == "8.9.2"
    assert _format_cudnn(None) is None


# ---------------------------------------------------------------- GPU architecture


def test_pascal_card_with_a_volta_plus_build_is_an_error():
    device = one_device(name="NVIDIA GeForce GTX 1080 Ti", compute_capability=(6, 1),
                        memory_total=11 * GiB, mig_mode=None)
    result = check_gpu_arch(device, VOLTA_PLUS, cuda_build="12.8")
    assert result.level == "error"
    assert "GTX 1080 Ti" in result.message and "sm_61" in result.message
    assert "sm_61" in result.fix and "older release" in result.fix


def test_arch_fix_names_the_wheels_that_do_support_the_gpu():
    device = one_device(name="Tesla P100-PCIE-16GB", compute_capability=(6, 0))
    releases = {"12.6": [50, 60, 70, 75, 80, 86, 90], "12.9": [75, 80, 86, 90, 100, 120]}
    result = check_gpu_arch(device, VOLTA_PLUS, cuda_build="12.9", release_archs=releases,
                               torch_version="2.13.0+cu129")
    assert result.level == "error"
    assert "cu126" in result.fix and "cu129" not in result.fix
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126" in result.fix


@pytest.mark.parametrize(
    "cc, arch_list, level",
    [
        ((8, 0), VOLTA_PLUS, "ok"),
        ((8, 9), ["sm_80", "sm_86"], "ok"),  # same major, newer minor: binary compatible
        ((6, 1), ["sm_60", "sm_70"], "ok"),
        ((7, 5), ["sm_80", "sm_90"], "error"),  # machine code never runs on an older GPU
        ((12, 0), ["sm_80", "sm_90", "compute_90"], "warn"),  # only by JIT from PTX
        ((12, 0), ["sm_80", "sm_90"], "error"),
        ((9, 0), ["sm_90a"], "ok"),
        ((10, 0), ["sm_90a"], "error"),  # "a" code runs only on exactly 9.0
        ((8, 7), ["sm_80", "sm_86"], "error"),  # Jetson Orin needs its own sm_87
        ((8, 7), ["sm_87"], "ok"),
    ],
)
def test_arch_coverage_rules(cc, arch_list, level):
    device = one_device(compute_capability=cc)
    assert check_gpu_arch(device, arch_list, cuda_build="12.8").level == level


def test_gpu_result_names_memory_and_compute_capability():
    device = one_device(name="NVIDIA A100-SXM4-80GB", memory_total=80 * GiB)
    result = check_gpu_arch(device, VOLTA_PLUS, cuda_build="12.4")
    assert result.name == "gpu 0"
    assert "A100-SXM4-80GB" in result.message and "80.0 GiB" in result.message
    assert "8.0" in result.message and "sm_80" in result.message


def test_lost_gpu_is_reported_not_raised():
    devices = list_devices(scenario("gpu_lost"))
    results = [check_gpu_arch(d, VOLTA_PLUS, cuda_build="12.4") for d in devices]
    assert [r.level for r in results] == ["ok", "warn"]
    assert "could not be read" in results[1].message


def test_bf16_needs_ampere():
    assert "bf16 supported" in check_bf16(one_device(compute_capability=(8, 0))).message
    t4 = check_bf16(one_device(name="Tesla T4", compute_capability=(7, 5)))
    assert t4.level == "ok" and "no bf16" in t4.message and "fp16" in t4.message


def test_cpu_bf16_says_what_auto_trains_cpu_runs_in():
    native = check_cpu_bf16(CpuFacts("AMD EPYC", 2, True, "AVX512-BF16", "bf16", "auto: bf16, ..."))
    assert native.level == "ok" and "AMD EPYC (2 cores) computes bf16 natively (AVX512-BF16)" in native.message
    assert "precision='auto' trains CPU runs in bf16" in native.message
    emulated = check_cpu_bf16(CpuFacts("Intel Xeon", 4, False, "no AVX512-BF16 or AMX-BF16", "fp32", ""))
    assert emulated.level == "ok" and "no native bf16" in emulated.message and "in fp32" in emulated.message
    assert "use the GPU" in check_cpu_bf16(CpuFacts(None, 8, True, "AMX-BF16", "bf16", ""), cuda_available=True).message
    unknown = check_cpu_bf16(CpuFacts(cores=2, error="ImportError: no torch"))
    assert unknown.level == "warn" and "no torch" in unknown.message and unknown.fix


def test_gather_cpu_judges_as_a_run_judges():
    from workbench.engine.precision import choose_precision, device_facts

    cpu = gather_cpu()
    assert cpu.error is None and cpu.cores >= 1
    if not __import__("torch").cuda.is_available():
        choice = choose_precision("auto", device_facts())
        assert (cpu.auto_precision, cpu.auto_reason) == (choice.precision, choice.reason)


def test_mig_on_warns_and_lists_the_instances():
    devices = list_devices(scenario("mig"))
    parent = devices[0]
    slices = [d for d in devices if d.is_mig and d.index == 0]
    result = check_mig(parent, slices)
    assert result.level == "warn"
    assert "3g.20gb" in result.message and "2g.10gb" in result.message
    assert "CUDA_VISIBLE_DEVICES=MIG-" in result.fix and "-mig 0" in result.fix
    other = next(d for d in devices if d.index == 1)
    assert check_mig(other).level == "ok"
    assert "not supported" in check_mig(one_device(mig_mode=None)).message


# ---------------------------------------------------------------- /dev/shm


def test_real_dev_shm_reading():
    facts = gather_shm("/dev/shm")
    st = os.statvfs("/dev/shm")
    assert facts.exists and facts.total_bytes == st.f_blocks * st.f_frsize
    result = check_shm(facts)
    assert result.level == ("warn" if facts.total_bytes < GiB else "ok")
    assert "/dev/shm" in result.message


def test_small_shm_warns_with_the_shm_size_fix():
    result = check_shm(ShmFacts("/dev/shm", True, 64 * 1024**2, 60 * 1024**2))
    assert result.level == "warn"
    assert "64 MiB" in result.message and "No space left on device" in result.message
    assert "--shm-size=8g" in result.fix and "shm_size" in result.fix


def test_missing_shm_warns(tmp_path):
    facts = gather_shm(str(tmp_path / "no-shm"))
    assert not facts.exists
    assert check_shm(facts).level == "warn"


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real 64 MiB tmpfs (like Docker's default /dev/shm); needs CAP_SYS_ADMIN."""
    target = tmp_path / "small shm"
    target.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(target)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=False)


def test_real_small_tmpfs_is_found_and_flagged(small_tmpfs):
    assert check_shm(gather_shm(str(small_tmpfs))).level == "warn"
    # The live mount table (with the space escaped as \040) finds the mount point.
    mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    entry = find_mount(str(small_tmpfs / "run1"), mounts)
    assert entry.mount_point == str(small_tmpfs) and entry.fstype == "tmpfs"
    out = gather_dir(small_tmpfs / "run1", mounts, container=None)
    assert out.writable
    assert check_output_volume(out).level == "warn"


# ---------------------------------------------------------------- mountinfo & containers

MOUNTINFO = r"""
1250 1100 0:94 / / rw,relatime master:1 - overlay overlay rw,lowerdir=/var/lib/docker/l1,upperdir=/var/lib/docker/u,workdir=/var/lib/docker/w
1251 1250 0:97 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
1256 1250 0:99 / /dev/shm rw,nosuid,nodev,noexec,relatime - tmpfs shm rw,size=65536k
1260 1250 259:2 /home/ana/proj/outputs /workspace/outputs rw,relatime - ext4 /dev/nvme0n1p2 rw
1261 1250 259:2 /home/ana/My\040Data /workspace/my\040data rw,relatime shared:5 master:3 - ext4 /dev/nvme0n1p2 rw
1262 1250 0:50 / /workspace/outputs/tmp rw - tmpfs tmpfs rw
1263 1250 0:51 / /workspace/outputs/tmp rw - ext4 /dev/sdb1 rw
this line is not a mount entry
""".strip()


def test_mountinfo_parsing_unescapes_and_reads_fields():
    mounts = parse_mountinfo(MOUNTINFO)
    assert len(mounts) == 7  # the malformed line is skipped
    root = mounts[0]
    assert (root.mount_point, root.fstype, root.source) == ("/", "overlay", "overlay")
    spaced = mounts[4]
    assert spaced.mount_point == "/workspace/my data"  # optional fields skipped, \040 decoded
    assert spaced.root == "/home/ana/My Data" and spaced.fstype == "ext4"


@pytest.mark.parametrize(
    "path, mount_point",
    [
        ("/workspace/outputs/run1/checkpoint-10", "/workspace/outputs"),
        ("/workspace/outputs", "/workspace/outputs"),
        ("/workspace/outputs2", "/"),  # a prefix of the name is not a parent directory
        ("/workspace/my data/x", "/workspace/my data"),
        ("/root/outputs", "/"),
    ],
)
def test_find_mount_takes_the_longest_matching_mount_point(path, mount_point):
    assert find_mount(path, parse_mountinfo(MOUNTINFO)).mount_point == mount_point


def test_find_mount_prefers_the_mount_on_top():
    entry = find_mount("/workspace/outputs/tmp/a", parse_mountinfo(MOUNTINFO))
    assert entry.source == "/dev/sdb1"  # mounted after (over) the tmpfs


def test_real_mountinfo_has_a_root_mount():
    mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    assert find_mount("/", mounts).mount_point == "/"
    assert find_mount("/proc/self", mounts).fstype == "proc"


def test_container_detection():
    assert detect_container(["/.dockerenv"], "", "ext4") == "/.dockerenv exists"
    assert "kubepods" in detect_container([], "0::/kubepods/burstable/pod1/abc\n", "ext4")
    assert "overlay" in detect_container([], "0::/\n", "overlay")
    assert detect_container([], "0::/init.scope\n", "ext4") is None


# ---------------------------------------------------------------- output directory


def mounts_for(tmp_path, volume: bool):
    """A container's mount table: / is the overlay layer; optionally tmp_path is a volume."""
    lines = ["1 0 0:94 / / rw - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w"]
    if volume:
        escaped = str(tmp_path).replace(" ", "\\040")
        lines.append(f"2 1 259:2 /srv/outputs {escaped} rw - ext4 /dev/sda1 rw")
    return parse_mountinfo("\n".join(lines))


def test_checkpoints_in_the_container_layer_warn_with_the_volume_fix(tmp_path):
    mounts = mounts_for(tmp_path, volume=False)
    out = gather_dir(tmp_path / "run", mounts, detect_container([], "", "overlay"))
    result = check_output_volume(out)
    assert result.level == "warn" and "vanish" in result.message
    assert "-v $PWD/outputs:/workspace/outputs" in result.fix and "compose" in result.fix


def test_checkpoints_on_a_mounted_volume_are_ok(tmp_path):
    outputs = tmp_path / "my outputs"
    outputs.mkdir()
    out = gather_dir(outputs / "run", mounts_for(outputs, volume=True), "/.dockerenv exists")
    assert out.mount.mount_point == str(outputs)
    result = check_output_volume(out)
    assert result.level == "ok" and "mounted volume" in result.message


def test_root_filesystem_outside_a_container_is_ok(tmp_path):
    out = gather_dir(tmp_path, mounts_for(tmp_path, volume=False), container=None)
    assert check_output_volume(out).level == "ok"


def test_writable_existing_and_new_directories(tmp_path):
    existing = gather_dir(tmp_path, [], None)
    assert existing.exists and existing.writable
    assert check_output_writable(existing).level == "ok"
    new = gather_dir(tmp_path / "a" / "b", [], None)
    assert not new.exists and new.writable and new.probe_dir == str(tmp_path)
    assert "does not exist yet" in check_output_writable(new).message
    assert not (tmp_path / "a").exists()  # the doctor creates nothing
    assert list(tmp_path.iterdir()) == []  # and leaves no probe file behind


def test_a_file_in_place_of_the_directory_is_unwritable_even_for_root(tmp_path):
    (tmp_path / "outputs").write_text("not a directory")
    out = gather_dir(tmp_path / "outputs" / "run1", [], None)
    assert not out.writable
    result = check_output_writable(out)
    assert result.level == "error" and "not a directory" in result.message
    assert "--output-dir" in result.fix


def test_proc_is_unwritable_even_for_root():
    out = gather_dir("/proc/workbench-outputs", [], None)
    assert not out.writable and out.write_error
    assert check_output_writable(out).level == "error"


def test_free_space(tmp_path):
    out = gather_dir(tmp_path, [], None)
    assert abs(out.free_bytes - shutil.disk_usage(tmp_path).free) < 256 * 1024**2
    low = DirFacts(str(tmp_path), True, str(tmp_path), True, None, GiB, None, None)
    result = check_output_space(low)
    assert result.level == "warn" and "1.0 GiB" in result.message
    assert "keep_checkpoints" in result.fix


# ---------------------------------------------------------------- Hugging Face


class _CountingHandler(http.server.BaseHTTPRequestHandler):
    requests: list[str] = []

    def do_HEAD(self):
        _CountingHandler.requests.append(self.path)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):  # keep test output clean
        pass


@pytest.fixture
def local_hub():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CountingHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _CountingHandler.requests = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there any more


def test_hub_reachable(local_hub):
    result = check_hub_reachable(local_hub, offline=False)
    assert result.level == "ok" and "HTTP 200" in result.message
    assert _CountingHandler.requests == ["/"]


def test_hub_unreachable_is_a_warning():
    url = closed_port_url()
    result = check_hub_reachable(url, offline=False, timeout=2.0)
    assert result.level == "warn" and url in result.message
    assert "HF_HUB_OFFLINE=1" in result.fix


def test_a_server_that_never_answers_is_unreachable_after_the_timeout():
    with socket.socket() as silent:  # accepts connections (backlog) but never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        reachable, detail = probe_url(url, timeout=0.5)
    assert not reachable and ("timed out" in detail or "no answer" in detail)


def test_offline_mode_skips_the_request(local_hub):
    result = check_hub_reachable(local_hub, offline=True)
    assert result.level == "ok" and "skipped" in result.message
    assert _CountingHandler.requests == []


def test_hub_facts_follow_huggingface_hub_constants():
    from huggingface_hub import constants

    hub = gather_hub([], None)
    assert hub.home == constants.HF_HOME and hub.hub_cache == constants.HF_HUB_CACHE
    assert hub.offline  # tests/conftest.py sets HF_HUB_OFFLINE=1
    assert "HF_HUB_OFFLINE" in check_hub_offline(hub).message
    assert check_hub_cache(hub).level in ("ok", "warn")
    assert constants.HF_HUB_CACHE in check_hub_cache(hub).message


# ---------------------------------------------------------------- Jupyter


def write_server_info(runtime_dir, token: str, password: bool, pid: int | None = None):
    runtime_dir.mkdir(exist_ok=True)
    pid = os.getpid() if pid is None else pid  # list_running_servers checks the pid is alive
    info = {"url": "http://127.0.0.1:8888/", "port": 8888, "token": token, "password": password,
            "pid": pid, "root_dir": "/workspace"}
    (runtime_dir / f"jpserver-{pid}.json").write_text(json.dumps(info))


def test_running_server_without_token_or_password_is_an_error(tmp_path):
    write_server_info(tmp_path / "rt", token="", password=False)
    facts = gather_jupyter(env={}, runtime_dir=str(tmp_path / "rt"))
    assert len(facts.servers) == 1
    result = check_jupyter(facts)
    assert result.level == "error" and "no token and no password" in result.message
    assert "workbench lab" in result.fix and "JUPYTER_TOKEN" in result.fix


@pytest.mark.parametrize("token, password", [("s3cret-Zq3v9XkP2mW8rT5yB7nL4cH6jD1fG0sA", False), ("", True)])
def test_running_server_with_token_or_password_is_ok(tmp_path, token, password):
    write_server_info(tmp_path / "rt", token=token, password=password)
    facts = gather_jupyter(env={}, runtime_dir=str(tmp_path / "rt"))
    assert check_jupyter(facts).level == "ok"
    assert "s3cret" not in json.dumps(_plain(facts))  # the token itself never leaves


def test_weak_token_of_a_running_server_is_a_warning(tmp_path):
    write_server_info(tmp_path / "rt", token="a" * 40, password=False)
    facts = gather_jupyter(env={}, runtime_dir=str(tmp_path / "rt"))
    result = check_jupyter(facts)
    assert result.level == "warn" and "predictable" in result.message and "token_urlsafe" in result.fix


def test_in_a_kernel_the_token_comes_from_the_runtime_file(tmp_path):
    """`workbench lab` keeps JUPYTER_TOKEN out of kernels: the doctor reads the server's file."""
    write_server_info(tmp_path / "rt", token="s3cret-Zq3v9XkP2mW8rT5yB7nL4cH6jD1fG0sA", password=False)
    kernel_env = {"JPY_PARENT_PID": "1", "JPY_SESSION_NAME": "/w/a.ipynb"}
    ok = check_jupyter(gather_jupyter(env=kernel_env, runtime_dir=str(tmp_path / "rt")))
    assert ok.level == "ok" and "runtime file" in ok.message
    leaked = gather_jupyter(env={**kernel_env, "JUPYTER_TOKEN": "x" * 43}, runtime_dir=str(tmp_path / "rt"))
    result = check_jupyter(leaked)
    assert result.level == "warn" and "saves the token into the notebook" in result.message


def test_dead_server_is_ignored(tmp_path):
    write_server_info(tmp_path / "rt", token="", password=False, pid=2**22 + 12345)
    facts = gather_jupyter(env={}, runtime_dir=str(tmp_path / "rt"))
    assert facts.servers == []
    assert check_jupyter(facts).level == "ok"


def test_token_from_environment(tmp_path):
    empty = str(tmp_path / "none")
    assert check_jupyter(gather_jupyter({"JUPYTER_TOKEN": "abc"}, empty)).level == "ok"
    missing = gather_jupyter({"JUPYTER_TOKEN_FILE": str(tmp_path / "nope")}, empty)
    assert missing.token_file_ok is False and check_jupyter(missing).level == "warn"
    token_file = tmp_path / "token"
    token_file.write_text("abc\n")
    present = gather_jupyter({"JUPYTER_TOKEN_FILE": str(token_file)}, empty)
    assert check_jupyter(present).level == "ok"


# ---------------------------------------------------------------- packages


def test_package_checks():
    assert check_package("transformers", None, "5.0").level == "error"
    old = check_package("transformers", "4.46.3", "5.0")
    assert old.level == "error" and "transformers>=5.0" in old.fix
    assert check_package("transformers", "5.24.0", "5.0").level == "ok"
    assert check_python("3.9.18").level == "error"
    assert check_python("3.11.7").level == "ok"


def test_installed_versions_are_read():
    import transformers

    facts = gather_python()
    assert facts.packages["transformers"] == transformers.__version__


# ---------------------------------------------------------------- whole report


def test_report_with_a_pascal_gpu_and_a_cu124_build(tmp_path):
    fake = FakeNVML(devices=[FakeDevice(name="Tesla P100-PCIE-16GB", compute_capability=(6, 0),
                                        memory_total=16 * GiB, mig_mode=None)],
                    driver="550.54.15", cuda_driver=12040)
    facts = gather_facts(tmp_path, nvml=fake)
    facts.torch = TorchFacts(version="2.13.0+cu124", cuda_build="12.4", cudnn="9.1.0",
                                nccl="2.21.5", cuda_available=True, device_count=1,
                                arch_list=VOLTA_PLUS)
    report = build_report(facts, check_network=False)
    assert not report.ok
    assert [r.name for r in report.errors] == ["gpu 0"]
    assert report["nvidia driver"].level == "ok"
    assert report["gpu 0 bf16"].level == "ok" and "no bf16" in report["gpu 0 bf16"].message
    assert "CUDA 12.4, cuDNN 9.1.0, NCCL 2.21.5" in report["torch build"].message
    assert report.to_dict()["facts"]["gpus"][0]["name"] == "Tesla P100-PCIE-16GB"


def test_report_without_a_driver_still_shows_cpu_facts(tmp_path):
    report = doctor(tmp_path, nvml=scenario("no_library"), check_network=False)
    assert report["nvidia driver"].level == "warn"
    assert not [r for r in report.results if r.section == "gpu" and r.name != "nvidia driver"]
    for name in ("python", "torch", "transformers", "shared memory", "output dir", "jupyter auth"):
        assert report[name].message
    assert report["output dir"].level == "ok"


def test_rendering(tmp_path):
    results = [
        CheckResult("a", "ok", "fine", section="s1"),
        CheckResult("b <x>", "warn", "careful & <b>", "do <this>", section="s1"),
        CheckResult("c", "error", "broken", "repair it", section="s2"),
    ]
    report = DoctorReport(results, {"k": 1})
    text = report.to_text(width=80)
    assert "WARN" in text and "ERROR" in text and "fix: do <this>" in text
    assert "-- s2 " in text and "1 error(s), 1 warning(s), 1 ok" in text
    html = report._repr_html_()
    assert "<table" in html and "careful &amp; &lt;b&gt;" in html and "<b>x" not in html
    data = json.loads(report.to_json())
    assert data["version"] == 1 and data["ok"] is False
    assert data["counts"] == {"ok": 1, "warn": 1, "error": 1}
    assert data["results"][2] == {"section": "s2", "name": "c", "level": "error",
                                  "message": "broken", "fix": "repair it"}
    with pytest.raises(KeyError):
        report["missing"]
    with pytest.raises(ValueError):
        CheckResult("x", "fatal", "no such level")


def test_workbench_doctor_is_the_public_entry(tmp_path):
    import workbench

    # The function itself, even after this file imported the diagnostics modules: no module
    # shares its name, so importing one cannot replace the attribute.
    assert workbench.doctor is doctor
    report = workbench.doctor(tmp_path, check_network=False)
    assert isinstance(report, DoctorReport)
    assert report._repr_html_().startswith('<table class="workbench-doctor">')
