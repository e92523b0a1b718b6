/*
 * tblock_ref.c: the plain C99 reference of Lesson 13's transformer block.
 * See tblock_ref.h for the equations, the conventions and the API.
 *
 * Layout of this file:
 *   1. status codes and their messages
 *   2. size arithmetic that cannot overflow
 *   3. argument checks
 *   4. the math: static helpers that trust their arguments
 *   5. the entry points: check everything, then call the math
 *   6. stored weight formats: tb_dequantize, its checks and its unpacking
 *
 * Loops index with size_t; every product of dimensions is computed once,
 * overflow-checked, in tb_sizes, before any loop runs.
 */
#include "tblock_ref.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* ======================================================================
 * 1. Status codes
 * ====================================================================== */

static const char *const STATUS_NAMES[TB_STATUS_COUNT] = {
    [TB_OK]                    = "TB_OK",
    [TB_ERR_NULL_ARG]          = "TB_ERR_NULL_ARG",
    [TB_ERR_NULL_WEIGHT]       = "TB_ERR_NULL_WEIGHT",
    [TB_ERR_UNEXPECTED_WEIGHT] = "TB_ERR_UNEXPECTED_WEIGHT",
    [TB_ERR_NULL_TRACE]        = "TB_ERR_NULL_TRACE",
    [TB_ERR_DIM]               = "TB_ERR_DIM",
    [TB_ERR_HEADS]             = "TB_ERR_HEADS",
    [TB_ERR_HEAD_INDEX]        = "TB_ERR_HEAD_INDEX",
    [TB_ERR_NORM]              = "TB_ERR_NORM",
    [TB_ERR_ACTIVATION]        = "TB_ERR_ACTIVATION",
    [TB_ERR_FLAG]              = "TB_ERR_FLAG",
    [TB_ERR_EPS]               = "TB_ERR_EPS",
    [TB_ERR_OVERFLOW]          = "TB_ERR_OVERFLOW",
    [TB_ERR_INPUT_SIZE]        = "TB_ERR_INPUT_SIZE",
    [TB_ERR_OUTPUT_SIZE]       = "TB_ERR_OUTPUT_SIZE",
    [TB_ERR_WEIGHT_SIZE]       = "TB_ERR_WEIGHT_SIZE",
    [TB_ERR_SCRATCH_SIZE]      = "TB_ERR_SCRATCH_SIZE",
    [TB_ERR_TRACE_SIZE]        = "TB_ERR_TRACE_SIZE",
    [TB_ERR_OVERLAP]           = "TB_ERR_OVERLAP",
    [TB_ERR_NOT_CAUSAL]        = "TB_ERR_NOT_CAUSAL",
    [TB_ERR_CACHE_RANGE]       = "TB_ERR_CACHE_RANGE",
    [TB_ERR_CACHE_SIZE]        = "TB_ERR_CACHE_SIZE",
    [TB_ERR_FORMAT]            = "TB_ERR_FORMAT",
    [TB_ERR_BLOCK]             = "TB_ERR_BLOCK",
    [TB_ERR_DATA_SIZE]         = "TB_ERR_DATA_SIZE",
    [TB_ERR_NOT_FINITE]        = "TB_ERR_NOT_FINITE",
    [TB_ERR_DOT]               = "TB_ERR_DOT",
    [TB_ERR_KV]                = "TB_ERR_KV",
    [TB_ERR_NORM_TYPE]         = "TB_ERR_NORM_TYPE",
    [TB_ERR_FFN]               = "TB_ERR_FFN",
    [TB_ERR_POSITIONS]         = "TB_ERR_POSITIONS",
    [TB_ERR_ROPE]              = "TB_ERR_ROPE",
    [TB_ERR_KV_HEADS]          = "TB_ERR_KV_HEADS",
};

static const char *const STATUS_MESSAGES[TB_STATUS_COUNT] = {
    [TB_OK]                    = "success",
    [TB_ERR_NULL_ARG]          = "a required pointer argument is NULL",
    [TB_ERR_NULL_WEIGHT]       = "a weight the config needs is NULL (or LayerNorm gamma is given without beta)",
    [TB_ERR_UNEXPECTED_WEIGHT] = "an optional weight is given although the config says it is absent "
                                 "(has_ffn_bias / has_ln_affine / has_attn_bias is 0, b_o without "
                                 "TB_BIAS_QKVO, a beta with RMSNorm, w_gate / b_gate without the gated FFN)",
    [TB_ERR_NULL_TRACE]        = "a trace struct is given but one of its arrays is NULL",
    [TB_ERR_DIM]               = "a dimension (B, T, d_model, n_heads, d_ff, rows, cols, d_in or d_out) is < 1",
    [TB_ERR_HEADS]             = "d_model is not divisible by n_heads (tb_rotary_rows: cols is not a multiple of d_k)",
    [TB_ERR_HEAD_INDEX]        = "the head index is outside 0 .. n_heads-1",
    [TB_ERR_NORM]              = "norm is not TB_NORM_PRE (0) or TB_NORM_POST (1)",
    [TB_ERR_ACTIVATION]        = "activation is not TB_ACT_GELU_TANH (0), TB_ACT_GELU_ERF (1), TB_ACT_RELU (2) "
                                 "or TB_ACT_SILU (3)",
    [TB_ERR_FLAG]              = "a flag (causal, has_ffn_bias, has_ln_affine) is not 0 or 1, or has_attn_bias "
                                 "is not TB_BIAS_NONE (0), TB_BIAS_QKVO (1) or TB_BIAS_QKV (2)",
    [TB_ERR_EPS]               = "eps must be positive and finite",
    [TB_ERR_OVERFLOW]          = "a buffer size computed from the dimensions does not fit in size_t",
    [TB_ERR_INPUT_SIZE]        = "an input buffer is shorter than its shape needs",
    [TB_ERR_OUTPUT_SIZE]       = "an output buffer is shorter than its shape needs",
    [TB_ERR_WEIGHT_SIZE]       = "a weight buffer is shorter than its shape needs",
    [TB_ERR_SCRATCH_SIZE]      = "the scratch buffer is shorter than it must be (see tb_scratch_len)",
    [TB_ERR_TRACE_SIZE]        = "a trace buffer is shorter than its shape needs",
    [TB_ERR_OVERLAP]           = "an output buffer overlaps another buffer of the same call",
    [TB_ERR_NOT_CAUSAL]        = "a KV cache needs a causal block (causal = 1): with every key visible, "
                                 "a new token would change the earlier rows",
    [TB_ERR_CACHE_RANGE]       = "the new tokens do not fit in the cache: past must be >= 0 and "
                                 "past + T_new <= max_T",
    [TB_ERR_CACHE_SIZE]        = "a key or value cache is shorter than (B, n_kv_heads, max_T, d_k)",
    [TB_ERR_FORMAT]            = "format is not TB_FMT_BF16 (0), TB_FMT_Q8_0 (1) or TB_FMT_Q4_0 (2)",
    [TB_ERR_BLOCK]             = "d_in is not a multiple of 32, the inputs of one Q8_0 or Q4_0 block",
    [TB_ERR_DATA_SIZE]         = "data_len is not exactly the stored size in bytes of a (d_in, d_out) "
                                 "matrix in this format",
    [TB_ERR_NOT_FINITE]        = "a stored value is not finite: a block's float16 scale (Q8_0, Q4_0) "
                                 "or a bf16 weight is NaN or infinite",
    [TB_ERR_DOT]               = "dot is not TB_DOT_EXACT (0), TB_DOT_Q8 (1) or TB_DOT_BF16 (2), or is TB_DOT_Q8 with "
                                 "d_model or d_ff not a multiple of 32",
    [TB_ERR_KV]                = "kv is not TB_KV_EXACT (0), TB_KV_BF16 (1) or TB_KV_Q8 (2)",
    [TB_ERR_NORM_TYPE]         = "norm_type is not TB_LAYERNORM (0) or TB_RMSNORM (1)",
    [TB_ERR_FFN]               = "ffn is not TB_FFN_MLP (0) or TB_FFN_GATED (1), or not the FFN this entry point "
                                 "computes (tb_ffn: the two-matrix one; tb_gated_ffn: the gated one)",
    [TB_ERR_POSITIONS]         = "positions is not TB_POS_NONE (0) or TB_POS_ROTARY (1) "
                                 "(tb_rotary_rows needs TB_POS_ROTARY)",
    [TB_ERR_ROPE]              = "rotary positions need rope_theta and rope_scale positive and finite, "
                                 "and d_k = d_model / n_heads even",
    [TB_ERR_KV_HEADS]          = "n_kv_heads must be 0 (meaning n_heads) or a positive divisor of n_heads",
};

const char *tb_status_name(int status)
{
    if (status < 0 || status >= TB_STATUS_COUNT || STATUS_NAMES[status] == NULL)
        return "TB_UNKNOWN_STATUS";
    return STATUS_NAMES[status];
}

const char *tb_status_message(int status)
{
    if (status < 0 || status >= TB_STATUS_COUNT || STATUS_MESSAGES[status] == NULL)
        return "unknown status code";
    return STATUS_MESSAGES[status];
}

/* Return from the enclosing function with the status of expr unless it is TB_OK. */
#define TRY(expr)                             \
    do {                                      \
        tb_status try_status_ = (expr);       \
        if (try_status_ != TB_OK)             \
            return try_status_;               \
    } while (0)

/* ======================================================================
 * 2. Size arithmetic
 * ====================================================================== */

