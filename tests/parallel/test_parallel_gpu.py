"""CUDA: the plans on a one-GPU NCCL mesh match training without a mesh (skipped without a GPU)."""

import textwrap

import pytest
from parallel_launching import run_python

SCRIPT = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F
    import functrain
    from functrain import parallel as fdist

    def run(mesh, plan):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3)).cuda()
        opt = functrain.optim.adamw(1e-2)
        state = functrain.init(model, opt, seed=0, mesh=mesh, plan=plan)
        step = functrain.make_step(model, lambda m, b: F.cross_entropy(m(b[0]), b[1]), opt)
        gen = torch.Generator().manual_seed(1)
        for _ in range(5):
            batch = (torch.randn(8, 8, generator=gen).cuda(), torch.randint(0, 3, (8,), generator=gen).cuda())
            state, _ = step(state, batch)
        return fdist.full_params(state.params)

    mesh = fdist.init_mesh(dp_shard=-1, device_type="cuda")
    reference = run(None, None)
    for plan in ("ddp", "fsdp", fdist.fsdp(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)):
        got = run(mesh, plan)
        tol = 1e-5 if isinstance(plan, str) else 5e-2
        err = max(float((got[k] - reference[k]).abs().max()) for k in reference)
        assert err < tol, (plan, err)
        assert all(v.is_cuda for v in got.values())
    print("ok")
    """
)


@pytest.mark.gpu
def test_plans_on_a_cuda_mesh(tmp_path):
    script = tmp_path / "cuda_plans.py"
    script.write_text(SCRIPT)
    proc = run_python([str(script)], timeout=300)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-4000:]
