"""Session 5 debugging aid: one slab-driver run (after a default-driver run, with tight capacities or one lane)
under mpirun, progress lines per rank, a traceback dump if it hangs (mode: slab | default | tight | lanes1)."""
import faulthandler, sys, time, os
faulthandler.dump_traceback_later(35, exit=True)
sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "tests", "apps", "md")]
import hpcgpu
import test_md_resident_slab as t
from apps.md import resident_slab
comm = hpcgpu.Communicator()
hpcgpu.arch.auto(comm, backend="cupy", allow_sharing=True)
import cupy
T = time.time()
def say(*a):
    print(f"[{comm.rank} {time.time()-T:6.2f}]", *a, flush=True)
mode = sys.argv[1]
config = t._config(thermostat="langevin")
if mode in ("default", "both"):
    st = t._state(comm, cupy, t._config(thermostat="langevin", resident=False)); say("default init")
    d, _ = t._run(st, config, 60); say("default run", d[-1])
if mode == "lanes1":
    resident_slab.lanes_per_atom = lambda n: 1
if mode == "tight":
    resident_slab.INITIAL_CAPACITIES = {"rows": 0, "ghost_rows": 40, "migrants": 2}
st = t._state(comm, cupy, t._config(thermostat="langevin", resident=True)); say("slab init", st.resident.summary())
s, _ = t._run(st, config, 60); say("slab run", s[-1], st.resident.summary())
say("closing")
if "noclose" not in sys.argv:
    st.resident.close()
    say("closed")
    del st
    import gc; gc.collect()
    say("collected")
