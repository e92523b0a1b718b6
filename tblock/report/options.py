"""``tblock report``'s options: the command line, checked before anything runs, and the --out folder."""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from .. import peers
from ..backends import components
from ..config import BlockConfig
from ..counting import param_breakdown
from ..outfolder import OutputError, check_folder
from .family import DESCRIPTIONS, FAMILIES, block_config, config_dict, default_d_ff, default_kv_heads
from ..perf import t_grid, usable_cores

SCHEMA = "tblock-report/2"        # 2: "limits" and the roofline; 1 had "ceilings" (BLAS GEMMs), % of ceiling
SCHEMAS = ("tblock-report/1", SCHEMA)      # what --compare reads
PLOTS = ("time_vs_T.png", "flops_vs_T.png", "gflops_vs_T.png", "roofline.png")


class ReportError(ValueError):
    """A bad option, or an --out folder that gained foreign files during the run: the CLI
    prints it and exits with status 2, having written nothing."""


@dataclass
class ReportOptions:
    d_model: int = 384
    n_heads: int = 6
    T_list: list = field(default_factory=list)
    backends: list = field(default_factory=list)
    unavailable: dict = field(default_factory=dict)   # default backends that cannot run here -> why
    dtype: str = "float32"
    causal: bool = True
    out: str = "tblock-report"
    mode: str = "quick"
    threads: int = 1
    repeats: int = 3
    min_repeat_s: float = 0.01      # tiny calls are looped until one repeat lasts this long
    target_s: float = 0.1           # cheap points get more repeats, up to about this long
    point_budget_s: float = 8.0     # a backend stops once one T would take longer than this
    mem_limit_bytes: int = 2 << 30  # skip a component whose (n_heads, T, T) arrays would exceed it
    ceiling_sizes: tuple = (1024, 2048)     # the BLAS GEMM reference's n
    plots: bool = True
    seed: int = 0
    peers: list | None = None       # whole-block peers to time after the sweep; None: every installed one
    force: bool = False             # --force: write into a folder holding other files, replacing same-named ones
    family: str = "lesson"          # --family: which block is swept (tblock.report.family)
    d_ff: int | None = None         # --d-ff; None: the family's default
    n_kv_heads: int | None = None   # --n-kv-heads (llama); None: the family's default

    def config(self) -> dict:
        """report.json's "config" for these options (tblock.report.family.config_dict)."""
        return config_dict(self.family, self.d_model, self.n_heads, self.d_ff, self.n_kv_heads, self.causal,
                           self.dtype)

    def block(self) -> BlockConfig:
        """The swept block, built the one way every part of the report builds it."""
        return block_config(self.config())


MODES = {
    # (T_max in d_model, points per doubling of T, repeats, min_repeat_s, target_s, point budget s)
    "quick": (8, 1, 3, 0.01, 0.1, 8.0),
    "full": (16, 2, 7, 0.05, 0.5, 120.0),
}


