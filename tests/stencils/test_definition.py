"""Reading stencil functions: fields, parameters, outputs, the inferred neighbourhood, and the errors
for what the kernel layer cannot compile."""

from __future__ import annotations

import pytest

from hpcgpu.errors import ConfigurationError
from hpcgpu.stencils import StencilDefinitionError, stencil
from tests.stencils import kernels


def test_fields_parameters_and_outputs_are_read_from_the_function():
    gs = kernels.gray_scott
    assert gs.fields == ("u", "v")
    assert gs.parameters == ("feed", "kill", "diffusion_u", "diffusion_v", "dt")
    assert gs.n_outputs == 2
    assert gs.definition.ndim == 2
    assert gs.__name__ == "gray_scott"


@pytest.mark.parametrize("kernel, halo, corners", [
    (kernels.heat, (1, 1), False),
    (kernels.gray_scott, (1, 1), False),
    (kernels.box_blur_wide, (1, 2), True),
    (kernels.diffusion_3d, (1, 1, 1), False),
    (kernels.upwind_1d, (1,), False),
    (kernels.smooth_sqrt, (1, 0), False),
])
def test_neighbourhood_is_inferred_from_the_offsets(kernel, halo, corners):
    assert kernel.halo_width == halo
    assert kernel.corners is corners


def test_per_field_halo_widths_and_which_fields_are_exchanged():
    neighbourhood = kernels.box_blur_wide.neighbourhood
    assert neighbourhood.field_halo_width("u") == (1, 2)
    assert neighbourhood.reads_neighbours("u")
    assert kernels.gray_scott.neighbourhood.n_points == 10


def test_power_is_repeated_multiplication_and_min_max_follow_python():
    from hpcgpu.stencils.definition import Binary, Compare, Select

    reaction = kernels.gray_scott.definition.statements[2].value
    assert isinstance(reaction.right, Binary) and reaction.right.op == "*"
    clipped = kernels.diffusion_3d.definition.outputs[0].if_true
    assert isinstance(clipped, Select) and isinstance(clipped.condition, Compare)
    assert clipped.condition.op == ">"   # max(a, b): b if b > a else a


BAD = {
    "loop": ("def k(u):\n    s = 0.0\n    for i in range(3):\n        s += u[i, 0]\n    return s\n",
             "unsupported statement (For)"),
    "variable index": ("def k(u, n):\n    return u[n, 0]\n", "is not an integer constant"),
    "bare field": ("def k(u):\n    return u[0, 0] + u\n", "used without an index"),
    "mixed ndim": ("def k(u):\n    return u[0, 0] + u[1]\n", "1 indices where earlier accesses have 2"),
    "no return": ("def k(u):\n    a = u[0, 0]\n", "does not end with `return VALUE`"),
    "unknown call": ("def k(u):\n    return foo(u[0, 0])\n", "a call of 'foo'"),
    "unknown name": ("def k(u):\n    return u[0, 0] * beta\n", "neither a parameter nor an assigned local"),
    "fractional power": ("def k(u):\n    return u[0, 0] ** 0.5\n", "is not an integer constant 0..8"),
    "if statement": ("def k(u):\n    if u[0, 0] > 0:\n        return u[0, 0]\n    return 0.0\n",
                     "unsupported statement (If)"),
    "no field": ("def k(a):\n    return a\n", "no parameter is indexed as a field"),
    "condition as number": ("def k(u):\n    return u[0, 0] > 1\n", "a condition where a number is expected"),
    "assign to parameter": ("def k(u, a):\n    a = 2 * u[0, 0]\n    return a\n", "assignment to the parameter"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_unsupported_constructs_are_refused_with_the_line(case, tmp_path):
    source, expected = BAD[case]
    module = tmp_path / f"bad_{case.replace(' ', '_')}.py"
    module.write_text(source)
    namespace = {}
    exec(compile(module.read_text(), str(module), "exec"), namespace)
    import linecache

    linecache.checkcache(str(module))
    with pytest.raises(StencilDefinitionError) as error:
        stencil(namespace["k"])
    assert expected in str(error.value)
    assert "line " in str(error.value)
    assert isinstance(error.value, ConfigurationError)   # replicated: every rank raises the same
