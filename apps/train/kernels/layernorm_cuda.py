"""CUDA source of the layer-norm kernels (:mod:`apps.train.kernels.layernorm`), compiled once per process.

One RawModule holds every instantiation (storage type x vector width x fused GELU); the wrappers in
:mod:`apps.train.kernels.layernorm` pick one with :func:`layer_norm_kernel`. The algorithm is described
there.
"""

import functools

import numpy as np

from .cuda_source import CUDA_HELPERS, GELU_FUNCTIONS, STORAGE_TYPES, VECTOR_WIDTH

LAYER_NORM_SOURCE = CUDA_HELPERS + GELU_FUNCTIONS + r"""
// Values per thread of the row-in-registers kernels (PACKS = ELEMENTS / VEC packs each).
#define HPCGPU_LN_ELEMENTS 16

// Two block-wide sums at once (one round of barriers); scratch: 66 elements.
template <typename M>
__device__ void block_sum_pair(M& a, M& b, M* scratch) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    a = warp_sum(a);
    b = warp_sum(b);
    if (lane == 0) {
        scratch[warp] = a;
        scratch[33 + warp] = b;
    }
    __syncthreads();
    if (warp == 0) {
        const int n_warps = blockDim.x >> 5;
        M partial_a = lane < n_warps ? scratch[lane] : (M)0;
        M partial_b = lane < n_warps ? scratch[33 + lane] : (M)0;
        partial_a = warp_sum(partial_a);
        partial_b = warp_sum(partial_b);
        if (lane == 0) {
            scratch[32] = partial_a;
            scratch[65] = partial_b;
        }
    }
    __syncthreads();
    a = scratch[32];
    b = scratch[65];
    __syncthreads();
}

// The LayerNorm output x_hat * weight + bias, then (GELU) the activation of it rounded like a
// stored tensor: the fused output is bitwise the GELU kernel applied to the stored LayerNorm output.
template <bool GELU, typename S>
__device__ __forceinline__ typename MathType<S>::type output_value(
        const S* storage, typename MathType<S>::type x_hat, const S* weight, const S* bias,
        long long column) {
    typedef typename MathType<S>::type M;
    const M y = x_hat * load_math(weight, column) + load_math(bias, column);
    return GELU ? gelu_value(round_to_storage(storage, y)) : y;
}

// Gradient with respect to the LayerNorm output: the incoming gradient itself, or (GELU) the
// incoming gradient times gelu'(y) with y recomputed, rounded like the GELU kernel's stored result.
template <bool GELU, typename S>
__device__ __forceinline__ typename MathType<S>::type output_grad(
        const S* storage, typename MathType<S>::type grad, typename MathType<S>::type x_hat,
        const S* weight, const S* bias, long long column) {
    typedef typename MathType<S>::type M;
    if (!GELU) {
        return grad;
    }
    const M y = round_to_storage(storage, x_hat * load_math(weight, column) + load_math(bias, column));
    return round_to_storage(storage, grad * gelu_derivative(y));
}

// ---- row in registers (n_cols <= ELEMENTS * blockDim.x, a multiple of VEC, 16-byte aligned rows):
// thread t holds packs t, t + blockDim.x, ... of the row, so x is read from memory once.

template <typename S, int VEC, bool GELU>
__global__ void hpcgpu_train_layer_norm_forward_rows(
        const S* x, const S* input_bias, const S* weight, const S* bias, S* y,
        typename MathType<S>::type* mean_out, typename MathType<S>::type* inverse_std_out,
        int n_cols, double eps) {
    typedef typename MathType<S>::type M;
    typedef Pack<S, VEC> P;
    constexpr int PACKS = HPCGPU_LN_ELEMENTS / VEC;
    __shared__ M scratch[33];
    const int n_packs = n_cols / VEC;
    const long long offset = (long long)blockIdx.x * n_cols;
    const P* x_row = reinterpret_cast<const P*>(x + offset);
    P* y_row = reinterpret_cast<P*>(y + offset);
    M v[PACKS][VEC];
    M sum = 0;
#pragma unroll
    for (int p = 0; p < PACKS; ++p) {
        const int pack = p * blockDim.x + threadIdx.x;
        if (pack < n_packs) {
            const P loaded = x_row[pack];
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                v[p][k] = load_biased(loaded.value, input_bias, k, (long long)pack * VEC + k);
                sum += v[p][k];
            }
        }
    }
    const M mean = block_sum(sum, scratch) / (M)n_cols;
    M squares = 0;
#pragma unroll
    for (int p = 0; p < PACKS; ++p) {
        if (p * blockDim.x + threadIdx.x < n_packs) {
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                const M centred = v[p][k] - mean;
                squares += centred * centred;
            }
        }
    }
    const M variance = block_sum(squares, scratch) / (M)n_cols;
    const M inverse_std = (M)1 / math_sqrt(variance + (M)eps);
#pragma unroll
    for (int p = 0; p < PACKS; ++p) {
        const int pack = p * blockDim.x + threadIdx.x;
        if (pack < n_packs) {
            P out;
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                const M x_hat = (v[p][k] - mean) * inverse_std;
                store_math(out.value, k, output_value<GELU>(y, x_hat, weight, bias, (long long)pack * VEC + k));
            }
            y_row[pack] = out;
        }
    }
    if (threadIdx.x == 0) {
        mean_out[blockIdx.x] = mean;
        inverse_std_out[blockIdx.x] = inverse_std;
    }
}

// grad_x of rows blockIdx.x, blockIdx.x + gridDim.x, ... and this block's partial sums of the
// parameter gradients over those rows (one row of partial_weight / partial_bias per block).
template <typename S, int VEC, bool GELU>
__global__ void hpcgpu_train_layer_norm_backward_rows(
        const S* grad_out, const S* x, const S* input_bias, const S* weight, const S* bias,
        const typename MathType<S>::type* mean, const typename MathType<S>::type* inverse_std,
        S* grad_input, typename MathType<S>::type* partial_weight,
        typename MathType<S>::type* partial_bias, long long n_rows, int n_cols) {
    typedef typename MathType<S>::type M;
    typedef Pack<S, VEC> P;
    constexpr int PACKS = HPCGPU_LN_ELEMENTS / VEC;
    __shared__ M scratch[66];
    const int n_packs = n_cols / VEC;
    M sum_weight[PACKS][VEC];
    M sum_bias[PACKS][VEC];
#pragma unroll
    for (int p = 0; p < PACKS; ++p) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            sum_weight[p][k] = 0;
            sum_bias[p][k] = 0;
        }
    }
    for (long long row = blockIdx.x; row < n_rows; row += gridDim.x) {
        const long long offset = row * n_cols;
        const P* x_row = reinterpret_cast<const P*>(x + offset);
        const P* grad_row = reinterpret_cast<const P*>(grad_out + offset);
        const M row_mean = mean[row];
        const M row_inverse_std = inverse_std[row];
        M x_hat[PACKS][VEC];
        M g[PACKS][VEC];      // times weight: the gradient with respect to x_hat
        M sum_g = 0;
        M sum_g_xhat = 0;
#pragma unroll
        for (int p = 0; p < PACKS; ++p) {
            const int pack = p * blockDim.x + threadIdx.x;
            if (pack < n_packs) {
                const P x_pack = x_row[pack];
                const P grad_pack = grad_row[pack];
#pragma unroll
                for (int k = 0; k < VEC; ++k) {
                    const long long column = (long long)pack * VEC + k;
                    x_hat[p][k] = (load_biased(x_pack.value, input_bias, k, column) - row_mean) * row_inverse_std;
                    const M grad_y = output_grad<GELU>(x, load_math(grad_pack.value, k), x_hat[p][k],
                                                       weight, bias, column);
                    sum_weight[p][k] += grad_y * x_hat[p][k];
                    sum_bias[p][k] += grad_y;
                    g[p][k] = grad_y * load_math(weight, column);
                    sum_g += g[p][k];
                    sum_g_xhat += g[p][k] * x_hat[p][k];
                }
            }
        }
        block_sum_pair(sum_g, sum_g_xhat, scratch);
        const M mean_g = sum_g / (M)n_cols;
        const M mean_g_xhat = sum_g_xhat / (M)n_cols;
        P* out_row = reinterpret_cast<P*>(grad_input + offset);
#pragma unroll
        for (int p = 0; p < PACKS; ++p) {
            const int pack = p * blockDim.x + threadIdx.x;
            if (pack < n_packs) {
                P out;
#pragma unroll
                for (int k = 0; k < VEC; ++k) {
                    store_math(out.value, k, row_inverse_std * (g[p][k] - mean_g - x_hat[p][k] * mean_g_xhat));
                }
                out_row[pack] = out;
            }
        }
    }
    const long long base = (long long)blockIdx.x * n_cols;
#pragma unroll
    for (int p = 0; p < PACKS; ++p) {
        const int pack = p * blockDim.x + threadIdx.x;
        if (pack < n_packs) {
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                partial_weight[base + (long long)pack * VEC + k] = sum_weight[p][k];
                partial_bias[base + (long long)pack * VEC + k] = sum_bias[p][k];
            }
        }
    }
}

// ---- any row length: one block per row, the row re-read from L1/L2 on each pass.

template <typename S, bool GELU>
__global__ void hpcgpu_train_layer_norm_forward(
        const S* x, const S* input_bias, const S* weight, const S* bias, S* y,
        typename MathType<S>::type* mean_out, typename MathType<S>::type* inverse_std_out,
        int n_cols, double eps) {
    typedef typename MathType<S>::type M;
    __shared__ M scratch[33];
    const long long offset = (long long)blockIdx.x * n_cols;
    M sum = 0;
    for (int j = threadIdx.x; j < n_cols; j += blockDim.x) {
        sum += load_biased(x, input_bias, offset + j, j);
    }
    const M mean = block_sum(sum, scratch) / (M)n_cols;
    // second pass over the row (from L1/L2): the two-pass variance does not cancel
    M squares = 0;
    for (int j = threadIdx.x; j < n_cols; j += blockDim.x) {
        const M centred = load_biased(x, input_bias, offset + j, j) - mean;
        squares += centred * centred;
    }
    const M variance = block_sum(squares, scratch) / (M)n_cols;
    const M inverse_std = (M)1 / math_sqrt(variance + (M)eps);
    for (int j = threadIdx.x; j < n_cols; j += blockDim.x) {
        const M x_hat = (load_biased(x, input_bias, offset + j, j) - mean) * inverse_std;
        store_math(y, offset + j, output_value<GELU>(y, x_hat, weight, bias, j));
    }
    if (threadIdx.x == 0) {
        mean_out[blockIdx.x] = mean;
        inverse_std_out[blockIdx.x] = inverse_std;
    }
}

template <typename S, bool GELU>
__global__ void hpcgpu_train_layer_norm_backward_input(
        const S* grad_out, const S* x, const S* input_bias, const S* weight, const S* bias,
        const typename MathType<S>::type* mean, const typename MathType<S>::type* inverse_std,
        S* grad_input, int n_cols) {
    typedef typename MathType<S>::type M;
    __shared__ M scratch[66];
    const long long offset = (long long)blockIdx.x * n_cols;
    const M row_mean = mean[blockIdx.x];
    const M row_inverse_std = inverse_std[blockIdx.x];
    M sum_g = 0;
    M sum_g_xhat = 0;
    for (int j = threadIdx.x; j < n_cols; j += blockDim.x) {
        const M x_hat = (load_biased(x, input_bias, offset + j, j) - row_mean) * row_inverse_std;
        const M g = output_grad<GELU>(x, load_math(grad_out, offset + j), x_hat, weight, bias, j)
                    * load_math(weight, j);
        sum_g += g;
        sum_g_xhat += g * x_hat;
    }
    block_sum_pair(sum_g, sum_g_xhat, scratch);
    const M mean_g = sum_g / (M)n_cols;
    const M mean_g_xhat = sum_g_xhat / (M)n_cols;
    for (int j = threadIdx.x; j < n_cols; j += blockDim.x) {
        const M x_hat = (load_biased(x, input_bias, offset + j, j) - row_mean) * row_inverse_std;
        const M g = output_grad<GELU>(x, load_math(grad_out, offset + j), x_hat, weight, bias, j)
                    * load_math(weight, j);
        store_math(grad_input, offset + j, row_inverse_std * (g - mean_g - x_hat * mean_g_xhat));
    }
}

// In a (32, 8) block: the 8 row lanes' sums of each of the 32 features, added in lane order;
// the totals land in sum_weight / sum_bias of the threads with threadIdx.y == 0.
template <typename M>
__device__ __forceinline__ void sum_row_lanes(M& sum_weight, M& sum_bias) {
    __shared__ M tile_weight[8][33];
    __shared__ M tile_bias[8][33];
    tile_weight[threadIdx.y][threadIdx.x] = sum_weight;
    tile_bias[threadIdx.y][threadIdx.x] = sum_bias;
    __syncthreads();
    if (threadIdx.y == 0) {
        sum_weight = 0;
        sum_bias = 0;
        for (int lane = 0; lane < 8; ++lane) {
            sum_weight += tile_weight[lane][threadIdx.x];
            sum_bias += tile_bias[lane][threadIdx.x];
        }
    }
}

// Parameter-gradient partial sums over chunks of rows: block (32, 8) covers 32 features of one
// chunk; threadIdx.y strides over the chunk's rows, then the 8 row lanes are summed in order.
template <typename S, bool GELU>
__global__ void hpcgpu_train_layer_norm_backward_params_partial(
        const S* grad_out, const S* x, const S* input_bias, const S* weight, const S* bias,
        const typename MathType<S>::type* mean, const typename MathType<S>::type* inverse_std,
        typename MathType<S>::type* partial_weight, typename MathType<S>::type* partial_bias,
        long long n_rows, int n_cols, int rows_per_chunk) {
    typedef typename MathType<S>::type M;
    const int column = blockIdx.x * 32 + threadIdx.x;
    const long long row_start = (long long)blockIdx.y * rows_per_chunk;
    long long row_end = row_start + rows_per_chunk;
    if (row_end > n_rows) {
        row_end = n_rows;
    }
    M sum_weight = 0;
    M sum_bias = 0;
    if (column < n_cols) {
        for (long long row = row_start + threadIdx.y; row < row_end; row += 8) {
            const long long index = row * n_cols + column;
            const M x_hat = (load_biased(x, input_bias, index, column) - mean[row]) * inverse_std[row];
            const M g = output_grad<GELU>(x, load_math(grad_out, index), x_hat, weight, bias, column);
            sum_weight += g * x_hat;
            sum_bias += g;
        }
    }
    sum_row_lanes(sum_weight, sum_bias);
    if (threadIdx.y == 0 && column < n_cols) {
        partial_weight[(long long)blockIdx.y * n_cols + column] = sum_weight;
        partial_bias[(long long)blockIdx.y * n_cols + column] = sum_bias;
    }
}

// Sums the (n_chunks, n_cols) partials in a fixed order and ADDS them into the gradients:
// block (32, 8) covers 32 features; lane y takes chunks y, y + 8, ..., then the lanes in order.
template <typename S>
__global__ void hpcgpu_train_layer_norm_backward_params_final(
        const typename MathType<S>::type* partial_weight,
        const typename MathType<S>::type* partial_bias,
        S* grad_weight, S* grad_bias, int n_chunks, int n_cols) {
    typedef typename MathType<S>::type M;
    const int column = blockIdx.x * 32 + threadIdx.x;
    M sum_weight = 0;
    M sum_bias = 0;
    if (column < n_cols) {
        for (int chunk = threadIdx.y; chunk < n_chunks; chunk += 8) {
            sum_weight += partial_weight[(long long)chunk * n_cols + column];
            sum_bias += partial_bias[(long long)chunk * n_cols + column];
        }
    }
    sum_row_lanes(sum_weight, sum_bias);
    if (threadIdx.y == 0 && column < n_cols) {
        store_math(grad_weight, column, load_math(grad_weight, column) + sum_weight);
        store_math(grad_bias, column, load_math(grad_bias, column) + sum_bias);
    }
}
"""

