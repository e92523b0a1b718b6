"""Compiler options shared by every kernel."""

import functools
import hashlib
import importlib
import types as pytypes

import llvmlite.binding as llvm
import llvmlite.ir as llvmir
from numba.core import cgutils, imputils, types
from numba.core.base import OverloadSelector
from numba.core.errors import TypingError
from numba.core.registry import CPUDispatcher
from numba.extending import intrinsic

from .cache import CACHE_PATH

# Fast-math flags that keep IEEE NaN/Inf semantics: no "nnan", no "ninf", so a NaN or
# an infinity in the data still propagates and masked (-inf) scores still behave.
# "reassoc"/"contract" let LLVM vectorise reductions and fuse multiply-adds; "afn"
# allows approximate library calls, "arcp" x/y -> x*(1/y), "nsz" ignores the sign of 0.
FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}

# Options of every kernel: cache (compiled code is written where tblock.kernels.cache found
# a writable folder; where there is none, Numba would refuse cache=True at import); nogil so
# that serial calls from several Python threads run at once; error_model="numpy" so x/0
# gives inf/nan instead of Python's branch and exception on every division;
# no_cfunc_wrapper: nothing takes a kernel's C address (a wrapper is compiled code too).
JIT = dict(fastmath=FASTMATH, cache=CACHE_PATH is not None, nogil=True, error_model="numpy",
           no_cfunc_wrapper=True)

# What ``parallel=True`` means for a kernel: explicit prange loops only.  The kernels write
# every loop they want parallel as a prange; Numba's search for implicitly parallel array
# expressions and loops to fuse only adds compile time (docs/perf-log.md).
PRANGE_ONLY = dict(comprehension=False, reduction=False, inplace_binop=False, setitem=False, numpy=False,
                   stencil=False, fusion=False, prange=True)


def _canonical(t):
    """The type a kernel is compiled for when compiled code passes a ``t``: no literal
    constants, and every integer an intp."""
    t = types.unliteral(t)
    return types.intp if isinstance(t, types.Integer) else t


class KernelDispatcher(CPUDispatcher):
    """Numba's CPU dispatcher, except that a call from compiled code is typed canonically
    (_canonical), so that a kernel is compiled once per dtype, not once per combination of
    argument types at its call sites, each a full LLVM compile:

    * without literal constants: offsets of 0 and flags of True or False would each
      make a build of their own;
    * every integer an intp: a parallel loop's index is an int64 while Numba types the
      function and a uint64 in the loop body it compiles, so every task called with its
      index would be built twice;
    * the arrays a kernel only reads (its ``readonly`` parameters) read-only: a writeable
      array converts to a read-only one, so a scratch buffer and the caller's input share
      one build.

    Records (kernels.records) are typed as they come: Numba converts no named tuple to
    another, so each is built with the same field types everywhere."""

    readonly_positions = ()
    standalone = False

    def get_call_template(self, args, kws):
        args = tuple(_canonical(a) for a in args)
        args = tuple(a.copy(readonly=True) if i in self.readonly_positions and isinstance(a, types.Array)
                     else a for i, a in enumerate(args))
        return super().get_call_template(args, {k: _canonical(v) for k, v in kws.items()})

    def add_overload(self, cres):
        # Numba rebuilds a library loaded from its cache without the set of functions to
        # run before loading it (reload_init): a caller compiled now that links it would
        # then be cached without them, and a later process loading that caller would find
        # the standalone kernels it calls by address unpublished (_call_by_address)
        cres.library._reload_init.update(cres.reload_init or ())
        super().add_overload(cres)
        if self.standalone:
            _call_by_address(self, cres)


class InternalKernelDispatcher(KernelDispatcher):
    """A kernel built without the wrapper that converts Python objects (each wrapper is a
    compiled function of its own, a few tens of ms of a first call): compiled code calls
    it; a call from Python is refused here, as the missing wrapper would crash."""

    def __call__(self, *args, **kws):
        raise TypeError(f"{self.py_func.__qualname__} is an internal kernel: it is called from compiled "
                        "code only")