/* The most doubles a buffer can hold with its size in bytes still a size_t. */
#define TB_MAX_DOUBLES (SIZE_MAX / sizeof(double))
#define QBLOCK 32                     /* inputs per block of Q8_0, Q4_0 and TB_DOT_Q8's rounding */

/* *out = a * b; 0 (and *out untouched) when the product exceeds TB_MAX_DOUBLES. */
static int mul_size(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > TB_MAX_DOUBLES / a)
        return 0;
    *out = a * b;
    return 1;
}

/* *out = a + b; 0 when the sum exceeds TB_MAX_DOUBLES. */
static int add_size(size_t a, size_t b, size_t *out)
{
    if (a > TB_MAX_DOUBLES || b > TB_MAX_DOUBLES - a)
        return 0;
    *out = a + b;
    return 1;
}

/* *out = v for a dimension v >= 1; 0 when v exceeds TB_MAX_DOUBLES. */
static int dim_size(int64_t v, size_t *out)
{
    if (v < 1 || (uint64_t)v > (uint64_t)TB_MAX_DOUBLES)
        return 0;
    *out = (size_t)v;
    return 1;
}

/* Every dimension and buffer length of one call, in doubles. A call's T query rows
 * attend over `keys` key rows: the same T rows in tb_block_forward, the past cached
 * ones and the T new ones in tb_block_forward_cached. */
typedef struct {
    size_t B, T, d, h, dk, f;   /* batch, tokens, d_model, n_heads, d_k, d_ff */
    size_t hk, group, dkv;      /* K/V heads, query heads per K/V head, d_kv = hk * d_k */
    size_t past, keys;          /* tokens before the T rows (0 without a cache); keys = past + T */
    size_t dd, df, ddkv;        /* weights (d, d), (d, f) = (f, d) and (d, d_kv) */
    size_t Td, Tf, TK, hTK;     /* one sequence: (T, d), (T, f), (T, keys), (h, T, keys) */
    size_t Tdkv;                /*               (T, d_kv) */
    size_t BTd, BTf, BhTK;      /* the batch:    (B, T, d), (B, T, f), (B, h, T, keys) */
    size_t BTdkv;               /*               (B, T, d_kv) */
    size_t scratch;             /* doubles of scratch, see seq_buffers */
} tb_sizes;

/* Number of (T, d_model) arrays in seq_buffers; K and V are (T, d_kv) beside them. */
#define N_SEQ_TD 9

/* The K/V heads of a config: n_kv_heads, where 0 stands for n_heads. */
static int64_t kv_heads(const tb_config *cfg)
{
    return cfg->n_kv_heads == 0 ? cfg->n_heads : cfg->n_kv_heads;
}

/* Fill s for a checked config, B sequences of T tokens and past tokens before them. */
static tb_status block_sizes(const tb_config *cfg, int64_t B, int64_t T, size_t past, tb_sizes *s)
{
    size_t extra;
    if (B < 1 || T < 1)
        return TB_ERR_DIM;
    if (!dim_size(B, &s->B) || !dim_size(T, &s->T) || !dim_size(cfg->d_model, &s->d) ||
        !dim_size(cfg->n_heads, &s->h) || !dim_size(cfg->d_ff, &s->f))
        return TB_ERR_OVERFLOW;
    s->dk = s->d / s->h;
    s->hk = (size_t)kv_heads(cfg);      /* 1 <= hk <= h: check_config has checked it divides h */
    s->group = s->h / s->hk;
    s->dkv = s->hk * s->dk;             /* <= d, so no product below with dkv can overflow first */
    s->past = past;
    if (!add_size(past, s->T, &s->keys) ||
        !mul_size(s->d, s->d, &s->dd) || !mul_size(s->d, s->f, &s->df) || !mul_size(s->d, s->dkv, &s->ddkv) ||
        !mul_size(s->T, s->d, &s->Td) || !mul_size(s->T, s->f, &s->Tf) || !mul_size(s->T, s->dkv, &s->Tdkv) ||
        !mul_size(s->T, s->keys, &s->TK) || !mul_size(s->h, s->TK, &s->hTK) ||
        !mul_size(s->B, s->Td, &s->BTd) || !mul_size(s->B, s->Tf, &s->BTf) ||
        !mul_size(s->B, s->Tdkv, &s->BTdkv) || !mul_size(s->B, s->hTK, &s->BhTK))
        return TB_ERR_OVERFLOW;
    /* scratch = N_SEQ_TD (T, d) arrays + K, V (T, d_kv) + S (T, keys) + A (h, T, keys)
     * + F_pre, F_post (T, f), and F_gate (T, f) with the gated FFN */
    if (!mul_size(N_SEQ_TD, s->Td, &s->scratch) ||
        !mul_size(2, s->Tdkv, &extra) ||
        !add_size(s->scratch, extra, &s->scratch) ||
        !add_size(s->scratch, s->TK, &s->scratch) ||
        !add_size(s->scratch, s->hTK, &s->scratch) ||
        !mul_size(cfg->ffn == TB_FFN_GATED ? 3 : 2, s->Tf, &extra) ||
        !add_size(s->scratch, extra, &s->scratch))
        return TB_ERR_OVERFLOW;
    return TB_OK;
}

/* Sizes of a cached call: B sequences of T_new new tokens after past cached ones, in
 * caches of max_T tokens; *cache = doubles of each cache, (B, n_kv_heads, max_T, d_k). */
static tb_status cached_sizes(const tb_config *cfg, int64_t B, int64_t T_new, int64_t past, int64_t max_T,
                              tb_sizes *s, size_t *cache)
{
    size_t max_t;
    if (B < 1 || T_new < 1 || max_T < 1)
        return TB_ERR_DIM;
    if (past < 0 || past > max_T - T_new)   /* max_T, T_new >= 1: the difference cannot overflow */
        return TB_ERR_CACHE_RANGE;
    if (!dim_size(max_T, &max_t))
        return TB_ERR_OVERFLOW;
    TRY(block_sizes(cfg, B, T_new, (size_t)past, s));   /* 0 <= past < max_T <= TB_MAX_DOUBLES */
    if (!mul_size(s->B, max_t, cache) || !mul_size(*cache, s->dkv, cache))
        return TB_ERR_OVERFLOW;
    return TB_OK;
}

/* ======================================================================
 * 3. Argument checks
 * ====================================================================== */

static int is_flag(int v) { return v == 0 || v == 1; }

static int eps_ok(double eps) { return eps > 0.0 && isfinite(eps); } /* NaN fails eps > 0 */

static tb_status check_config(const tb_config *cfg)
{
    if (cfg == NULL)
        return TB_ERR_NULL_ARG;
    if (cfg->d_model < 1 || cfg->n_heads < 1 || cfg->d_ff < 1)
        return TB_ERR_DIM;
    if (cfg->d_model % cfg->n_heads != 0)
        return TB_ERR_HEADS;
    if (cfg->n_kv_heads < 0 || (cfg->n_kv_heads > 0 && cfg->n_heads % cfg->n_kv_heads != 0))
        return TB_ERR_KV_HEADS;
    if (cfg->norm != TB_NORM_PRE && cfg->norm != TB_NORM_POST)
        return TB_ERR_NORM;
    if (cfg->norm_type != TB_LAYERNORM && cfg->norm_type != TB_RMSNORM)
        return TB_ERR_NORM_TYPE;
    if (cfg->ffn != TB_FFN_MLP && cfg->ffn != TB_FFN_GATED)
        return TB_ERR_FFN;
    if (cfg->activation != TB_ACT_GELU_TANH && cfg->activation != TB_ACT_GELU_ERF &&
        cfg->activation != TB_ACT_RELU && cfg->activation != TB_ACT_SILU)
        return TB_ERR_ACTIVATION;
    if (!is_flag(cfg->causal) || !is_flag(cfg->has_ffn_bias) || !is_flag(cfg->has_ln_affine) ||
        (cfg->has_attn_bias != TB_BIAS_NONE && cfg->has_attn_bias != TB_BIAS_QKVO &&
         cfg->has_attn_bias != TB_BIAS_QKV))
        return TB_ERR_FLAG;
    if (cfg->positions != TB_POS_NONE && cfg->positions != TB_POS_ROTARY)
        return TB_ERR_POSITIONS;
    /* NaN fails > 0; the pairs (x[j], x[j + d_k/2]) need d_k even */
    if (cfg->positions == TB_POS_ROTARY &&
        (!(cfg->rope_theta > 0.0 && isfinite(cfg->rope_theta)) ||
         !(cfg->rope_scale > 0.0 && isfinite(cfg->rope_scale)) || (cfg->d_model / cfg->n_heads) % 2 != 0))
        return TB_ERR_ROPE;
    if (!eps_ok(cfg->eps))
        return TB_ERR_EPS;
    if (cfg->dot != TB_DOT_EXACT && cfg->dot != TB_DOT_Q8 && cfg->dot != TB_DOT_BF16)
        return TB_ERR_DOT;
    if (cfg->dot == TB_DOT_Q8 && (cfg->d_model % QBLOCK != 0 || cfg->d_ff % QBLOCK != 0))
        return TB_ERR_DOT;
    if (cfg->kv != TB_KV_EXACT && cfg->kv != TB_KV_BF16 && cfg->kv != TB_KV_Q8)
        return TB_ERR_KV;
    return TB_OK;
}

