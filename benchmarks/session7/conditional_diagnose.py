"""Why did cuGraphAddNode_v2 refuse the IF node (CUDA error 1)? Tries variants and prints each outcome."""
import ctypes
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import cupy  # noqa: E402

from hpcgpu.runtime import graph_conditional as gc  # noqa: E402

drv = gc._driver()
version = ctypes.c_int()
drv.cuDriverGetVersion(ctypes.byref(version))
print("driver", version.value)


def error_name(code):
    text = ctypes.c_char_p()
    drv.cuGetErrorString(code, ctypes.byref(text))
    return f"{code} {text.value.decode() if text.value else ''}"


for name in ("cuGraphAddNode", "cuGraphAddNode_v2", "cuStreamGetCaptureInfo", "cuStreamGetCaptureInfo_v2",
             "cuStreamGetCaptureInfo_v3", "cuStreamUpdateCaptureDependencies_v2", "cuStreamBeginCaptureToGraph"):
    pfn, status = ctypes.c_void_p(), ctypes.c_int()
    code = drv.cuGetProcAddress_v2(name.split("_v")[0].encode(), ctypes.byref(pfn), ctypes.c_int(13000),
                                   ctypes.c_uint64(0), ctypes.byref(status))
    exported = ctypes.cast(getattr(drv, name), ctypes.c_void_p).value if hasattr(drv, name) else None
    print(f"{name:<40} exported {exported and hex(exported)}  proc(13000, {name.split('_v')[0]}) "
          f"{pfn.value and hex(pfn.value)} code {code}")

cupy.zeros(1)
ctx = ctypes.c_void_p()
print("cuCtxGetCurrent", drv.cuCtxGetCurrent(ctypes.byref(ctx)), hex(ctx.value or 0))


def add_if(graph, deps, count, context, add_name="cuGraphAddNode_v2", edge=True):
    handle = ctypes.c_uint64()
    code = drv.cuGraphConditionalHandleCreate(ctypes.byref(handle), graph, context, ctypes.c_uint(0),
                                              ctypes.c_uint(1))
    if code:
        return f"handle create: {error_name(code)}"
    params = gc._NodeParams()
    params.type = 13
    params.conditional.handle = handle.value
    params.conditional.type = 0
    params.conditional.size = 1
    params.conditional.ctx = context
    node = ctypes.c_void_p()
    if edge:
        code = getattr(drv, add_name)(ctypes.byref(node), graph, deps, None, ctypes.c_size_t(count),
                                      ctypes.byref(params))
    else:
        code = getattr(drv, add_name)(ctypes.byref(node), graph, deps, ctypes.c_size_t(count), ctypes.byref(params))
    body = params.conditional.phGraph_out[0] if params.conditional.phGraph_out else None
    return f"{add_name}: {error_name(code)} body {body and hex(body)}"


# explicit graph, no capture
graph = ctypes.c_void_p()
drv.cuGraphCreate(ctypes.byref(graph), ctypes.c_uint(0))
print("explicit graph, ctx current:", add_if(graph, None, 0, ctx))
graph2 = ctypes.c_void_p()
drv.cuGraphCreate(ctypes.byref(graph2), ctypes.c_uint(0))
print("explicit graph, ctx NULL   :", add_if(graph2, None, 0, ctypes.c_void_p()))
graph3 = ctypes.c_void_p()
drv.cuGraphCreate(ctypes.byref(graph3), ctypes.c_uint(0))
print("explicit graph, cuGraphAddNode (no edges):", add_if(graph3, None, 0, ctx, "cuGraphAddNode", edge=False))

# inside a capture
x = cupy.zeros(4)
for label, context, add_name, edge in (("capture, ctx current", ctx, "cuGraphAddNode_v2", True),
                                       ("capture, ctx NULL", ctypes.c_void_p(), "cuGraphAddNode_v2", True),
                                       ("capture, cuGraphAddNode", ctx, "cuGraphAddNode", False)):
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            x += 1
            status, cid, g = ctypes.c_int(), ctypes.c_uint64(), ctypes.c_void_p()
            deps, edges, count = ctypes.POINTER(ctypes.c_void_p)(), ctypes.c_void_p(), ctypes.c_size_t()
            code = drv.cuStreamGetCaptureInfo_v3(ctypes.c_void_p(stream.ptr), ctypes.byref(status), ctypes.byref(cid),
                                                 ctypes.byref(g), ctypes.byref(deps), ctypes.byref(edges),
                                                 ctypes.byref(count))
            print(f"{label}: capture info {error_name(code)} status {status.value} deps {count.value} "
                  f"edges {edges.value}", end="; ")
            print(add_if(g, deps, count.value, context, add_name, edge))
        finally:
            try:
                stream.end_capture()
            except Exception as error:   # noqa: BLE001
                print("   end_capture:", type(error).__name__, str(error)[:120])
print("works():", gc.works(0))