def default_T_list(d_model: int, mode: str, T_min: int | None = None, T_max: int | None = None) -> list[int]:
    """Geometric T from d_model/8 to 8 d_model (16 d_model with --full): tblock.perf's grid,
    on which 4 d_model and 8 d_model, the FLOP model's crossovers, are measured."""
    top, per_doubling = MODES[mode][0], MODES[mode][1]
    return t_grid(d_model, top, per_doubling, T_min, T_max)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``report`` subcommand's options (tblock.cli builds the parser)."""
    p.add_argument("--d-model", type=int, default=384, help="d_model of the swept block (default 384)")
    p.add_argument("--n-heads", type=int, default=None,
                   help="heads (default d_model/64: 6 for 384, 12 for 768)")
    p.add_argument("--family", default="lesson",
                   help="the block swept: " + "; ".join(f"{f}: {DESCRIPTIONS[f]}" for f in FAMILIES)
                        + " (default lesson)")
    p.add_argument("--d-ff", type=int, default=None,
                   help="the FFN's hidden width (default 4*d_model; llama: 8/3*d_model rounded up to a "
                        "multiple of 64, 1536 for d_model 576 as in SmolLM2)")
    p.add_argument("--n-kv-heads", type=int, default=None,
                   help="K/V heads of --family llama, dividing n_heads (default: n_heads over its smallest "
                        "divisor >= 3, SmolLM2's 3:1 where 3 divides it; 1 is multi-query)")
    p.add_argument("--T-min", type=int, default=None, help="smallest T of the sweep (default d_model/8)")
    p.add_argument("--T-max", type=int, default=None,
                   help="largest T of the sweep (default 8*d_model, 16*d_model with --full)")
    p.add_argument("--T-list", default=None, help="explicit comma-separated T values, e.g. 64,256,1024")
    p.add_argument("-T", "--tokens", type=int, default=None, help="time a single T (same as --T-list T)")
    p.add_argument("--backends", default=None,
                   help=f"comma-separated, from {','.join(components.BACKENDS)} (default: every one that runs here)")
    p.add_argument("--dtype", default="float32", help="float32 (default) or float64")
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True,
                   help="causal mask (default) or the full square (--no-causal)")
    p.add_argument("--out", default="tblock-report", help="report folder (default ./tblock-report)")
    p.add_argument("--force", action="store_true",
                   help="write into an --out folder that holds other files: report.json, report.md and the "
                        "plots replace files of those names there, nothing else is touched")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick",
                      help="the default: T up to 8*d_model, 3 repeats; under 2 minutes on 2 cores")
    mode.add_argument("--full", dest="mode", action="store_const", const="full",
                      help="T up to 16*d_model at sqrt(2) steps, 7 repeats, larger budgets")
    p.set_defaults(mode="quick")
    p.add_argument("--threads", type=int, default=None,
                   help="threads for numba, BLAS and torch, at most the cores this process may use "
                        "(default: all of them)")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per point (median reported)")
    p.add_argument("--point-budget", type=float, default=None,
                   help="seconds one backend may spend on one T; larger T are skipped once exceeded "
                        "(default 8 quick, 120 full)")
    p.add_argument("--target-time", type=float, default=None,
                   help="seconds a cheap point keeps repeating for a sturdier median (default 0.1 quick, 0.5 full)")
    p.add_argument("--ceiling-sizes", default=None,
                   help="comma-separated n of the n x n BLAS GEMMs timed as a reference line "
                        "(default 1024,2048; --full adds 512 and 3072)")
    p.add_argument("--no-plots", dest="plots", action="store_false", help="skip the PNG plots")
    p.add_argument("--peers", default=None,
                   help=f"comma-separated, from {','.join(peers.PEERS)}, or none: other libraries' whole "
                        "block timed after the sweep, float32 only (default: every one installed)")
    p.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"),
                   help="print two saved report.json side by side with ratios, then exit")


def _positive(name, value):
    if value is not None and value < 1:
        raise ReportError(f"{name} must be >= 1, got {value}")


def _threads(given: int | None) -> int:
    """--threads, at most the cores this process may use and Numba's pool: above that numba
    would be capped and the BLAS not, and the report would time two different counts."""
    from .. import _runtime
    cores, pool = usable_cores(), _runtime.pool_size()
    top = min(cores, pool)
    if given is None:
        return top
    _positive("--threads", given)
    if given > top:
        why = (f"the {cores} cores this process may use" if cores <= pool
               else f"the size of Numba's thread pool (NUMBA_NUM_THREADS={pool})")
        raise ReportError(f"--threads must be at most {top}, {why}, got {given}")
    return given


