"""The GPU form of a stencil without a GPU: NVRTC compiles the generated CUDA C for sm_90 (H100/H200)
without contracting into FMA, and the very same source, run on the host over the launch grid, gives
the CPU kernel's bits (index mapping, regions, bounds checks and arithmetic)."""

from __future__ import annotations

import numpy as np
import pytest

from hpcgpu.stencils import codegen_cuda
from tests.stencils import kernels
from tests.stencils.cuda_on_host import HostKernel, compiler

ALL = [
    (kernels.gray_scott, dict(feed=0.037, kill=0.06, diffusion_u=0.2, diffusion_v=0.1, dt=0.9), (37, 29), 1),
    (kernels.box_blur_wide, dict(w=0.3), (19, 33), (1, 2)),
    (kernels.heat, dict(alpha=0.21), (31, 40), (2, 1)),
    (kernels.diffusion_3d, dict(k=0.15), (9, 11, 35), 1),
    (kernels.upwind_1d, dict(courant=0.4), (301,), 1),
    (kernels.smooth_sqrt, {}, (12, 13), (1, 0)),
]


def _fields(shape, halo, dtype, names):
    import hpcgpu

    comm = hpcgpu.Communicator()
    arch = hpcgpu.arch.auto(comm, backend="numpy")
    grid = hpcgpu.Decomposition(comm, shape, periodic=True)
    return [hpcgpu.Field(grid, arch, halo_width=halo, dtype=dtype, name=n) for n in names]


def _binding(kernel, shape, halo, dtype, seed=0):
    fields = _fields(shape, halo, dtype, [*kernel.fields, *(f"out{k}" for k in range(kernel.n_outputs))])
    inputs = dict(zip(kernel.fields, fields))
    outputs = fields[len(kernel.fields):]
    rng = np.random.default_rng(seed)
    for field in inputs.values():
        field.data[...] = rng.random(field.data.shape)
    return kernel.bind(outputs, inputs)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", range(len(ALL)), ids=[k.__name__ for k, *_ in ALL])
def test_nvrtc_compiles_the_kernel_for_sm90_without_fma(case, dtype):
    nvrtc = pytest.importorskip("hpcgpu.stencils.nvrtc")
    from hpcgpu.errors import BackendError

    kernel, _, shape, halo = ALL[case]
    source = _binding(kernel, shape, halo, dtype).cuda_source()
    try:
        ptx = nvrtc.compile_to_ptx(source, codegen_cuda.NVRTC_OPTIONS, architecture="sm_90")
    except BackendError as error:
        if "not found" in str(error):
            pytest.skip(str(error))
        raise
    assert f".entry {codegen_cuda.kernel_name(kernel.definition)}" in ptx
    assert ".target sm_90" in ptx
    assert "fma." not in ptx   # --fmad=false: every product is rounded before it is added
    if kernel is kernels.gray_scott:
        # Without the option NVRTC contracts the same source: the option is what keeps the CPU's bits.
        assert "fma." in nvrtc.compile_to_ptx(source, ("-std=c++17",), architecture="sm_90")