#: Values of a row each thread of the row-in-registers kernels holds (HPCGPU_LN_ELEMENTS).
ELEMENTS_PER_THREAD = 16
MAX_THREADS = 1024


def _name_expressions():
    names = []
    for dtype_name, storage in STORAGE_TYPES.items():
        for gelu in ("false", "true"):
            for width in sorted({1, VECTOR_WIDTH[dtype_name]}):
                names += [f"hpcgpu_train_layer_norm_forward_rows<{storage}, {width}, {gelu}>",
                          f"hpcgpu_train_layer_norm_backward_rows<{storage}, {width}, {gelu}>"]
            names += [f"hpcgpu_train_layer_norm_{kernel}<{storage}, {gelu}>"
                      for kernel in ("forward", "backward_input", "backward_params_partial")]
        names.append(f"hpcgpu_train_layer_norm_backward_params_final<{storage}>")
    return names


@functools.lru_cache(maxsize=None)
def _module():
    import cupy

    return cupy.RawModule(code=LAYER_NORM_SOURCE, name_expressions=_name_expressions())


def layer_norm_kernel(name, dtype, *template_arguments):
    arguments = ", ".join([STORAGE_TYPES[np.dtype(dtype).name]] + [str(a) for a in template_arguments])
    return _module().get_function(f"{name}<{arguments}>")
