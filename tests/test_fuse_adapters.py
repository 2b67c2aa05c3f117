"""The compiled blocks' adapter fusion (engine/fuse_adapters.py): what it fuses, what it leaves
apart, and that the fused graph computes the unfused one's values and gradients."""

from __future__ import annotations

import copy

import torch
from torch import nn

from workbench.engine import compile as compiling
from workbench.engine.fuse_adapters import FUSE_SIBLING_ADAPTERS, FuseSiblingAdapters

LINEAR = (torch._C._nn.linear, nn.functional.linear)


class _Siblings(nn.Module):
    """Three LoRA-like adapters on one input beside what must stay apart: a frozen base weight,
    a biased layer and a square trainable one (full fine-tuning's)."""

    def __init__(self):
        super().__init__()
        self.base = nn.Linear(64, 64, bias=False).requires_grad_(False)
        self.a_q, self.a_k, self.a_v = (nn.Linear(64, 16, bias=False) for _ in range(3))
        self.b_q, self.b_k, self.b_v = nn.Linear(16, 64, bias=False), nn.Linear(16, 32, bias=False), \
            nn.Linear(16, 32, bias=False)
        self.biased = nn.Linear(64, 16)
        self.square = nn.Linear(64, 64, bias=False)

    def forward(self, x):
        return (self.base(x) + self.b_q(self.a_q(x)), self.b_k(self.a_k(x)), self.b_v(self.a_v(x)),
                self.biased(x), self.square(x))


def test_the_pass_fuses_trainable_thin_siblings_and_leaves_the_rest_apart():
    torch.manual_seed(0)
    eager = _Siblings()
    rewritten, seen, fuse = copy.deepcopy(eager), {}, FuseSiblingAdapters()

    def backend(graph_module, example_inputs):  # dynamo's graph, as inductor's pre-grad passes get it
        count = lambda: sum(n.op == "call_function" and n.target in LINEAR for n in graph_module.graph.nodes)  # noqa: E731
        seen["before"] = count()
        fuse(graph_module.graph)
        graph_module.graph.lint()
        graph_module.recompile()
        seen["after"] = count()
        return graph_module.forward

    x = torch.randn(2, 5, 64)
    got = torch.compile(rewritten, backend=backend, fullgraph=True)(x)
    expected = eager(x)
    # q, k, v's A as one product and their B as one (block-diagonal); base, biased and square apart.
    assert seen == {"before": 9, "after": 5} and fuse.fused == 4
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)
    weights = torch.randn(5)
    sum(w * out.square().sum() for w, out in zip(weights, got, strict=True)).backward()
    sum(w * out.square().sum() for w, out in zip(weights, expected, strict=True)).backward()
    for (name, p_got), p_expected in zip(rewritten.named_parameters(), eager.parameters(), strict=True):
        if p_expected.requires_grad:  # each B its own diagonal block's gradient, nothing of its neighbours'
            torch.testing.assert_close(p_got.grad, p_expected.grad, rtol=1e-5, atol=1e-6, msg=name)
        else:
            assert p_got.grad is None


def test_a_split_along_another_dimension_is_not_read_as_adapter_parts():
    class SplitRows(nn.Module):
        def __init__(self):
            super().__init__()
            self.b1, self.b2 = nn.Linear(16, 64, bias=False), nn.Linear(16, 64, bias=False)

        def forward(self, h):
            first, second = torch.split(h, [3, 3], dim=0)  # rows, not features: no block-diagonal product
            return self.b1(first), self.b2(second)

    fuse = FuseSiblingAdapters()

    def backend(graph_module, example_inputs):
        fuse(graph_module.graph)
        graph_module.recompile()
        return graph_module.forward

    module = SplitRows()
    h = torch.randn(6, 16)
    got = torch.compile(module, backend=backend, fullgraph=True)(h)
    assert fuse.fused == 0
    torch.testing.assert_close(got[0], module.b1(h[:3]))


