"""The compute stream stays CuPy's current stream (issue 22's root cause).

Before the fix, ``GPU`` made its compute stream current with ``Stream.use()``. CuPy's own ``with stream:``
blocks (``ndarray.get(stream=...)``, reached through ``arch.to_host``) pop back to the top of CuPy's stack
of streams on exit, which was the legacy null stream: every later kernel ran there, unordered with the
communication stream (shallow water at 3600 x 1800 differed run to run and lost mass) and outside CUDA
graph captures (``--graph`` replayed only the halo copies).
"""

import numpy as np
import pytest

import hpcgpu
from hpcgpu.arch import on_stream
from hpcgpu.errors import BackendError

pytestmark = pytest.mark.gpu


@pytest.fixture
def arch(cupy):
    comm = hpcgpu.Communicator()
    return hpcgpu.arch.auto(comm, backend="cupy")


def test_compute_stream_survives_cupy_with_blocks(cupy, arch):
    x = arch.zeros((1000,))
    arch.to_host(x)                                       # ndarray.get(stream=compute): a with-block inside CuPy
    cupy.ElementwiseKernel("T a", "T b", "b = a * a + 3", "streams_test_new_kernel")(x)   # a fresh compile
    other = cupy.cuda.Stream(non_blocking=True)
    with other:                                           # user code using CuPy's own context manager
        x.get(stream=other)
    with on_stream(arch.comm_stream):
        x.get(stream=arch.comm_stream)
        assert cupy.cuda.get_current_stream() == arch.comm_stream
    assert cupy.cuda.get_current_stream() == arch.compute_stream
    arch.check_compute_stream("this test")


def test_on_stream_restores_a_stream_made_current_with_use(cupy, arch):
    side = cupy.cuda.Stream(non_blocking=True)
    side.use()
    try:
        with on_stream(arch.comm_stream):
            pass
        assert cupy.cuda.get_current_stream() == side
        with pytest.raises(BackendError, match="compute stream"):
            arch.check_compute_stream("a halo exchange")
    finally:
        arch.compute_stream.use()


def test_halo_exchange_refuses_to_run_off_the_compute_stream(cupy, arch):
    grid = hpcgpu.Decomposition(hpcgpu.Communicator(), global_shape=(16, 24), periodic=(True, True))
    field = hpcgpu.Field(grid, arch, halo_width=1, dtype="float64")
    field.exchange_halos()                                # fine on the compute stream
    side = cupy.cuda.Stream(non_blocking=True)
    side.use()
    try:
        with pytest.raises(BackendError, match="halo exchange"):
            field.exchange_halos()
    finally:
        arch.compute_stream.use()
    assert np.isfinite(arch.to_host(field.data)).all()