def kernel(fn=None, readonly=(), standalone=False, internal=False, **options):
    """``@njit(**JIT, **options)`` with a KernelDispatcher: the decorator of every kernel.
    ``readonly``: names of array parameters the kernel never writes (typed read-only).
    ``standalone``: compiled code calls the kernel through its address (_call_by_address)
    instead of carrying a copy of it; for coarse kernels, called once per task.
    ``internal``: called from compiled code only (InternalKernelDispatcher)."""
    opts = {**JIT, **options, "nopython": True, "boundscheck": None}
    if internal:
        opts["no_cpython_wrapper"] = True
    if opts.get("parallel") is True:
        opts["parallel"] = dict(PRANGE_ONLY)        # a copy: Numba empties the dict it is given
    cache = opts.pop("cache")

    def wrap(f):
        names = f.__code__.co_varnames[:f.__code__.co_argcount]
        unknown = set(readonly) - set(names)
        if unknown:
            raise TypeError(f"{f.__name__} has no parameters {sorted(unknown)}")
        cls = InternalKernelDispatcher if internal else KernelDispatcher
        disp = cls(py_func=f, locals={}, targetoptions=opts)
        disp.readonly_positions = tuple(names.index(n) for n in readonly)
        disp.standalone = standalone
        if cache:
            disp.enable_caching()
        return disp
    return wrap(fn) if fn is not None else wrap


def build(fn, name, **options):
    """kernel(fn, **options) compiled as ``name``: one of the builds of one body (its
    serial and its parallel build), each a kernel of the module under its own name.  Numba
    names a function's cache files after its qualified name, and a standalone kernel's
    entry point is published under it (_symbol), so two builds of one function would
    overwrite each other's: this is a copy of fn under ``name``, with fn's code, defaults
    and globals (nothing rebound)."""
    f = pytypes.FunctionType(fn.__code__, fn.__globals__, name, fn.__defaults__, fn.__closure__)
    f.__qualname__ = name
    f.__doc__ = fn.__doc__
    return kernel(f, **options)


def _symbol(module, qualname, argtypes):
    """The name a standalone kernel's entry point is published under: one per kernel and
    signature, the same in every process (a cached caller refers to it by this name)."""
    key = hashlib.sha256(repr((module, qualname, argtypes)).encode()).hexdigest()[:16]
    return f"tblock.kernel.{qualname}.{key}"


def _publish(module, qualname, argtypes):
    """Compile, or load from the cache, the standalone kernel ``module.qualname`` for
    argtypes, which publishes its entry point (KernelDispatcher.add_overload)."""
    getattr(importlib.import_module(module), qualname).compile(argtypes)


def _call_by_address(disp, cres):
    """Make compiled callers call this overload of a standalone kernel through its address.

    Why: Numba links a copy of every callee into each caller's module, then optimises it and
    generates its machine code again there.  A parallel loop is three such modules (the
    loop's body, its gufunc wrapper and the wrapper's wrapper), all linked into the
    function's own, so a parallel block compiled each of its tasks several times over
    (docs/perf-log.md).  Instead, the entry point is published to the
    JIT linker under a fixed name (_symbol) and callers declare that name and call it, so
    each kernel is compiled once per signature.  A caller records the kernels it calls
    (its library's reload_init), so that loading it from Numba's cache publishes them first.

    Numba internals used: a user function's implementation in the target context's
    registry (_defns, as Numba's insert_user_function fills it), and a code library's
    _reload_init."""
    fndesc = cres.fndesc
    module, qualname, argtypes = disp.py_func.__module__, disp.py_func.__qualname__, tuple(cres.signature.args)
    symbol = _symbol(module, qualname, argtypes)
    llvm.add_symbol(symbol, cres.library.get_pointer_to_function(fndesc.llvm_func_name))
    republish = functools.partial(_publish, module, qualname, argtypes)

    def call(context, builder, sig, args):
        context.active_code_library._reload_init.add(republish)
        fnty = context.call_conv.get_function_type(fndesc.restype, fndesc.argtypes)
        callee = cgutils.get_or_insert_function(builder.module, fnty, symbol)
        status, res = context.call_conv.call_function(builder, callee, fndesc.restype, fndesc.argtypes, args)
        with cgutils.if_unlikely(builder, status.is_error):
            context.call_conv.return_status_propagate(builder, status)
        res = imputils.fix_returning_optional(context, builder, sig, status, res)
        return imputils.impl_ret_new_ref(context, builder, fndesc.restype, res)

    call.signature = fndesc.argtypes
    call.libs = ()                  # nothing linked: the point
    selector = OverloadSelector()
    selector.append(call, fndesc.argtypes)
    disp.targetctx._defns[cres.entry_point] = selector


