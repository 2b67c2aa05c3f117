"""A graph pass for compiled blocks: sibling low-rank adapters as one matrix product each.

LoRA puts an adapter on every linear layer, and the siblings of a block read the same input:
q, k and v read the attention's input, gate and up the MLP's. Eagerly each adapter is two
small matrix products forward (``x @ A.T``, then ``h @ B.T``) and four backward, each a kernel
launch on a GPU and a dispatch on a CPU, whose arithmetic (rank 16) is far smaller than
the launch: 56 products per LLaMA layer with all seven projections adapted. Inductor
keeps each ``linear`` as its own product (its ``batch_linear_lhs`` fusion wants a 2-D input and
a transformer's are 3-D), so this pass, run on the graph before autograd traces it
(``pre_grad_custom_pass``), rewrites:

- **shared input**: ``linear(x, A_i)`` for each sibling -> one ``linear(x, cat(A_i))`` split
  into its parts (q, k, v: one product instead of three, forward and for each gradient);
- **their second halves**: ``linear(h_i, B_i)``, where each ``h_i`` is a part of such a split,
  -> one ``linear(h, block_diag(B_i))`` split into its parts. The zero blocks add exact zeros,
  and the gradient of ``block_diag`` is its diagonal blocks, so each ``B_i`` gets its own.
  Those blocks are views into one matrix, and autograd copies a parameter's gradient that is
  not laid out as the parameter (``AccumulateGrad``): 5 copies per LLaMA layer outside the
  graph, each a host op (a kernel on a GPU). Each ``B_i`` goes through ``contiguous_gradient``
  first, so the compiled backward writes them contiguous itself (2 fused kernels per layer).

39 products instead of 56 per layer. Only trainable weights that are thin (one side at most
half the other: an adapter's rank against its layer's width) are fused. The concatenated copies are what the backward keeps (a
``cat`` is not recomputed), as large as the weights concatenated: small for adapters, but
for a frozen base weight that copy would be as large as the layer, so base weights stay
apart. Biases, other weights and anything else in the graph are untouched.

Values equal the unfused graph's up to rounding (each output element is the same dot
product; a kernel may sum it in another order): the compiled LoRA tests compare the two.
"""

from __future__ import annotations

import collections
import operator

import torch
import torch.nn.functional as F
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

LINEAR_TARGETS = (torch._C._nn.linear, F.linear)
THIN = 2  # an adapter's weight: one side at most 1/THIN of the other (rank 16 of 64 in the stand-in, of 576 in SmolLM2)


def _argument(node: torch.fx.Node, index: int, name: str):
    return node.args[index] if len(node.args) > index else node.kwargs.get(name)


def _adapter_weight(node: torch.fx.Node, thin_side: int):
    """``node``'s weight when ``node`` is an unbiased ``linear`` whose weight is a trainable graph input
    thin on ``thin_side`` (0: the rows, as an A; 1: the columns, as a B); else None."""
    if node.op != "call_function" or node.target not in LINEAR_TARGETS:
        return None
    weight, bias = _argument(node, 1, "weight"), _argument(node, 2, "bias")
    if bias is not None or not isinstance(weight, torch.fx.Node) or weight.op != "placeholder":
        return None
    value = weight.meta.get("example_value")
    if not isinstance(value, torch.Tensor) or value.dim() != 2 or not value.requires_grad:
        return None
    if THIN * value.shape[thin_side] > value.shape[1 - thin_side]:
        return None
    return value


class _ContiguousGradient(torch.autograd.Function):
    """The identity forward; backward, the gradient made contiguous (inside the compiled graph)."""

    @staticmethod
    def forward(ctx, weight):
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


def contiguous_gradient(weight: torch.Tensor) -> torch.Tensor:
    """``weight``, whose gradient arrives contiguous: as its parameter's, which autograd keeps without a copy."""
    return _ContiguousGradient.apply(weight)


def _set_example_value(node: torch.fx.Node) -> None:
    """``node``'s example value (a fake tensor) from its arguments', as dynamo gives every node; later passes read it."""
    args = torch.fx.node.map_arg(node.args, lambda arg: arg.meta.get("example_value"))
    if any(value is None for value in torch.utils._pytree.tree_leaves(args)):
        return
    node.meta["example_value"] = node.target(*args, **node.kwargs)


