"""Call 2 showed cuGraphAddNode accepting an IF node in a capture, yet works() said False and the probe's
AddNode failed (error 1). Which step differs? Each variant prints its outcome with the full error."""
import ctypes
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import cupy  # noqa: E402
import numpy as np  # noqa: E402

from hpcgpu.arch import on_stream  # noqa: E402
from hpcgpu.runtime import graph_conditional as gc  # noqa: E402

print("works():", gc.works(0), gc.FAILURES)
word = cupy.zeros(1, dtype=cupy.int32)
x = cupy.zeros(4)
kernel = gc._unless_kernel(0)
print("condition kernel loaded:", kernel)


def variant(label, body):
    stream = cupy.cuda.Stream(non_blocking=True)
    try:
        with on_stream(stream):
            stream.begin_capture()
            try:
                body(stream)
            finally:
                graph = stream.end_capture()
            graph.launch()
            stream.synchronize()
        print(f"{label}: OK")
    except Exception:   # noqa: BLE001
        print(f"{label}: FAILED\n" + "".join(traceback.format_exc().splitlines(True)[-4:]))


def a(stream):   # handle before any node, one IF node after a plain kernel
    c = gc.GraphConditions(stream)
    h = c.new_handle()
    x.__iadd__(1)
    with c.if_node(h):
        x.__iadd__(1)


def b(stream):   # the condition kernel before the IF node
    c = gc.GraphConditions(stream)
    h = c.new_handle()
    gc.set_condition_unless(h, word, 0)
    with c.if_node(h):
        x.__iadd__(1)


def b2(stream):   # a plain kernel, then the condition kernel, then the IF node
    x.__iadd__(1)
    c = gc.GraphConditions(stream)
    h = c.new_handle()
    gc.set_condition_unless(h, word, 0)
    with c.if_node(h):
        x.__iadd__(1)


def c2(stream):   # two IF nodes on one handle
    c = gc.GraphConditions(stream)
    h = c.new_handle()
    x.__iadd__(1)
    gc.set_condition_unless(h, word, 0)
    with c.if_node(h):
        x.__iadd__(1)
    with c.if_node(h):
        x.__iadd__(1)


def d(stream):   # one handle per IF node
    c = gc.GraphConditions(stream)
    x.__iadd__(1)
    for _ in range(2):
        h = c.new_handle()
        gc.set_condition_unless(h, word, 0)
        with c.if_node(h):
            x.__iadd__(1)


def e(stream):   # raw launch of the condition kernel by ctypes-free CuPy call with a Python int
    c = gc.GraphConditions(stream)
    h = c.new_handle()
    x.__iadd__(1)
    kernel((1,), (1,), (np.uint64(h), word, np.int32(0)))
    status, deps = ctypes.c_int(), None
    print("   capture info after the condition kernel:", c._capture_info()[2], "deps")
    with c.if_node(h):
        x.__iadd__(1)


for label, body in (("a: plain kernel, IF", a), ("b: condition kernel, IF", b), ("b2: kernel, condition, IF", b2),
                    ("c2: two IF nodes, one handle", c2), ("d: a handle per IF node", d),
                    ("e: as b2 with capture info", e)):
    variant(label, body)
