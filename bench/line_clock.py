"""A clock reading after every statement of named functions and methods (bench/host_lines.py): each is compiled again
from its source with `CKS.append((label, line, perf_counter()))` after each statement of its body, its branches'
and its handlers' (a loop's body stays whole: one reading after the loop), in its own module's namespace, so the
code runs as it was otherwise. line: the statement's first line in the function's dedented source (1: the def)."""
import ast, inspect, sys, textwrap, time

CKS = []
pc = time.perf_counter
t0 = pc(); [pc() for _ in range(10000)]; PC_COST = (pc() - t0) / 10000 * 1e6
SRCS = {}


class _T(ast.NodeTransformer):
    def __init__(self, label):
        self.label = label

    def body(self, body):
        out = []
        for st in body:
            self.visit(st)
            out.append(st)
            if not isinstance(st, (ast.Return, ast.Raise, ast.Continue, ast.Break)):
                out.append(ast.parse(f"_CKS.append(({self.label!r}, {st.lineno}, _pc()))").body[0])
        return out

    def generic_visit(self, node):
        if isinstance(node, (ast.For, ast.While, ast.FunctionDef, ast.Lambda, ast.AsyncFunctionDef)):
            return node
        for f in ("body", "orelse", "finalbody"):
            v = getattr(node, f, None)
            if isinstance(v, list) and v and isinstance(v[0], ast.stmt):
                setattr(node, f, self.body(v))
        if isinstance(node, ast.Try):
            for h in node.handlers:
                h.body = self.body(h.body)
        return node


def _compile(fn, label):
    src = textwrap.dedent(inspect.getsource(fn))
    SRCS[label] = src.split("\n")
    tree = ast.parse(src)
    fdef = tree.body[0]
    fdef.decorator_list = []
    fdef.body = _T(label).body(fdef.body)
    ast.fix_missing_locations(tree)
    mod = sys.modules[fn.__module__]
    ns = vars(mod)              # the module's own namespace: later patches of its globals are seen
    ns["_CKS"], ns["_pc"] = CKS, pc
    loc = {}
    exec(compile(tree, f"<{label}>", "exec"), ns, loc)
    return loc[fdef.name]


def instrument_methods(targets):
    for owner, name, label in targets:
        raw = inspect.getattr_static(owner, name)
        fn = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
        new = _compile(fn, label)
        setattr(owner, name, staticmethod(new) if isinstance(raw, staticmethod) else new)


def instrument_module_funcs(targets):
    for mod, name, label in targets:
        fn = getattr(mod, name)
        new = _compile(fn, label)
        setattr(mod, name, new)
        for other in list(sys.modules.values()):          # modules that imported it by name
            if other is not None and getattr(other, name, None) is fn:
                setattr(other, name, new)


def reset():
    CKS.clear()


def line(label, ln):
    """The source text of checkpoint (label, ln)."""
    s = SRCS.get(label)
    return s[ln - 1].strip()[:95] if s and 0 < ln <= len(s) else ""
