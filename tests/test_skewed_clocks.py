"""Wall-clock intervals fire on the same step on every rank, however the ranks' clocks drift
(issue 26 point 4): a callback that issues a collective on a "1sec" interval, on 2 gloo ranks whose
clocks run at different rates, ends without a hang and every collective pairs with the same step
on the other rank. The interval reads the run's clock (`Timestamp.elapsed_sec`), which the ranks
agree on (`functrain.loop.agreement`), never the process's own.
"""

import datetime
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
STEPS = 80


class CollectiveEvery:
    """On a wall-clock interval, all-reduces the batch it fires at (MAX): the result is its own
    batch only when the other rank fired at the same batch."""

    def __init__(self, interval: str, pace: float):
        from functrain.callbacks import Trigger

        self.trigger, self.pace, self.fired = Trigger(interval), pace, []

    def batch_end(self, ctx):
        time.sleep(self.pace)  # lets the clock advance a few seconds over the run
        if self.trigger.due(ctx.timestamp):
            mine = float(ctx.timestamp.batch)
            value = torch.tensor([mine], dtype=torch.float64)
            torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
            self.fired.append([mine, value.item()])


def count_step(state, batch):
    x = batch[0]
    new = state.replace(
        step=state.step + 1,
        params={"w": state.params["w"] + x.sum()},
        timestamp=state.timestamp.advance_batch(samples=x.shape[0]),
    )
    return new, {"loss": x.mean()}


def _worker(rank: int, store: str, out: str, rate: float) -> None:
    import functrain
    from functrain.data import Loader

    torch.set_num_threads(1)
    torch.distributed.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=60),  # a mismatched collective fails, not hangs
    )
    try:
        real = time.monotonic
        offset = real()
        # This rank's clock runs `rate` times as fast as real time, from another origin.
        time.monotonic = lambda: 1000.0 * rank + rate * (real() - offset)
        callback = CollectiveEvery("1sec", pace=0.03)
        state = functrain.TrainState(
            step=0,
            params={"w": torch.zeros(())},
            buffers={},
            opt_state=(),
            rng=functrain.RngState(0),
        )
        data = torch.utils.data.TensorDataset(torch.ones(8 * STEPS, 1))
        result = functrain.fit(
            count_step,
            state,
            Loader(data, 8),
            duration=f"{STEPS}ba",
            callbacks=[callback],
            log_interval=None,
            progress=False,
        )
        pathlib.Path(out).write_text(json.dumps({"fired": callback.fired, "step": result.step}))
    finally:
        functrain.parallel.shutdown()  # not a bare destroy: see test_torch_private


@pytest.mark.slow
def test_a_collective_on_a_seconds_interval_with_skewed_clocks_ends_without_a_hang(tmp_path):
    store = tmp_path / "store"
    rates = (1.0, 3.0)  # rank 1's clock runs three times as fast, and 1000 s ahead
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import test_skewed_clocks as t; "
                f"t._worker({rank}, {str(store)!r}, {str(tmp_path / str(rank))!r}, {rates[rank]})",
            ],
            env=ENV,
            cwd=str(ROOT),
        )
        for rank in range(2)
    ]
    try:
        codes = [proc.wait(timeout=300) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert codes == [0, 0]
    reports = [json.loads((tmp_path / str(rank)).read_text()) for rank in range(2)]
    assert [r["step"] for r in reports] == [STEPS, STEPS]
    fired = [r["fired"] for r in reports]
    assert fired[0] == fired[1]  # the same batches on both ranks
    assert len(fired[0]) >= 1  # the interval did fire
    assert all(mine == agreed for mine, agreed in fired[0])  # each paired with the same step
