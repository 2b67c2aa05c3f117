"""The doctor under library facts of other shapes than the installed ones (issue 32, part 1).

pyproject allows torch >= 2.4, so the doctor meets release tables, version values and arch
lists shaped as older and newer builds shape them. Each test feeds one such shape into the
real ``gather_torch`` (by patching the attribute torch exposes) and checks that the whole
report still renders and says what it can: a value it cannot read is "unknown", not a
traceback.
"""

from __future__ import annotations

import json

import pytest
import torch

from workbench.diagnostics import diagnose
from workbench.diagnostics.diagnose import build_report, gather_facts
from workbench.diagnostics.facts import _format_nccl, gather_hub, gather_torch, read_release_table

try:
    from tests.fake_nvml import FakeDevice, FakeNVML
except ImportError:  # tests/ itself on sys.path (pytest's rootdir insertion)
    from fake_nvml import FakeDevice, FakeNVML

# torch 2.13's table (per host) and torch 2.11's (one set of codes for every host)
TABLE_2_13 = {
    "12.6": {"x86_64": {50, 60, 70, 75, 80, 86, 90}, "aarch64": {80, 90}},
    "13.0": {"x86_64": {75, 80, 86, 90, 100, 120}, "aarch64": {80, 90, 100, 110, 120}},
}
TABLE_2_11 = {"12.6": {50, 60, 70, 75, 80, 86, 90}, "13.0": {75, 80, 86, 90, 100, 120}}
NO_TABLE = object()  # the attribute absent, as in torch before the table existed


@pytest.fixture
def release_table(monkeypatch):
    """Give torch.cuda a PYTORCH_RELEASES_CODE_CC of the shape a test names."""

    def install(table):
        if table is NO_TABLE:
            monkeypatch.delattr(torch.cuda, "PYTORCH_RELEASES_CODE_CC", raising=False)
        else:
            monkeypatch.setattr(torch.cuda, "PYTORCH_RELEASES_CODE_CC", table, raising=False)

    return install


def pascal_report(tmp_path):
    """The whole report for a Pascal GPU that a Volta+ cu130 build does not cover: the arch
    check is the one that reads the release table (its fix names the wheels that would work)."""
    fake = FakeNVML(devices=[FakeDevice(name="Tesla P100-PCIE-16GB", compute_capability=(6, 0),
                                        mig_mode=None)], driver="580.65.06", cuda_driver=13000)
    facts = gather_facts(tmp_path, nvml=fake)
    facts.torch.cuda_build = "13.0"
    facts.torch.arch_list = ["sm_75", "sm_80", "sm_90"]
    facts.torch.cuda_available = True
    return build_report(facts, check_network=False)


def assert_renders(report):
    text = report.to_text(width=100)
    assert "gpu 0" in text and "nvidia driver" in text
    assert report._repr_html_().startswith('<table class="workbench-doctor">')
    data = json.loads(report.to_json())
    assert {r["name"] for r in data["results"]} >= {"torch build", "gpu 0", "cpu bf16", "jupyter auth"}
    return data


@pytest.mark.parametrize("table", [TABLE_2_13, TABLE_2_11], ids=["torch-2.13", "torch-2.11"])
def test_both_known_shapes_name_the_wheels_that_cover_the_gpu(tmp_path, release_table, table):
    release_table(table)
    facts = gather_torch()
    assert facts.release_archs == {"12.6": [50, 60, 70, 75, 80, 86, 90], "13.0": [75, 80, 86, 90, 100, 120]}
    assert facts.release_archs_note is None
    report = pascal_report(tmp_path)
    assert_renders(report)
    arch = report["gpu 0"]
    assert arch.level == "error" and "sm_60" in arch.message
    assert "cu126" in arch.fix and "cu130" not in arch.fix  # the 12.6 wheels still ship sm_60


def test_the_2_13_table_is_read_for_this_host_only():
    archs, note = read_release_table(TABLE_2_13, "aarch64")
    assert archs == {"12.6": [80, 90], "13.0": [80, 90, 100, 110, 120]} and note is None


