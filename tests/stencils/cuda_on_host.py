"""Run a stencil's generated CUDA C kernel on the host: the same source, every thread of the launch grid.

The GPU form of a stencil is CUDA C text (:mod:`hpcgpu.stencils.codegen_cuda`). Without a GPU, CI
compiles that very text with the host's C++ compiler after a prelude that defines ``__global__``,
``threadIdx``, ``blockIdx``, ``blockDim`` and ``gridDim``, and a generated ``launch`` function that
calls the kernel once per thread of the launch grid (:func:`codegen_cuda.launch_shape`), block by
block. That executes the kernel's index mapping (threads to cells, regions, padded strides, bounds
checks) and its arithmetic (``-ffp-contract=off``, like ``--fmad=false``), so the result can be
compared with the CPU kernel bit for bit. NVRTC compiles the same text for sm_90 in another test.
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
from pathlib import Path

import numpy as np

from hpcgpu.stencils import codegen_cuda

PRELUDE = """\
#include <math.h>
struct HostDim3 { unsigned int x, y, z; };
static HostDim3 threadIdx, blockIdx, blockDim, gridDim;
#define __global__
"""


def compiler() -> str | None:
    return shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")


def _launcher(definition, dtype) -> str:
    arguments = codegen_cuda.kernel_arguments(definition, dtype)
    signature = ", ".join(f"{ctype} {name}" for ctype, name in arguments)
    names = ", ".join(name for _, name in arguments)
    return f"""
extern "C" void launch({signature}, unsigned int gx, unsigned int gy, unsigned int gz,
                       unsigned int bx, unsigned int by, unsigned int bz)
{{
    gridDim = {{gx, gy, gz}};
    blockDim = {{bx, by, bz}};
    for (unsigned int kz = 0; kz < gz; ++kz) for (unsigned int ky = 0; ky < gy; ++ky) for (unsigned int kx = 0; kx < gx; ++kx)
    for (unsigned int tz = 0; tz < bz; ++tz) for (unsigned int ty = 0; ty < by; ++ty) for (unsigned int tx = 0; tx < bx; ++tx) {{
        blockIdx = {{kx, ky, kz}};
        threadIdx = {{tx, ty, tz}};
        {codegen_cuda.kernel_name(definition)}({names});
    }}
}}
"""


class HostKernel:
    """The CUDA source of a bound stencil compiled for the host; :meth:`run` launches it over a region."""

    def __init__(self, binding, directory: Path):
        self.binding = binding
        definition, dtype = binding.kernel.definition, binding.dtype
        source = PRELUDE + binding.cuda_source() + _launcher(definition, dtype)
        digest = hashlib.sha256(source.encode()).hexdigest()[:16]
        directory.mkdir(parents=True, exist_ok=True)
        path, library = directory / f"kernel_{digest}.cpp", directory / f"kernel_{digest}.so"
        path.write_text(source)
        if not library.exists():
            subprocess.run([compiler(), "-O1", "-fPIC", "-shared", "-ffp-contract=off", "-o", str(library), str(path)],
                           check=True, capture_output=True, text=True)
        self.launch = ctypes.CDLL(str(library)).launch
        scalar = ctypes.c_float if np.dtype(dtype) == np.float32 else ctypes.c_double
        types = []
        for ctype, _ in codegen_cuda.kernel_arguments(definition, dtype):
            types.append(ctypes.c_void_p if "*" in ctype else ctypes.c_int if "int" in ctype else scalar)
        self.launch.argtypes = types + [ctypes.c_uint] * 6
        self.launch.restype = None

    def run(self, region: str, params) -> int:
        """Launch over every slab of ``region`` (as the GPU path does); returns the number of launches."""
        binding = self.binding
        values = [float(v) for v in binding.parameter_values(params)]
        pointers = [a.ctypes.data for a in binding.arrays]
        launches = 0
        for bounds in binding.regions[region]:
            shape = codegen_cuda.launch_shape(binding.grid.ndim, bounds, binding.rows_per_thread)
            if shape is None:
                continue
            grid, block = shape
            self.launch(*pointers, *values, *[int(b) for b in bounds], *grid, *block)
            launches += 1
        return launches
