"""The layout's rules (issue 30's "Done when"), read from the source with ast, nothing imported:
no import circle among tblock's modules, no kernel function of more than 10 parameters, no
file over 500 lines in tblock/ or kernels/, no "numba" in model code, no module reading
another's private names, and Numba pinned to the range the project tests."""

from __future__ import annotations

import ast
import re
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# the installed layout: tblock/ is tblock, the top-level kernels/ is tblock.kernels
PACKAGES = ((ROOT / "tblock", "tblock"), (ROOT / "kernels", "tblock.kernels"))


def source_modules(packages=PACKAGES) -> dict[str, Path]:
    """{dotted module name: file} for every .py file of the packages, given as (folder,
    dotted name) pairs (an __init__.py is its package's name)."""
    out = {}
    for folder, name in packages:
        for f in sorted(folder.rglob("*.py")):
            if "__pycache__" in f.parts:
                continue
            parts = list(f.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([name, *parts])] = f
    return out


MODULES = source_modules()


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_walk_sees_the_package():
    assert {"tblock", "tblock.api", "tblock.kernels", "tblock.kernels.block"} <= set(MODULES)


# ---------------------------------------------------------------------------------------
# no import circle

def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:` (never run)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                skip.update(id(x) for stmt in node.body for x in ast.walk(stmt))
    return skip


def imports_of(name: str, modules=MODULES) -> list[tuple[str, int]]:
    """The modules of ``modules`` that module ``name`` imports, at module level or inside a
    function, with the line: [(module, line)]."""
    path = modules[name]
    tree = parse(path)
    skip = _type_checking_only(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            for a in node.names:
                # `from P import x`: the submodule P.x when there is one, else P's own names
                found.append((f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module, node.lineno))
    return [(m, line) for m, line in found if m in modules and m != name]


def import_graph(modules=MODULES) -> dict[str, list[tuple[str, int]]]:
    return {name: imports_of(name, modules) for name in modules}


def strongly_connected(graph) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's
    algorithm, iterative): each holds at least one circle."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            for w, _ in edges:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def circle_in(graph, component: list[str]) -> list[str]:
    """One circle through the component's first module: [a, b, ..., a] (breadth first, so
    the shortest)."""
    start, inside = component[0], set(component)
    came_from = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w, _ in graph[v]:
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return path[::-1] + [start]
            if w in inside and w not in came_from:
                came_from[w] = v
                queue.append(w)
    raise AssertionError(f"no circle through {start} in {component}")


def test_no_import_circle():
    """No module needs, through any chain of imports, a module that needs it.

    An edge a -> b is an import statement in a's file (at module level or inside a
    function: one that runs only when called still makes a need b, and b need a back)
    that names b's own code: `import tblock.x.y` and `from tblock.x import y` (y a
    submodule) name tblock.x.y; `from tblock.x import name` (a name that x's __init__
    defines or re-exports) names tblock.x itself.  Relative imports are resolved; the
    top-level kernels/ is tblock.kernels.  Not edges: the parent packages Python runs
    before a submodule (running them is import machinery, not a need: an __init__ that
    re-exports its children is not in a circle with them), imports under `if
    TYPE_CHECKING:`, and importlib's imports by a computed name (tblock's lazy names, the
    backend registry), which run on a caller's request after every module has loaded.
    So a child that imports names from its package's __init__, which imports the child,
    is a circle: the __init__ cannot finish before the child, nor the child before it."""
    graph = import_graph()
    lines = {(a, b): line for a in graph for b, line in graph[a]}
    report = []
    for component in strongly_connected(graph):
        circle = circle_in(graph, component)
        report.append(" -> ".join(circle) + "".join(f"\n    {a} (line {lines[a, b]}) imports {b}"
                                                   for a, b in zip(circle, circle[1:])))
    assert not report, "import circles:\n  " + "\n  ".join(report)


def test_a_package_and_its_children(tmp_path):
    """An __init__ re-exporting its children is no circle; a child taking a name from that
    __init__ is one; `from pkg import child` names the child, not the __init__."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {"__init__.py": "from .a import f\nfrom .b import g\nVERSION = 1\n",
             "a.py": "from .b import g\ndef f():\n    from pkg import b\n    return b\n",
             "b.py": "from . import VERSION\ng = VERSION\n",
             "sub/__init__.py": "from .c import h\n",
             "sub/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n"
                         "def h():\n    from ..a import f\n    return f\n"}
    for name, text in files.items():
        (pkg / name).write_text(text)
    modules = source_modules([(pkg, "pkg")])
    graph = import_graph(modules)
    assert sorted(graph["pkg"]) == [("pkg.a", 1), ("pkg.b", 2)]
    assert sorted(graph["pkg.a"]) == [("pkg.b", 1), ("pkg.b", 3)]
    assert graph["pkg.b"] == [("pkg", 1)]
    assert graph["pkg.sub.c"] == [("pkg.a", 5)]              # not the TYPE_CHECKING import
    assert strongly_connected(graph) == [["pkg", "pkg.a", "pkg.b"]]
    assert circle_in(graph, ["pkg", "pkg.a", "pkg.b"]) == ["pkg", "pkg.b", "pkg"]


def test_the_circle_finder_finds_each_circle():
    graph = {"a": [("b", 1)], "b": [("c", 2)], "c": [("a", 3), ("d", 4)], "d": [("e", 5)], "e": [("d", 6)],
             "f": [("a", 7)]}
    assert strongly_connected(graph) == [["d", "e"], ["a", "b", "c"]]
    assert circle_in(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]
    assert circle_in(graph, ["d", "e"]) == ["d", "e", "d"]
    assert strongly_connected({"a": [("b", 1)], "b": []}) == []


# ---------------------------------------------------------------------------------------
# kernel signatures, file sizes

MAX_PARAMS = 10
MAX_LINES = 500


def _outer_functions(tree: ast.Module):
    """Every function not nested in another function (module level, or a class's method)."""
    def walk(node, in_class):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield child, in_class
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, True)
            elif not isinstance(child, ast.Lambda):
                yield from walk(child, in_class)
    yield from walk(tree, False)


def parameters(fn: ast.FunctionDef, method: bool) -> list[str]:
    """The parameters a caller passes: a method's self/cls and an intrinsic's typing
    context left out."""
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    names += [a.vararg.arg] if a.vararg else []
    names += [a.kwarg.arg] if a.kwarg else []
    decorators = {ast.unparse(d).split("(")[0].rsplit(".", 1)[-1] for d in fn.decorator_list}
    if ((method and "staticmethod" not in decorators) or "intrinsic" in decorators) and names:
        names = names[1:]
    return names


def test_no_kernel_function_takes_more_than_10_parameters():
    """A block call's dimensions, flags and buffers travel as a few records, so every
    function of kernels/ (module level or a method; a function nested in another is the
    implementation of one and mirrors it) takes at most 10 parameters."""
    too_many = []
    for path in sorted((ROOT / "kernels").rglob("*.py")):
        for fn, method in _outer_functions(parse(path)):
            n = len(parameters(fn, method))
            if n > MAX_PARAMS:
                too_many.append(f"{rel(path)}:{fn.lineno} {fn.name}: {n} parameters")
    assert not too_many, f"{len(too_many)} kernel functions over {MAX_PARAMS} parameters:\n" + "\n".join(too_many)


def test_parameters_leave_out_self_and_the_typing_context():
    tree = ast.parse("@intrinsic\ndef f(typingctx, a, b): pass\nclass C:\n    def m(self, x, *r, k=1, **kw): pass\n")
    (f, f_method), (m, m_method) = list(_outer_functions(tree))
    assert parameters(f, f_method) == ["a", "b"]
    assert parameters(m, m_method) == ["x", "k", "r", "kw"]


def test_no_file_over_500_lines():
    long = [f"{rel(p)}: {n} lines" for p in MODULES.values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, f"files over {MAX_LINES} lines in tblock/ or kernels/:\n" + "\n".join(long)


# ---------------------------------------------------------------------------------------
# model code names no backend

def model_files() -> list[Path]:
    """tblock/models/ (the model layer), and tblock/gpt2.py while it exists."""
    files = sorted((ROOT / "tblock" / "models").rglob("*.py"))
    return files + [p for p in [ROOT / "tblock" / "gpt2.py"] if p.exists()]


def _docstrings(tree: ast.Module) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def numba_mentions(tree: ast.Module) -> list[tuple[int, str]]:
    """Strings (docstrings aside) and imports in ``tree`` that name numba: [(line, what)]."""
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
                and re.search(r"numba", node.value, re.I)):
            found.append((node.lineno, repr(node.value)))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names]
            if any("numba" in n or n.startswith("tblock.kernels") or n == "kernels" for n in names):
                found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_model_code_names_no_backend():
    """The model reaches the kernels through the backend registry's hooks only: no
    "numba" in its strings (a branch on the backend's name, a message listing the
    backends that have a hook) and no import of Numba, the numba backend or the kernels."""
    files = model_files()
    assert files, "no model code found (tblock/models/ or tblock/gpt2.py)"
    found = [f"{rel(p)}:{line}: {what}" for p in files for line, what in numba_mentions(parse(p))]
    assert not found, "model code names numba:\n" + "\n".join(found)


def test_numba_mentions_finds_strings_and_imports_not_docstrings():
    tree = ast.parse('"""numba docs"""\nimport numba\nfrom tblock.backends import numba as nb\n'
                     'def f(backend="numba"):\n    """numba"""\n    return f"{backend} (numba)"\n')
    assert [line for line, _ in numba_mentions(tree)] == [2, 3, 4, 6]


# ---------------------------------------------------------------------------------------
# no module reads another's private names

# Private names of other libraries that tblock uses on purpose, each for a job their
# public API has no door for: (file, attribute or imported name) -> why.
ALLOWED_PRIVATE = {
    ("kernels/cache.py", "_CacheLocator"): "Numba's cache locator base: tblock's per-path cache folder is one",
    ("kernels/cache.py", "_CacheImpl"): "Numba's cache implementation, whose locator list tblock's locator joins",
    ("kernels/cache.py", "_locator_classes"): "the list of cache locators Numba tries in turn",
    ("kernels/cache.py", "_cache"): "a dispatcher's cache (holds: is a signature's code there)",
    ("kernels/cache.py", "_index_key"): "the key Numba files a signature's code under in the index",
    ("kernels/cache.py", "_cache_file"): "the index and data files of a dispatcher's cache",
    ("kernels/isa.py", "_tm_features"): "the features of the LLVM target machine Numba compiles for",
    ("kernels/isa.py", "_get_host_cpu_name"): "the LLVM name of the host CPU Numba targets",
    ("kernels/options.py", "_defns"): "Numba's table of a target context's function implementations",
    ("kernels/options.py", "_getvalue"): "the LLVM value inside a Numba struct proxy",
    ("kernels/options.py", "_reload_init"): "what Numba's code library runs when it loads cached code",
    ("tblock/_runtime.py", "_is_initialized"): "whether Numba's thread pool has started",
    ("tblock/_runtime.py", "_LLVMLock"): "llvmlite's lock around LLVM, held by a compile in flight",
    ("tblock/peers.py", "_dynamo"): "torch.compile's compiler, reset between peers",
}
# public APIs whose names start with an underscore
PUBLIC_UNDERSCORED = {"_replace", "_asdict", "_fields", "_make", "_field_defaults",   # namedtuple's
                      "_exit"}                                                        # os._exit


def _private(name: str) -> bool:
    return len(name) > 1 and name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def own_names(tree: ast.Module) -> set[str]:
    """The private names a module defines: its functions and classes (at any depth), its
    module-level and class-level assignments, and the attributes it sets on self/cls."""
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            own.add(node.attr)
    for scope in [tree] + [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
        for stmt in scope.body:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else \
                [stmt.target] if isinstance(stmt, (ast.AnnAssign, ast.AugAssign)) else []
            for t in targets:
                own.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
            if isinstance(stmt, ast.Assign) and any(getattr(t, "id", None) == "__slots__" for t in stmt.targets):
                own.update(n.value for n in ast.walk(stmt.value) if isinstance(n, ast.Constant)
                           and isinstance(n.value, str))
    return own


def private_reads(tree: ast.Module, where: str, modules: set[str]) -> list[str]:
    """`x._name` and `from m import _name` in ``tree`` where _name belongs to another module.

    A read is the module's own when _name is one of own_names (matched by spelling: a
    module's own class's attribute, read on another instance of it, is its own) or the
    base is self, cls or super(); a package-private module (tblock._runtime) is a name
    any module of the package may import.  ``modules``: the package's dotted names."""
    own = own_names(tree)
    package_private = {m.rsplit(".", 1)[-1] for m in modules if _private(m.rsplit(".", 1)[-1])}
    found = []

    def allowed(name):
        return (name in own or name in PUBLIC_UNDERSCORED or name in package_private
                or (where, name) in ALLOWED_PRIVATE)

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and not allowed(node.attr):
            base = node.value
            if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                continue
            if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
                continue
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                if _private(a.name) and not allowed(a.name):
                    found.append((node.lineno, f"from {'.' * node.level}{node.module or ''} import {a.name}"))
    return [f"{where}:{line}: {what}" for line, what in sorted(found)]


def test_no_module_reads_another_modules_private_names():
    """A module's `_names` are its own: another module asks through a public name (KVCache
    advances and hands out its buffers, prepared weights have an accessor).  Numba's and
    torch's internals that tblock relies on are in ALLOWED_PRIVATE, each with its reason."""
    found = []
    for path in MODULES.values():
        found += private_reads(parse(path), rel(path), set(MODULES))
    assert not found, "private names read across modules:\n" + "\n".join(found)


def test_private_reads_tell_own_names_from_others():
    src = ("from tblock import _runtime\nfrom tblock.config import _check_int\nclass C:\n"
           "    def __init__(self):\n        self._n = 0\n    def same(self, other):\n        return other._n\n"
           "def f(cache, weights):\n    cache._length += 1\n    return weights._cache, _runtime._serial_only, "
           "super()._x, C._n, x._replace()\n")
    got = private_reads(ast.parse(src), "m.py", {"tblock._runtime", "tblock.config"})
    assert [g.split(": ", 1)[1] for g in got] == [
        "from tblock.config import _check_int", "cache._length", "_runtime._serial_only", "weights._cache"]


def test_every_allowed_private_name_is_still_used():
    """An allowance outlives its use only as a stale excuse: each entry is still read."""
    used = set()
    for path in MODULES.values():
        names = {n.attr for n in ast.walk(parse(path)) if isinstance(n, ast.Attribute)}
        names |= {a.name for n in ast.walk(parse(path)) if isinstance(n, ast.ImportFrom) for a in n.names}
        used |= {(rel(path), name) for name in names}
    stale = sorted(set(ALLOWED_PRIVATE) - used)
    assert not stale, f"allowed but no longer read: {stale}"


# ---------------------------------------------------------------------------------------
# Numba pinned

def numba_requirement() -> str:
    """The numba entry of pyproject.toml's [project] dependencies, e.g. "numba>=0.59,<0.69"."""
    text = (ROOT / "pyproject.toml").read_text()
    try:
        import tomllib
        deps = tomllib.loads(text)["project"]["dependencies"]
    except ModuleNotFoundError:             # Python 3.10: read the one array by hand
        block = re.search(r"^dependencies\s*=\s*\[(.*?)^\]", text, re.M | re.S).group(1)
        deps = re.findall(r'"([^"]+)"', block)
    [req] = [d for d in deps if re.match(r"numba\b", d.strip())]
    return req.strip()


def version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


def in_range(version: str, spec: str) -> bool:
    """Whether ``version`` meets the comma-separated clauses of ``spec`` (>=, >, <=, <, ==, !=)."""
    v = version_tuple(version)
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        op, bound = re.match(r"(>=|<=|==|!=|>|<|~=)\s*(\S+)", clause).groups()
        b = version_tuple(bound)
        ok = {">=": v >= b, ">": v > b, "<=": v <= b, "<": v < b, "==": v[:len(b)] == b, "!=": v[:len(b)] != b,
              "~=": v >= b and v[:len(b) - 1] == b[:-1]}[op]
        if not ok:
            return False
    return True


def test_numba_is_pinned_to_the_tested_range():
    """kernels.options' dispatcher and the cache hooks rest on Numba's internals (see
    ALLOWED_PRIVATE), so pyproject.toml names the Numba releases the project tests with an
    upper bound, and the one installed here is among them."""
    req = numba_requirement()
    spec = req[len("numba"):].split(";")[0].strip()
    assert re.search(r"<|==|~=", spec), f"pyproject.toml's {req!r} has no upper bound"
    installed = metadata.version("numba")
    try:
        from packaging.specifiers import SpecifierSet
        inside = SpecifierSet(spec).contains(installed, prereleases=True)
    except ImportError:
        inside = in_range(installed, spec)
    assert inside, f"numba {installed} is installed, outside the tested range {req!r}"


def test_in_range_reads_the_clauses():
    assert in_range("0.68.1", ">=0.59,<0.69") and not in_range("0.69.0", ">=0.59,<0.69")
    assert in_range("0.60.0", "~=0.60.0") and not in_range("0.61.0", "~=0.60.0")
