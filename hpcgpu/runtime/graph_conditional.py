"""Conditional (IF) nodes inside a CuPy stream capture: skip a part of a CUDA graph on the device.

A captured graph replays a fixed chain of kernels. Work that is needed only on some replays (a
neighbour-list rebuild, say) is usually written as kernels that read a device flag and return at
once; in a graph each such kernel still costs a node launch (on an H200 about 5 µs for a grid
over 2M rows that returns at once: ``benchmarks/graph_conditional_probe.py``). CUDA 12.4 added *conditional nodes*: an IF node runs its body graph only when a
condition value, set on the device by ``cudaGraphSetConditional`` in an earlier kernel, is
non-zero. CuPy exposes none of this, so it is done here with the driver API (``libcuda`` through
ctypes), in the middle of a capture that CuPy started::

    def record():                                 # run inside capture_graph (hpcgpu.runtime.capture)
        conditions = GraphConditions(stream)      # the graph being captured
        handle = conditions.new_handle()
        set_condition_unless(handle, word, 0)     # a kernel: condition := word[0] != 0
        with conditions.if_node(handle):          # launches in here go into the IF node's body
            ...kernels on the current CuPy stream...

    graph = capture_graph(stream, record)

:class:`SkipUnless` wraps that pattern (and turns into plain launches outside a capture).

A body may hold kernels, memsets, copies and further conditional nodes; no events, host
callbacks or NCCL calls that need them. A handle steers exactly one conditional node (the driver
refuses a second node on it: CUDA_ERROR_INVALID_VALUE); it is reset to ``default`` at every graph
launch.

Device code sets the condition after :data:`CONDITION_SOURCE` (declarations NVRTC accepts without
the CUDA headers); :func:`load_module` compiles it to PTX and loads that.

Requires a driver with CUDA 12.4+ (:func:`available` says whether this one has the entry points).
CuPy is imported inside the functions: importing this module needs no GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools

import numpy as np

from hpcgpu.runtime.streams import on_stream
from hpcgpu.runtime.capture import capture_graph

#: CUDA source that declares the device call; put it before kernels that set a condition.
CONDITION_SOURCE = r"""
typedef unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle,
                                                                       unsigned int value);
