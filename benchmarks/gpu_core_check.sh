#!/usr/bin/env bash
# One batched call on a GPU machine: environment facts, the GPU test suite of the core on 1 and 2 GPUs,
# and the halo benchmark. Writes logs and JSON under ${OUT:-./gpu-out}.
set -u
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
NGPU=$(nvidia-smi -L | wc -l)
{ nvidia-smi -L; nvidia-smi topo -m; python3 -c "import cupy, mpi4py, numpy, numba, h5py; print('cupy', cupy.__version__, 'numpy', numpy.__version__, 'numba', numba.__version__, 'h5py', h5py.__version__, 'mpi4py', mpi4py.__version__)"; } 2>&1 | tee "$OUT/env.txt"
mpirun -np "$NGPU" --bind-to none python3 -m hpcgpu info 2>&1 | tee "$OUT/info.txt"
python3 -m pytest tests/core -m gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -15
if [ "$NGPU" -ge 2 ]; then
  mpirun -np 2 --bind-to none python3 -m hpcgpu.bench halo --json "$OUT/halo_2gpu.json" 2>&1 | tee "$OUT/halo_2gpu.txt"
fi
