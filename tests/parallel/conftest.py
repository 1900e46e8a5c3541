"""Fixtures for the distribution tests.

`mesh1` is a one-process mesh (an in-memory process group, no ports): the single-process paths of
functrain.parallel run for real. Under `python -m functrain.launch -n N -m pytest tests/parallel` the
process group belongs to the launcher's world, so the one-process tests skip there.
"""

import pytest
from parallel_launching import launched_world

from functrain import parallel as fdist


@pytest.fixture(scope="module")
def mesh1():
    if launched_world() not in (None, 1):
        pytest.skip("one-process test; running as one rank of a launched world")
    mesh = fdist.init_mesh()
    yield mesh
    fdist.shutdown()
