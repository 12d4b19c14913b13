"""Print a stencil definition as a CUDA C kernel (compiled by NVRTC through CuPy's ``RawModule``).

One thread updates one cell of a rectangular region given in owned coordinates; the last axis (the
contiguous one) maps to ``threadIdx.x``, so a warp reads consecutive addresses::

    extern "C" __global__ void stencil_heat(double* __restrict__ out_0, const double* __restrict__ field_u,
                                            const double param_alpha,
                                            const int lo_0, const int hi_0, const int lo_1, const int hi_1)
    {
        const int i_1 = lo_1 + (int)(blockIdx.x * blockDim.x + threadIdx.x);
        const int i_0 = lo_0 + (int)(blockIdx.y * blockDim.y + threadIdx.y);
        if (i_0 >= hi_0 || i_1 >= hi_1) return;
        const long long base_0 = (long long)(i_0 + 1) * 1026LL + (long long)(i_1 + 1);
        out_0[base_0] = field_u[base_0] + param_alpha * (field_u[base_0 + -1026LL] + ...);
    }

The padded shape and ghost widths of every array are constants of the source (one compilation per
block shape: per rank, usually one), so each access is the cell's base index plus a constant.
Arrays of equal padded shape and ghost widths share one base index.

Rows per thread: for float32 one cell per thread leaves too few bytes in flight to reach the copy
bandwidth, so each thread updates ``rows_per_thread`` consecutive cells along the second-to-last axis
(:func:`rows_per_thread`). The rows are unrolled and the arrays are ``__restrict__``, so a value read
for one row (``u[i + 1, j]``) is kept in a register for the next (``u[i, j]``) instead of loaded again.
Every cell is still computed by the same expression, so the bits do not depend on the choice.

Floating point: the expression tree is printed in the order Python evaluates it, every constant and
parameter in the fields' dtype (``4.0f`` for float32), and the source must be compiled with
``--fmad=false`` (:data:`NVRTC_OPTIONS`): NVRTC would otherwise fuse ``a * b + c`` into one rounding
(FMA) where the CPU rounds twice. Division and square root are IEEE (NVRTC's defaults
``-prec-div=true -prec-sqrt=true``), so ``+ - * /`` and ``sqrt`` give the same bits as the CPU kernel.
``exp``, ``log``, ``sin``, ``cos``, ``tan`` and ``tanh`` come from CUDA's math library, whose results
may differ in the last bit from the CPU's ``libm``.
"""

from __future__ import annotations

import numpy as np

from hpcgpu.stencils.definition import (Access, Binary, Call, Compare, Constant, Local, Logic, Negate, Not, Parameter,
                                       Select)

#: Options every generated kernel is compiled with (NVRTC). ``--fmad=false``: no contraction of
#: ``a * b + c`` into FMA, so that the GPU rounds where the CPU does.
NVRTC_OPTIONS = ("--fmad=false", "-std=c++17")

#: Threads per block per launch axis (x = the last array axis).
BLOCK_SHAPES = {1: (256, 1, 1), 2: (32, 8, 1), 3: (32, 4, 2)}

#: Consecutive cells per thread along the second-to-last array axis, per dtype (1D kernels: always 1).
#: float32 needs several to keep enough bytes in flight; see the module docstring.
ROWS_PER_THREAD = {"float32": 4, "float64": 2}

_FUNCTIONS = {"sqrt", "exp", "log", "sin", "cos", "tan", "tanh", "floor", "ceil"}


def kernel_name(definition) -> str:
    return f"stencil_{definition.name}"


def c_type(dtype) -> str:
    return {"float32": "float", "float64": "double"}[np.dtype(dtype).name]


def kernel_arguments(definition, dtype) -> list[tuple[str, str]]:
    """``(C type, name)`` of the kernel's arguments, in order: outputs, fields, parameters, bounds."""
    scalar = c_type(dtype)
    arguments = [(f"{scalar}* __restrict__", f"out_{k}") for k in range(definition.n_outputs)]
    arguments += [(f"const {scalar}* __restrict__", f"field_{f}") for f in definition.fields]
    arguments += [(f"const {scalar}", f"param_{p}") for p in definition.parameters]
    for axis in range(definition.ndim):
        arguments += [("const int", f"lo_{axis}"), ("const int", f"hi_{axis}")]
    return arguments


def rows_per_thread(ndim: int, dtype) -> int:
    """Cells one thread updates along array axis ``ndim - 2`` (1 for 1D kernels)."""
    return 1 if ndim < 2 else ROWS_PER_THREAD[np.dtype(dtype).name]