/* A weight the config needs: given, and at least `shape` doubles long. */
static tb_status need_weight(const double *p, size_t len, size_t shape)
{
    if (p == NULL)
        return TB_ERR_NULL_WEIGHT;
    if (len < shape)
        return TB_ERR_WEIGHT_SIZE;
    return TB_OK;
}

/* An optional weight: needed when flag is 1, must be NULL when flag is 0. */
static tb_status optional_weight(int flag, const double *p, size_t len, size_t shape)
{
    if (!flag)
        return p == NULL ? TB_OK : TB_ERR_UNEXPECTED_WEIGHT;
    return need_weight(p, len, shape);
}

static tb_status check_attention_weights(const tb_config *cfg, const tb_weights *w, const tb_sizes *s)
{
    const int qkv_bias = cfg->has_attn_bias != TB_BIAS_NONE, out_bias = cfg->has_attn_bias == TB_BIAS_QKVO;
    TRY(need_weight(w->w_q, w->w_q_len, s->dd));
    TRY(need_weight(w->w_k, w->w_k_len, s->ddkv));
    TRY(need_weight(w->w_v, w->w_v_len, s->ddkv));
    TRY(need_weight(w->w_o, w->w_o_len, s->dd));
    TRY(optional_weight(qkv_bias, w->b_q, w->b_q_len, s->d));
    TRY(optional_weight(qkv_bias, w->b_k, w->b_k_len, s->dkv));
    TRY(optional_weight(qkv_bias, w->b_v, w->b_v_len, s->dkv));
    TRY(optional_weight(out_bias, w->b_o, w->b_o_len, s->d));
    return TB_OK;
}

static tb_status check_ffn_weights(const tb_config *cfg, const tb_weights *w, const tb_sizes *s)
{
    const int gated = cfg->ffn == TB_FFN_GATED;
    TRY(need_weight(w->w_ff1, w->w_ff1_len, s->df));
    TRY(need_weight(w->w_ff2, w->w_ff2_len, s->df));
    TRY(optional_weight(gated, w->w_gate, w->w_gate_len, s->df));
    TRY(optional_weight(cfg->has_ffn_bias, w->b_ff1, w->b_ff1_len, s->f));
    TRY(optional_weight(cfg->has_ffn_bias, w->b_ff2, w->b_ff2_len, s->d));
    TRY(optional_weight(gated && cfg->has_ffn_bias, w->b_gate, w->b_gate_len, s->f));
    return TB_OK;
}

static tb_status check_ln_weights(const tb_config *cfg, const tb_weights *w, const tb_sizes *s)
{
    /* RMSNorm has a gain and no shift: its betas must be NULL */
    const int shifts = cfg->has_ln_affine && cfg->norm_type == TB_LAYERNORM;
    TRY(optional_weight(cfg->has_ln_affine, w->ln1_gamma, w->ln1_gamma_len, s->d));
    TRY(optional_weight(shifts, w->ln1_beta, w->ln1_beta_len, s->d));
    TRY(optional_weight(cfg->has_ln_affine, w->ln2_gamma, w->ln2_gamma_len, s->d));
    TRY(optional_weight(shifts, w->ln2_beta, w->ln2_beta_len, s->d));
    return TB_OK;
}

/* Every weight of the block: the attention's, the FFN's and the LayerNorms'. */
static tb_status check_block_weights(const tb_config *cfg, const tb_weights *w, const tb_sizes *s)
{
    TRY(check_attention_weights(cfg, w, s));
    TRY(check_ffn_weights(cfg, w, s));
    TRY(check_ln_weights(cfg, w, s));
    return TB_OK;
}

/* One array of a trace: given, and at least `shape` doubles long. */
static tb_status need_trace(const double *p, size_t len, size_t shape)
{
    if (p == NULL)
        return TB_ERR_NULL_TRACE;
    if (len < shape)
        return TB_ERR_TRACE_SIZE;
    return TB_OK;
}

static tb_status check_trace(const tb_config *cfg, const tb_trace *t, const tb_sizes *s)
{
    TRY(need_trace(t->H_norm1, t->H_norm1_len, s->BTd));
    TRY(need_trace(t->Q, t->Q_len, s->BTd));
    TRY(need_trace(t->K, t->K_len, s->BTdkv));
    TRY(need_trace(t->V, t->V_len, s->BTdkv));
    TRY(need_trace(t->A, t->A_len, s->BhTK));
    TRY(need_trace(t->out_concat, t->out_concat_len, s->BTd));
    TRY(need_trace(t->A_out, t->A_out_len, s->BTd));
    TRY(need_trace(t->H_mid, t->H_mid_len, s->BTd));
    TRY(need_trace(t->H_norm2, t->H_norm2_len, s->BTd));
    TRY(need_trace(t->F_pre, t->F_pre_len, s->BTf));
    TRY(need_trace(t->F_post, t->F_post_len, s->BTf));
    TRY(need_trace(t->F_out, t->F_out_len, s->BTd));
    TRY(need_trace(t->H_out, t->H_out_len, s->BTd));
    if (cfg->ffn == TB_FFN_GATED)
        TRY(need_trace(t->F_gate, t->F_gate_len, s->BTf));
    return TB_OK;
}

/* The part of a buffer a call touches: n doubles from p. */
typedef struct {
    const void *p;   /* NULL: an absent optional buffer, overlaps nothing */
    size_t n;        /* doubles; <= TB_MAX_DOUBLES, so n * sizeof(double) fits */
    int writable;    /* the call writes it */
} span;

static span span_of(const void *p, size_t n, int writable)
{
    span s;
    s.p = p;
    s.n = n;
    s.writable = writable;
    return s;
}

/* 1 when some span the call writes shares a byte with another span. */
static int any_overlap(const span *spans, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        for (size_t j = i + 1; j < count; j++) {
            const span a = spans[i], b = spans[j];
            if (!(a.writable || b.writable) || a.p == NULL || b.p == NULL || a.n == 0 || b.n == 0)
                continue;
            const uintptr_t a0 = (uintptr_t)a.p, a1 = a0 + a.n * sizeof(double);
            const uintptr_t b0 = (uintptr_t)b.p, b1 = b0 + b.n * sizeof(double);
            if (a0 < b1 && b0 < a1)
                return 1;
        }
    }
    return 0;
}

/* Spans of all 18 weights (an absent one is NULL and overlaps nothing), read-only. */
#define N_WEIGHT_SPANS 18
static size_t add_weight_spans(span *spans, size_t n, const tb_weights *w, const tb_sizes *s)
{
    spans[n++] = span_of(w->w_q, s->dd, 0);
    spans[n++] = span_of(w->w_k, s->ddkv, 0);
    spans[n++] = span_of(w->w_v, s->ddkv, 0);
    spans[n++] = span_of(w->w_o, s->dd, 0);
    spans[n++] = span_of(w->w_ff1, s->df, 0);
    spans[n++] = span_of(w->w_ff2, s->df, 0);
    spans[n++] = span_of(w->b_ff1, s->f, 0);
    spans[n++] = span_of(w->b_ff2, s->d, 0);
    spans[n++] = span_of(w->ln1_gamma, s->d, 0);
    spans[n++] = span_of(w->ln1_beta, s->d, 0);
    spans[n++] = span_of(w->ln2_gamma, s->d, 0);
    spans[n++] = span_of(w->ln2_beta, s->d, 0);
    spans[n++] = span_of(w->b_q, s->d, 0);
    spans[n++] = span_of(w->b_k, s->dkv, 0);
    spans[n++] = span_of(w->b_v, s->dkv, 0);
    spans[n++] = span_of(w->b_o, s->d, 0);
    spans[n++] = span_of(w->w_gate, s->df, 0);
    spans[n++] = span_of(w->b_gate, s->f, 0);
    return n;
}

/* Spans of the 14 trace arrays, all written; F_gate only with the gated FFN. */
#define N_TRACE_SPANS 14
static size_t add_trace_spans(span *spans, size_t n, const tb_config *cfg, const tb_trace *t, const tb_sizes *s)
{
    spans[n++] = span_of(t->H_norm1, s->BTd, 1);
    spans[n++] = span_of(t->Q, s->BTd, 1);
    spans[n++] = span_of(t->K, s->BTdkv, 1);
    spans[n++] = span_of(t->V, s->BTdkv, 1);
    spans[n++] = span_of(t->A, s->BhTK, 1);
    spans[n++] = span_of(t->out_concat, s->BTd, 1);
    spans[n++] = span_of(t->A_out, s->BTd, 1);
    spans[n++] = span_of(t->H_mid, s->BTd, 1);
    spans[n++] = span_of(t->H_norm2, s->BTd, 1);
    spans[n++] = span_of(t->F_pre, s->BTf, 1);
    spans[n++] = span_of(t->F_post, s->BTf, 1);
    spans[n++] = span_of(t->F_out, s->BTd, 1);
    spans[n++] = span_of(t->H_out, s->BTd, 1);
    spans[n++] = span_of(t->F_gate, cfg->ffn == TB_FFN_GATED ? s->BTf : 0, 1);   /* 0: not touched */
    return n;
}

/* ======================================================================
 * 4. The math. These helpers trust their arguments: the entry points in
 *    section 5 have checked every pointer, dimension and length.
 * ====================================================================== */

static const double PI = 3.14159265358979323846;

static void copy(double *out, const double *in, size_t n)
{
    memcpy(out, in, n * sizeof(double));
}

