"""Kernels of the training app: each a public function that validates and dispatches to CuPy (GPU) or Numba (CPU).

* :mod:`~apps.train.kernels.backend` -- the array helpers every layer uses (``is_cupy``, ``to_numpy``, bf16 checks,
  CPU thread counts)
* :mod:`~apps.train.kernels.cuda_source` -- CUDA C snippets shared by the raw kernels (storage types, GELU, bf16 bits)
* :mod:`~apps.train.kernels.buffers` -- element-wise work on flat buffers (scaled copies, bf16 rounding, sums of
  squares)
* :mod:`~apps.train.kernels.gemm` -- matrix products (cuBLAS with fp32 accumulation for bf16)
* :mod:`~apps.train.kernels.gelu`, :mod:`~apps.train.kernels.layernorm` (its CUDA source in
  :mod:`~apps.train.kernels.layernorm_cuda`) -- fused activation and normalisation, forward and backward
* :mod:`~apps.train.kernels.im2col` -- the column layout of 1-D convolutions
* :mod:`~apps.train.kernels.optimizer_updates` -- SGD and AdamW steps over a buffer range
* :mod:`~apps.train.kernels.random_mask` -- counter-based dropout keep-masks

The lowest layer of :mod:`apps.train`: it imports from :mod:`hpcgpu` and from itself only, never from another
subpackage of the app (``tests/imports/test_import_graph.py`` checks this).
"""