def _replace_with_parts(graph: torch.fx.Graph, nodes: list, fused_input, fused_weight_fn, weights) -> None:
    """Replace the ``linear`` ``nodes`` by one ``linear(fused_input, fused_weight_fn(weights))``, split back."""
    sections = [weight.meta["example_value"].shape[0] for weight in weights]
    # Before the first of them in the graph's order, which need not be the parts' order (a block may
    # run its B's as v, k, q): every user of any of them then comes after the fused product.
    order = {node: index for index, node in enumerate(graph.nodes)}
    with graph.inserting_before(min(nodes, key=order.__getitem__)):
        fused_weight = fused_weight_fn(weights)
        fused = graph.call_function(torch._C._nn.linear, (fused_input, fused_weight))
        parts = graph.call_function(torch.split, (fused, sections), {"dim": -1})
    _set_example_value(fused_weight)
    _set_example_value(fused)
    for index, node in enumerate(nodes):
        with graph.inserting_after(parts):
            part = graph.call_function(operator.getitem, (parts, index))
        part.meta.update(node.meta)  # the part is what the linear was: same shape, same example value
        node.replace_all_uses_with(part)
        graph.erase_node(node)


def _splits_last_dim(node) -> bool:
    """``node`` is a ``torch.split`` along the last dimension (as this pass's own are): the parts of
    its input's features, which a block-diagonal weight can read at once."""
    if not isinstance(node, torch.fx.Node) or node.target is not torch.split:
        return False
    dim = _argument(node, 2, "dim")
    value = _argument(node, 0, "tensor")
    value = value.meta.get("example_value") if isinstance(value, torch.fx.Node) else None
    return isinstance(value, torch.Tensor) and dim is not None and dim % value.dim() == value.dim() - 1


def _block_diagonal(graph: torch.fx.Graph, weights: list) -> torch.fx.Node:
    """``block_diag`` of ``weights``, each through ``contiguous_gradient`` (the module's docstring)."""
    parts = []
    for weight in weights:
        parts.append(graph.call_function(contiguous_gradient, (weight,)))
        _set_example_value(parts[-1])
    return graph.call_function(torch.block_diag, tuple(parts))


class FuseSiblingAdapters(CustomGraphPass):
    """The pass (see the module's docstring); ``fused`` counts the products it removed, for the tests."""

    def __init__(self):
        self.fused = 0

    def __call__(self, graph: torch.fx.Graph) -> None:
        self._fuse_shared_inputs(graph)
        self._fuse_second_halves(graph)

    def _fuse_shared_inputs(self, graph: torch.fx.Graph) -> None:
        groups = collections.defaultdict(list)  # (input, dtype, device) -> the A-like linears reading it
        for node in graph.nodes:
            value = _adapter_weight(node, thin_side=0)
            if value is not None:
                groups[(_argument(node, 0, "input"), value.dtype, value.device)].append(node)
        for (shared_input, _, _), nodes in groups.items():
            if len(nodes) < 2:
                continue
            weights = [_argument(node, 1, "weight") for node in nodes]
            _replace_with_parts(graph, nodes, shared_input,
                                lambda ws: graph.call_function(torch.cat, (ws,), {"dim": 0}), weights)
            self.fused += len(nodes) - 1

    def _fuse_second_halves(self, graph: torch.fx.Graph) -> None:
        groups = collections.defaultdict(dict)  # a split -> {part index: the B-like linear reading that part}
        for node in graph.nodes:
            value = _adapter_weight(node, thin_side=1)
            part = _argument(node, 0, "input") if value is not None else None
            if (isinstance(part, torch.fx.Node) and part.target is operator.getitem
                    and _splits_last_dim(part.args[0])):
                groups[(part.args[0], value.dtype, value.device)].setdefault(part.args[1], node)
        for (split, _, _), by_part in groups.items():
            # Every part, each read by one such linear: the whole split's input is their input.
            if len(by_part) < 2 or sorted(by_part) != list(range(len(split.args[1]))):
                continue
            nodes = [by_part[index] for index in range(len(by_part))]
            weights = [_argument(node, 1, "weight") for node in nodes]
            _replace_with_parts(graph, nodes, split.args[0], lambda ws: _block_diagonal(graph, ws), weights)
            self.fused += len(nodes) - 1

    def uuid(self):
        """For inductor's cache: a compiled graph from another version of this pass is not reused."""
        return get_hash_for_files((__file__,))


# One instance for every block: the blocks' compile options stay equal, so one compile serves them all.
FUSE_SIBLING_ADAPTERS = FuseSiblingAdapters()