/* v[0 .. n-1] rounded in place, as llama.cpp rounds activations for its 8-bit dot products
 * but with a float32 scale: in float32, amax = max |v|, d = amax / 127, and each v goes to
 * d * rint(v * (127 / amax)), ties to even (all zero where amax is 0, or so small that
 * 127 / amax overflows). */
static void round_q8(double *v, size_t n)
{
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++)
        amax = fmaxf(amax, fabsf((float)v[i]));
    const float inv = 127.0f / amax;          /* +inf where amax is 0 or below 127 / FLT_MAX */
    const int keep = isfinite(inv);
    const float d = keep ? amax / 127.0f : 0.0f;
    for (size_t i = 0; i < n; i++)
        v[i] = keep ? (double)d * (double)rintf((float)v[i] * inv) : 0.0;
}

/* x rounded to float32 and then to the nearest bfloat16, ties to even. */
static double round_bf16(double x)
{
    float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* x, or 0 (of its sign) where it is a float32 subnormal: vdpbf16ps reads those as zero,
 * so TB_DOT_BF16 does, inputs and weights alike. */
static double flush_subnormal(double x)
{
    return fabs((float)x) < FLT_MIN ? x * 0.0 : x;
}

/* x_in[0 .. n-1] = the n inputs at x as a product computed as `dot` takes them (tb_dot):
 * as they are, rounded by round_q8 (TB_DOT_Q8, n = QBLOCK), or each by round_bf16. */
static void input_block(double *x_in, const double *x, size_t n, int dot)
{
    copy(x_in, x, n);
    if (dot == TB_DOT_Q8)
        round_q8(x_in, n);
    else if (dot == TB_DOT_BF16)
        for (size_t i = 0; i < n; i++)
            x_in[i] = round_bf16(flush_subnormal(x_in[i]));
}

/* out (rows, cols) = X (rows, inner) @ W (inner, cols), X's rows taken as `dot` says
 * (input_block); each element sums k = 0 .. inner-1 in order. TB_DOT_Q8 needs inner a
 * multiple of QBLOCK (check_config). */
static void matmul(double *out, const double *X, const double *W, size_t rows, size_t inner, size_t cols,
                   int dot)
{
    double x_in[QBLOCK];
    for (size_t r = 0; r < rows; r++) {
        double *out_row = out + r * cols;
        for (size_t c = 0; c < cols; c++)
            out_row[c] = 0.0;
        for (size_t k0 = 0; k0 < inner; k0 += QBLOCK) {
            const size_t n = inner - k0 < QBLOCK ? inner - k0 : QBLOCK;
            input_block(x_in, X + r * inner + k0, n, dot);
            for (size_t k = 0; k < n; k++) {
                const double *w_row = W + (k0 + k) * cols;
                for (size_t c = 0; c < cols; c++)
                    out_row[c] += x_in[k] * (dot == TB_DOT_BF16 ? flush_subnormal(w_row[c]) : w_row[c]);
            }
        }
    }
}

/* out[i] = a[i] + b[i] */
static void add(double *out, const double *a, const double *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

/* Each row of X (rows, cols) += bias (cols,) */
static void add_row_bias(double *X, const double *bias, size_t rows, size_t cols)
{
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++)
            X[r * cols + c] += bias[c];
}

/* LN(x) = (x - mean) / sqrt(var + eps) per row, var the population variance
 * (divides by cols); then * gamma + beta when gamma is given. */
static void layernorm_rows(double *out, const double *X, size_t rows, size_t cols,
                           const double *gamma, const double *beta, double eps)
{
    for (size_t r = 0; r < rows; r++) {
        const double *x = X + r * cols;
        double *y = out + r * cols;
        double mean = 0.0, var = 0.0;
        for (size_t c = 0; c < cols; c++)
            mean += x[c];
        mean /= (double)cols;
        for (size_t c = 0; c < cols; c++)
            var += (x[c] - mean) * (x[c] - mean);
        var /= (double)cols;
        const double sd = sqrt(var + eps);
        for (size_t c = 0; c < cols; c++) {
            y[c] = (x[c] - mean) / sd;
            if (gamma != NULL)
                y[c] = y[c] * gamma[c] + beta[c];
        }
    }
}

/* RMSNorm(x) = x / sqrt(mean(x^2) + eps) per row, no mean taken out; then * gamma when
 * gamma is given. */
static void rmsnorm_rows(double *out, const double *X, size_t rows, size_t cols, const double *gamma, double eps)
{
    for (size_t r = 0; r < rows; r++) {
        const double *x = X + r * cols;
        double *y = out + r * cols;
        double ms = 0.0;
        for (size_t c = 0; c < cols; c++)
            ms += x[c] * x[c];
        ms /= (double)cols;
        const double rms = sqrt(ms + eps);
        for (size_t c = 0; c < cols; c++) {
            y[c] = x[c] / rms;
            if (gamma != NULL)
                y[c] = y[c] * gamma[c];
        }
    }
}

/* The block's norm (cfg->norm_type) of each row of X (rows, d); beta is NULL for RMSNorm. */
static void norm_rows(double *out, const double *X, size_t rows, size_t d, const double *gamma,
                      const double *beta, const tb_config *cfg)
{
    if (cfg->norm_type == TB_RMSNORM)
        rmsnorm_rows(out, X, rows, d, gamma, cfg->eps);
    else
        layernorm_rows(out, X, rows, d, gamma, beta, cfg->eps);
}

/* Rotary positions, in place, on X (rows, cols): every head (d_k columns) of row t turned
 * for position first + t, pair j = (x[j], x[j + d_k/2]) by the angle
 * (t / rope_scale) * rope_theta^(-2j / d_k), all in double. The angle does not depend on
 * the head, so each (row, pair) computes its cos and sin once for all heads. */
static void rotate_rows(double *X, size_t rows, size_t cols, size_t first, size_t d_k, const tb_config *cfg)
{
    const size_t half = d_k / 2;
    for (size_t t = 0; t < rows; t++) {
        const double pos = (double)(first + t);
        double *row = X + t * cols;
        for (size_t j = 0; j < half; j++) {
            const double inv_freq = 1.0 / pow(cfg->rope_theta, (double)(2 * j) / (double)d_k);
            const double angle = (pos / cfg->rope_scale) * inv_freq;
            const double c = cos(angle), s = sin(angle);
            for (size_t h0 = 0; h0 < cols; h0 += d_k) {
                const double x1 = row[h0 + j], x2 = row[h0 + half + j];
                row[h0 + j] = x1 * c - x2 * s;
                row[h0 + half + j] = x2 * c + x1 * s;
            }
        }
    }
}

/* Query row t, token first + t of its sequence, may look at key column i: always, or
 * only i <= first + t when causal. */
static int key_allowed(int causal, size_t first, size_t t, size_t i) { return !causal || i <= first + t; }

/* out (rows, cols) = softmax over the allowed entries of each row of S, the row's max
 * subtracted first; masked entries are exactly 0. Row t is token first + t (first = 0
 * unless earlier tokens sit in a cache). Column 0 is always allowed, so every row has a
 * positive sum. */
static void masked_softmax_rows(double *out, const double *S, size_t rows, size_t cols, size_t first,
                                int causal)
{
    for (size_t t = 0; t < rows; t++) {
        const double *s = S + t * cols;
        double *a = out + t * cols;
        double max = s[0], sum = 0.0;
        for (size_t i = 1; i < cols; i++)
            if (key_allowed(causal, first, t, i) && s[i] > max)
                max = s[i];
        for (size_t i = 0; i < cols; i++) {
            a[i] = key_allowed(causal, first, t, i) ? exp(s[i] - max) : 0.0;
            sum += a[i];
        }
        for (size_t i = 0; i < cols; i++)
            a[i] /= sum;    /* a masked 0 stays exactly 0 */
    }
}

/* Where attention reads one sequence's keys and values: head h's key i is the d_k
 * doubles at K + h * head_step + i * row_step, its value the same place in V. The
 * block's own projections (T, d) are head_step = d_k, row_step = d; a cache
 * (h, max_T, d_k) is head_step = max_T * d_k, row_step = d_k. */
typedef struct {
    const double *K, *V;
    size_t head_step, row_step;
    size_t keys;      /* keys 0 .. keys-1 exist */
    size_t first;     /* query row t is token first + t: with causal it sees keys 0 .. first + t */
} kv_view;

/* Head `head` of MHA for the T query rows of Q (T, d) over K/V head g = head / group of kv
 * (grouped-query attention: `group` query heads share one K/V head; 1 without it):
 * S (T, keys) = Q_h K_g^T / sqrt(d_k), A_h (T, keys) = masked softmax of S,
 * columns c0 .. c0+d_k-1 of out_concat (T, d) = A_h V_g, c0 = head * d_k. */
static void attention_head(double *out_concat, double *A_h, double *S, const double *Q, const kv_view *kv,
                           size_t T, size_t d, size_t d_k, size_t head, size_t group, int causal)
{
    const size_t c0 = head * d_k, keys = kv->keys, g = head / group;
    const double *K = kv->K + g * kv->head_step, *V = kv->V + g * kv->head_step;
    const double scale = 1.0 / sqrt((double)d_k);
    for (size_t t = 0; t < T; t++) {
        for (size_t i = 0; i < keys; i++) {
            double dot = 0.0;
            for (size_t c = 0; c < d_k; c++)
                dot += Q[t * d + c0 + c] * K[i * kv->row_step + c];
            S[t * keys + i] = dot * scale;
        }
    }
    masked_softmax_rows(A_h, S, T, keys, kv->first, causal);
    for (size_t t = 0; t < T; t++) {
        for (size_t c = 0; c < d_k; c++) {
            double acc = 0.0;
            for (size_t i = 0; i < keys; i++)
                acc += A_h[t * keys + i] * V[i * kv->row_step + c];
            out_concat[t * d + c0 + c] = acc;
        }
    }
}

static double activation(int act, double x)
{
    switch (act) {
    case TB_ACT_GELU_TANH:
        return 0.5 * x * (1.0 + tanh(sqrt(2.0 / PI) * (x + 0.044715 * x * x * x)));
    case TB_ACT_GELU_ERF:
        return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case TB_ACT_SILU:   /* x * sigmoid(x); exp(-x) = inf for x < -709 gives -0, not NaN */
        return x / (1.0 + exp(-x));
    default: /* TB_ACT_RELU; check_config has rejected anything else */
        return x > 0.0 ? x : 0.0;
    }
}

/* F_pre = X W1 (+ b1); F_post = act(F_pre); F_out = F_post W2 (+ b2). b1, b2 NULL for none. */
static void ffn(double *F_out, double *F_pre, double *F_post, const double *X,
                size_t T, size_t d, size_t f,
                const double *w1, const double *b1, const double *w2, const double *b2, int act, int dot)
{
    matmul(F_pre, X, w1, T, d, f, dot);
    if (b1 != NULL)
        add_row_bias(F_pre, b1, T, f);
    for (size_t i = 0; i < T * f; i++)
        F_post[i] = activation(act, F_pre[i]);
    matmul(F_out, F_post, w2, T, f, d, dot);
    if (b2 != NULL)
        add_row_bias(F_out, b2, T, d);
}

/* Gated FFN: F_pre = X W_ff1 (+ b_ff1), F_gate = X W_gate (+ b_gate), F_post = act(F_gate) * F_pre,
 * F_out = F_post W_ff2 (+ b_ff2); the biases are NULL for none. */
static void gated_ffn(double *F_out, double *F_pre, double *F_gate, double *F_post, const double *X,
                      size_t T, size_t d, size_t f, const tb_weights *w, int act, int dot)
{
    matmul(F_pre, X, w->w_ff1, T, d, f, dot);
    if (w->b_ff1 != NULL)
        add_row_bias(F_pre, w->b_ff1, T, f);
    matmul(F_gate, X, w->w_gate, T, d, f, dot);
    if (w->b_gate != NULL)
        add_row_bias(F_gate, w->b_gate, T, f);
    for (size_t i = 0; i < T * f; i++)
        F_post[i] = activation(act, F_gate[i]) * F_pre[i];
    matmul(F_out, F_post, w->w_ff2, T, f, d, dot);
    if (w->b_ff2 != NULL)
        add_row_bias(F_out, w->b_ff2, T, d);
}

/* The scratch of one sequence, carved from tb_scratch.data by carve_scratch. */
typedef struct {
    /* N_SEQ_TD arrays of (T, d) */
    double *H_norm1, *Q, *out_concat, *A_out, *resid, *H_mid, *H_norm2, *F_out, *H_out;
    double *K, *V;              /* (T, d_kv) */
    double *S;                  /* (T, keys) one head's scores */
    double *A;                  /* (h, T, keys) every head's probabilities */
    double *F_pre, *F_post;     /* (T, f) */
    double *F_gate;             /* (T, f) with the gated FFN, else NULL */
} seq_buffers;

/* Hand out n doubles from *next. */
static double *take(double **next, size_t n)
{
    double *p = *next;
    *next += n;
    return p;
}

/* Exactly s->scratch doubles from data, in the order block_sizes counts them. */
static seq_buffers carve_scratch(double *data, const tb_config *cfg, const tb_sizes *s)
{
    seq_buffers b;
    double *next = data;
    b.H_norm1 = take(&next, s->Td);
    b.Q = take(&next, s->Td);
    b.out_concat = take(&next, s->Td);
    b.A_out = take(&next, s->Td);
    b.resid = take(&next, s->Td);
    b.H_mid = take(&next, s->Td);
    b.H_norm2 = take(&next, s->Td);
    b.F_out = take(&next, s->Td);
    b.H_out = take(&next, s->Td);   /* N_SEQ_TD = 9 so far */
    b.K = take(&next, s->Tdkv);
    b.V = take(&next, s->Tdkv);
    b.S = take(&next, s->TK);
    b.A = take(&next, s->hTK);
    b.F_pre = take(&next, s->Tf);
    b.F_post = take(&next, s->Tf);
    b.F_gate = cfg->ffn == TB_FFN_GATED ? take(&next, s->Tf) : NULL;
    return b;
}

/* One sequence's slice of the key and value caches, (hk, max_T, d_k) each. */
typedef struct {
    double *K, *V;
    size_t max_T;
} seq_cache;

/* Copy the T new rows' keys and values (b's K and V, (T, d_kv)) into the cache at positions
 * past .. past+T-1: K/V head h's d_k columns of a row go to row past+t of its (max_T, d_k) block. */
static void append_kv(const seq_cache *c, const seq_buffers *b, const tb_sizes *s)
{
    for (size_t h = 0; h < s->hk; h++) {
        for (size_t t = 0; t < s->T; t++) {
            const size_t to = (h * c->max_T + s->past + t) * s->dk, from = t * s->dkv + h * s->dk;
            copy(c->K + to, b->K + from, s->dk);
            copy(c->V + to, b->V + from, s->dk);
        }
    }
}

/* The T new rows of the cache (positions past .. past+T-1) rounded in place as the caller's
 * cache holds them (cfg->kv, a tb_kv): bf16 each value, Q8 each head's row of d_k values. */
static void round_new_kv(const seq_cache *c, const tb_sizes *s, int kv)
{
    for (size_t h = 0; h < s->hk; h++) {
        for (size_t t = 0; t < s->T; t++) {
            double *k = c->K + (h * c->max_T + s->past + t) * s->dk, *v = c->V + (k - c->K);
            if (kv == TB_KV_Q8) {
                round_q8(k, s->dk);
                round_q8(v, s->dk);
            } else if (kv == TB_KV_BF16) {
                for (size_t i = 0; i < s->dk; i++) {
                    k[i] = round_bf16(k[i]);
                    v[i] = round_bf16(v[i]);
                }
            }
        }
    }
}

/* What attention reads: the cache (past + T keys), or without one (c NULL, the full
 * forward) the T rows' own projections in b. */
static kv_view keys_and_values(const seq_cache *c, const seq_buffers *b, const tb_sizes *s)
{
    kv_view kv;
    if (c != NULL) {
        kv.K = c->K;
        kv.V = c->V;
        kv.head_step = c->max_T * s->dk;
        kv.row_step = s->dk;
    } else {
        kv.K = b->K;
        kv.V = b->V;
        kv.head_step = s->dk;
        kv.row_step = s->dkv;
    }
    kv.keys = s->keys;    /* past + T; T without a cache (past = 0) */
    kv.first = s->past;
    return kv;
}

/* Q (T, d), K and V (T, d_kv) of X (T, d) into b: the projections, their biases, and with
 * rotary positions Q and K turned for positions past .. past+T-1 (absolute: with a cache
 * the rows follow the past cached ones). */
static void qkv(const seq_buffers *b, const double *X, const tb_config *cfg, const tb_weights *w,
                const tb_sizes *s)
{
    matmul(b->Q, X, w->w_q, s->T, s->d, s->d, cfg->dot);
    matmul(b->K, X, w->w_k, s->T, s->d, s->dkv, cfg->dot);
    matmul(b->V, X, w->w_v, s->T, s->d, s->dkv, cfg->dot);
    if (cfg->has_attn_bias != TB_BIAS_NONE) {
        add_row_bias(b->Q, w->b_q, s->T, s->d);
        add_row_bias(b->K, w->b_k, s->T, s->dkv);
        add_row_bias(b->V, w->b_v, s->T, s->dkv);
    }
    if (cfg->positions == TB_POS_ROTARY) {
        rotate_rows(b->Q, s->T, s->d, s->past, s->dk, cfg);
        rotate_rows(b->K, s->T, s->dkv, s->past, s->dk, cfg);
    }
}

/* MHA(X) for X (T, d): fills Q, K, V, S, A, out_concat and A_out of b. With a cache c,
 * the rows' keys and values are appended to it and attention runs over all it holds. */
static void mha(const seq_buffers *b, const double *X, const tb_config *cfg, const tb_weights *w,
                const tb_sizes *s, const seq_cache *c)
{
    kv_view kv;
    qkv(b, X, cfg, w, s);
    if (c != NULL) {
        append_kv(c, b, s);     /* first: the new rows attend to each other too, */
        round_new_kv(c, s, cfg->kv);    /* as the caller's cache will hold them */
    }
    kv = keys_and_values(c, b, s);
    for (size_t h = 0; h < s->h; h++)
        attention_head(b->out_concat, b->A + h * s->TK, b->S, b->Q, &kv, s->T, s->d, s->dk, h, s->group,
                       cfg->causal);
    if (c != NULL && cfg->kv != TB_KV_EXACT)
        append_kv(c, b, s);     /* the exact rows back: the caller rounds them into its cache */
    matmul(b->A_out, b->out_concat, w->w_o, s->T, s->d, s->d, cfg->dot);
    if (cfg->has_attn_bias == TB_BIAS_QKVO)
        add_row_bias(b->A_out, w->b_o, s->T, s->d);
}

/* FFN(X) for X (T, d): fills F_pre, F_post and F_out of b (and F_gate, gated). */
static void block_ffn(const seq_buffers *b, const double *X, const tb_config *cfg, const tb_weights *w,
                      const tb_sizes *s)
{
    if (cfg->ffn == TB_FFN_GATED)
        gated_ffn(b->F_out, b->F_pre, b->F_gate, b->F_post, X, s->T, s->d, s->f, w, cfg->activation, cfg->dot);
    else
        ffn(b->F_out, b->F_pre, b->F_post, X, s->T, s->d, s->f,
            w->w_ff1, w->b_ff1, w->w_ff2, w->b_ff2, cfg->activation, cfg->dot);
}

/* One sequence H_in (T, d) through the block; every intermediate, H_out included, lands in b.
 * c: its caches, to which the rows' keys and values are appended (NULL for the full forward);
 * the two paths differ only in where attention reads its keys and values (keys_and_values). */
static void block_forward_one(const seq_buffers *b, const double *H_in, const tb_config *cfg,
                              const tb_weights *w, const tb_sizes *s, const seq_cache *c)
{
    const size_t n = s->Td;
    if (cfg->norm == TB_NORM_PRE) {
        /* H_mid = H_in + MHA(LN1(H_in)) */
        norm_rows(b->H_norm1, H_in, s->T, s->d, w->ln1_gamma, w->ln1_beta, cfg);
        mha(b, b->H_norm1, cfg, w, s, c);
        add(b->H_mid, H_in, b->A_out, n);
        /* H_out = H_mid + FFN(LN2(H_mid)) */
        norm_rows(b->H_norm2, b->H_mid, s->T, s->d, w->ln2_gamma, w->ln2_beta, cfg);
        block_ffn(b, b->H_norm2, cfg, w, s);
        add(b->H_out, b->H_mid, b->F_out, n);
    } else {
        /* H_mid = LN1(H_in + MHA(H_in)); the LN output is the stream: H_norm1 = H_mid */
        mha(b, H_in, cfg, w, s, c);
        add(b->resid, H_in, b->A_out, n);
        norm_rows(b->H_mid, b->resid, s->T, s->d, w->ln1_gamma, w->ln1_beta, cfg);
        copy(b->H_norm1, b->H_mid, n);
        /* H_out = LN2(H_mid + FFN(H_mid)); H_norm2 = H_out */
        block_ffn(b, b->H_mid, cfg, w, s);
        add(b->resid, b->H_mid, b->F_out, n);
        norm_rows(b->H_out, b->resid, s->T, s->d, w->ln2_gamma, w->ln2_beta, cfg);
        copy(b->H_norm2, b->H_out, n);
    }
}

/* Copy sequence `seq`'s intermediates from b into its slices of the trace. */
static void write_trace(const tb_trace *t, const seq_buffers *b, size_t seq, const tb_sizes *s)
{
    const size_t od = seq * s->Td, of = seq * s->Tf, oa = seq * s->hTK, okv = seq * s->Tdkv;
    copy(t->H_norm1 + od, b->H_norm1, s->Td);
    copy(t->Q + od, b->Q, s->Td);
    copy(t->K + okv, b->K, s->Tdkv);
    copy(t->V + okv, b->V, s->Tdkv);
    copy(t->A + oa, b->A, s->hTK);
    copy(t->out_concat + od, b->out_concat, s->Td);
    copy(t->A_out + od, b->A_out, s->Td);
    copy(t->H_mid + od, b->H_mid, s->Td);
    copy(t->H_norm2 + od, b->H_norm2, s->Td);
    copy(t->F_pre + of, b->F_pre, s->Tf);
    copy(t->F_post + of, b->F_post, s->Tf);
    copy(t->F_out + od, b->F_out, s->Td);
    copy(t->H_out + od, b->H_out, s->Td);
    if (b->F_gate != NULL)
        copy(t->F_gate + of, b->F_gate, s->Tf);
}

/* ======================================================================
 * 5. Entry points: check every argument, then run the math.
 *    Order of checks: pointers, config/enums/flags/eps, dimensions,
 *    overflow, lengths, overlap. Nothing is written before all pass.
 * ====================================================================== */

tb_status tb_scratch_len(const tb_config *cfg, int64_t T, size_t *len)
{
    tb_sizes s;
    if (cfg == NULL || len == NULL)
        return TB_ERR_NULL_ARG;
    TRY(check_config(cfg));
    TRY(block_sizes(cfg, 1, T, 0, &s));
    *len = s.scratch;
    return TB_OK;
}

tb_status tb_layernorm_rows(double *out, size_t out_len,
                            const double *X, size_t X_len,
                            int64_t rows, int64_t cols,
                            const double *gamma, const double *beta, size_t affine_len,
                            double eps)
{
    size_t r, c, n;
    if (out == NULL || X == NULL)
        return TB_ERR_NULL_ARG;
    if ((gamma == NULL) != (beta == NULL))
        return TB_ERR_NULL_WEIGHT;
    if (!eps_ok(eps))
        return TB_ERR_EPS;
    if (rows < 1 || cols < 1)
        return TB_ERR_DIM;
    if (!dim_size(rows, &r) || !dim_size(cols, &c) || !mul_size(r, c, &n))
        return TB_ERR_OVERFLOW;
    if (X_len < n)
        return TB_ERR_INPUT_SIZE;
    if (out_len < n)
        return TB_ERR_OUTPUT_SIZE;
    if (gamma != NULL && affine_len < c)
        return TB_ERR_WEIGHT_SIZE;
    {
        const span spans[] = {span_of(out, n, 1), span_of(X, n, 0),
                              span_of(gamma, c, 0), span_of(beta, c, 0)};
        if (any_overlap(spans, sizeof spans / sizeof spans[0]))
            return TB_ERR_OVERLAP;
    }
    layernorm_rows(out, X, r, c, gamma, beta, eps);
    return TB_OK;
}

tb_status tb_rmsnorm_rows(double *out, size_t out_len,
                          const double *X, size_t X_len,
                          int64_t rows, int64_t cols,
                          const double *gamma, size_t gamma_len,
                          double eps)
{
    size_t r, c, n;
    if (out == NULL || X == NULL)
        return TB_ERR_NULL_ARG;
    if (!eps_ok(eps))
        return TB_ERR_EPS;
    if (rows < 1 || cols < 1)
        return TB_ERR_DIM;
    if (!dim_size(rows, &r) || !dim_size(cols, &c) || !mul_size(r, c, &n))
        return TB_ERR_OVERFLOW;
    if (X_len < n)
        return TB_ERR_INPUT_SIZE;
    if (out_len < n)
        return TB_ERR_OUTPUT_SIZE;
    if (gamma != NULL && gamma_len < c)
        return TB_ERR_WEIGHT_SIZE;
    {
        const span spans[] = {span_of(out, n, 1), span_of(X, n, 0), span_of(gamma, c, 0)};
        if (any_overlap(spans, sizeof spans / sizeof spans[0]))
            return TB_ERR_OVERLAP;
    }
    rmsnorm_rows(out, X, r, c, gamma, eps);
    return TB_OK;
}

tb_status tb_rotary_rows(double *out, size_t out_len,
                         const double *X, size_t X_len,
                         int64_t rows, int64_t cols, int64_t first, const tb_config *cfg)
{
    size_t r, c, n, d_k;
    if (out == NULL || X == NULL || cfg == NULL)
        return TB_ERR_NULL_ARG;
    TRY(check_config(cfg));
    if (cfg->positions != TB_POS_ROTARY)
        return TB_ERR_POSITIONS;
    if (rows < 1 || cols < 1)
        return TB_ERR_DIM;
    if (first < 0)
        return TB_ERR_CACHE_RANGE;
    d_k = (size_t)(cfg->d_model / cfg->n_heads);
    if (!dim_size(rows, &r) || !dim_size(cols, &c) || !mul_size(r, c, &n) ||
        (uint64_t)first > (uint64_t)TB_MAX_DOUBLES || r > TB_MAX_DOUBLES - (size_t)first)
        return TB_ERR_OVERFLOW;
    if (c % d_k != 0)
        return TB_ERR_HEADS;
    if (X_len < n)
        return TB_ERR_INPUT_SIZE;
    if (out_len < n)
        return TB_ERR_OUTPUT_SIZE;
    {
        const span spans[] = {span_of(out, n, 1), span_of(X, n, 0)};
        if (any_overlap(spans, 2))
            return TB_ERR_OVERLAP;
    }
    copy(out, X, n);
    rotate_rows(out, r, c, (size_t)first, d_k, cfg);
    return TB_OK;
}

tb_status tb_masked_softmax_rows(double *out, size_t out_len,
                                 const double *S, size_t S_len,
                                 int64_t rows, int64_t cols, int causal)
{
    size_t r, c, n;
    if (out == NULL || S == NULL)
        return TB_ERR_NULL_ARG;
    if (!is_flag(causal))
        return TB_ERR_FLAG;
    if (rows < 1 || cols < 1)
        return TB_ERR_DIM;
    if (!dim_size(rows, &r) || !dim_size(cols, &c) || !mul_size(r, c, &n))
        return TB_ERR_OVERFLOW;
    if (S_len < n)
        return TB_ERR_INPUT_SIZE;
    if (out_len < n)
        return TB_ERR_OUTPUT_SIZE;
    {
        const span spans[] = {span_of(out, n, 1), span_of(S, n, 0)};
        if (any_overlap(spans, 2))
            return TB_ERR_OVERLAP;
    }
    masked_softmax_rows(out, S, r, c, 0, causal);
    return TB_OK;
}

tb_status tb_attention_head(double *out_concat, size_t out_concat_len,
                            double *A_h, size_t A_h_len,
                            double *S, size_t S_len,
                            const double *Q, size_t Q_len,
                            const double *K, size_t K_len,
                            const double *V, size_t V_len,
                            int64_t T, int64_t head, const tb_config *cfg)
{
    tb_sizes s;
    if (out_concat == NULL || A_h == NULL || S == NULL || Q == NULL || K == NULL || V == NULL ||
        cfg == NULL)
        return TB_ERR_NULL_ARG;
    TRY(check_config(cfg));
    if (T < 1)
        return TB_ERR_DIM;
    if (head < 0 || head >= cfg->n_heads)
        return TB_ERR_HEAD_INDEX;
    TRY(block_sizes(cfg, 1, T, 0, &s));
    if (Q_len < s.Td || K_len < s.Tdkv || V_len < s.Tdkv)
        return TB_ERR_INPUT_SIZE;
    if (out_concat_len < s.Td || A_h_len < s.TK)
        return TB_ERR_OUTPUT_SIZE;
    if (S_len < s.TK)
        return TB_ERR_SCRATCH_SIZE;
    {
        const span spans[] = {span_of(out_concat, s.Td, 1), span_of(A_h, s.TK, 1), span_of(S, s.TK, 1),
                              span_of(Q, s.Td, 0), span_of(K, s.Tdkv, 0), span_of(V, s.Tdkv, 0)};
        if (any_overlap(spans, sizeof spans / sizeof spans[0]))
            return TB_ERR_OVERLAP;
    }
    {
        const kv_view kv = {K, V, s.dk, s.dkv, s.T, 0};    /* (T, d_kv) rows, as in the block */
        attention_head(out_concat, A_h, S, Q, &kv, s.T, s.d, s.dk, (size_t)head, s.group, cfg->causal);
    }
    return TB_OK;
}

tb_status tb_ffn(double *F_out, size_t F_out_len,
                 double *F_pre, size_t F_pre_len,
                 double *F_post, size_t F_post_len,
                 const double *X, size_t X_len,
                 int64_t T, const tb_config *cfg, const tb_weights *w)
{
    tb_sizes s;
    if (F_out == NULL || F_pre == NULL || F_post == NULL || X == NULL || cfg == NULL || w == NULL)
        return TB_ERR_NULL_ARG;
    TRY(check_config(cfg));
    if (cfg->ffn != TB_FFN_MLP)
        return TB_ERR_FFN;
    TRY(block_sizes(cfg, 1, T, 0, &s));
    if (X_len < s.Td)
        return TB_ERR_INPUT_SIZE;
    if (F_out_len < s.Td || F_pre_len < s.Tf || F_post_len < s.Tf)
        return TB_ERR_OUTPUT_SIZE;
    TRY(check_ffn_weights(cfg, w, &s));
    {
        const span spans[] = {span_of(F_out, s.Td, 1), span_of(F_pre, s.Tf, 1), span_of(F_post, s.Tf, 1),
                              span_of(X, s.Td, 0), span_of(w->w_ff1, s.df, 0), span_of(w->w_ff2, s.df, 0),
                              span_of(w->b_ff1, s.f, 0), span_of(w->b_ff2, s.d, 0)};
        if (any_overlap(spans, sizeof spans / sizeof spans[0]))
            return TB_ERR_OVERLAP;
    }
    ffn(F_out, F_pre, F_post, X, s.T, s.d, s.f, w->w_ff1, w->b_ff1, w->w_ff2, w->b_ff2, cfg->activation, cfg->dot);
    return TB_OK;
}

tb_status tb_gated_ffn(double *F_out, size_t F_out_len,
                       double *F_pre, size_t F_pre_len,
                       double *F_gate, size_t F_gate_len,
                       double *F_post, size_t F_post_len,
                       const double *X, size_t X_len,
                       int64_t T, const tb_config *cfg, const tb_weights *w)
{
    tb_sizes s;
    if (F_out == NULL || F_pre == NULL || F_gate == NULL || F_post == NULL || X == NULL || cfg == NULL ||
        w == NULL)
        return TB_ERR_NULL_ARG;
    TRY(check_config(cfg));
    if (cfg->ffn != TB_FFN_GATED)
        return TB_ERR_FFN;
    TRY(block_sizes(cfg, 1, T, 0, &s));
    if (X_len < s.Td)
        return TB_ERR_INPUT_SIZE;
    if (F_out_len < s.Td || F_pre_len < s.Tf || F_gate_len < s.Tf || F_post_len < s.Tf)
        return TB_ERR_OUTPUT_SIZE;
    TRY(check_ffn_weights(cfg, w, &s));
    {
        const span spans[] = {span_of(F_out, s.Td, 1), span_of(F_pre, s.Tf, 1), span_of(F_gate, s.Tf, 1),
                              span_of(F_post, s.Tf, 1), span_of(X, s.Td, 0),
                              span_of(w->w_ff1, s.df, 0), span_of(w->w_gate, s.df, 0), span_of(w->w_ff2, s.df, 0),
                              span_of(w->b_ff1, s.f, 0), span_of(w->b_gate, s.f, 0), span_of(w->b_ff2, s.d, 0)};
        if (any_overlap(spans, sizeof spans / sizeof spans[0]))
            return TB_ERR_OVERLAP;
    }
    gated_ffn(F_out, F_pre, F_gate, F_post, X, s.T, s.d, s.f, w, cfg->activation, cfg->dot);
    return TB_OK;
}

tb_status tb_block_forward(double *out, size_t out_len,
                           const double *in, size_t in_len,
                           int64_t B, int64_t T,
                           const tb_config *cfg, const tb_weights *w,
                           const tb_scratch *scratch, const tb_trace *trace)
{
    tb_sizes s;
    if (out == NULL || in == NULL || cfg == NULL || w == NULL || scratch == NULL || scratch->data == NULL)
        return TB_ERR_NULL_ARG;
    TRY(check_config(cfg));
    TRY(block_sizes(cfg, B, T, 0, &s));
    if (in_len < s.BTd)
        return TB_ERR_INPUT_SIZE;
    if (out_len < s.BTd)
        return TB_ERR_OUTPUT_SIZE;
    TRY(check_block_weights(cfg, w, &s));
    if (scratch->len < s.scratch)
        return TB_ERR_SCRATCH_SIZE;
    if (trace != NULL)
        TRY(check_trace(cfg, trace, &s));
    {
        span spans[3 + N_WEIGHT_SPANS + N_TRACE_SPANS];
        size_t n = 0;
        spans[n++] = span_of(out, s.BTd, 1);
        spans[n++] = span_of(in, s.BTd, 0);
        spans[n++] = span_of(scratch->data, s.scratch, 1);
        n = add_weight_spans(spans, n, w, &s);
        if (trace != NULL)
            n = add_trace_spans(spans, n, cfg, trace, &s);
        if (any_overlap(spans, n))
            return TB_ERR_OVERLAP;
    }

    /* every check passed: from here on nothing can fail */
    {
        const seq_buffers b = carve_scratch(scratch->data, cfg, &s);
        for (size_t seq = 0; seq < s.B; seq++) {
            block_forward_one(&b, in + seq * s.Td, cfg, w, &s, NULL);
            copy(out + seq * s.Td, b.H_out, s.Td);
            if (trace != NULL)
                write_trace(trace, &b, seq, &s);
        }
    }
    return TB_OK;
}

tb_status tb_scratch_len_cached(const tb_config *cfg, int64_t T_new, int64_t past, size_t *len)
{
    tb_sizes s;
    if (cfg == NULL || len == NULL)
        return TB_ERR_NULL_ARG;
    TRY(check_config(cfg));
    if (!cfg->causal)
        return TB_ERR_NOT_CAUSAL;
    if (T_new < 1)
        return TB_ERR_DIM;
    if (past < 0)
        return TB_ERR_CACHE_RANGE;
    if ((uint64_t)past > (uint64_t)TB_MAX_DOUBLES)
        return TB_ERR_OVERFLOW;
    TRY(block_sizes(cfg, 1, T_new, (size_t)past, &s));
    *len = s.scratch;
    return TB_OK;
}

tb_status tb_block_forward_cached(double *out, size_t out_len,
                                  const double *in, size_t in_len,
                                  int64_t B, int64_t T_new, int64_t past, int64_t max_T,
                                  double *K_cache, size_t K_cache_len,
                                  double *V_cache, size_t V_cache_len,
                                  const tb_config *cfg, const tb_weights *w,
                                  const tb_scratch *scratch)
{
    tb_sizes s;
    size_t cache_len;   /* (B, n_heads, max_T, d_k) */
    if (out == NULL || in == NULL || K_cache == NULL || V_cache == NULL || cfg == NULL || w == NULL ||
        scratch == NULL || scratch->data == NULL)
        return TB_ERR_NULL_ARG;
    TRY(check_config(cfg));
    if (!cfg->causal)
        return TB_ERR_NOT_CAUSAL;
    TRY(cached_sizes(cfg, B, T_new, past, max_T, &s, &cache_len));
    if (in_len < s.BTd)
        return TB_ERR_INPUT_SIZE;
    if (out_len < s.BTd)
        return TB_ERR_OUTPUT_SIZE;
    if (K_cache_len < cache_len || V_cache_len < cache_len)
        return TB_ERR_CACHE_SIZE;
    TRY(check_block_weights(cfg, w, &s));
    if (scratch->len < s.scratch)
        return TB_ERR_SCRATCH_SIZE;
    {
        /* the caches are written only at rows past .. past+T_new-1, but read up to there and
         * strided by head: their whole extent counts, which keeps the check simple */
        span spans[5 + N_WEIGHT_SPANS];
        size_t n = 0;
        spans[n++] = span_of(out, s.BTd, 1);
        spans[n++] = span_of(in, s.BTd, 0);
        spans[n++] = span_of(K_cache, cache_len, 1);
        spans[n++] = span_of(V_cache, cache_len, 1);
        spans[n++] = span_of(scratch->data, s.scratch, 1);
        n = add_weight_spans(spans, n, w, &s);
        if (any_overlap(spans, n))
            return TB_ERR_OVERLAP;
    }

    /* every check passed: from here on nothing can fail */
    {
        const seq_buffers b = carve_scratch(scratch->data, cfg, &s);
        const size_t per_seq = cache_len / s.B;     /* (n_heads, max_T, d_k) */
        for (size_t seq = 0; seq < s.B; seq++) {
            const seq_cache c = {K_cache + seq * per_seq, V_cache + seq * per_seq, (size_t)max_T};
            block_forward_one(&b, in + seq * s.Td, cfg, w, &s, &c);
            copy(out + seq * s.Td, b.H_out, s.Td);
        }
    }
    return TB_OK;
}

/* ======================================================================
 * 6. Stored weight formats (tb_dequantize). The bytes are unpacked here,
 *    apart from the Python side's numpy code, so that a packing or scale
 *    bug there shows up as a difference instead of hiding in shared code.
 *    The layouts are described above tb_format in tblock_ref.h.
 * ====================================================================== */

#define Q8_0_BYTES (2 + QBLOCK)       /* float16 scale, 32 int8 */
#define Q4_0_BYTES (2 + QBLOCK / 2)   /* float16 scale, 16 bytes of two nibbles */

/* The little-endian uint16 at p, read byte by byte so the host's byte order does not matter. */
static unsigned le16(const uint8_t *p)
{
    return (unsigned)p[0] | ((unsigned)p[1] << 8);
}

/* An IEEE binary float held in the low bits of `bits`: 1 sign bit, exp_bits exponent
 * bits, man_bits mantissa bits (float16: 5, 10; bfloat16: 8, 7). */
static int small_float_finite(unsigned bits, int exp_bits, int man_bits)
{
    const unsigned all_ones = (1u << exp_bits) - 1;
    return ((bits >> man_bits) & all_ones) != all_ones;   /* all ones: an Inf or a NaN */
}

/* Its value as a double, for a finite one. Exact: float16 and bfloat16 values, their
 * subnormals included, all lie well inside double's range and precision. */
static double small_float(unsigned bits, int exp_bits, int man_bits)
{
    const unsigned man = bits & ((1u << man_bits) - 1);
    const unsigned exp = (bits >> man_bits) & ((1u << exp_bits) - 1);
    const int bias = (1 << (exp_bits - 1)) - 1;
    double v;
    if (exp == 0)   /* zero or subnormal: 0.man * 2^(1 - bias), no implicit leading 1 */
        v = ldexp((double)man, 1 - bias - man_bits);
    else            /* normal: 1.man * 2^(exp - bias) */
        v = ldexp((double)(man | (1u << man_bits)), (int)exp - bias - man_bits);
    return (bits >> (exp_bits + man_bits)) & 1u ? -v : v;   /* -v keeps the sign of a zero */
}

static double fp16_at(const uint8_t *p) { return small_float(le16(p), 5, 10); }
static double bf16_at(const uint8_t *p) { return small_float(le16(p), 8, 7); }

/* What one stored unit is: a bf16 value (2 bytes, 1 input) or a block (32 inputs). */
static int format_unit(int format, size_t *unit_bytes, size_t *unit_inputs)
{
    switch (format) {
    case TB_FMT_BF16: *unit_bytes = 2;          *unit_inputs = 1;      return 1;
    case TB_FMT_Q8_0: *unit_bytes = Q8_0_BYTES; *unit_inputs = QBLOCK; return 1;
    case TB_FMT_Q4_0: *unit_bytes = Q4_0_BYTES; *unit_inputs = QBLOCK; return 1;
    default:          return 0;
    }
}

/* *n = doubles of W (d_in, d_out); *bytes = its stored size; *unit_bytes as format_unit. */
static tb_status stored_sizes(int format, int64_t d_in, int64_t d_out, size_t *n, size_t *bytes,
                              size_t *unit_bytes)
{
    size_t unit_inputs, i, o;
    if (!format_unit(format, unit_bytes, &unit_inputs))
        return TB_ERR_FORMAT;
    if (d_in < 1 || d_out < 1)
        return TB_ERR_DIM;
    if (d_in % (int64_t)unit_inputs != 0)
        return TB_ERR_BLOCK;
    /* mul_size caps at TB_MAX_DOUBLES: stricter than needed for a count of bytes, never wrong */
    if (!dim_size(d_in, &i) || !dim_size(d_out, &o) || !mul_size(i, o, n) ||
        !mul_size(*n / unit_inputs, *unit_bytes, bytes))
        return TB_ERR_OVERFLOW;
    return TB_OK;
}

/* 1 when [a, a + a_bytes) and [b, b + b_bytes) share a byte. */
static int bytes_overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes)
{
    const uintptr_t a0 = (uintptr_t)a, a1 = a0 + a_bytes;
    const uintptr_t b0 = (uintptr_t)b, b1 = b0 + b_bytes;
    return a0 < b1 && b0 < a1;
}

