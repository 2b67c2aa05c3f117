"""benchmarks/step_overhead.py: how it splits a step's time (the fixed cost and the cost per
token, the arithmetic's share), and a --quick run of the eager engine on the bert stand-in
that must report every figure."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "step_overhead.py"


def _load():
    sys.path.insert(0, str(SCRIPT.parent))  # it imports offline.py from beside itself
    try:
        spec = importlib.util.spec_from_file_location("step_overhead", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return module


bench = _load()


def test_the_line_through_the_steps_gives_their_fixed_cost_and_per_token_cost_despite_a_recompile():
    timed = [(tokens, 20.0 + 0.07 * tokens) for tokens in (256, 512, 512, 768, 1024, 2048, 512, 768)]
    timed[3] = (768, 2000.0)  # a step that compiled again
    got = bench.fixed_and_per_token(timed)
    assert got["fixed_ms"] == pytest.approx(20.0) and got["ms_per_1k_tokens"] == pytest.approx(70.0)


def test_lengths_too_alike_to_tell_fixed_from_per_token_give_none():
    assert bench.fixed_and_per_token([(800, 120.0), (816, 121.0), (832, 122.5)])["fixed_ms"] is None
    assert bench.fixed_and_per_token([(800, 120.0)] * 5)["ms_per_1k_tokens"] is None


def test_arithmetic_is_the_self_time_of_products_and_attention_only():
    def event(name, us):
        return SimpleNamespace(name=name, self_cpu_time_total=us)

    profile = SimpleNamespace(events=lambda: [
        event("aten::mm", 1500), event("aten::addmm", 500), event("aten::bmm", 250),
        event("aten::_scaled_dot_product_flash_attention_for_cpu_backward", 750),
        event("aten::linear", 40), event("aten::add", 900), event("graph_1_cpp_fused_add_0", 300)])
    assert bench.arithmetic_ms(profile) == pytest.approx(3.0)


def test_the_arithmetic_of_a_profiled_step_is_its_matrix_products_within_its_own_time():
    a = torch.randn(192, 192)
    meter = bench.StepMeter(warmup=0, steps=1, profile_steps=2)

    def step():
        products = [a @ a for _ in range(20)]
        [p.relu_().sum() for p in products for _ in range(5)]  # elementwise work: not arithmetic

    for _ in range(meter.total):
        meter.run(step, tokens=192)
    got = meter.summary()
    assert 0 < got["arithmetic_ms"] < got["profiled_step_ms"]
    # outermost calls only: 20 matmul (each calls mm inside), then relu_ and sum 5 times per product
    assert got["host_ops_per_step"] == 20 + 2 * 100


def test_a_quick_run_of_the_eager_engine_reports_every_figure(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--tasks", "bert", "--only", "b",
                           "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    row = next(line for line in done.stdout.splitlines() if line.startswith("bert  (b) engine"))
    host_ops, steps_per_s, step_ms, arithmetic, rest = (float(v) for v in row.split()[3:8])
    # Not arithmetic < step_ms: the one profiled step of --quick is another batch than the timed ones.
    assert host_ops > 500 and steps_per_s > 0 and arithmetic > 0
    assert rest == pytest.approx(step_ms - arithmetic, abs=0.2)
    assert "upper bound on CPU" in done.stdout


def test_each_round_rotates_the_order_so_no_variant_always_runs_first():
    assert bench.round_orders("ab", 3) == ["ab", "ba", "ab"]
    assert bench.round_orders("abc", 4) == ["abc", "bca", "cab", "abc"]
    assert bench.round_orders("b", 2) == ["b", "b"]


def test_rounds_give_each_variant_its_median_round_and_ratios_taken_within_each_round():
    def result(task, variant, steps_per_s):
        return {"task": task, "variant": variant, "steps_per_s": steps_per_s, "host_ops_per_step": 100}

    # The machine slowed in round 2: both variants' steps/s drop, their ratio in that round does not.
    runs = [[result("lora", "a", 3.0), result("lora", "b", 2.0)],
            [result("lora", "b", 1.0), result("lora", "a", 1.6)],
            [result("lora", "a", 3.3), result("lora", "b", 2.2)]]
    combined, ratios = bench.combine_rounds(runs)
    assert [(r["variant"], r["steps_per_s"]) for r in combined] == [("a", 3.0), ("b", 2.0)]
    assert combined[1]["steps_per_s_rounds"] == [2.0, 1.0, 2.2]
    assert ratios["lora"]["a/b"] == pytest.approx([1.5, 1.6, 1.5])
    assert set(ratios["lora"]) == {"a/b"}  # no (c) was run