def physical_memory() -> int | None:
    """Bytes of RAM in this machine, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _check_memory(cfg: BlockConfig, T_max: int, n_backends: int, dtype: str, ceiling_sizes) -> None:
    """Refuse sizes whose arrays cannot fit in this machine's memory at all, before anything
    is allocated: a lower bound, the weights (tblock.counting's matrices) once and once more
    per backend, one call's activations at the largest T (X, Q, the output and two more
    d_model-wide rows, K and V, the FFN's hidden layer: two of them gated), and the ceiling
    GEMMs' three float64 n x n matrices."""
    ram = physical_memory()
    if ram is None:
        return
    gib = lambda b: f"{b / 2**30:,.1f} GiB"      # noqa: E731
    itemsize = 4 if dtype == "float32" else 8
    d_model, parts = cfg.d_model, param_breakdown(cfg)
    params = parts["attention"] + parts["ffn"]
    per_token = 4 * d_model + 2 * cfg.d_kv + (2 if cfg.ffn == "gated" else 1) * cfg.d_ff
    need = itemsize * (params * (1 + n_backends) + T_max * per_token)
    if need > ram:
        raise ReportError(f"--d-model {d_model} with T up to {T_max} needs at least {gib(need)} (the weights "
                          f"once per backend and one call's activations), and this machine has {gib(ram)}: "
                          "choose a smaller --d-model or T")
    n = max(ceiling_sizes)
    if 3 * 8 * n * n > ram:
        raise ReportError(f"--ceiling-sizes {n} needs {gib(3 * 8 * n * n)} for its n x n float64 matrices, "
                          f"and this machine has {gib(ram)}: choose smaller sizes")


def _block_options(args: argparse.Namespace, d_model: int, n_heads: int) -> tuple[str, int, int | None]:
    """(family, d_ff, n_kv_heads) from --family, --d-ff and --n-kv-heads, each checked and
    defaulted (tblock.report.family); n_kv_heads stays None for the lesson's block."""
    family = args.family
    if family not in FAMILIES:
        raise ReportError(f"--family must be one of {', '.join(FAMILIES)}, got {family!r}")
    _positive("--d-ff", args.d_ff)
    d_ff = default_d_ff(family, d_model) if args.d_ff is None else args.d_ff
    if family == "lesson":
        if args.n_kv_heads is not None:
            raise ReportError(f"--n-kv-heads applies to --family llama only: the lesson's block has "
                              f"n_kv_heads = n_heads, got --n-kv-heads {args.n_kv_heads}")
        return family, d_ff, None
    _positive("--n-kv-heads", args.n_kv_heads)
    n_kv_heads = default_kv_heads(n_heads) if args.n_kv_heads is None else args.n_kv_heads
    if n_heads % n_kv_heads:
        raise ReportError(f"--n-kv-heads must divide n_heads={n_heads}, got {n_kv_heads}")
    if (d_model // n_heads) % 2:
        raise ReportError(f"--n-heads: rotary positions (--family {family}) turn pairs of a head's columns, so "
                          f"d_k = d_model / n_heads must be even, got d_k={d_model // n_heads}")
    return family, d_ff, n_kv_heads


def resolve_options(args: argparse.Namespace) -> ReportOptions:
    """Check every option and turn the namespace into ReportOptions; raises ReportError
    naming the option, before anything is measured or written."""
    _positive("--d-model", args.d_model)
    d_model = args.d_model
    if args.n_heads is None:
        if d_model % 64:
            raise ReportError(f"--n-heads is needed: d_model={d_model} is not a multiple of 64, "
                              "so there is no default head count")
        n_heads = d_model // 64
    else:
        _positive("--n-heads", args.n_heads)
        n_heads = args.n_heads
    if d_model % n_heads:
        raise ReportError(f"--n-heads: d_model={d_model} is not divisible by n_heads={n_heads}")
    family, d_ff, n_kv_heads = _block_options(args, d_model, n_heads)
    if args.dtype not in ("float32", "float64"):
        raise ReportError(f"--dtype must be float32 or float64, got {args.dtype!r}")

    explicit = [args.T_list is not None, args.tokens is not None, args.T_min is not None or args.T_max is not None]
    if sum(explicit) > 1:
        raise ReportError("--T-list, -T/--tokens and --T-min/--T-max cannot be combined: give one of them")
    if args.T_list is not None:
        try:
            T_list = sorted({int(x) for x in args.T_list.split(",") if x.strip()})
        except ValueError:
            raise ReportError(f"--T-list must be comma-separated integers, got {args.T_list!r}") from None
        if not T_list:
            raise ReportError("--T-list is empty: the T range must hold at least one T")
        if T_list[0] < 1:
            raise ReportError(f"--T-list values must be >= 1, got {T_list[0]}")
    elif args.tokens is not None:
        _positive("-T/--tokens", args.tokens)
        T_list = [args.tokens]
    else:
        _positive("--T-min", args.T_min)
        _positive("--T-max", args.T_max)
        lo = max(1, d_model // 8) if args.T_min is None else args.T_min
        hi = MODES[args.mode][0] * d_model if args.T_max is None else args.T_max
        if lo > hi:
            raise ReportError(f"the T range is empty: --T-min {lo} is greater than --T-max {hi}")
        T_list = default_T_list(d_model, args.mode, lo, hi)

    unavailable = {}
    if args.backends is None:
        backends = []
        for b in components.BACKENDS:
            ok, why = components.backend_status(b)
            (backends.append(b) if ok else unavailable.__setitem__(b, why))
    else:
        backends = [b.strip() for b in args.backends.split(",") if b.strip()]
        if not backends:
            raise ReportError("--backends is empty: name at least one backend")
        for b in backends:
            if b not in components.BACKENDS:
                raise ReportError(f"--backends: unknown backend {b!r}; choose from {', '.join(components.BACKENDS)}")
            ok, why = components.backend_status(b)
            if not ok:
                raise ReportError(f"--backends: backend {b!r} cannot run here: {why}")
        backends = list(dict.fromkeys(backends))     # drop repeats, keep the order

    threads = _threads(args.threads)
    _positive("--repeats", args.repeats)
    if args.point_budget is not None and not args.point_budget > 0:
        raise ReportError(f"--point-budget must be > 0 seconds, got {args.point_budget}")
    if args.target_time is not None and not (math.isfinite(args.target_time) and args.target_time >= 0):
        raise ReportError(f"--target-time must be a finite number of seconds >= 0, got {args.target_time}")
    ceiling_sizes = (1024, 2048) if args.mode == "quick" else (512, 1024, 2048, 3072)
    if args.ceiling_sizes is not None:
        try:
            ceiling_sizes = tuple(int(x) for x in args.ceiling_sizes.split(",") if x.strip())
        except ValueError:
            raise ReportError(f"--ceiling-sizes must be comma-separated integers, got {args.ceiling_sizes!r}") from None
        if not ceiling_sizes or min(ceiling_sizes) < 1:
            raise ReportError(f"--ceiling-sizes must hold at least one n >= 1, got {args.ceiling_sizes!r}")
    peer_names = None
    if args.peers is not None:
        peer_names = [x.strip() for x in args.peers.split(",") if x.strip() and x.strip() != "none"]
        for x in peer_names:
            if x not in peers.PEERS:
                raise ReportError(f"--peers: unknown peer {x!r}; choose from {', '.join(peers.PEERS)}, or none")
        peer_names = list(dict.fromkeys(peer_names))
    cfg = block_config({"family": family, "d_model": d_model, "n_heads": n_heads, "d_ff": d_ff,
                        "n_kv_heads": n_kv_heads, "causal": args.causal})
    _check_memory(cfg, max(T_list), len(backends), args.dtype, ceiling_sizes)
    out = check_out_folder(args.out, force=args.force)
    _, _, repeats, min_repeat_s, target_s, budget = MODES[args.mode]
    return ReportOptions(
        d_model=d_model, n_heads=n_heads, T_list=T_list, backends=backends, unavailable=unavailable,
        dtype=args.dtype, causal=args.causal, out=str(out), mode=args.mode, threads=threads,
        repeats=repeats if args.repeats is None else args.repeats, min_repeat_s=min_repeat_s,
        target_s=target_s if args.target_time is None else args.target_time,
        point_budget_s=budget if args.point_budget is None else args.point_budget,
        ceiling_sizes=ceiling_sizes,
        plots=args.plots, peers=peer_names, force=args.force, family=family, d_ff=d_ff, n_kv_heads=n_kv_heads)


def not_written_by_tblock(folder: Path) -> list[str]:
    """The entries of ``folder`` that a tblock report did not write: all of them unless its
    report.json carries a tblock report schema, else all but report.json, report.md, the plots."""
    names = sorted(p.name for p in folder.iterdir())
    try:
        schema = json.loads((folder / "report.json").read_text()).get("schema")
    except (OSError, ValueError, AttributeError):      # missing, not JSON, not an object
        schema = None
    if not (isinstance(schema, str) and schema.startswith("tblock-report/")):
        return names
    ours = {"report.json", "report.md", *PLOTS}
    return [n for n in names if n not in ours or (folder / n).is_symlink() or not (folder / n).is_file()]


def written_by_tblock(path: Path) -> bool:
    """Whether the file ``path`` belongs to a tblock report (tblock.outfolder's ``ours``)."""
    return path.name not in not_written_by_tblock(path.parent)


def refuse_foreign(out: str, folder: Path) -> None:
    foreign = not_written_by_tblock(folder)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ReportError(f"--out {out!r} holds files a tblock report did not write ({shown}); refusing "
                          "to write there: choose a new or empty folder, or one that holds only a tblock "
                          "report, or give --force (report.json, report.md and the plots then replace "
                          "files of those names, and nothing else is touched)")


def check_out_folder(out: str, force: bool = False) -> Path:
    """The report folder must be creatable, or empty, or hold nothing but a previous tblock
    report (whose files are replaced), unless ``force``; never removed or renamed itself."""
    path = Path(out).expanduser().absolute()
    if path.is_dir() and not force:
        refuse_foreign(out, path)
    try:
        return check_folder(out, "--out", ("report.json", "report.md", *PLOTS), written_by_tblock, force)
    except OutputError as e:
        raise ReportError(str(e)) from None
