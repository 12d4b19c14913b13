"""CPU kernels against plain NumPy references (im2col/col2im, dropout hash)."""

import numpy as np
import pytest

from apps.train.kernels.im2col import col2im, conv_output_length, im2col
from apps.train.kernels.random_mask import keep_mask, keep_threshold


def im2col_reference(x, kernel_size, stride, padding):
    batch, channels, length = x.shape
    padded = np.zeros((batch, channels, length + 2 * padding), dtype=x.dtype)
    padded[:, :, padding:padding + length] = x
    out_length = conv_output_length(length, kernel_size, stride, padding)
    cols = np.empty((batch, out_length, channels, kernel_size), dtype=x.dtype)
    for o in range(out_length):
        cols[:, o] = padded[:, :, o * stride:o * stride + kernel_size]
    return cols.reshape(batch, out_length, channels * kernel_size)


@pytest.mark.parametrize("kernel_size,stride,padding", [(5, 2, 1), (3, 1, 0), (3, 2, 2), (1, 3, 0)])
def test_im2col_matches_reference(rng, kernel_size, stride, padding):
    x = rng.standard_normal((3, 4, 17))
    assert np.array_equal(im2col(x, kernel_size, stride, padding),
                          im2col_reference(x, kernel_size, stride, padding))


def test_im2col_copies_float16_and_float32_bits_exactly(rng):
    x = rng.standard_normal((2, 3, 11))
    for dtype in (np.float16, np.float32):
        xd = x.astype(dtype)
        assert np.array_equal(im2col(xd, 3, 2, 1), im2col_reference(xd, 3, 2, 1))


@pytest.mark.parametrize("kernel_size,stride,padding", [(5, 2, 1), (3, 1, 0), (3, 2, 2)])
def test_col2im_is_the_adjoint_of_im2col(rng, kernel_size, stride, padding):
    # <im2col(x), c> == <x, col2im(c)> for all x, c
    x = rng.standard_normal((2, 3, 13))
    cols = rng.standard_normal(im2col(x, kernel_size, stride, padding).shape)
    left = np.sum(im2col(x, kernel_size, stride, padding) * cols)
    right = np.sum(x * col2im(cols, 13, kernel_size, stride, padding))
    assert abs(left - right) < 1e-12 * max(1.0, abs(left))


def test_im2col_rejects_bad_geometry(rng):
    with pytest.raises(ValueError, match="shorter than the kernel"):
        im2col(rng.standard_normal((1, 1, 3)), 5)
    with pytest.raises(TypeError, match="floating-point"):
        im2col(np.zeros((1, 1, 8), dtype=np.int32), 3)
    with pytest.raises(TypeError, match="float32 or float64"):
        col2im(np.zeros((1, 3, 3), dtype=np.float16), 5, 3)


def mix64_reference(z):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def keep_mask_reference(sample_index, n_elements, seed, step, stream, keep_prob):
    with np.errstate(over="ignore"):
        h = mix64_reference(np.array([seed], dtype=np.uint64) ^ np.uint64(0x9E3779B97F4A7C15))
        h = mix64_reference(h ^ np.uint64(step))
        h = mix64_reference(h ^ np.uint64(stream))
        h = mix64_reference(h ^ sample_index.astype(np.uint64))[:, None]
        h = mix64_reference(h ^ np.arange(n_elements, dtype=np.uint64)[None, :])
    return (h >> np.uint64(32)) < np.uint64(keep_threshold(keep_prob))


def test_keep_mask_matches_reference_hash():
    sample_index = np.array([0, 5, 1 << 40, 7], dtype=np.int64)
    expected = keep_mask_reference(sample_index, 33, 17, 9, 2, 0.7)
    assert np.array_equal(keep_mask(sample_index, 33, 17, 9, 2, 0.7), expected)


def test_keep_mask_statistics_and_coordinates():
    index = np.arange(200, dtype=np.int64)
    mask = keep_mask(index, 500, 1, 0, 1, 0.8)
    assert abs(mask.mean() - 0.8) < 0.005
    # every coordinate changes the mask
    for changed in [keep_mask(index, 500, 2, 0, 1, 0.8), keep_mask(index, 500, 1, 1, 1, 0.8),
                    keep_mask(index, 500, 1, 0, 2, 0.8), keep_mask(index + 1, 500, 1, 0, 1, 0.8)]:
        assert 0.2 < np.mean(changed != mask) < 0.4
    # a sample's row depends on its global index only, not on its position in the batch
    assert np.array_equal(keep_mask(index[::-1], 500, 1, 0, 1, 0.8), mask[::-1])
    assert keep_mask(index, 10, 1, 0, 1, 1.0).all()
