"""Tensor-parallel styles: which layers, and their one-rank behaviour (N ranks: multirank test)."""

import pytest
import torch
import torch.nn as nn
from torch.distributed.tensor import Replicate, Shard

from functrain.parallel import tensor_parallel as tpl


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.Module()
        self.attn.q_proj, self.attn.k_proj = nn.Linear(8, 8), nn.Linear(8, 8)
        self.attn.v_proj, self.attn.o_proj = nn.Linear(8, 8), nn.Linear(8, 8)
        self.mlp = nn.Module()
        self.mlp.fc1, self.mlp.fc2 = nn.Linear(8, 32), nn.Linear(32, 8)
        self.lonely = nn.Module()
        self.lonely.c_proj = nn.Linear(8, 8)  # a row name without a column partner: left alone
        self.head = nn.Linear(8, 5)


def test_auto_finds_column_row_pairs():
    styles = tpl.resolve_tp_styles(Block(), "auto")
    assert styles == {
        "attn.q_proj": "colwise",
        "attn.k_proj": "colwise",
        "attn.v_proj": "colwise",
        "attn.o_proj": "rowwise",
        "mlp.fc1": "colwise",
        "mlp.fc2": "rowwise",
    }


def test_patterns_and_their_errors():
    styles = tpl.resolve_tp_styles(
        Block(), {"mlp.fc1": "colwise", "mlp.fc2": "rowwise", "head": "colwise_gather"}
    )
    assert styles == {"mlp.fc1": "colwise", "mlp.fc2": "rowwise", "head": "colwise_gather"}
    with pytest.raises(ValueError, match="matches no module"):
        tpl.resolve_tp_styles(Block(), {"nothing.*": "colwise"})
    with pytest.raises(ValueError, match="must be one of"):
        tpl.resolve_tp_styles(Block(), {"head": "diagonal"})
    with pytest.raises(ValueError, match="found no column/row-parallel"):
        tpl.resolve_tp_styles(nn.Sequential(nn.Linear(2, 2)), "auto")


def test_placements_of_each_style():
    assert tpl.tp_placement("colwise", "weight") == Shard(0)
    assert tpl.tp_placement("colwise", "bias") == Shard(0)
    assert tpl.tp_placement("rowwise", "weight") == Shard(1)
    assert tpl.tp_placement("rowwise", "bias") == Replicate()


def test_check_style_needs_divisible_features():
    tpl.check_style("fc", nn.Linear(6, 4), "colwise", 2)
    with pytest.raises(ValueError, match="does not divide fc.out_features=5"):
        tpl.check_style("fc", nn.Linear(6, 5), "colwise", 2)
    with pytest.raises(ValueError, match="in_features=5"):
        tpl.check_style("fc", nn.Linear(5, 4), "rowwise", 2)


@pytest.mark.parametrize("style", ["colwise", "rowwise", "colwise_gather"])
def test_one_rank_style_is_the_plain_layer(mesh1, style):
    torch.manual_seed(0)
    layer = nn.Linear(4, 6)
    x = torch.randn(3, 4, requires_grad=True)
    expected = layer(x)
    (want,) = torch.autograd.grad(expected.sum(), [x])
    with tpl.parallel_forwards(layer, {"": style}, mesh1["tp"].get_group()):
        assert "forward" in vars(layer)  # the parallel forward, while the block runs
        out = layer(x)
    assert "forward" not in vars(layer)  # and nothing left on the module after
    (got,) = torch.autograd.grad(out.sum(), [x])
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(got, want)


def test_collectives_are_identity_on_one_rank(mesh1):
    group = mesh1["tp"].get_group()
    x = torch.randn(2, 3)
    assert tpl.copy_to_tp(x, group) is x
    assert tpl.reduce_from_tp(x, group) is x
    assert tpl.gather_from_tp(x, group) is x
