"""Checks of the machine around the GPU: the CPU's bf16 support (what precision="auto" picks
on CPU), shared memory for DataLoader workers, and the checkpoint directory (writable, free
space, on a volume that outlives the container)."""

from __future__ import annotations

from workbench.diagnostics.facts import CpuFacts, DirFacts, ShmFacts
from workbench.diagnostics.report import ERROR, OK, WARN, CheckResult
from workbench.diagnostics.values import GiB, format_bytes

SHM_MIN_BYTES = 1 * GiB  # below this, DataLoader workers run out of shared memory
OUTPUT_MIN_FREE_BYTES = 5 * GiB  # a BERT-base checkpoint with optimizer state is ~1.3 GB


SHM_FIX = (
    "Give the container more shared memory: docker run --shm-size=8g ... "
    '(compose: shm_size: "8gb"), or docker run --ipc=host; '
    "or set num_workers=0 in TrainConfig (slower data loading)."
)
VOLUME_FIX = (
    "Mount a volume there and write checkpoints into it: "
    "docker run -v $PWD/outputs:/workspace/outputs ... "
    "(compose: volumes: [\"./outputs:/workspace/outputs\"]), "
    "then use --output-dir / TrainConfig(output_dir=...) under that mount."
)


def check_cpu_bf16(cpu: CpuFacts, cuda_available: bool = False) -> CheckResult:
    """What precision="auto" trains in on this CPU, and why: a fact to know, never a problem."""
    name = "cpu bf16"
    what = cpu.name or "this CPU"
    what += f" ({cpu.cores} cores)" if cpu.cores else ""
    if cpu.bf16_native is None:
        return CheckResult(name, WARN, f"{what}: bf16 support could not be judged ({cpu.error}); "
                           "precision='auto' trains in fp32 on CPU.", "Check the torch result above.")
    gpu_note = " (runs on this machine use the GPU; this applies to CPU runs)" if cuda_available else ""
    if cpu.bf16_native:
        return CheckResult(name, OK, f"{what} computes bf16 natively ({cpu.bf16_evidence}): precision='auto' "
                           f"trains CPU runs in bf16 autocast, with fp32 weights{gpu_note}")
    return CheckResult(name, OK, f"{what} has no native bf16 ({cpu.bf16_evidence}): precision='auto' trains "
                       f"CPU runs in fp32; precision='bf16' would be emulated, slower{gpu_note}")


def check_shm(shm: ShmFacts, minimum: int = SHM_MIN_BYTES) -> CheckResult:
    name = "shared memory"
    if not shm.exists:
        return CheckResult(
            name, WARN, f"{shm.path} does not exist: DataLoader workers (num_workers > 0) share "
            "batches through it and will fail.", SHM_FIX,
        )
    size = f"{shm.path} is {format_bytes(shm.total_bytes)} ({format_bytes(shm.free_bytes)} free)"
    if (shm.total_bytes or 0) < minimum:
        return CheckResult(
            name, WARN,
            f"{size}, under {format_bytes(minimum)}: DataLoader workers fail with "
            "'No space left on device' or 'bus error' (Docker's default is 64 MiB).",
            SHM_FIX,
        )
    return CheckResult(name, OK, size)


def check_output_writable(d: DirFacts) -> CheckResult:
    name = "output dir"
    if not d.writable:
        return CheckResult(
            name, ERROR, f"cannot write checkpoints to {d.path}: {d.write_error}",
            "Choose a writable directory: workbench doctor --output-dir DIR, "
            "WORKBENCH_OUTPUT_DIR=DIR, or TrainConfig(output_dir=...); or fix its owner "
            "(chown) / mount it read-write.",
        )
    if d.exists:
        return CheckResult(name, OK, f"{d.path} is writable")
    return CheckResult(name, OK, f"{d.path} does not exist yet; it can be created in {d.probe_dir}")


def check_output_space(d: DirFacts, minimum: int = OUTPUT_MIN_FREE_BYTES) -> CheckResult:
    name = "output free space"
    if d.free_bytes is None:
        return CheckResult(name, WARN, f"free space at {d.path} unknown", "Check it with df -h.")
    if d.free_bytes < minimum:
        return CheckResult(
            name, WARN,
            f"only {format_bytes(d.free_bytes)} free at {d.path}: a BERT-base checkpoint with "
            f"optimizer state takes ~1.3 GB, and a full disk corrupts the last one.",
            "Free space, keep fewer checkpoints (TrainConfig.keep_checkpoints), or point "
            "--output-dir at a larger volume.",
        )
    return CheckResult(name, OK, f"{format_bytes(d.free_bytes)} free")


def check_output_volume(d: DirFacts) -> CheckResult:
    name = "output volume"
    m = d.mount
    if m is None:
        return CheckResult(name, WARN, f"no mount found for {d.path} in /proc/self/mountinfo")
    where = f"{m.mount_point} ({m.fstype} {m.source})"
    if m.fstype in ("tmpfs", "ramfs"):
        return CheckResult(
            name, WARN, f"{d.path} is on {where}, held in memory: checkpoints are lost at the next "
            "restart and use RAM.", VOLUME_FIX if d.container else
            "Use a directory on a disk: --output-dir / TrainConfig(output_dir=...).",
        )
    if m.mount_point == "/" and d.container:
        return CheckResult(
            name, WARN,
            f"{d.path} is inside the container's own filesystem ({m.fstype} root; container: "
            f"{d.container}), not on a mounted volume: checkpoints vanish when the container is "
            "removed.",
            VOLUME_FIX,
        )
    if d.container:
        return CheckResult(name, OK, f"on mounted volume {where}: survives the container")
    return CheckResult(name, OK, f"on {where} (not in a container)")