/* 1 when every unit's leading float is finite: each bf16 value, or each block's float16
 * scale. Checked before anything is written, so an error leaves out untouched. */
static int stored_finite(const uint8_t *data, size_t bytes, size_t unit_bytes, int format)
{
    const int exp_bits = format == TB_FMT_BF16 ? 8 : 5, man_bits = format == TB_FMT_BF16 ? 7 : 10;
    for (size_t at = 0; at < bytes; at += unit_bytes)
        if (!small_float_finite(le16(data + at), exp_bits, man_bits))
            return 0;
    return 1;
}

/* Stored row o holds column o of W: input i of it lands at out[i * d_out + o]. */

static void unpack_bf16(double *out, const uint8_t *data, size_t d_in, size_t d_out)
{
    for (size_t o = 0; o < d_out; o++)
        for (size_t i = 0; i < d_in; i++)
            out[i * d_out + o] = bf16_at(data + 2 * (o * d_in + i));
}

static void unpack_q8_0(double *out, const uint8_t *data, size_t d_in, size_t d_out)
{
    const size_t blocks = d_in / QBLOCK;
    for (size_t o = 0; o < d_out; o++) {
        for (size_t b = 0; b < blocks; b++) {
            const uint8_t *block = data + (o * blocks + b) * Q8_0_BYTES;
            const double d = fp16_at(block);
            for (size_t j = 0; j < QBLOCK; j++) {
                const unsigned byte = block[2 + j];
                const int q = byte < 128 ? (int)byte : (int)byte - 256;   /* the int8, two's complement */
                out[(b * QBLOCK + j) * d_out + o] = d * (double)q;
            }
        }
    }
}

