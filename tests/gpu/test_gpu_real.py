"""The NVML layer and the GPU panel on a real NVIDIA GPU (skipped elsewhere; ~5 s).

Self-contained: no model, no data; one 256 MiB tensor on cuda:0.
"""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

MIB = 1024**2


@pytest.fixture(scope="module")
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    torch.cuda.init()
    return torch.device("cuda:0")


def test_nvml_status_and_devices_on_a_real_gpu(cuda):
    from workbench.gpu import list_devices, nvml_status

    status = nvml_status()
    assert status.available, status.reason
    assert status.device_count >= 1
    assert status.driver_version and status.cuda_driver_version
    major, minor = (int(x) for x in status.cuda_driver_version.split("."))
    assert major >= 11 and 0 <= minor < 100
    gpus = [d for d in list_devices() if not d.is_mig]
    assert len(gpus) == status.device_count
    for d in gpus:
        assert d.error is None, d.error
        assert d.memory_total_bytes > 0
        assert d.uuid.startswith("GPU-")
        assert d.compute_capability is not None and d.compute_capability[0] >= 3
    for d in list_devices():
        if d.is_mig:
            assert d.memory_total_bytes > 0 and d.uuid


def test_panel_reads_real_values(cuda):
    from workbench.widgets.gpu_panel import GPUPanel

    panel = GPUPanel(interval=0.2)
    try:
        snapshot = panel.refresh()
        assert snapshot is not None and snapshot.status.available, snapshot
        assert snapshot.gpus, "no GPU sample"
        for g in snapshot.gpus:
            assert g.error is None, g.error
            assert g.memory_total_bytes > 0
            assert 0 <= g.memory_used_bytes <= g.memory_total_bytes
            if g.utilization_percent is not None:  # None on MIG slices: n/a
                assert 0 <= g.utilization_percent <= 100
            if g.temperature_c is not None:
                assert 0 < g.temperature_c < 130
            if g.power_w is not None and g.power_limit_w:
                assert 0 <= g.power_w <= 2 * g.power_limit_w
            assert g.processes is None or isinstance(g.processes, tuple)
        assert panel._cards and "GPU 0" in next(iter(panel._cards.values())).title.value
        assert "No GPU" not in panel.header.value
    finally:
        panel.close()


def test_torch_allocated_and_peak_increase_after_allocating(cuda):
    from workbench import gpu
    from workbench.widgets.gpu_panel import GPUPanel

    torch.cuda.synchronize()
    gpu.reset_torch_peak()
    before = {t.device: t for t in gpu.torch_memory()}[0]
    x = torch.empty(256 * MIB, dtype=torch.uint8, device=cuda)
    torch.cuda.synchronize()
    after = {t.device: t for t in gpu.torch_memory()}[0]
    assert after.allocated_bytes >= before.allocated_bytes + 256 * MIB
    assert after.reserved_bytes >= after.allocated_bytes
    assert after.peak_allocated_bytes >= after.allocated_bytes

    panel = GPUPanel(interval=0.1)
    try:
        snapshot = panel.refresh()
        mine = [g.torch for g in snapshot.gpus if g.torch is not None]
        # The card of the GPU this kernel uses shows its PyTorch memory apart from the rest.
        assert mine and mine[0].allocated_bytes >= 256 * MIB
        texts = [c.mine.value for c in panel._cards.values()] + [panel.torch_html.value]
        assert any("this kernel (PyTorch)" in t for t in texts)

        del x
        result = panel.free_memory()
        assert result.freed_bytes >= 256 * MIB
        assert "Freed" in panel.action.value
        peak = {t.device: t for t in gpu.torch_memory()}[0].peak_allocated_bytes
        assert peak >= 256 * MIB  # the peak survives the free: it is since the last reset
    finally:
        panel.close()


def test_sampler_thread_on_a_real_gpu(cuda):
    from workbench.widgets.gpu_panel import GPUPanel

    panel = GPUPanel(interval=0.05)
    panel.start()
    try:
        deadline = time.monotonic() + 10
        while panel.sampler.samples_taken < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert panel.sampler.samples_taken >= 5
        assert not panel.sampler.errors, list(panel.sampler.errors)
        assert not panel.latest.stale
        assert len(panel.chart.value) > 0 and "<svg" in panel.chart.value
    finally:
        panel.close()
    assert not panel.running