def _lora_llama(layers: int):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, num_hidden_layers=layers, vocab_size=300)
    torch.manual_seed(0)
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(
        r=16, lora_alpha=32, lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    for name, parameter in model.named_parameters():
        if "lora_B" in name:  # B starts at zero; trained adapters do not
            nn.init.normal_(parameter, std=0.05)
    return model


def _products_and_gradients(model, ids):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    products = sum(event.name == "aten::mm" for event in profile.events())
    # Gradients autograd had to copy to lay them out as their parameters (views of a larger matrix).
    copies = sum(event.name == "aten::copy_" and event.cpu_parent is not None
                 and "AccumulateGrad" in event.cpu_parent.name for event in profile.events())
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), products, copies, grads


def test_compiled_lora_layers_run_17_fewer_products_each_and_the_eager_values():
    """A LLaMA layer with all seven projections adapted: 56 matrix products eagerly (forward and
    backward), 39 compiled. Random B's, so every adapter's gradient is live."""
    ids = torch.randint(0, 300, (2, 24), generator=torch.Generator().manual_seed(1))
    eager = _lora_llama(layers=2)
    compiled = copy.deepcopy(eager)
    for layer in compiled.base_model.model.model.layers:
        layer.compile(**compiling.compile_arguments("default", "cpu"))
    compiled(input_ids=ids, labels=ids).loss.backward()  # compiles
    compiled.zero_grad(set_to_none=True)
    before = FUSE_SIBLING_ADAPTERS.fused
    loss_eager, products_eager, copies_eager, grads_eager = _products_and_gradients(eager, ids)
    loss_compiled, products_compiled, copies_compiled, grads_compiled = _products_and_gradients(compiled, ids)
    assert FUSE_SIBLING_ADAPTERS.fused == before  # compiled once, above: no recompiling in the measured step
    assert products_eager - products_compiled == 2 * 17, (products_eager, products_compiled)
    # The B's gradients, blocks of the block-diagonal weight's, arrive contiguous: none copied (5 a layer were).
    assert copies_compiled == copies_eager == 0
    assert all(grad.is_contiguous() for grad in grads_compiled.values())
    torch.testing.assert_close(loss_compiled, loss_eager, rtol=1e-5, atol=1e-6)
    assert grads_compiled.keys() == grads_eager.keys() and len(grads_eager) == 2 * 7 * 2  # A and B, 7 per layer
    for name, grad in grads_eager.items():
        torch.testing.assert_close(grads_compiled[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_second_halves_called_in_another_order_than_their_parts_still_give_a_valid_graph():
    """The fused B product goes before the first B in the graph, not before part 0's: a block that runs
    its B's as v, k, q and uses v's output before q's B would otherwise read a node not yet defined."""

    class Reversed(nn.Module):
        def __init__(self):
            super().__init__()
            self.a_q, self.a_k, self.a_v = (nn.Linear(64, 16, bias=False) for _ in range(3))
            self.b_q, self.b_k, self.b_v = (nn.Linear(16, 64, bias=False) for _ in range(3))

        def forward(self, x):
            h_q, h_k, h_v = self.a_q(x), self.a_k(x), self.a_v(x)
            v = self.b_v(h_v).relu()  # used before b_k and b_q run
            k = self.b_k(h_k) + v
            return self.b_q(h_q) * k

    torch.manual_seed(0)
    eager = Reversed()
    rewritten, fuse = copy.deepcopy(eager), FuseSiblingAdapters()

    def backend(graph_module, example_inputs):
        fuse(graph_module.graph)
        graph_module.graph.lint()  # every node defined before its users
        graph_module.recompile()
        return graph_module.forward

    x = torch.randn(2, 5, 64)
    got = torch.compile(rewritten, backend=backend, fullgraph=True)(x)
    assert fuse.fused == 4  # the three A's as one product, the three B's as one
    torch.testing.assert_close(got, eager(x), rtol=1e-5, atol=1e-6)
