"""activation_offload on CPU: the saved activations really go through host copies (counted), and
the gradients and trained parameters are bit-identical to the plain step's, alone, per block,
with dropout, microbatches and beside activation checkpointing. The saving itself needs a GPU
(bench/gpu_check.py's "activation_offload" check)."""

import pytest
import torch

import functrain
from functrain.algorithms import activation_checkpointing, activation_offload
from functrain.models.gpt import GPT, Block, GPTConfig, gpt_loss

offload_impl = __import__("functrain.algorithms.activation_offload", fromlist=["_pack"])


def gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=31, block_size=16, n_layer=3, n_head=2, n_embd=16,
                         dropout=0.1))  # fmt: skip


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 31, (4, 16), generator=g), torch.randint(0, 31, (4, 16), generator=g)


def trained(*algorithms, steps=2, **options):
    model = gpt()
    opt = functrain.optim.adamw(1e-2)
    step = functrain.compose(functrain.make_step(model, gpt_loss, opt, **options), *algorithms)
    state = functrain.init(model, opt, seed=3)
    for i in range(steps):
        state, _ = step(state, batch(i))
    return state.params


def assert_identical(a, b):
    for k in b:
        assert torch.equal(a[k], b[k]), k


@pytest.fixture
def host_copies(monkeypatch):
    """Counts the saved tensors packed as host copies, and the copies handed back."""
    counts = {"packed": 0, "unpacked": 0}
    pack, unpack = offload_impl._pack, offload_impl._unpack

    def counting_pack(*args):
        packed = pack(*args)
        counts["packed"] += packed[0] == "host"
        return packed

    def counting_unpack(inflight, packed):
        counts["unpacked"] += packed[0] == "host"
        return unpack(inflight, packed)

    monkeypatch.setattr(offload_impl, "_pack", counting_pack)
    monkeypatch.setattr(offload_impl, "_unpack", counting_unpack)
    return counts


PLAIN = {}


def plain(**options):
    key = tuple(sorted(options.items()))
    if key not in PLAIN:
        PLAIN[key] = trained(**options)
    return PLAIN[key]


@pytest.mark.parametrize("variant", ["whole", "blocks", "blocks_by_name"])
def test_offloaded_training_is_bit_identical(variant, host_copies):
    algorithm = {
        "whole": lambda: activation_offload(),
        "blocks": lambda: activation_offload(Block),
        "blocks_by_name": lambda: activation_offload(names="blocks.*"),
    }[variant]()
    assert_identical(trained(algorithm), plain())
    assert host_copies["packed"] > 20 and host_copies["unpacked"] == host_copies["packed"]


def test_offload_with_microbatches_is_bit_identical(host_copies):
    assert_identical(trained(activation_offload(), microbatch_size=2), plain(microbatch_size=2))
    assert host_copies["packed"] > 0


@pytest.mark.parametrize("order", ["checkpointing_first", "offload_first"])
def test_offload_beside_checkpointing_offloads_the_blocks_not_recomputed(host_copies, order):
    pair = [activation_checkpointing(Block, every=2), activation_offload(Block)]
    both = trained(*(pair if order == "checkpointing_first" else pair[::-1]), steps=1)
    offloaded_with = host_copies["packed"]
    host_copies["packed"] = 0
    trained(activation_offload(Block), steps=1)
    assert 0 < offloaded_with < host_copies["packed"]  # the checkpointed block saves nothing
    assert_identical(both, trained(steps=1))


def test_parameters_are_not_copied(host_copies, monkeypatch):
    seen = []
    pack = offload_impl._pack

    def spy(inflight, pin, tensor):
        packed = pack(inflight, pin, tensor)
        if packed[0] == "host":
            seen.append(tensor)
        return packed

    monkeypatch.setattr(offload_impl, "_pack", spy)
    trained(activation_offload(), steps=1)
    assert seen and not any(t.is_leaf and t.requires_grad for t in seen)


def test_no_match_is_an_error():
    with pytest.raises(ValueError, match="matched no module"):
        trained(activation_offload("Transformer"), steps=1)