@pytest.mark.parametrize(
    "table, note_says",
    [
        (NO_TABLE, "no PYTORCH_RELEASES_CODE_CC"),
        (None, "no PYTORCH_RELEASES_CODE_CC"),
        ([("12.6", {60})], "is a list"),
        ("12.6: 60", "is a str"),
        (42, "is a int"),
        ({}, "lists no compute capability"),
    ],
    ids=["missing", "None", "list", "string", "int", "empty"],
)
def test_a_missing_or_unreadable_table_is_unknown_and_the_report_still_renders(
        tmp_path, release_table, table, note_says):
    release_table(table)
    facts = gather_torch()
    assert facts.release_archs == {}
    assert facts.release_archs_note.startswith("unknown") and note_says in facts.release_archs_note
    report = pascal_report(tmp_path)
    data = assert_renders(report)
    assert data["facts"]["torch"]["release_archs_note"] == facts.release_archs_note
    arch = report["gpu 0"]
    # what it can still say: the GPU, its arch, that this build misses it, and the general fix
    assert arch.level == "error" and "sm_60" in arch.message
    assert "TORCH_CUDA_ARCH_LIST=6.0" in arch.fix and "previous-versions" in arch.fix


def test_malformed_entries_are_left_out_and_named_while_good_ones_are_kept(tmp_path, release_table):
    table = {
        "12.6": {"x86_64": [60, "70", "sm_75", None, 3.5, -1, True, "junk"]},  # codes of every kind
        126: {60, 70},  # an int as the CUDA key: read as "126", its codes kept
        "12.8": None,
        "12.9": "80,90",
        "13.0": {"x86_64": None},
        None: {60},
        "13.1": {"x86_64": {"a": 1}},  # a mapping where codes belong: its keys are no codes
    }
    release_table(table)
    facts = gather_torch()
    assert facts.release_archs == {"12.6": [60, 70, 75], "126": [60, 70]}
    note = facts.release_archs_note
    for named in ("'12.8': NoneType", "'12.9': str", "'13.0': NoneType", "None: set"):
        assert named in note
    report = pascal_report(tmp_path)
    assert_renders(report)
    assert "cu126" in report["gpu 0"].fix


def test_other_torch_facts_of_odd_shapes_become_unknown(tmp_path, monkeypatch, release_table):
    release_table(TABLE_2_11)
    monkeypatch.setattr(torch.version, "cuda", 13.0)  # a number instead of text
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: None)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: "9.1")
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: [2, "x"])
    facts = gather_torch()
    assert facts.cuda_build == "13.0"
    assert facts.arch_list == [] and facts.cudnn is None and facts.nccl is None
    report = build_report(gather_facts(tmp_path, nvml=FakeNVML()), check_network=False)
    assert_renders(report)
    assert "cuDNN none" in report["torch build"].message
    assert report["gpu 0"].level == "warn" and "no compiled arch list" in report["gpu 0"].message


def test_an_arch_list_with_entries_of_other_types_keeps_the_text_ones(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: ["sm_80", 90, None, "sm_90"])
    assert gather_torch().arch_list == ["sm_80", "sm_90"]


@pytest.mark.parametrize("value, text", [((2, 27, 5), "2.27.5"), (2708, "2.7.8"), (None, None),
                                         ("2.27", None), ((), None), (0, None)])
def test_nccl_versions_of_old_and_new_torch(value, text):
    assert _format_nccl(value) == text


def test_hub_constants_missing_in_another_huggingface_hub_are_unknown(monkeypatch):
    from huggingface_hub import constants

    for name in ("HF_HOME", "HF_HUB_CACHE", "ENDPOINT"):
        monkeypatch.delattr(constants, name)
    facts = gather_hub([], None)
    assert facts.installed and facts.hub_cache is None and facts.cache is None
    from workbench.diagnostics.checks_hub import check_hub_cache

    assert "cache unknown (HF_HOME=unknown)" in check_hub_cache(facts).message


def test_a_check_that_raises_costs_its_own_row_not_the_report(tmp_path, monkeypatch):
    def broken(device):
        raise AttributeError("'set' object has no attribute 'get'")

    monkeypatch.setattr(diagnose, "check_bf16", broken)
    report = build_report(gather_facts(tmp_path, nvml=FakeNVML()), check_network=False)
    row = report["gpu 0 bf16"]
    assert row.level == "warn" and row.section == "gpu"
    assert "could not be checked" in row.message and "AttributeError" in row.message
    assert "workbench doctor --json" in row.fix
    assert report["gpu 0 MIG"].level == "ok"  # the rows after it are still there
    assert_renders(report)
