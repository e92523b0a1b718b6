"""``tblock lesson``: Lesson 13's walk-through on its worked example, numbers beside the lesson's,
and the lesson's figures as PNG files.

Everything is computed through the public API (``tblock.forward``, ``Stack``) and
``tblock.lesson.analysis`` and ``depth`` on the chosen backend. The worked example's weights are shipped; the
lesson's other weights (block 2 drawn with seed(14), the Systems-lens stack with seed(1300))
are drawn again by ``tblock.rustlab``, the lesson's own generator reproduced bit for bit, so
every number printed beside the lesson's comes from the lesson's own weights.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace

import numpy as np

from ..api import forward
from ..backends import DEFAULT_BACKEND
from ..config import BlockConfig
from ..counting import param_breakdown, param_count
from ..outfolder import OutputError, check_folder, write_folder
from ..rustlab import Rng
from ..weights import init_weights
from ..worked_example import LESSON_PRINTED, load_worked_example
from . import analysis, depth

# the Systems-lens table as the lesson prints it: N -> (ratio unscaled, scaled, max gain unscaled, scaled)
LESSON_SYSTEMS = {
    2: (2.110514497741098, 1.2876085953458334, 2.1436353496367158, 1.6271641931427017),
    4: (3.4271154139164315, 1.3965030076089215, 2.1436353496367158, 1.4986869084529262),
    8: (4.259092877559233, 1.2613544565561314, 2.1436353496367158, 1.3894371112628576),
}
LESSON_BLOCK2_NORM = 14.85162630563989      # |H| after the lesson's block 2 (seed(14) weights)
BLOCK2_SEED = 14                             # the lesson's seed(14) before block 2's weights
STACK_SEED = 1300                            # the lesson's seed(1300) before each stack_trace
FIGURES = ("lesson13_stream.png", "lesson13_perturbation.png", "lesson13_depth.png", "lesson13_entropy.png")
FIGURE_MARK = "tblock lesson"   # the figures' PNG Software field: a later run knows them as its own


def _vec(v, digits=6):
    return "[" + ", ".join(f"{float(x):.{digits}f}" for x in np.ravel(v)) + "]"


def _row(out, name, lesson, ours, digits=15):
    """One comparison line: name, the lesson's value, ours, and the largest difference
    (a scalar to ``digits`` significant digits)."""
    diff = float(np.max(np.abs(np.asarray(ours, dtype=float) - np.asarray(lesson, dtype=float))))
    if np.ndim(lesson) == 0:
        out(f"  {name:<30} lesson {float(lesson):<22.{digits}g} ours {float(ours):<22.{digits}g} |diff| {diff:.1e}")
    else:
        out(f"  {name:<30} lesson {_vec(lesson)}")
        out(f"  {'':<30} ours   {_vec(ours)}   max |diff| {diff:.1e}")


def walkthrough(backend=None, out=print):
    """Print the walk-through; return the numbers the figures need."""
    ex = load_worked_example()
    cfg, H_in, w = ex.cfg, ex.H_in, ex.weights
    P = LESSON_PRINTED
    n = np.linalg.norm
    _, tr = forward(H_in, w, cfg, backend=backend, trace=True)
    out(f"Lesson 13: the transformer block, on the lesson's worked example (backend {backend or DEFAULT_BACKEND})")
    out(f"  T=4, d_model={cfg.d_model}, {cfg.n_heads} heads of d_k={cfg.d_k}, d_ff={cfg.d_ff}, "
        f"Pre-LN, causal, GELU ({cfg.activation}), weights drawn by the lesson with seed(13)")
    out("")
    out("Shapes (every tensor on the residual stream is (T, d_model) = (4, 8))")
    # (name, the shape the lesson prints, our array)
    shapes = [("H_in", (4, 8), H_in), ("W_Q, W_K, W_V, W_O (each)", (8, 8), w.w_q),
              ("W_ff1 (d_model -> d_ff)", (8, 32), w.w_ff1), ("W_ff2 (d_ff -> d_model)", (32, 8), w.w_ff2),
              ("LN1(H_in)", (4, 8), tr.H_norm1), ("MHA output A_out", (4, 8), tr.A_out),
              ("H_mid", (4, 8), tr.H_mid), ("LN2(H_mid)", (4, 8), tr.H_norm2),
              ("FFN hidden F_pre", (4, 32), tr.F_pre), ("FFN output F_out", (4, 8), tr.F_out),
              ("block output H_out", (4, 8), tr.H_out)]
    for name, lesson_shape, a in shapes:
        out(f"  {name:<30} lesson {str(lesson_shape):<10} ours {a.shape}")
    out("")
    out("Magnitudes")
    _row(out, "|H_in|", P["norm_H_in"], n(H_in))
    _row(out, "|H_mid|", P["norm_H_mid"], n(tr.H_mid))
    _row(out, "|H_out|", P["norm_H_out"], n(tr.H_out))
    _row(out, "|A_out| / |H_in|", P["mha_ratio"], n(tr.A_out) / n(H_in))
    _row(out, "|F_out| / |H_mid|", P["ffn_ratio"], n(tr.F_out) / n(tr.H_mid))
    _row(out, "H_mid row 1, first 4 values", P["H_mid_row1_first4"], tr.H_mid[0, :4])
    out("")

    out("Signals lens: attention rows are causal, non-negative, unit-DC-gain FIR tap vectors")
    fb = analysis.filter_bank(H_in, w, cfg, backend=backend)
    for t in range(4):
        _row(out, f"head 1 taps, row {t + 1}", P["A_1"][t], fb.A[0, t])
    _row(out, "row sums of A_1", [1.0] * 4, fb.row_sums[0])
    out(f"  {'max |A_1 V_const - 0.7|':<30} lesson 1.1e-16 (floating-point noise)   ours {fb.dc_gain_error:.1e}"
        f"   (both heads)")
    out(f"  {'taps above the diagonal':<30} max {fb.causal_leak:g}, smallest tap {fb.min_tap:g}")
    _row(out, "head 2, row 4 taps", P["A_2_row4"], fb.A[1, 3])
    out("")
    out("Information lens: row entropy (bits) against the log2 t bound")
    _row(out, "log2 t bound", P["entropy_bound_bits"], fb.bound)
    _row(out, "row entropy, head 1", P["entropy_head1_bits"], fb.entropies[0])
    _row(out, "row entropy, head 2", P["entropy_head2_bits"], fb.entropies[1])
    out("")

    out("The two mixing axes: bump channel 1 of token 3 by +1.0 at each sublayer's input")
    pt = analysis.perturb(H_in, w, cfg, token=2, channel=0, delta=1.0, backend=backend)
    _row(out, "sum |dA_out| per token (MHA)", P["perturb_mha_sums"], pt.mha_sums)
    _row(out, "sum |dF_out| per token (FFN)", P["perturb_ffn_sums"], pt.ffn_sums)
    out(f"  {'max |dA_out| on tokens 1-2':<30} lesson 0   ours {pt.mha_max_before:g}")
    out(f"  {'channels of token 3 (FFN)':<30} lesson 8 of 8   ours {pt.ffn_channels_touched} of {cfg.d_model}")
    out("")

    out(f"Stacking two blocks (block 2: the lesson's seed({BLOCK2_SEED}) weights, drawn by tblock.rustlab)")
    w2 = depth.lesson_block_weights(cfg, Rng(BLOCK2_SEED))
    H_out2 = forward(tr.H_out, w2, cfg, backend=backend)
    # 16 digits: the lesson prints block 2's norm so (Rust's shortest round-trip form)
    _row(out, "after block 1 |H|", P["norm_H_out"], n(tr.H_out), digits=16)
    _row(out, "after block 2 |H|", LESSON_BLOCK2_NORM, n(H_out2), digits=16)
    out(f"  {'after block 2 shape':<30} lesson (4, 8)      ours {H_out2.shape}")
    out("")

    out("Parameter count per block (d_model=8, d_ff=32)")
    parts = param_breakdown(cfg)
    out(f"  attention {parts['attention']} (lesson 256), FFN matmul {parts['ffn']} (lesson 512), "
        f"FFN biases {parts['ffn_bias']} (lesson 40)")
    out(f"  {'total per block':<30} lesson {P['params']}   ours {param_count(cfg, ln_affine=False)}")
    out(f"  {'with LN affines (+4 d_model)':<30} lesson {P['params_with_ln_affine']}   ours "
        f"{param_count(cfg, ln_affine=True)}")
    out(f"  {'FFN / attention':<30} lesson 2   ours {parts['ffn'] / parts['attention']:g}")
    out("")

    out(f"Systems lens: N fresh blocks on H_in, branches as initialised vs scaled by 1/sqrt(2N)")
    out(f"  the lesson's blocks: seed({STACK_SEED}), then stack_trace's draws, by tblock.rustlab")
    table = depth.systems_table(H_in, Ns=(2, 4, 8), cfg=cfg, seed=STACK_SEED, backend=backend,
                                   generator="rustlab")
    out(f"  {'':<8}{'N':>3}  {'|H_N|/|H_0| unscaled':>21} {'scaled':>9}   {'max sigma_max(J) unscaled':>26} {'scaled':>9}")
    for r in table:
        lesson_row = LESSON_SYSTEMS[r.N]
        ours_row = (r.unscaled.norm_ratio, r.scaled.norm_ratio, r.unscaled.max_gain, r.scaled.max_gain)
        # the gains come from a 1e-5 finite difference, which magnifies rounding ~1e5 times
        diff = [abs(a - b) for a, b in zip(ours_row, lesson_row)]
        for who, (nu, ns, gu, gs) in (("lesson", lesson_row), ("ours", ours_row)):
            out(f"  {who:<8}{r.N:>3}  {nu:>21.4f} {ns:>9.4f}   {gu:>26.4f} {gs:>9.4f}"
                + (f"   max |diff| {max(diff[:2]):.1e} (ratios), {max(diff[2:]):.1e} (gains)"
                   if who == "ours" else ""))
    deep = table[-1]
    out(f"  N=8 per-block gain (forward difference), unscaled {_vec(deep.unscaled.gains, 3)}")
    out(f"  {'':<40}scaled   {_vec(deep.scaled.gains, 3)}")
    agree = max(float(np.max(np.abs(r.unscaled.gains - r.unscaled.gains_central))) for r in table)
    out(f"  forward vs central difference sigma_max: max |diff| {agree:.1e} (step 1e-5)")
    out("")

    out("Exercises")
    big = BlockConfig(d_model=64, n_heads=8)
    H_big = np.random.default_rng(1).standard_normal((16, 64))
    _, trb = forward(H_big, init_weights(big, 1, dtype=np.float64), big, backend=backend, trace=True)
    out(f"  1. T=16, d_model=64, H=8: H_in {H_big.shape}, H_mid {trb.H_mid.shape}, H_out {trb.H_out.shape}, "
        f"F_pre {trb.F_pre.shape}, F_out {trb.F_out.shape}; only the per-head pieces depend on H: "
        f"A {trb.A.shape}, Q_h (16, {big.d_k})")
    nores = depth.stack_trace(H_in, 2, 1.0, [w, w2], cfg, backend=backend, residual=False)
    withres = depth.stack_trace(H_in, 2, 1.0, [w, w2], cfg, backend=backend)
    out(f"  2. no residuals, the lesson's blocks 1 and 2: |H| {_vec(nores.norms, 3)} "
        f"(with residuals {_vec(withres.norms, 3)})")
    out(f"     sigma_max(J) per block without the identity path {_vec(nores.gains, 3)}, with it "
        f"{_vec(withres.gains, 3)}")
    post = replace(cfg, norm="post")
    H_post = forward(H_in, w, post, backend=backend)
    out(f"  3. Post-LN on the lesson's weights: H_out shape {H_post.shape}, |H_out| {n(H_post):.6f} "
        f"(rows standardised: |H_out| ~ sqrt(T d_model) = {math.sqrt(32):.6f})")
    p1 = analysis.perturb(H_in, w, cfg, token=0, backend=backend)
    out(f"  4. bump token 1: sum |dA| per token {_vec(p1.mha_sums)}: every row t >= 1 can move, the most "
        f"a causal block allows; FFN {_vec(p1.ffn_sums)}")
    out(f"  5. LN affines add {analysis.ln_affine_delta(cfg)} per block (808 -> {param_count(cfg, ln_affine=True)}); "
        f"4d / 12d^2 = 1/(3d) is {analysis.ln_affine_fraction(8):.1%} at d_model=8, "
        f"{analysis.ln_affine_fraction(768):.3%} at 768; under 1% from d_model = "
        f"{analysis.ln_affine_negligible_from(0.01)}")
    return dict(H_in=H_in, A_out=tr.A_out, F_out=tr.F_out, perturbation=pt, filter_bank=fb, depth=deep)


def _heatmap(ax, M, title, plt):
    lim = float(np.max(np.abs(M))) or 1.0                  # symmetric, signed colour scale
    im = ax.imshow(M, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
    T, d = M.shape
    ax.set_xticks(range(d), [str(j + 1) for j in range(d)])
    ax.set_yticks(range(T), [str(t + 1) for t in range(T)])
    ax.set_xlabel("channel")
    ax.set_ylabel("token (time)")
    ax.set_title(title, fontsize=10)
    for t in range(T):
        for j in range(d):
            dark = abs(M[t, j]) > 0.6 * lim                  # white text on the deep colours
            ax.text(j, t, f"{M[t, j]:.2f}", ha="center", va="center", fontsize=6,
                    color="white" if dark else "black")
    plt.colorbar(im, ax=ax, fraction=0.046, pad=0.04)


def _is_our_figure(path) -> bool:
    # a PNG whose Software field says a lesson run wrote it (savefig's metadata below)
    with open(path, "rb") as f:
        head = f.read(4096)
    return head.startswith(b"\x89PNG") and b"Software\x00" + FIGURE_MARK.encode() in head


def write_figures(data, out_dir) -> list[str]:
    """The lesson's four figures as PNG into ``out_dir`` (made if missing), replacing what
    is there; needs matplotlib (the ``plot`` extra).  run_lesson writes them safely."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, name) for name in FIGURES]
    savefig = lambda fig, path: fig.savefig(path, dpi=110, metadata={"Software": FIGURE_MARK})  # noqa: E731

    fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
    for ax, M, title in zip(axes, (data["H_in"], data["A_out"], data["F_out"]),
                            ("H_in", "MHA correction A_out", "FFN correction F_out")):
        _heatmap(ax, M, title, plt)
    fig.suptitle("The residual stream and the two corrections the block adds to it")
    fig.tight_layout()
    savefig(fig, paths[0])
    plt.close(fig)

    pt = data["perturbation"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    _heatmap(axes[0], pt.dA, "MHA response to a bump at token 3", plt)
    _heatmap(axes[1], pt.dF, "FFN response to a bump at token 3", plt)
    fig.suptitle("Attention mixes rows (causally); the FFN mixes channels within one row")
    fig.tight_layout()
    savefig(fig, paths[1])
    plt.close(fig)

    deep = data["depth"]
    N = len(deep.unscaled.gains)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    ax.semilogy(range(N + 1), deep.unscaled.norms, "o-", color="red", label="branch scale 1")
    ax.semilogy(range(N + 1), deep.scaled.norms, "o-", color="blue", label="branch scale 1/sqrt(2N)")
    ax.axhline(deep.unscaled.norms[0], color="gray", ls="--", label="|H_0|")
    ax.set_title(f"|H_l| along an {N}-block stack (the lesson's seed({STACK_SEED}) weights)")
    ax.set_xlabel("block l")
    ax.set_ylabel("|H_l|")
    ax.legend()
    ax = axes[1]
    ax.plot(range(1, N + 1), deep.unscaled.gains, "o-", color="red", label="branch scale 1")
    ax.plot(range(1, N + 1), deep.scaled.gains, "o-", color="blue", label="branch scale 1/sqrt(2N)")
    ax.axhline(1.0, color="gray", ls="--", label="unity gain")
    ax.set_title("per-block gain sigma_max(J_l) at token T")
    ax.set_xlabel("block l")
    ax.set_ylabel("sigma_max")
    ax.legend()
    fig.tight_layout()
    savefig(fig, paths[2])
    plt.close(fig)

    fb = data["filter_bank"]
    T = len(fb.bound)
    fig, ax = plt.subplots(figsize=(6, 4))
    t = np.arange(1, T + 1)
    ax.plot(t, fb.bound, "o--", color="gray", label="log2 t (uniform prefix average)")
    for h, color in zip(range(fb.entropies.shape[0]), ("blue", "red", "green", "purple")):
        ax.plot(t, fb.entropies[h], "o-", color=color, label=f"head {h + 1}")
    ax.set_title("attention row entropy vs the uniform bound")
    ax.set_xlabel("query position t")
    ax.set_ylabel("bits")
    ax.set_xticks(t)
    ax.legend()
    fig.tight_layout()
    savefig(fig, paths[3])
    plt.close(fig)
    return paths


def run_lesson(out_dir="lesson13-figures", backend=None, out=print, force=False) -> int:
    """The walk-through, then the figures into ``out_dir`` by tblock.outfolder's rules: a
    figure of an earlier run is replaced, a user's file of the same name only with ``force``.
    A folder that cannot hold them raises ValueError naming it, before the walk-through
    (the CLI: exit 2, no traceback)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        matplotlib = None
    if matplotlib is not None:
        path = _figures_folder(lambda: check_folder(out_dir, "--out", FIGURES, _is_our_figure, force))
    data = walkthrough(backend=backend, out=out)
    out("")
    if matplotlib is None:
        out("Figures skipped: matplotlib is not installed (pip install 'tblock-cpu[plot]').")
        return 0
    fill = lambda staging: [os.path.basename(f) for f in write_figures(data, staging)]  # noqa: E731
    for written in _figures_folder(lambda: write_folder(path, out_dir, "--out", fill, _is_our_figure, force)):
        out(f"wrote {os.path.join(out_dir, written.name)}")
    return 0


def _figures_folder(action):
    # action(), its OutputError worded for the figures (a ValueError, which the CLI reports)
    try:
        return action()
    except OutputError as e:
        raise ValueError(f"{e.option} {e.given!r} cannot hold the figures: {e.reason}") from None
