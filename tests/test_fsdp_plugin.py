"""What the engine hands Accelerate for distributed='fsdp' (the run itself needs CUDA: tests/gpu)."""

from __future__ import annotations

import pytest

from workbench.engine import distributed


def test_fsdp_is_fsdp2_with_sharded_checkpoints_and_no_meta_loading():
    from torch.distributed.fsdp import StateDictType

    plugin = distributed.fsdp_plugin()
    # FSDP1 (Accelerate's default) left an optimizer made before prepare on orphaned parameters:
    # saving it raised KeyError in torch's _unflatten_param_groups (issue 32).
    assert plugin.fsdp_version == 2
    assert plugin.state_dict_type == StateDictType.SHARDED_STATE_DICT
    assert plugin.cpu_ram_efficient_loading is False
    assert plugin.reshard_after_forward is True


def test_the_blocks_sharded_are_the_layers_not_the_module_that_holds_the_embeddings(tiny_bert):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=2)
    assert "BertEmbeddings" in model._no_split_modules  # what would be sharded twice
    assert distributed.fsdp_block_names(model) == ["BertLayer"]


def test_the_prepare_call_gets_the_optimizer_with_its_model():
    # FSDP2 swaps the optimizer's parameters for the sharded ones inside one prepare(model,
    # optimizer, ...) call; Accelerate refuses an optimizer prepared without its model.
    import inspect

    from workbench.engine import setup

    source = inspect.getsource(setup.prepare)
    made, blocks, prepared = (source.index(s) for s in (
        "make_optimizer(model", "distributed.shard_blocks(accelerator, model)",
        "accelerator.prepare(model, optimizer"))
    assert made < blocks < prepared


def test_fsdp_on_a_cpu_is_refused_rather_than_silently_ddp(monkeypatch):
    import torch

    from workbench.config import TrainConfig
    from workbench.errors import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="only on CUDA"):
        distributed.make_accelerator(TrainConfig(output_dir="unused", distributed="fsdp"), "fp32")