@intrinsic
def borrowed(typingctx, a):
    """A view of the array a that takes no reference counts: its meminfo is null.  Numba
    counts a reference for every array a function receives, with an atomic increment and
    decrement, so a task given a dozen buffers pays two dozen atomics, a visible part of a
    small block (docs/perf-log.md).  The caller keeps a alive while the view is in use
    (keep_alive)."""
    if not isinstance(a, types.Array):
        raise TypingError(f"borrowed: an array, not {a}")

    def codegen(context, builder, sig, args):
        ary = context.make_array(a)(context, builder, value=args[0])
        ary.meminfo = cgutils.get_null_value(ary.meminfo.type)
        ary.parent = cgutils.get_null_value(ary.parent.type)
        return ary._getvalue()
    return a(a), codegen


@intrinsic
def keep_alive(typingctx, *arrays):
    """Nothing, but a use of each array: Numba frees an array after its last use, and the
    borrowed views of it must not outlive it."""
    def codegen(context, builder, sig, args):
        return context.get_dummy_value()
    return types.none(types.StarArgTuple(arrays)), codegen


@intrinsic
def borrowed_at(typingctx, like, address, n):
    """A 1-D C array of n elements of like's type (dtype, read-only or not) whose data is at
    ``address`` (an integer: a numpy array's ctypes.data), borrowed as borrowed()'s views
    are.  Lets one compiled call run blocks whose arrays are separate Python objects (a
    stack's weights and KV caches, passed as a table of addresses); the caller holds the
    arrays and checks their sizes."""
    if (not isinstance(like, types.Array) or not isinstance(address, types.Integer)
            or not isinstance(n, types.Integer)):
        raise TypingError(f"borrowed_at: an array, an integer address and a length, not {like}, {address}, {n}")
    view = like.copy(ndim=1, layout="C")

    def codegen(context, builder, sig, args):
        from numba.np.arrayobj import populate_array
        ary = context.make_array(view)(context, builder)
        itemsize = context.get_constant(types.intp, context.get_abi_sizeof(context.get_data_type(view.dtype)))
        data = builder.inttoptr(context.cast(builder, args[1], sig.args[1], types.intp), ary.data.type)
        count = context.cast(builder, args[2], sig.args[2], types.intp)
        populate_array(ary, data=data, shape=[count], strides=[itemsize], itemsize=itemsize, meminfo=None)
        return ary._getvalue()
    return view(like, address, n), codegen


def _plan_cell(context, builder, sig, args):
    """A pointer to plan[s, col] (plan: a 2-D intp array; s, col: integers)."""
    ary = context.make_array(sig.args[0])(context, builder, value=args[0])
    row = context.cast(builder, args[1], sig.args[1], types.intp)
    column = context.cast(builder, args[2], sig.args[2], types.intp)
    return cgutils.get_item_pointer(context, builder, sig.args[0], ary, [row, column])


def _counter_args(plan, *ints):
    """Whether an intrinsic's arguments are a writable 2-D intp plan and integers."""
    return (isinstance(plan, types.Array) and plan.dtype == types.intp and plan.ndim == 2 and plan.mutable
            and all(isinstance(i, types.Integer) for i in ints))


