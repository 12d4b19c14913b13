"""Conditional (IF) nodes in CuPy stream captures (hpcgpu.runtime.graph_conditional).

CPU (CI): the ctypes structures have the sizes of cuda.h's, and without a GPU nothing raises: the
self-test says False and the plain-launch form is an ordinary block. GPU: an IF node runs its body only on
launches where the steering word allows it, with several IF nodes steered by one word.
"""

import ctypes

import numpy as np
import pytest

from hpcgpu.runtime import graph_conditional


def test_node_parameter_structures_match_cuda_h():
    assert ctypes.sizeof(graph_conditional._NodeParams) == 256            # CUgraphNodeParams
    assert graph_conditional._NodeParams.u.offset == 16
    assert ctypes.sizeof(graph_conditional._ConditionalParams) == 32      # CUDA_CONDITIONAL_NODE_PARAMS


def test_plain_launch_form_is_an_ordinary_block():
    skip = graph_conditional.SkipUnless(None, word=None, value=0)
    assert not skip.active
    ran = []
    with skip.body():
        ran.append(1)
    assert ran == [1]


def test_self_test_says_false_without_a_gpu():
    try:
        import cupy

        has_gpu = cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:   # noqa: BLE001 -- no CuPy or no driver
        has_gpu = False
    if has_gpu:
        pytest.skip("a GPU is present (the GPU test covers it)")
    assert graph_conditional.works() is False


@pytest.mark.gpu
def test_if_nodes_run_their_bodies_only_when_the_word_allows(cupy):
    from hpcgpu.arch import on_stream

    assert graph_conditional.works(cupy.cuda.Device().id)
    word = cupy.zeros(1, dtype=cupy.int32)
    counter = cupy.zeros(3, dtype=cupy.int32)
    add = cupy.ElementwiseKernel("raw int32 amount", "raw int32 c", "atomicAdd(&c[i], amount[i])",
                                 "test_conditional_add")
    stream = cupy.cuda.Stream(non_blocking=True)
    steps = 5
    one, hundred = cupy.ones(3, dtype=cupy.int32), cupy.full(3, 100, dtype=cupy.int32)   # no allocation inside
    with on_stream(stream):
        add(one, counter, size=3)   # compiled before the capture
        counter.fill(0)
        stream.begin_capture()
        try:
            skip = graph_conditional.SkipUnless(stream, word, 7)
            for _ in range(steps):
                add(hundred, counter, size=3)   # always
                with skip.body():
                    add(one, counter, size=3)
                with skip.body():   # a second IF node steered by the same word
                    add(one, counter, size=3)
        finally:
            graph = stream.end_capture()
        results = {}
        for value in (7, 0, 7):   # 7: bodies skipped; anything else: they run
            counter.fill(0)
            word.fill(np.int32(value))
            graph.launch()
            stream.synchronize()
            results.setdefault(value, []).append(counter.get().tolist())
    assert results[7] == [[100 * steps] * 3] * 2
    assert results[0] == [[102 * steps] * 3]