static void unpack_q4_0(double *out, const uint8_t *data, size_t d_in, size_t d_out)
{
    const size_t blocks = d_in / QBLOCK, half = QBLOCK / 2;
    for (size_t o = 0; o < d_out; o++) {
        for (size_t b = 0; b < blocks; b++) {
            const uint8_t *block = data + (o * blocks + b) * Q4_0_BYTES;
            const double d = fp16_at(block);
            for (size_t j = 0; j < half; j++) {
                const unsigned byte = block[2 + j];
                const int low = (int)(byte & 0x0Fu) - 8, high = (int)(byte >> 4) - 8;
                out[(b * QBLOCK + j) * d_out + o] = d * (double)low;          /* input j */
                out[(b * QBLOCK + j + half) * d_out + o] = d * (double)high;  /* input j + 16 */
            }
        }
    }
}

tb_status tb_dequantize(double *out, size_t out_len, const uint8_t *data, size_t data_len,
                        int format, int64_t d_in, int64_t d_out)
{
    size_t n, bytes, unit_bytes;
    if (out == NULL || data == NULL)
        return TB_ERR_NULL_ARG;
    TRY(stored_sizes(format, d_in, d_out, &n, &bytes, &unit_bytes));
    /* exactly: a longer buffer means the caller's idea of the shape or format differs */
    if (data_len != bytes)
        return TB_ERR_DATA_SIZE;
    if (out_len < n)
        return TB_ERR_OUTPUT_SIZE;
    if (bytes_overlap(out, n * sizeof(double), data, bytes))
        return TB_ERR_OVERLAP;
    if (!stored_finite(data, bytes, unit_bytes, format))
        return TB_ERR_NOT_FINITE;

    /* every check passed: from here on nothing can fail */
    if (format == TB_FMT_BF16)
        unpack_bf16(out, data, (size_t)d_in, (size_t)d_out);
    else if (format == TB_FMT_Q8_0)
        unpack_q8_0(out, data, (size_t)d_in, (size_t)d_out);
    else
        unpack_q4_0(out, data, (size_t)d_in, (size_t)d_out);
    return TB_OK;
}
