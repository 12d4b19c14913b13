"""CUDA C++ helpers shared by the training RawKernels (source text only, no CuPy import).

The kernels of :mod:`apps.train.kernels.layernorm` and :mod:`apps.train.kernels.buffers`
are templates over the *storage* type ``S`` of the arrays (``unsigned short`` for
float16, ``float``, ``double``) and do their arithmetic in ``MathType<S>::type``:
float for float16 and float32 (as PyTorch's "opmath"), double for float64.

float16 values travel as their 16-bit patterns and are converted with the PTX
``cvt`` instructions, so the kernels need no ``cuda_fp16.h`` (whose location
depends on how CUDA and CuPy were installed). bfloat16 values (CuPy has no
bfloat16 dtype: on the GPU they are ``uint16`` arrays of bit patterns) travel as
``bfloat16_storage``, a distinct 16-bit type so that the overloads pick the right
conversion, and are converted by integer arithmetic (no ``cuda_bf16.h`` either):
to float by a 16-bit shift, from float with round-to-nearest-even and NaN kept
(:func:`apps.train.training.precision.bfloat16_bits` is the NumPy twin of ``float_to_bfloat16``).

``block_sum`` is a deterministic block-wide sum: warp shuffles, then one warp
over the per-warp partials, always in the same order -- the same inputs give
the same bits on every run, which the bitwise restart tests rely on.
``GELU_FUNCTIONS`` holds the tanh-approximation GELU and its derivative, shared by
the GELU kernels and the LayerNorm kernels that apply GELU to their output.
"""

CUDA_HELPERS = r"""
// bfloat16 bit pattern (the upper half of a float32): its own type, so that the overloads
// below are not float16's (unsigned short)
struct __align__(2) bfloat16_storage { unsigned short bits; };

__device__ __forceinline__ float bfloat16_to_float(unsigned short bits) {
    return __uint_as_float(((unsigned int)bits) << 16);
}

// round to nearest even; NaN -> the quiet NaN 0x7fc0 with its sign (as ml_dtypes)
__device__ __forceinline__ unsigned short float_to_bfloat16(float value) {
    const unsigned int bits = __float_as_uint(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        return (unsigned short)(((bits >> 16) & 0x8000u) | 0x7fc0u);
    }
    return (unsigned short)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

template <typename S> struct MathType { typedef float type; };
template <> struct MathType<double> { typedef double type; };

__device__ __forceinline__ float load_math(const unsigned short* values, long long i) {
    float result;
    asm("cvt.f32.f16 %0, %1;" : "=f"(result) : "h"(values[i]));
    return result;
}
__device__ __forceinline__ float load_math(const bfloat16_storage* values, long long i) {
    return bfloat16_to_float(values[i].bits);
}
__device__ __forceinline__ float load_math(const float* values, long long i) { return values[i]; }
__device__ __forceinline__ double load_math(const double* values, long long i) { return values[i]; }

__device__ __forceinline__ void store_math(unsigned short* values, long long i, float value) {
    unsigned short bits;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(value));
    values[i] = bits;
}
__device__ __forceinline__ void store_math(bfloat16_storage* values, long long i, float value) {
    values[i].bits = float_to_bfloat16(value);
}
__device__ __forceinline__ void store_math(float* values, long long i, float value) { values[i] = value; }
__device__ __forceinline__ void store_math(double* values, long long i, double value) { values[i] = value; }

// value rounded to the precision of storage type S and back (what storing and reloading
// would give): the fused "+ bias" of a following kernel matches the separate bias pass.
__device__ __forceinline__ float round_to_storage(const unsigned short*, float value) {
    unsigned short bits;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(value));
    float result;
    asm("cvt.f32.f16 %0, %1;" : "=f"(result) : "h"(bits));
    return result;
}
__device__ __forceinline__ float round_to_storage(const bfloat16_storage*, float value) {
    return bfloat16_to_float(float_to_bfloat16(value));
}
__device__ __forceinline__ float round_to_storage(const float*, float value) { return value; }
__device__ __forceinline__ double round_to_storage(const double*, double value) { return value; }

// x[i] + bias[column] (when bias is not null) in the arithmetic type, rounded like storage
template <typename S>
__device__ __forceinline__ typename MathType<S>::type load_biased(
        const S* x, const S* bias, long long i, long long column) {
    typename MathType<S>::type value = load_math(x, i);
    if (bias != nullptr) {
        value = round_to_storage(x, value + load_math(bias, column));
    }
    return value;
}

__device__ __forceinline__ float math_sqrt(float value) { return sqrtf(value); }
__device__ __forceinline__ double math_sqrt(double value) { return sqrt(value); }

template <typename M>
__device__ __forceinline__ M warp_sum(M value) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        value += __shfl_xor_sync(0xffffffffu, value, offset);
    }
    return value;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets
// lane 0's result, so the value is the same on all threads. scratch: 33 elements.
template <typename M>
__device__ M block_sum(M value, M* scratch) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    value = warp_sum(value);
    if (lane == 0) {
        scratch[warp] = value;
    }
    __syncthreads();
    if (warp == 0) {
        const int n_warps = blockDim.x >> 5;
        value = lane < n_warps ? scratch[lane] : (M)0;
        value = warp_sum(value);
        if (lane == 0) {
            scratch[32] = value;
        }
    }
    __syncthreads();
    value = scratch[32];
    __syncthreads();   // the caller may reuse scratch right away
    return value;
}

// VEC consecutive values of storage type S, moved as one 16-byte access when aligned
template <typename S, int VEC>
struct __align__(sizeof(S) * VEC) Pack { S value[VEC]; };
"""

GELU_FUNCTIONS = r"""
__device__ __forceinline__ float math_tanh(float value) { return tanhf(value); }
__device__ __forceinline__ double math_tanh(double value) { return tanh(value); }

template <typename M>
__device__ __forceinline__ M gelu_value(M v) {
    const M inner = (M)0.7978845608028654 * (v + (M)0.044715 * v * v * v);
    return (M)0.5 * v * ((M)1 + math_tanh(inner));
}

template <typename M>
__device__ __forceinline__ M gelu_derivative(M v) {
    const M t = math_tanh((M)0.7978845608028654 * (v + (M)0.044715 * v * v * v));
    const M d_inner = (M)0.7978845608028654 * ((M)1 + (M)0.134145 * v * v);
    return (M)0.5 * ((M)1 + t) + (M)0.5 * v * ((M)1 - t * t) * d_inner;
}
"""

#: The CuPy dtype of bfloat16 arrays on the GPU: their bit patterns.
BFLOAT16_BITS = "uint16"

#: C++ storage type of each (CuPy) dtype name in the kernel templates.
STORAGE_TYPES = {"float16": "unsigned short", BFLOAT16_BITS: "bfloat16_storage", "float32": "float",
                 "float64": "double"}

#: Elements of each storage dtype in one 16-byte ``Pack`` access.
VECTOR_WIDTH = {"float16": 8, BFLOAT16_BITS: 8, "float32": 4, "float64": 2}


def math_dtype(dtype_name):
    """NumPy dtype name of the arithmetic type for a storage dtype name."""
    return "float64" if dtype_name == "float64" else "float32"
