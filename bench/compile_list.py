"""`python -m strata.accel ARGS` under a Numba compile listener: runs it, then lists on stderr each of strata's
functions compiled in this process ("SIG module.function (argument types)"), so a first run shows what the
children of strata/accel/cpu/warm.py left to compile here.

python bench/compile_list.py generate --stats -n 32
"""
import sys, runpy, atexit
from numba.core import event
rec = []
class L(event.Listener):
    def on_start(self, ev): pass
    def on_end(self, ev):
        d = ev.data['dispatcher']
        rec.append((d.py_func.__module__ + '.' + d.py_func.__qualname__, str(ev.data['args'])))
event.register("numba:compile", L())
def dump():
    for r in rec:
        if r[0].startswith("strata"):
            print("SIG", r[0], r[1], file=sys.stderr)
atexit.register(dump)
sys.argv = ["strata.accel"] + sys.argv[1:]
runpy.run_module("strata.accel", run_name="__main__")