def _increment(context, builder, sig, args, ordering):
    """plan[s, col] += 1 for the arguments (plan, s, col, nthr): atomically with ``ordering``
    when nthr > 1, plainly for one thread; the value before."""
    ptr = _plan_cell(context, builder, sig, args)
    one = context.get_constant(types.intp, 1)
    many = builder.icmp_signed(">", context.cast(builder, args[3], sig.args[3], types.intp), one)
    with builder.if_else(many) as (atomic, plain):
        with atomic:
            shared = builder.atomic_rmw("add", ptr, one, ordering)
            atomic_block = builder.block
        with plain:
            alone = builder.load(ptr)
            builder.store(builder.add(alone, one), ptr)
            plain_block = builder.block
    before = builder.phi(shared.type)
    before.add_incoming(shared, atomic_block)
    before.add_incoming(alone, plain_block)
    return before


@intrinsic
def claim(typingctx, plan, s, col, nthr):
    """The next task from the counter plan[s, col]: its value, then incremented (plan an
    intp array (stages, columns)), atomically when nthr > 1.  Numba's OpenMP layer splits a
    prange statically, half the iterations to each of two threads whatever they cost;
    threads that claim tasks one at a time from a shared counter balance themselves.  One
    thread just counts: an atomic would be pure cost on a small block's many short tasks."""
    if not _counter_args(plan, s, col, nthr):
        raise TypingError(f"claim: a writable 2-D intp array and three integers, not {plan}, {s}, {col}, {nthr}")

    def codegen(context, builder, sig, args):
        return _increment(context, builder, sig, args, "monotonic")
    return types.intp(plan, s, col, nthr), codegen


@intrinsic
def finished(typingctx, plan, s, col, nthr):
    """Count one more finished task of stage s in plan[s, col], atomically and with
    release order when nthr > 1: what the task wrote is visible to a thread that sees
    the count (wait_for)."""
    if not _counter_args(plan, s, col, nthr):
        raise TypingError(f"finished: a writable 2-D intp array and three integers, not {plan}, {s}, {col}, {nthr}")

    def codegen(context, builder, sig, args):
        _increment(context, builder, sig, args, "acq_rel")
        return context.get_dummy_value()
    return types.none(plan, s, col, nthr), codegen


def _spin_hint(builder):
    """The CPU's hint that this is a spin-wait loop (x86 pause, AArch64 yield), if it has one."""
    arch = llvm.get_process_triple().split("-")[0]
    if arch in ("x86_64", "i386", "i686"):
        fn = cgutils.get_or_insert_function(builder.module, llvmir.FunctionType(llvmir.VoidType(), []),
                                            "llvm.x86.sse2.pause")
        builder.call(fn, [])
    elif arch in ("aarch64", "arm64"):
        fn = cgutils.get_or_insert_function(builder.module, llvmir.FunctionType(llvmir.VoidType(),
                                                                                 [llvmir.IntType(32)]),
                                            "llvm.aarch64.hint")
        builder.call(fn, [llvmir.Constant(llvmir.IntType(32), 1)])


@intrinsic
def wait_for(typingctx, plan, s, col, n):
    """Spin until plan[s, col] (a finished() count) reaches n, reading it with acquire
    order: the tasks' writes are then visible.  Within one parallel region, this is the
    barrier between a stage and the next; it waits for tasks, not for threads, so a
    region whose iterations one thread runs in turn (it then claims every task itself)
    cannot deadlock."""
    if not _counter_args(plan, s, col, n):
        raise TypingError(f"wait_for: a writable 2-D intp array and three integers, not {plan}, {s}, {col}, {n}")

    def codegen(context, builder, sig, args):
        ptr = _plan_cell(context, builder, sig, args)
        target = context.cast(builder, args[3], sig.args[3], types.intp)
        spin = builder.append_basic_block("wait_for.spin")
        check = builder.append_basic_block("wait_for.check")
        done = builder.append_basic_block("wait_for.done")
        builder.branch(check)
        builder.position_at_end(spin)
        _spin_hint(builder)
        builder.branch(check)
        builder.position_at_end(check)
        count = builder.load_atomic(ptr, "acquire", context.get_abi_sizeof(context.get_value_type(types.intp)))
        builder.cbranch(builder.icmp_signed(">=", count, target), done, spin)
        builder.position_at_end(done)
        return context.get_dummy_value()
    return types.none(plan, s, col, n), codegen
