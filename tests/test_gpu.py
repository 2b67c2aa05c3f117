"""The NVML layer (workbench.gpu) against the fake module, and the real no-GPU path."""

from __future__ import annotations

import ast
import ctypes
import os
import sys
import time
from pathlib import Path

import pytest
from fake_nvml import (
    GIB,
    MIB,
    NVML_DEVICE_MIG_ENABLE,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    FakeDevice,
    FakeNVML,
    FakeProcess,
    scenario,
    unused_pids,
)

from workbench import gpu
from workbench.gpu import GpuReader, Sampler, list_devices, nvml_status
from workbench.gpu import reader as gpu_reader

ROOT = Path(__file__).resolve().parents[1]


class Clock:
    """A hand-driven monotonic clock for back-off and process-interval tests."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def by_key(snapshot):
    return {(g.index, g.mig_index): g for g in snapshot.gpus}


# ---------------------------------------------------------------- normal values


def test_status_and_devices_normal():
    fake = scenario("two_gpus")
    status = nvml_status(fake)
    assert status == gpu.NvmlStatus(True, None, "550.54.15", "12.4", 2)
    devices = list_devices(fake)
    assert [d.index for d in devices] == [0, 1]
    first = devices[0]
    assert first.name == "NVIDIA A100-SXM4-40GB"
    assert first.uuid.startswith("GPU-")
    assert first.memory_total_bytes == 40 * GIB
    assert first.compute_capability == (8, 0)
    assert first.mig_mode is False and first.is_mig is False and first.error is None


def test_cuda_version_is_decoded():
    assert nvml_status(FakeNVML(cuda_driver=11080)).cuda_driver_version == "11.8"
    assert nvml_status(FakeNVML(cuda_driver=12060)).cuda_driver_version == "12.6"


def test_reader_values_for_each_gpu():
    snapshot = GpuReader(scenario("two_gpus")).read()
    assert snapshot.status.available and not snapshot.stale
    g0, g1 = snapshot.gpus
    assert g0.utilization_percent == 37.0
    assert g0.memory_used_bytes == 2 * GIB  # memory info v2: driver-reserved memory left out
    assert g0.memory_total_bytes == 40 * GIB
    assert g0.temperature_c == 45.0
    assert g0.power_w == 123.0 and g0.power_limit_w == 400.0
    assert [p.pid for p in g0.processes] == [os.getpid()]
    assert g0.processes[0].is_this_kernel and g0.processes[0].visible
    assert g0.warnings == () and g0.foreign_memory_bytes == 0
    assert g1.utilization_percent == 0.0  # a real 0 stays 0; only n/a is None
    assert g1.processes == ()
    assert snapshot.host is not None and snapshot.host.ram_total_bytes > 0


def test_memory_info_v1_fallback_counts_reserved_as_used():
    fake = FakeNVML(devices=[FakeDevice(memory_used=1 * GIB, memory_reserved=300 * MIB)],
                    memory_v2=False)
    (g,) = GpuReader(fake).read().gpus
    assert g.memory_used_bytes == 1 * GIB + 300 * MIB


def test_nvml_initialised_once_and_handles_cached():
    fake = scenario("two_gpus")
    reader = GpuReader(fake)
    for _ in range(5):
        reader.read()
    nvml_status(fake)
    list_devices(fake)
    assert fake.calls["nvmlInit"] == 1
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == 2
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 10


def test_process_list_is_queried_less_often():
    fake, clock = scenario("two_gpus"), Clock()
    reader = GpuReader(fake, process_interval=5.0, clock=clock)
    for _ in range(4):
        reader.read()
        clock.now += 1.0
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses"] == 2  # once per GPU
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 8
    clock.now += 1.0  # 5 s after the first query
    reader.read()
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses"] == 4
    assert reader.process_queries == 2


# ---------------------------------------------------------------- NVML failures


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("no_library", ["libnvidia-ml.so.1", "--gpus all"]),
        ("driver_not_loaded", ["driver is not loaded", "nvidia-smi"]),
        ("no_permission", ["no permission", "/dev/nvidia"]),
        ("version_mismatch", ["version mismatch", "reboot"]),
    ],
)
def test_init_failure_is_a_one_line_reason(name, words):
    fake = scenario(name)
    status = nvml_status(fake)
    assert status.available is False and status.device_count == 0
    assert "\n" not in status.reason
    for word in words:
        assert word in status.reason
    assert list_devices(fake) == []
    snapshot = GpuReader(fake).read()
    assert snapshot.gpus == () and not snapshot.status.available
    assert words[0] in snapshot.status.reason
    assert snapshot.host is not None  # CPU/RAM are still there to show


def test_failed_init_is_retried_not_cached():
    fake = FakeNVML(fail_init=NVML_ERROR_LIBRARY_NOT_FOUND)
    assert not nvml_status(fake).available
    fake.fail_init = None  # e.g. the driver got installed
    assert nvml_status(fake).available
    assert fake.calls["nvmlInit"] == 2


def test_no_gpus_reported():
    status = nvml_status(scenario("no_gpus"))
    assert not status.available and "no GPU" in status.reason
    assert status.driver_version == "550.54.15"


@pytest.mark.parametrize(
    ("name", "word"),
    [
        ("gpu_lost", "GPU is lost"),
        ("gpu_no_permission", "no permission"),
        ("gpu_not_supported", "not supported"),
        ("gpu_version_mismatch", "version mismatch"),
        ("gpu_driver_not_loaded", "driver is not loaded"),
    ],
)
def test_one_failing_gpu_does_not_blank_the_others(name, word):
    fake = scenario(name)
    devices = list_devices(fake)
    assert len(devices) == 2
    assert devices[0].error is None and devices[0].memory_total_bytes == 40 * GIB
    assert word in devices[1].error and "\n" not in devices[1].error
    assert devices[1].memory_total_bytes is None

    snapshot = GpuReader(fake).read()
    g0, g1 = snapshot.gpus
    assert g0.error is None and g0.utilization_percent == 37.0
    assert word in g1.error and g1.utilization_percent is None
    assert snapshot.status.available


def test_unsupported_metrics_are_none_never_zero():
    snapshot = GpuReader(scenario("metrics_not_supported")).read()
    old, new = snapshot.gpus
    assert old.error is None
    assert old.utilization_percent is None
    assert old.temperature_c is None
    assert old.power_w is None and old.power_limit_w is None
    assert old.processes is None  # unreadable list, not "no processes"
    assert old.memory_used_bytes == 2 * GIB
    assert new.utilization_percent == 37.0
    (info, _) = list_devices(scenario("metrics_not_supported"))
    assert info.mig_mode is None and info.compute_capability == (3, 7)


def test_describe_error_names_unknown_codes():
    fake = scenario("one_gpu")
    assert "code_77" in gpu.describe_error(fake.NVMLError(77), fake)
    assert gpu.describe_error(ValueError("boom")) == "ValueError: boom"
    assert gpu.error_name(fake.NVMLError(15), fake) == "GPU_IS_LOST"


def test_broken_binding_never_raises():
    status = nvml_status(object())  # a module without any NVML function
    assert not status.available and "AttributeError" in status.reason
    assert list_devices(object()) == []


# ---------------------------------------------------------------- MIG


def test_mig_slices_are_listed_with_their_memory():
    fake = scenario("mig")
    devices = list_devices(fake)
    assert [(d.index, d.is_mig, d.mig_index) for d in devices] == [
        (0, False, None), (0, True, 0), (0, True, 1), (1, False, None)]
    parent, s0, s1, _ = devices
    assert parent.mig_mode is True
    assert s0.name.endswith("3g.20gb") and s0.memory_total_bytes == 20 * GIB
    assert s1.memory_total_bytes == 10 * GIB
    assert s0.uuid.startswith("MIG-")


def test_mig_metrics_without_support_read_na():
    snapshot = GpuReader(scenario("mig")).read()
    slices = [g for g in snapshot.gpus if g.is_mig]
    assert len(slices) == 2
    for s in slices:
        assert s.utilization_percent is None and s.power_w is None and s.temperature_c is None
        assert s.memory_total_bytes > 0 and s.memory_used_bytes > 0  # v1 fallback on MIG
        assert s.error is None
    assert slices[0].label == "GPU 0 MIG 0"


def test_empty_mig_slots_are_skipped():
    slice_ = FakeDevice(name="MIG 1g.5gb", memory_total=5 * GIB)
    fake = FakeNVML(devices=[FakeDevice(mig_mode=NVML_DEVICE_MIG_ENABLE, mig_devices=[slice_],
                                        mig_slots=7)])
    assert sum(d.is_mig for d in list_devices(fake)) == 1


# ---------------------------------------------------------------- processes


def test_unused_pids_really_do_not_exist():
    for pid in unused_pids(3):
        assert not os.path.exists(f"/proc/{pid}")


def test_host_pids_are_shown_and_foreign_use_flagged():
    fake = scenario("host_pids")
    (g,) = GpuReader(fake).read().gpus
    assert len(g.processes) == 2
    assert all(not p.visible and p.name is None for p in g.processes)
    assert {p.used_memory_bytes for p in g.processes} == {6 * GIB, 3 * GIB}
    assert g.foreign_memory_bytes == 9 * GIB
    text = " ".join(g.warnings)
    assert "host PIDs not visible" in text
    assert "9.0 GiB used by no process of this container" in text
    assert "88% load" in text


def test_visible_process_accounts_for_its_memory():
    other = unused_pids(1)[0]
    device = FakeDevice(memory_used=5 * GIB, processes=[FakeProcess(os.getpid(), 4 * GIB),
                                                        FakeProcess(other, 1 * GIB)])
    (g,) = GpuReader(FakeNVML(devices=[device])).read().gpus
    assert g.foreign_memory_bytes == 1 * GIB
    mine = next(p for p in g.processes if p.is_this_kernel)
    assert mine.visible and mine.name  # comm of this test process


def test_this_kernels_torch_memory_is_not_flagged_as_foreign():
    torch_mem = gpu.TorchMemory(0, "GPU-abc", 3 * GIB, 4 * GIB, 3 * GIB, 4 * GIB)
    hidden = gpu.GpuProcess(unused_pids(1)[0], 4 * GIB + 300 * MIB, False, None)
    foreign, warnings = gpu_reader._foreign_use(4 * GIB + 300 * MIB, 90.0, (hidden,), torch_mem)
    assert foreign == 0
    assert not any("no process of this container" in w for w in warnings)


# ---------------------------------------------------------------- errors mid-run


def test_gpu_lost_mid_run_marks_stale_and_recovers_with_backoff():
    fake, clock = scenario("two_gpus"), Clock()
    reader = GpuReader(fake, backoff_initial=1.0, backoff_max=8.0, clock=clock)
    reader.read()
    fake.devices[0].fail("GPU_IS_LOST")
    clock.now += 1
    g0, g1 = reader.read().gpus
    assert g0.stale and "GPU is lost" in g0.error and g0.retry_in_s == 1.0
    assert g0.utilization_percent == 37.0  # last good values, marked stale
    assert not g1.stale and g1.error is None

    calls = fake.calls["nvmlDeviceGetHandleByIndex"]
    clock.now += 0.5  # inside the back-off: GPU 0 is not touched
    g0, _ = reader.read().gpus
    assert g0.stale and fake.calls["nvmlDeviceGetHandleByIndex"] == calls

    clock.now += 0.6  # retried, still lost: the delay doubles
    g0, _ = reader.read().gpus
    assert g0.retry_in_s == 2.0 and "GPU is lost" in g0.error

    fake.devices[0].heal()
    clock.now += 2.1
    g0, g1 = reader.read().gpus
    assert not g0.stale and g0.error is None and g0.utilization_percent == 37.0
    assert fake.calls["nvmlInit"] == 1  # one GPU lost: the session itself stays


def test_driver_reload_reinitialises_nvml():
    fake, clock = scenario("two_gpus"), Clock()
    reader = GpuReader(fake, backoff_initial=1.0, clock=clock)
    reader.read()
    fake.initialized = 0  # driver reloaded: every call now answers "uninitialized"
    clock.now += 1
    snapshot = reader.read()
    assert all(g.stale for g in snapshot.gpus)
    clock.now += 0.5
    snapshot = reader.read()  # waiting: NVML as a whole is down
    assert not snapshot.status.available and snapshot.status.retry_in_s == 1.0 and snapshot.status.reason
    assert snapshot.stale
    clock.now += 1
    snapshot = reader.read()
    assert snapshot.status.available and not any(g.stale for g in snapshot.gpus)
    assert fake.calls["nvmlInit"] == 2


# ---------------------------------------------------------------- sampler thread


def test_sampler_survives_errors_marks_stale_and_recovers():
    fake = scenario("one_gpu")
    reader = GpuReader(fake)
    failures = {"left": 0}

    def flaky_read():
        if failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("simulated NVML crash")
        return reader.read()

    seen = []
    sampler = Sampler(flaky_read, interval=0.01, backoff_max=0.05, on_sample=seen.append)
    sampler.start()
    try:
        _wait(lambda: sampler.samples_taken >= 2)
        failures["left"] = 3
        _wait(lambda: len(sampler.errors) >= 3)
        assert sampler.running
        assert any(s.stale and "simulated NVML crash" in (s.error or "") for s in seen)
        taken = sampler.samples_taken
        _wait(lambda: sampler.samples_taken > taken + 2)
        assert not sampler.latest.stale
        assert "simulated NVML crash" in sampler.last_error
    finally:
        sampler.stop()
    assert not sampler.running


def test_sampler_survives_a_failing_display_callback():
    def bad_draw(_snapshot):
        raise ValueError("draw bug")

    sampler = Sampler(GpuReader(scenario("one_gpu")).read, interval=0.01, on_sample=bad_draw)
    sampler.start()
    try:
        _wait(lambda: sampler.samples_taken >= 3)
        assert sampler.running and "draw bug" in sampler.last_error
    finally:
        sampler.stop()


def test_sampler_history_is_bounded_and_thread_ends_on_stop():
    sampler = Sampler(GpuReader(scenario("one_gpu")).read, interval=0.01, history_seconds=0.05)
    assert sampler.history.maxlen == 5
    sampler.start()
    thread = sampler._thread
    _wait(lambda: sampler.samples_taken >= 8)
    sampler.stop()
    assert not thread.is_alive()
    assert len(sampler.history) == 5
    taken = sampler.samples_taken
    time.sleep(0.05)
    assert sampler.samples_taken == taken
    assert thread.daemon  # never keeps a kernel from exiting


def test_sampler_rejects_bad_interval():
    with pytest.raises(ValueError, match="interval"):
        Sampler(lambda: None, interval=0)


# ---------------------------------------------------------------- torch and host


def test_torch_memory_is_empty_without_cuda_and_free_says_so():
    import torch

    assert not torch.cuda.is_initialized()
    assert gpu.torch_memory() == ()
    result = gpu.free_cached_memory()
    assert result.before == () and result.after == () and result.freed_bytes == 0
    assert "nothing to free" in result.message
    gpu.reset_torch_peak()  # no CUDA: a no-op, not an error
    assert not torch.cuda.is_initialized()  # the sampler never creates a CUDA context


def test_host_sample_reads_psutil():
    host = gpu.host_sample()
    assert 0 < host.ram_used_bytes < host.ram_total_bytes
    assert host.process_rss_bytes > 0 and host.cpu_count >= 1


# ---------------------------------------------------------------- the real library


def _driver_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        return True
    except OSError:
        return False


@pytest.mark.skipif(_driver_present(), reason="this machine has an NVIDIA driver")
def test_real_pynvml_without_a_driver():
    import pynvml

    assert pynvml.__file__  # the real nvidia-ml-py module, not a fake
    status = nvml_status()
    assert status.available is False
    assert "libnvidia-ml.so.1" in status.reason
    assert list_devices() == []
    snapshot = GpuReader().read()
    assert snapshot.gpus == () and "libnvidia-ml.so.1" in snapshot.status.reason


def test_missing_bindings_say_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    status = nvml_status()
    assert not status.available and "pip install nvidia-ml-py" in status.reason


def test_layers_do_not_cross():
    """The gpu package never imports ipywidgets; only gpu/nvml.py imports pynvml."""

    def imports(path):
        tree = ast.parse(path.read_text())
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module.split(".")[0])
        return names

    package = sorted((ROOT / "workbench" / "gpu").glob("*.py"))
    assert len(package) > 1
    for path in package:
        assert not {"ipywidgets", "IPython"} & imports(path), path.name
        assert ("pynvml" in imports(path)) == (path.name == "nvml.py"), path.name
    assert "pynvml" not in imports(ROOT / "workbench" / "widgets" / "gpu_panel.py")


def _wait(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.005)






def test_torch_memory_is_matched_to_its_gpu_by_uuid(monkeypatch):
    fake = scenario("two_gpus")
    nvml_uuid = list_devices(fake)[1].uuid  # "GPU-0000...": torch prints the bare hex
    reading = gpu.TorchMemory(0, nvml_uuid[4:].upper(), 1 * GIB, 2 * GIB, 3 * GIB, 3 * GIB)
    # Patched where the reader looks it up (workbench.gpu.reader), not the re-export.
    monkeypatch.setattr(gpu_reader, "torch_memory", lambda: (reading,))
    g0, g1 = GpuReader(fake).read().gpus
    assert g0.torch is None
    assert g1.torch == reading  # torch's cuda:0 is NVML's GPU 1 here
