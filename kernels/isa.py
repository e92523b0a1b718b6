"""Which vector path the kernels are compiled for: ``avx512``, ``avx2`` or ``generic``.

A path is the width of one SIMD vector (``simd.lanes``) and the instructions LLVM may use;
``tiles`` sizes the GEMM's micro-tile and every block for it (by the path, the
architecture and the L1 data cache found here).

The path is the widest the target Numba compiles for can run, found by asking LLVM to
compile one 16-lane and one 8-lane FMA for that target (Numba's target: the host CPU,
or NUMBA_CPU_NAME / NUMBA_CPU_FEATURES when set).  ``TBLOCK_ISA=avx512|avx2|generic``
forces a path; forcing a narrower one than the host's also narrows the instructions
LLVM may use (AVX-512 features off for avx2; the baseline "generic" CPU for generic),
so the forced path runs the code a machine of that kind would run.  Forcing must happen
before Numba compiles anything in the process; a path the target cannot execute is an
error.

Compiled code is cached per path (``cache.py``): one path's machine code is never
loaded for another.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import llvmlite.binding as ll
from numba.core import config as numba_config

NAMES = ("avx512", "avx2", "generic")       # widest first


@dataclass(frozen=True)
class VectorPath:
    """One compilation path of the kernels, and the target it was chosen for."""
    name: str              # "avx512" | "avx2" | "generic"
    vector_bytes: int      # bytes of one SIMD vector
    cpu: str               # the CPU name LLVM compiles for
    forced: bool           # chosen by TBLOCK_ISA rather than detected
    fma: bool              # the target has a fused multiply-add instruction
    runnable: tuple        # every path this machine can execute, widest first
    arch: str              # the target's architecture (x86_64, aarch64, ...)
    l1d: int               # bytes of one core's L1 data cache (tiles.KC is sized to it)
    f16c: bool = False     # the target converts float16 to float32 in one instruction
    vnni: bool = False     # int8 dot products (vpdpbusd) on this path's vectors
    bf16_dot: bool = False  # bf16 pair dot products (vdpbf16ps) on zmm: the avx512 path only

    @property
    def key(self) -> str:
        """What compiled code depends on besides the sources (the path, and what tiles.py
        sizes the micro-tile and KC by): the cache keeps one directory per key."""
        return f"{self.name}-v{self.vector_bytes}-{self.arch}-l1d{self.l1d}"


def _probe_asm(triple: str, cpu: str, features: str, lanes: int) -> str:
    """LLVM's assembly for one <lanes x float> FMA compiled for (cpu, features)."""
    ir = f"""
declare <{lanes} x float> @llvm.fma.v{lanes}f32(<{lanes} x float>, <{lanes} x float>, <{lanes} x float>)
define void @probe(ptr %p) {{
  %a = load <{lanes} x float>, ptr %p
  %r = call <{lanes} x float> @llvm.fma.v{lanes}f32(<{lanes} x float> %a, <{lanes} x float> %a, <{lanes} x float> %a)
  store <{lanes} x float> %r, ptr %p
  ret void
}}"""
    mod = ll.parse_assembly(ir)
    mod.triple = triple
    tm = ll.Target.from_triple(triple).create_target_machine(cpu=cpu, features=features, opt=2)
    return tm.emit_assembly(mod)


def widest_path(triple: str, cpu: str, features: str) -> str:
    """The widest path LLVM can compile for this target: one 512-bit FMA instruction
    on zmm registers means avx512, a 256-bit one on ymm avx2, anything else generic."""
    if not triple.startswith(("x86_64", "i686", "i386")):
        return "generic"
    if "zmm" in _probe_asm(triple, cpu, features, 16):
        return "avx512"
    asm = _probe_asm(triple, cpu, features, 8)
    return "avx2" if "ymm" in asm and "vfmadd" in asm else "generic"


def has_fma(triple: str, cpu: str, features: str) -> bool:
    """Whether LLVM compiles a 4-lane FMA for this target without calling libm's fmaf."""
    return "fmaf" not in _probe_asm(triple, cpu, features, 4)


def _without_avx512(features: str) -> str:
    """A feature string with every AVX-512 (and AVX10, EVEX-512, AMX) feature off."""
    out = []
    for f in filter(None, features.split(",")):
        name = f[1:]
        if f[0] == "+" and name.startswith(("avx512", "avx10", "evex512", "amx")):
            f = "-" + name
        out.append(f)
    return ",".join(out)