"""

_CU_GRAPH_NODE_TYPE_CONDITIONAL = 13
_CU_GRAPH_COND_TYPE_IF = 0
_CU_GRAPH_COND_ASSIGN_DEFAULT = 1
_CU_STREAM_CAPTURE_STATUS_ACTIVE = 1
_CU_STREAM_CAPTURE_MODE_RELAXED = 2
_CU_STREAM_SET_CAPTURE_DEPENDENCIES = 1

_ENTRY_POINTS = ("cuCtxGetCurrent", "cuStreamGetCaptureInfo_v3", "cuGraphConditionalHandleCreate",
                 "cuGraphAddNode_v2", "cuStreamUpdateCaptureDependencies_v2", "cuStreamBeginCaptureToGraph",
                 "cuStreamEndCapture")


class _ConditionalParams(ctypes.Structure):
    """``CUDA_CONDITIONAL_NODE_PARAMS``."""
    _fields_ = [("handle", ctypes.c_uint64), ("type", ctypes.c_int), ("size", ctypes.c_uint),
                ("phGraph_out", ctypes.POINTER(ctypes.c_void_p)), ("ctx", ctypes.c_void_p)]


class _NodeUnion(ctypes.Union):
    _fields_ = [("reserved1", ctypes.c_longlong * 29), ("conditional", _ConditionalParams)]


class _NodeParams(ctypes.Structure):
    """``CUgraphNodeParams`` (256 bytes: type, 3 reserved ints, a 29-word union, one reserved word)."""
    _anonymous_ = ("u",)
    _fields_ = [("type", ctypes.c_int), ("reserved0", ctypes.c_int * 3), ("u", _NodeUnion),
                ("reserved2", ctypes.c_longlong)]


@functools.cache
def _driver():
    return ctypes.CDLL("libcuda.so.1")


def available() -> bool:
    """Whether the driver library is loadable and has every entry point used here (CUDA 12.4+)."""
    try:
        driver = _driver()
    except OSError:
        return False
    return all(hasattr(driver, name) for name in _ENTRY_POINTS)


def load_module(source: str, options=("-std=c++17",)):
    """A CuPy module (``cupy.cuda.function.Module``: ``get_function(name)`` gives launchable kernels) of
    ``source``, kernels that call ``cudaGraphSetConditional`` (prepend :data:`CONDITION_SOURCE`). Compiled
    to PTX, which the driver links with the device call when it loads the module."""
    import cupy
    from cupy_backends.cuda.libs import nvrtc

    capability = cupy.cuda.Device().compute_capability   # "90" on an H100 / H200
    program = nvrtc.createProgram(source, "conditions.cu", [], [])
    try:
        nvrtc.compileProgram(program, [f"-arch=compute_{capability}", *options])
    except Exception as error:   # noqa: BLE001 -- re-raised with the compiler's log
        raise RuntimeError(f"{error}\n{nvrtc.getProgramLog(program)}") from error
    ptx = nvrtc.getPTX(program)
    ptx = ptx if isinstance(ptx, bytes) else ptx.encode()
    module = cupy.cuda.function.Module()
    module.load(ptx if ptx.endswith(b"\0") else ptx + b"\0")
    return module


def _call(name: str, *arguments) -> None:
    status = getattr(_driver(), name)(*arguments)
    if status != 0:
        raise RuntimeError(f"{name} failed: CUDA driver error {status}")


class GraphConditions:
    """Conditional nodes for the capture now running on CuPy ``stream`` (see the module docstring).

    Parameters
    ----------
    stream : cupy.cuda.Stream
        A stream whose capture has begun; IF nodes join its graph at the current point.
    """

    def __init__(self, stream):
        if not available():
            raise RuntimeError("conditional graph nodes need a CUDA 12.4+ driver (entry points missing)")
        self.stream = stream
        self.graph = self._capture_info()[0]
        context = ctypes.c_void_p()
        _call("cuCtxGetCurrent", ctypes.byref(context))
        self.context = context
        self._body_stream = None   # created on first use, reused by every IF node
        self._inside = False

    def _capture_info(self):
        """(graph, dependency array, count) of the capture on ``self.stream``."""
        status, capture_id, graph = ctypes.c_int(), ctypes.c_uint64(), ctypes.c_void_p()
        dependencies, edges, count = ctypes.POINTER(ctypes.c_void_p)(), ctypes.c_void_p(), ctypes.c_size_t()
        _call("cuStreamGetCaptureInfo_v3", ctypes.c_void_p(self.stream.ptr), ctypes.byref(status),
              ctypes.byref(capture_id), ctypes.byref(graph), ctypes.byref(dependencies), ctypes.byref(edges),
              ctypes.byref(count))
        if status.value != _CU_STREAM_CAPTURE_STATUS_ACTIVE:
            raise RuntimeError("conditional graph nodes: the stream is not capturing")
        return graph, dependencies, count.value

    def new_handle(self, default: int = 0) -> int:
        """A condition handle of this graph, reset to ``default`` at every launch of the graph."""
        handle = ctypes.c_uint64()
        _call("cuGraphConditionalHandleCreate", ctypes.byref(handle), self.graph, self.context,
              ctypes.c_uint(int(default)), ctypes.c_uint(_CU_GRAPH_COND_ASSIGN_DEFAULT))
        return handle.value

    @contextlib.contextmanager
    def if_node(self, handle: int):
        """An IF node after everything captured so far; CuPy launches inside the block form its body.
        Not nested (a body holding a further IF node is not supported here)."""
        import cupy

        if self._inside:
            raise RuntimeError("conditional graph nodes: IF nodes do not nest here")
        graph, dependencies, count = self._capture_info()
        params = _NodeParams()
        params.type = _CU_GRAPH_NODE_TYPE_CONDITIONAL
        params.conditional.handle = handle
        params.conditional.type = _CU_GRAPH_COND_TYPE_IF
        params.conditional.size = 1
        params.conditional.ctx = self.context
        node = ctypes.c_void_p()
        _call("cuGraphAddNode_v2", ctypes.byref(node), graph, dependencies, None, ctypes.c_size_t(count),
              ctypes.byref(params))
        body = ctypes.c_void_p(params.conditional.phGraph_out[0])
        _call("cuStreamUpdateCaptureDependencies_v2", ctypes.c_void_p(self.stream.ptr), ctypes.byref(node), None,
              ctypes.c_size_t(1), ctypes.c_uint(_CU_STREAM_SET_CAPTURE_DEPENDENCIES))
        if self._body_stream is None:
            self._body_stream = cupy.cuda.Stream(non_blocking=True)
        body_stream = self._body_stream
        _call("cuStreamBeginCaptureToGraph", ctypes.c_void_p(body_stream.ptr), body, None, None, ctypes.c_size_t(0),
              ctypes.c_int(_CU_STREAM_CAPTURE_MODE_RELAXED))
        self._inside = True
        try:
            with on_stream(body_stream):
                yield
        finally:
            self._inside = False
            captured = ctypes.c_void_p()
            _call("cuStreamEndCapture", ctypes.c_void_p(body_stream.ptr), ctypes.byref(captured))


_UNLESS_SOURCE = CONDITION_SOURCE + r"""
/* condition := (word[0] != value): one thread, between the kernel that writes `word` and the IF node. */
extern "C" __global__ void hpcgpu_condition_unless(cudaGraphConditionalHandle handle, const int* word, int value) {
    cudaGraphSetConditional(handle, word[0] != value ? 1u : 0u);
}
"""


@functools.cache
def _unless_kernel(device_id: int):
    return load_module(_UNLESS_SOURCE).get_function("hpcgpu_condition_unless")


def set_condition_unless(handle: int, word, value: int) -> None:
    """Queue (on CuPy's current stream) a one-thread kernel: condition ``handle`` := ``word[0] != value``.

    Parameters
    ----------
    handle : int
        From :meth:`GraphConditions.new_handle`.
    word : cupy.ndarray of int32, shape (>= 1,)
        Read on the device when the kernel runs.
    value : int
    """
    import cupy

    _unless_kernel(cupy.cuda.Device().id)((1,), (1,), (np.uint64(handle), word, np.int32(value)))


class SkipUnless:
    """IF nodes steered by one device word: their bodies run only when ``word[0] != value``.

    Inside a capture on ``stream``, each ``with skip.body():`` block becomes a one-thread kernel that
    reads the word (after whatever the stream did before) and sets a condition, then an IF node holding
    the block's launches (a condition handle steers exactly one conditional node, so each body has its
    own). With ``stream=None`` (no capture, or conditional nodes turned off) a body is an ordinary block:
    its kernels are plain launches.
    """

    def __init__(self, stream, word, value: int):
        self.word, self.value = word, int(value)
        self.conditions = GraphConditions(stream) if stream is not None else None

    @property
    def active(self) -> bool:
        return self.conditions is not None

    def body(self):
        return self._if_body() if self.conditions is not None else contextlib.nullcontext()

    @contextlib.contextmanager
    def _if_body(self):
        handle = self.conditions.new_handle()
        set_condition_unless(handle, self.word, self.value)
        with self.conditions.if_node(handle):
            yield


#: device id -> why :func:`works` said False there.
FAILURES: dict = {}


@functools.cache
def works(device_id: int = -1) -> bool:
    """Whether IF nodes work here: a tiny graph is captured and launched with the condition clear and set
    (once per process and device; ``device_id`` only keys the cache). False, never an exception, when the
    driver, the compiler or the launch refuses; :data:`FAILURES` then says why."""
    if not available():
        FAILURES[device_id] = "the driver lacks the entry points (CUDA 12.4+ needed)"
        return False
    try:
        import cupy

        word, counter = cupy.zeros(1, dtype=cupy.int32), cupy.zeros(1, dtype=cupy.int32)
        add = cupy.ElementwiseKernel("", "int32 c", "c += 1", "hpcgpu_conditional_probe_add")
        stream = cupy.cuda.Stream(non_blocking=True)
        with on_stream(stream):
            add(counter)   # compiled and loaded before the capture, as is the condition kernel:
            _unless_kernel(cupy.cuda.Device().id)
            counter.fill(0)

            def record():
                with SkipUnless(stream, word, 0).body():
                    add(counter)

            graph = capture_graph(stream, record)
            for value in (0, 7):
                word.fill(np.int32(value))
                graph.launch()
            stream.synchronize()
        ran = int(counter.get()[0])
        if ran != 1:
            FAILURES[device_id] = f"the IF node's body ran {ran} times in 2 launches, expected 1"
        return ran == 1
    except Exception as error:   # noqa: BLE001 -- any refusal means "not here"
        FAILURES[device_id] = f"{type(error).__name__}: {error}"
        return False