@pytest.mark.skipif(compiler() is None, reason="needs a host C++ compiler to run the CUDA source on the host")
@pytest.mark.parametrize("rows", ["default", 3])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", range(len(ALL)), ids=[k.__name__ for k, *_ in ALL])
def test_cuda_source_run_on_the_host_equals_the_cpu_kernel_bitwise(case, dtype, rows, tmp_path_factory, monkeypatch):
    """Every cell once, ghosts untouched, CPU bits; with the default rows per thread and with 3, which
    leaves a partial group of rows at the end of the odd-sized regions."""
    kernel, params, shape, halo = ALL[case]
    if rows != "default":
        if len(shape) < 2:
            pytest.skip("1D kernels update one cell per thread")
        monkeypatch.setitem(codegen_cuda.ROWS_PER_THREAD, dtype, rows)
    binding = _binding(kernel, shape, halo, dtype, seed=case)
    host = HostKernel(binding, tmp_path_factory.getbasetemp() / "cuda_on_host")
    for region_order in (("owned",), ("interior", "rim")):
        for out in binding.outputs:
            out.data[...] = np.nan
        launches = sum(host.run(region, params) for region in region_order)
        assert launches == sum(len(binding.regions[r]) for r in region_order)
        from_cuda_source = [out.data.copy() for out in binding.outputs]
        for out in binding.outputs:
            out.data[...] = np.nan
        for region in region_order:
            binding.run(region, binding.parameter_values(params))
        for k, (gpu_form, out) in enumerate(zip(from_cuda_source, binding.outputs)):
            assert not np.isnan(gpu_form[out.interior_slices]).any(), "a cell was not updated"
            assert np.isnan(np.delete(gpu_form.ravel(), np.ravel_multi_index(
                np.indices(out.interior.shape).reshape(out.interior.ndim, -1)
                + np.array(out.halo_width)[:, None], gpu_form.shape))).all(), "a ghost cell was written"
            np.testing.assert_array_equal(gpu_form, out.data, err_msg=f"output {k}, regions {region_order}")


def test_launch_shape_covers_a_region_with_whole_blocks():
    grid, block = codegen_cuda.launch_shape(3, (0, 5, 2, 9, 1, 66))
    assert block == codegen_cuda.BLOCK_SHAPES[3]
    assert grid == (-(-65 // 32), -(-7 // 4), -(-5 // 2))   # x = the last (contiguous) array axis
    assert codegen_cuda.launch_shape(2, (3, 3, 0, 4)) is None


def test_launch_shape_divides_the_coarse_axis_by_the_rows_per_thread():
    grid, _ = codegen_cuda.launch_shape(2, (0, 33, 0, 70), rows=4)
    assert grid == (-(-70 // 32), -(-(-(-33 // 4)) // 8), 1)
    grid, _ = codegen_cuda.launch_shape(3, (0, 5, 0, 9, 0, 66), rows=2)
    assert grid == (-(-66 // 32), -(-5 // 4), -(-5 // 2))   # 9 rows of axis 1 -> 5 threads -> 2 blocks of 4
    with pytest.raises(ValueError):
        codegen_cuda.cuda_source(ALL[4][0].definition, "float64", {"q": ((303,), (1,))}, (((303,), (1,)),), rows=2)


@pytest.mark.skipif(compiler() is None, reason="needs a host C++ compiler to run the CUDA source on the host")
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_inputs_with_other_ghost_widths_than_the_output_get_their_own_base_index(dtype, tmp_path_factory):
    """A coefficient field with a wider halo than the output has another padded shape, hence another base
    index; the source declares it (NVRTC refused an undeclared one) and the host build gives the CPU bits."""
    import hpcgpu

    comm = hpcgpu.Communicator()
    arch = hpcgpu.arch.auto(comm, backend="numpy")
    grid = hpcgpu.Decomposition(comm, (23, 17), periodic=True)
    u = hpcgpu.Field(grid, arch, halo_width=1, dtype=dtype, name="u")
    k = hpcgpu.Field(grid, arch, halo_width=(2, 3), dtype=dtype, name="k")
    out = hpcgpu.Field(grid, arch, halo_width=1, dtype=dtype, name="out")
    rng = np.random.default_rng(7)
    u.data[...], k.data[...] = rng.random(u.data.shape), rng.random(k.data.shape)
    binding = _variable_diffusion().bind(out, {"u": u, "k": k})
    source = binding.cuda_source()
    assert source.count("const long long base_") == 2, source
    host = HostKernel(binding, tmp_path_factory.getbasetemp() / "cuda_on_host")
    host.run("owned", {})
    from_cuda_source = out.data.copy()
    binding.run("owned", binding.parameter_values({}))
    np.testing.assert_array_equal(from_cuda_source, out.data)


def _variable_diffusion():
    import hpcgpu

    @hpcgpu.stencil
    def variable_diffusion(u, k):
        return u[0, 0] + k[0, 0] * (u[-1, 0] + u[1, 0] + u[0, -1] + u[0, 1] - 4 * u[0, 0])

    return variable_diffusion