def _numba_target() -> tuple[str, str, bool]:
    """(cpu name, feature string, already built) as Numba compiles or will compile."""
    from numba.core.registry import cpu_target
    if "_toplevel_target_context" in cpu_target.__dict__:
        cg = cpu_target.target_context.codegen()
        return cg._get_host_cpu_name(), cg._tm_features, True
    name = numba_config.CPU_NAME or ll.get_host_cpu_name()
    if numba_config.CPU_FEATURES is not None:
        feats = numba_config.CPU_FEATURES
    else:
        try:
            feats = ll.get_host_cpu_features().flatten()
        except RuntimeError:                # no feature detection on this platform
            feats = ""
    return name, feats, False


def l1d_bytes() -> int:
    """The L1 data cache of one core: Linux's sysfs, else sysconf, else 32 KiB."""
    for idx in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if (idx / "level").read_text().strip() == "1" and \
                    (idx / "type").read_text().strip() in ("Data", "Unified"):
                size = (idx / "size").read_text().strip().upper()
                mult = {"K": 1024, "M": 1024 * 1024}.get(size[-1:], 1)
                return int(size.rstrip("KM")) * mult
        except (OSError, ValueError):
            break
    try:
        size = os.sysconf("SC_LEVEL1_DCACHE_SIZE")
    except (ValueError, OSError, AttributeError):
        size = 0
    return size if size and size > 0 else 32 * 1024


def _make(name: str, triple: str, cpu: str, features: str, forced: bool, runnable: tuple) -> VectorPath:
    vector_bytes = {"avx512": 64, "avx2": 32, "generic": 16}[name]
    fma = name != "generic" or has_fma(triple, cpu, features)
    have = set(features.split(","))
    vnni = ((name == "avx512" and {"+avx512vnni", "+avx512vl"} <= have)
            or (name in ("avx512", "avx2") and "+avxvnni" in have))
    return VectorPath(name, vector_bytes, cpu, forced, fma, runnable, triple.split("-")[0], l1d_bytes(),
                      f16c="+f16c" in have, vnni=vnni, bf16_dot=name == "avx512" and "+avx512bf16" in have)


def resolve(env=None) -> VectorPath:
    """The path for this process: TBLOCK_ISA if set, else the widest Numba's target runs.
    Sets Numba's target CPU when a forced path needs a narrower one (and NUMBA_CPU_NAME /
    NUMBA_CPU_FEATURES were not set)."""
    env = os.environ if env is None else env
    triple = ll.get_process_triple()
    cpu, feats, built = _numba_target()
    widest = widest_path(triple, cpu, feats)
    runnable = NAMES[NAMES.index(widest):]
    want = env.get("TBLOCK_ISA", "").strip().lower()
    if not want:
        return _make(widest, triple, cpu, feats, False, runnable)
    if want not in NAMES:
        raise ValueError(f"TBLOCK_ISA must be one of {', '.join(NAMES)} (or unset); got {want!r}")
    if want not in runnable:
        raise ValueError(f"TBLOCK_ISA={want}: Numba compiles for {cpu!r}, which runs at most the "
                         f"{widest} path; this machine can run {', '.join(runnable)}")
    if want != widest:
        user_set = "NUMBA_CPU_NAME" in env or "NUMBA_CPU_FEATURES" in env
        if not user_set:
            if built:
                raise ValueError(f"TBLOCK_ISA={want} needs Numba to compile for a narrower CPU, but "
                                 "Numba had already compiled code in this process: set TBLOCK_ISA "
                                 "before anything imports numba, or set NUMBA_CPU_NAME/NUMBA_CPU_FEATURES")
            if want == "avx2":
                numba_config.CPU_NAME, numba_config.CPU_FEATURES = cpu, _without_avx512(feats)
            else:
                numba_config.CPU_NAME, numba_config.CPU_FEATURES = "generic", ""
            cpu, feats = numba_config.CPU_NAME, numba_config.CPU_FEATURES
    return _make(want, triple, cpu, feats, True, runnable)


ll.initialize_native_target()
ll.initialize_native_asmprinter()
PATH = resolve()
