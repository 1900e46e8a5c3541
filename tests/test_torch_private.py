"""Torch's private API in one module (issue 26.6): `functrain._torch`.

Outside `functrain/_torch.py` functrain names no private torch API (a grep, with the patterns
below); the `_foreach_clone` fallback works on a torch without it (2.6); and the one torch bug it
works around (`torch.distributed.nn.functional` binding the default group as a default argument)
still happens on the torch in use, or the test says it no longer needs the workaround.
"""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from functrain import _torch

ROOT = Path(__file__).resolve().parents[1]

# Private torch names, as functrain's code would spell them.
PRIVATE = re.compile(
    r"\btorch(\.\w+)*\._[a-zA-Z]"
    r"|from torch(\.\w+)* import _"
    r"|aten\._[a-z]"
    r"|(?<!self)\._(parameters|buffers|modules|forward_pre_hooks|forward_hooks)\b"
    r"|\._local_tensor\b|_execution_engine|_pg_registry|\._flatten\(|_global_forward"
    r"|__defaults__|gc\.get_objects|gc\.get_referrers"
)
# functrain/optim routes its names through `_torch` in its own change (issue 26.6).
NOT_YET: tuple[str, ...] = ()


def _offences():
    found = []
    for path in sorted((ROOT / "functrain").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "functrain/_torch.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if PRIVATE.search(code) and not code.lstrip().startswith(('"', "'", "`")):
                found.append(f"{rel}:{number}: {line.strip()}")
    return found


def test_no_private_torch_name_outside_the_one_module():
    assert _offences() == []


def test_the_pattern_finds_what_it_should():
    for line in (
        "torch._foreach_copy_(a, b)",
        "x = value._local_tensor",
        "module._parameters[name] = t",
        "from torch.distributed.tensor._utils import f",
        "fn.__defaults__ = ()",
        "for obj in gc.get_objects():",
        "from torch.utils.data._utils.collate import default_collate",
        "from torch.nn.modules.utils import _pair",
        "_aten._scaled_dot_product_flash_attention.default",
        "torch.autograd.Variable._execution_engine.queue_callback(f)",
    ):
        assert PRIVATE.search(line), line
    assert not PRIVATE.search("self._buffers = {}")


def test_foreach_clone_falls_back_where_torch_lacks_it(monkeypatch):
    xs = [torch.arange(3.0), torch.ones(2, 2)]
    expected = _torch.foreach_clone(xs)
    monkeypatch.delattr(torch, "_foreach_clone", raising=False)
    copies = _torch.foreach_clone(xs)
    for x, c, e in zip(xs, copies, expected):
        assert torch.equal(c, x) and torch.equal(e, x)
        assert c.data_ptr() != x.data_ptr()


def test_foreach_names_a_missing_op():
    with pytest.raises(NotImplementedError, match="torch._foreach_no_such_op"):
        _torch.foreach("no_such_op")


WORLD_DEFAULT = textwrap.dedent(
    """
    import json
    import torch.distributed as dist
    from functrain import _torch

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    import torch.distributed.nn.functional    # imported after the default group exists
    bound = _torch.world_group_defaults()
    dist.destroy_process_group()
    _torch.release_world_defaults()
    print(json.dumps({"bound": bound, "after": _torch.world_group_defaults()}))
    """
)


@pytest.mark.slow
def test_world_default_still_bound_on_this_torch():
    """The torch behaviour `_torch.release_world_defaults` works around, on the torch in use."""
    import json

    proc = subprocess.run(
        [sys.executable, "-c", WORLD_DEFAULT],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if not out["bound"]:
        pytest.skip(
            f"torch {torch.__version__} no longer binds group.WORLD as a default argument: "
            "functrain._torch.release_world_defaults can go"
        )
    assert "all_reduce" in out["bound"]
    assert out["after"] == []  # the workaround releases every one