def cuda_source(definition, dtype, field_layouts: dict, output_layouts: tuple, rows: int = 1) -> str:
    """CUDA C source of the kernel :func:`kernel_name` for these array layouts.

    Parameters
    ----------
    definition : StencilDefinition
    dtype : numpy.dtype
        float32 or float64.
    field_layouts : dict of str to (padded shape, ghost widths)
        Per input field: the shape of its padded array and its ghost width per axis.
    output_layouts : tuple of (padded shape, ghost widths)
        Per output field.
    rows : int
        Consecutive cells per thread along axis ``ndim - 2`` (:func:`rows_per_thread`); launch with
        the same value.

    Returns
    -------
    str
        Self-contained source (no ``#include``); arguments as :func:`kernel_arguments`; launch it with
        :func:`launch_shape`.
    """
    ndim = definition.ndim
    printer = _CudaPrinter(ndim, c_type(dtype), field_layouts)
    # Every base index is declared before the body: register the outputs' and every input's layout now
    # (an input whose padded shape or ghost widths differ from the outputs' has a base of its own).
    for layout in (*output_layouts, *(field_layouts[name] for name in definition.fields)):
        printer.base_of(layout)
    signature = ",\n    ".join(f"{ctype} {name}" for ctype, name in kernel_arguments(definition, dtype))
    launch_axes = ["x", "y", "z"]
    lines = [f"// Generated by hpcgpu.stencils from the stencil function '{definition.name}': do not edit.",
             f'extern "C" __global__ void {kernel_name(definition)}(', f"    {signature})", "{"]
    if ndim < 2 and rows != 1:
        raise ValueError(f"rows={rows}: a 1D kernel updates one cell per thread")
    coarse = ndim - 2   # the axis along which one thread updates `rows` consecutive cells
    for axis in reversed(range(ndim)):
        which = launch_axes[ndim - 1 - axis]
        thread = f"(int)(blockIdx.{which} * blockDim.{which} + threadIdx.{which})"
        if axis == coarse and rows > 1:
            lines.append(f"    const int first_{axis} = lo_{axis} + {thread} * {rows};")
        else:
            lines.append(f"    const int i_{axis} = lo_{axis} + {thread};")
    checks = [f"first_{axis}" if axis == coarse and rows > 1 else f"i_{axis}" for axis in range(ndim)]
    lines.append(f"    if ({' || '.join(f'{c} >= hi_{axis}' for axis, c in enumerate(checks))}) return;")
    indent = "    "
    if rows > 1:
        # Unrolled, so that a neighbour loaded for one row stays in a register for the next.
        lines += ["    #pragma unroll", f"    for (int row = 0; row < {rows}; ++row) {{",
                  f"        const int i_{coarse} = first_{coarse} + row;", f"        if (i_{coarse} >= hi_{coarse}) return;"]
        indent = "        "
    for (shape, halo), name in printer.bases.items():
        terms = []
        for axis in range(ndim):
            stride = int(np.prod(shape[axis + 1:], dtype=np.int64))
            terms.append(f"(long long)(i_{axis} + {halo[axis]}) * {stride}LL")
        lines.append(f"{indent}const long long {name} = {' + '.join(terms)};")
    for statement in definition.statements:
        if statement.name not in printer.declared:
            printer.declared.add(statement.name)
            lines.append(f"{indent}{printer.scalar} local_{statement.name};")
        lines.append(f"{indent}local_{statement.name} = {printer.expression(statement.value)};")
    for k, (value, layout) in enumerate(zip(definition.outputs, output_layouts)):
        lines.append(f"{indent}out_{k}[{printer.base_of(layout)}] = {printer.expression(value)};")
    if rows > 1:
        lines.append("    }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def launch_shape(ndim: int, bounds, rows: int = 1) -> tuple[tuple, tuple] | None:
    """``(grid, block)`` covering the region ``bounds = (lo_0, hi_0, lo_1, hi_1, ...)``; None if empty.

    ``rows``: cells per thread along axis ``ndim - 2``, as the source was generated with.
    """
    extents = [bounds[2 * axis + 1] - bounds[2 * axis] for axis in range(ndim)]
    if any(e <= 0 for e in extents):
        return None
    if ndim >= 2:
        extents[ndim - 2] = -(-extents[ndim - 2] // rows)
    block = BLOCK_SHAPES[ndim]
    along_launch_axes = list(reversed(extents)) + [1] * (3 - ndim)   # x = last array axis
    grid = tuple(-(-e // b) for e, b in zip(along_launch_axes, block))
    return grid, block


class _CudaPrinter:
    def __init__(self, ndim, scalar, field_layouts):
        self.ndim, self.scalar, self.field_layouts = ndim, scalar, field_layouts
        self.bases: dict = {}
        self.declared: set = set()

    def base_of(self, layout) -> str:
        shape, halo = tuple(map(int, layout[0])), tuple(map(int, layout[1]))
        key = (shape, halo)
        if key not in self.bases:
            self.bases[key] = f"base_{len(self.bases)}"
        return self.bases[key]

    def constant(self, value: float) -> str:
        if self.scalar == "float":
            exact = float(np.float32(value))
            return f"{exact!r}f" if ("." in repr(exact) or "e" in repr(exact)) else f"{exact!r}.0f"
        text = repr(float(value))
        return text if ("." in text or "e" in text or "n" in text) else text + ".0"

    def expression(self, node) -> str:
        if isinstance(node, Constant):
            return self.constant(node.value)
        if isinstance(node, Parameter):
            return f"param_{node.name}"
        if isinstance(node, Local):
            return f"local_{node.name}"
        if isinstance(node, Access):
            shape, halo = self.field_layouts[node.field]
            base = self.base_of((shape, halo))
            offset = 0
            for axis, d in enumerate(node.offsets):
                offset += d * int(np.prod(shape[axis + 1:], dtype=np.int64))
            return f"field_{node.field}[{base}]" if offset == 0 else f"field_{node.field}[{base} + ({offset}LL)]"
        if isinstance(node, Negate):
            return f"(-{self.expression(node.operand)})"
        if isinstance(node, (Binary, Compare)):
            return f"({self.expression(node.left)} {node.op} {self.expression(node.right)})"
        if isinstance(node, Call):
            suffix = "f" if self.scalar == "float" else ""
            name = "fabs" if node.function == "abs" else node.function
            return f"{name}{suffix}({self.expression(node.argument)})"
        if isinstance(node, Select):
            return (f"({self.expression(node.condition)} ? {self.expression(node.if_true)} "
                    f": {self.expression(node.if_false)})")
        if isinstance(node, Logic):
            return f"({self.expression(node.left)} {'&&' if node.op == 'and' else '||'} {self.expression(node.right)})"
        if isinstance(node, Not):
            return f"(!{self.expression(node.operand)})"
        raise TypeError(f"unknown stencil node {node!r}")   # parse() produces none: a bug here
