/*
 * tblock_ref.h: the plain C99 reference of Lesson 13's transformer block.
 *
 * The second, independent implementation every fast kernel is checked against,
 * so it is written to be checked by eye, not to be fast: double precision,
 * libm only, no globals, no allocation, no fast-math.
 *
 *   Pre-LN  (the lesson):  H_mid = H_in  + MHA(LN1(H_in))
 *                          H_out = H_mid + FFN(LN2(H_mid))
 *   Post-LN (Exercise 3):  H_mid = LN1(H_in  + MHA(H_in))
 *                          H_out = LN2(H_mid + FFN(H_mid))
 *
 *   MHA(X): Q = X W_Q (+ b_Q), K = X W_K (+ b_K), V = X W_V (+ b_V); per head h
 *           (columns h*d_k .. h*d_k+d_k-1) S_h = Q_h K_h^T / sqrt(d_k), masked,
 *           A_h = softmax_rows(S_h), out_h = A_h V_h;
 *           out_concat = [out_1 ... out_H]; MHA(X) = out_concat W_O (+ b_O)
 *   FFN(X): F_pre = X W_ff1 (+ b_ff1); F_post = act(F_pre); F_out = F_post W_ff2 (+ b_ff2)
 *
 * The variants of the blocks in use today (Llama, Qwen2, SmolLM), each a tb_config
 * field whose zero value is the lesson's block:
 *   norm_type  RMSNorm: LN(x) = x / sqrt(mean(x^2) + eps) * gamma (no mean taken out, no beta)
 *   ffn        gated: F_pre = X W_ff1 (+ b_ff1), F_gate = X W_gate (+ b_gate),
 *              F_post = act(F_gate) * F_pre, F_out = F_post W_ff2 (+ b_ff2) (SwiGLU with silu)
 *   positions  rotary: Q and K, after their biases, turned per head (Hugging Face's
 *              rotate-half pairing): for pair j < d_k/2 of a head, x1 = x[j], x2 = x[j + d_k/2],
 *              at absolute position t (past + i with a cache), in double:
 *                inv_freq = 1 / rope_theta^(2j / d_k), angle = (t / rope_scale) * inv_freq,
 *                x[j] = x1 cos(angle) - x2 sin(angle), x[j + d_k/2] = x2 cos(angle) + x1 sin(angle)
 *   n_kv_heads grouped-query attention: K and V have d_kv = n_kv_heads * d_k columns, and
 *              query head h reads K/V head h / (n_heads / n_kv_heads); the scale stays 1/sqrt(d_k)
 *   has_attn_bias TB_BIAS_QKV: b_Q, b_K, b_V without b_O (Qwen2)
 *
 * Conventions
 *   - Every matrix is a row-major array of doubles; a layer acts by right
 *     multiplication (row convention), X @ W, as in the lesson.
 *   - Every buffer is passed with its length, counted in doubles. A function
 *     fails if a length is smaller than the shapes need, and never touches a
 *     double past what the shapes need.
 *   - Every entry point checks all of its arguments before it writes anything:
 *     on error it returns a tb_status other than TB_OK and has written nothing.
 *   - Output buffers must not overlap any other buffer of the same call
 *     (TB_ERR_OVERLAP); read-only buffers may overlap each other.
 */
#ifndef TBLOCK_REF_H
#define TBLOCK_REF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- cffi-cdef-begin ----
 * c_ref/build_cref.py hands the text between these two markers to cffi's cdef,
 * so it must stay plain declarations: no #define, no #if, no inline code. */

/* What every entry point returns. */
typedef enum {
    TB_OK = 0,
    TB_ERR_NULL_ARG,          /* a required pointer argument is NULL */
    TB_ERR_NULL_WEIGHT,       /* a weight the config needs is NULL (gamma given without beta counts too) */
    TB_ERR_UNEXPECTED_WEIGHT, /* an optional weight is given although the config's flag says absent */
    TB_ERR_NULL_TRACE,        /* a trace struct is given but one of its arrays is NULL */
    TB_ERR_DIM,               /* a dimension (B, T, d_model, n_heads, d_ff, rows, cols, d_in, d_out) is < 1 */
    TB_ERR_HEADS,             /* d_model is not divisible by n_heads */
    TB_ERR_HEAD_INDEX,        /* a head index outside 0 .. n_heads-1 */
    TB_ERR_NORM,              /* norm is not TB_NORM_PRE or TB_NORM_POST */
    TB_ERR_ACTIVATION,        /* activation is not one of TB_ACT_* */
    TB_ERR_FLAG,              /* causal, has_ffn_bias or has_ln_affine is not 0 or 1, has_attn_bias not a tb_attn_bias */
    TB_ERR_EPS,               /* eps is <= 0, NaN or infinite */
    TB_ERR_OVERFLOW,          /* a buffer size (in doubles or in bytes) does not fit in size_t */
    TB_ERR_INPUT_SIZE,        /* an input buffer is shorter than its shape */
    TB_ERR_OUTPUT_SIZE,       /* an output buffer is shorter than its shape */
    TB_ERR_WEIGHT_SIZE,       /* a weight buffer is shorter than its shape */
    TB_ERR_SCRATCH_SIZE,      /* the scratch buffer is shorter than tb_scratch_len says */
    TB_ERR_TRACE_SIZE,        /* a trace buffer is shorter than its shape */
    TB_ERR_OVERLAP,           /* an output buffer overlaps another buffer of the call */
    TB_ERR_NOT_CAUSAL,        /* a KV-cache call on a config with causal = 0 */
    TB_ERR_CACHE_RANGE,       /* past < 0, or past + T_new > max_T: the new rows do not fit in the cache */
    TB_ERR_CACHE_SIZE,        /* a key or value cache is shorter than (B, n_kv_heads, max_T, d_k) */
    TB_ERR_FORMAT,            /* tb_dequantize: format is not one of TB_FMT_* */
    TB_ERR_BLOCK,             /* tb_dequantize: a blocked format's d_in is not a multiple of 32 */
    TB_ERR_DATA_SIZE,         /* tb_dequantize: data_len is not exactly the stored size of the shape */
    TB_ERR_NOT_FINITE,        /* tb_dequantize: a stored scale or bf16 value is NaN or infinite */
    TB_ERR_DOT,               /* dot is not a tb_dot, or TB_DOT_Q8 with d_model or d_ff not a multiple of 32 */
    TB_ERR_KV,                /* kv is not a tb_kv */
    TB_ERR_NORM_TYPE,         /* norm_type is not a tb_norm_type */
    TB_ERR_FFN,               /* ffn is not a tb_ffn_kind, or the entry point does not compute this one */
    TB_ERR_POSITIONS,         /* positions is not a tb_positions (or tb_rotary_rows without rotary) */
    TB_ERR_ROPE,              /* rotary with rope_theta or rope_scale not positive and finite, or d_k odd */
    TB_ERR_KV_HEADS,          /* n_kv_heads is < 0 or does not divide n_heads */
    TB_STATUS_COUNT           /* number of codes; not a code */
} tb_status;

/* Where the LayerNorms sit (tb_config.norm). */
typedef enum {
    TB_NORM_PRE = 0,          /* H + f(LN(H)), the lesson */
    TB_NORM_POST = 1          /* LN(H + f(H)), the original Transformer */
} tb_norm;

/* The FFN's nonlinearity (tb_config.activation). */
typedef enum {
    TB_ACT_GELU_TANH = 0,     /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), GPT-2 */
    TB_ACT_GELU_ERF = 1,      /* 0.5 x (1 + erf(x / sqrt(2))), exact GELU */
    TB_ACT_RELU = 2,          /* max(x, 0) */
    TB_ACT_SILU = 3           /* x / (1 + exp(-x)), SwiGLU's (with the gated FFN) */
} tb_activation;

/* Which norm LN1 and LN2 are (tb_config.norm_type). */
typedef enum {
    TB_LAYERNORM = 0,         /* (x - mean) / sqrt(var + eps) (* gamma + beta), the lesson */
    TB_RMSNORM = 1            /* x / sqrt(mean(x^2) + eps) (* gamma), Llama's */
} tb_norm_type;

/* Which FFN the block has (tb_config.ffn). */
typedef enum {
    TB_FFN_MLP = 0,           /* act(X W_ff1) W_ff2, the lesson */
    TB_FFN_GATED = 1          /* (act(X W_gate) * (X W_ff1)) W_ff2 */
} tb_ffn_kind;

/* How token positions enter the block (tb_config.positions). */
typedef enum {
    TB_POS_NONE = 0,          /* they come with the input (a learned table added before the block) */
    TB_POS_ROTARY = 1         /* rotary embeddings turn Q and K */
} tb_positions;

/* Which attention projections carry a bias (tb_config.has_attn_bias). */
typedef enum {
    TB_BIAS_NONE = 0,         /* none, the lesson */
    TB_BIAS_QKVO = 1,         /* b_q, b_k, b_v and b_o (GPT-2) */
    TB_BIAS_QKV = 2           /* b_q, b_k, b_v, no b_o (Qwen2) */
} tb_attn_bias;

/* How a quantized weight matrix W (d_in, d_out) is stored (tb_dequantize). The
 * stored rows are W^T, one per output feature, as Hugging Face and GGUF files hold
 * them; every multi-byte number is little-endian.
 *   BF16: d_out rows of d_in uint16, each the top half of a float32.
 *   Q8_0: d_out rows of d_in/32 blocks of 34 bytes: a float16 scale d, then 32
 *         int8 q; input j of the block is d * q[j].
 *   Q4_0: d_out rows of d_in/32 blocks of 18 bytes: a float16 scale d, then 16
 *         bytes; byte j holds input j in its low nibble and input j+16 in its
 *         high one, each worth d * (nibble - 8). */
typedef enum {
    TB_FMT_BF16 = 0,
    TB_FMT_Q8_0 = 1,
    TB_FMT_Q4_0 = 2
} tb_format;

/* How a product X @ W with a weight matrix is computed (tb_config.dot).
 *   EXACT: X's doubles times W's.
 *   Q8:    each row of X first rounded as llama.cpp rounds activations for its 8-bit
 *          dot products, in float32, block by block of 32 inputs: amax = max |x|;
 *          d = amax / 127, q = rint(x * (127 / amax)) (ties to even), x -> d * q
 *          (0 where amax is 0 or 127 / amax overflows). d_model and d_ff must be
 *          multiples of 32.
 *   BF16:  each input rounded to float32, then to the nearest bfloat16 (ties to even);
 *          float32 subnormals, of the inputs and of W, count as zero (as vdpbf16ps). */
typedef enum {
    TB_DOT_EXACT = 0,
    TB_DOT_Q8 = 1,
    TB_DOT_BF16 = 2
} tb_dot;

/* How the caller's key/value cache holds what tb_block_forward_cached writes there
 * (tb_config.kv), so that attention reads the new rows as later calls will read them:
 *   EXACT: as computed.
 *   BF16:  each value rounded to float32, then to the nearest bfloat16 (ties to even).
 *   Q8:    each head's row of d_k values rounded as TB_DOT_Q8 rounds a block of 32.
 * The cache buffers still receive the exact rows: the caller stores them in its format. */
typedef enum {
    TB_KV_EXACT = 0,
    TB_KV_BF16 = 1,
    TB_KV_Q8 = 2
} tb_kv;

/* The block's hyper-parameters. */
typedef struct {
    int64_t d_model;          /* width of the residual stream, >= 1 */
    int64_t n_heads;          /* attention heads, >= 1, divides d_model; d_k = d_model / n_heads */
    int64_t d_ff;             /* hidden width of the FFN, >= 1 */
    int     causal;           /* 1: query t sees keys i <= t; 0: every key */
    int     norm;             /* a tb_norm */
    int     activation;       /* a tb_activation */
    double  eps;              /* LayerNorm epsilon, added to the variance inside the sqrt; > 0, finite */
    int     has_ffn_bias;     /* 1: b_ff1, b_ff2 are given; 0: they must be NULL */
    int     has_ln_affine;    /* 1: ln1/ln2 gamma, beta are given; 0: they must be NULL */
    int     has_attn_bias;    /* a tb_attn_bias: which of b_q, b_k, b_v, b_o are given (the rest NULL) */
    int     dot;              /* a tb_dot: how products with w_q .. w_ff2 and w_gate are computed */
    int     kv;               /* a tb_kv: how a KV cache call's caller stores keys and values */
    int     norm_type;        /* a tb_norm_type; RMSNorm's affine is gamma only (betas NULL) */
    int     ffn;              /* a tb_ffn_kind; gated: w_gate given (and b_gate with has_ffn_bias) */
    int     positions;        /* a tb_positions; rotary needs d_k even */
    double  rope_theta;       /* rotary base, > 0 and finite (read with rotary only) */
    double  rope_scale;       /* rotary's linear scaling: positions divided by it, > 0 (rotary only) */
    int64_t n_kv_heads;       /* heads of K and V, dividing n_heads; 0 means n_heads */
} tb_config;

/* The block's parameters, each with its length in doubles. */
typedef struct {
    const double *w_q;       size_t w_q_len;        /* (d_model, d_model): Q = X @ w_q */
    const double *w_k;       size_t w_k_len;        /* (d_model, d_kv): K = X @ w_k */
    const double *w_v;       size_t w_v_len;        /* (d_model, d_kv): V = X @ w_v */
    const double *w_o;       size_t w_o_len;        /* (d_model, d_model): A_out = out_concat @ w_o */
    const double *w_ff1;     size_t w_ff1_len;      /* (d_model, d_ff):    F_pre = X @ w_ff1 */
    const double *w_ff2;     size_t w_ff2_len;      /* (d_ff, d_model):    F_out = F_post @ w_ff2 */
    const double *b_ff1;     size_t b_ff1_len;      /* (d_ff,)    or NULL without has_ffn_bias */
    const double *b_ff2;     size_t b_ff2_len;      /* (d_model,) or NULL without has_ffn_bias */
    const double *ln1_gamma; size_t ln1_gamma_len;  /* (d_model,) or NULL without has_ln_affine */
    const double *ln1_beta;  size_t ln1_beta_len;   /* (d_model,) or NULL without has_ln_affine */
    const double *ln2_gamma; size_t ln2_gamma_len;  /* (d_model,) or NULL without has_ln_affine */
    const double *ln2_beta;  size_t ln2_beta_len;   /* (d_model,) or NULL without has_ln_affine */
    const double *b_q;       size_t b_q_len;        /* (d_model,) or NULL without has_attn_bias */
    const double *b_k;       size_t b_k_len;        /* (d_kv,)    or NULL without has_attn_bias */
    const double *b_v;       size_t b_v_len;        /* (d_kv,)    or NULL without has_attn_bias */
    const double *b_o;       size_t b_o_len;        /* (d_model,) or NULL unless has_attn_bias is TB_BIAS_QKVO */
    const double *w_gate;    size_t w_gate_len;     /* (d_model, d_ff): F_gate = X @ w_gate; NULL unless gated */
    const double *b_gate;    size_t b_gate_len;     /* (d_ff,) or NULL unless gated with has_ffn_bias */
} tb_weights;

/* Working memory for tb_block_forward (tb_block_forward_cached), allocated by the
 * caller: len >= what tb_scratch_len (tb_scratch_len_cached) returns. */
typedef struct {
    double *data;
    size_t  len;
} tb_scratch;

/* Optional outputs of tb_block_forward: the lesson's intermediates for the
 * whole batch, each with its length in doubles. All thirteen must be given,
 * and F_gate too with the gated FFN (without it F_gate is not read or written).
 * For Post-LN, H_norm1 is LN1(H_in + A_out) (= H_mid) and H_norm2 is
 * LN2(H_mid + F_out) (= H_out); Q, K, V are then computed from H_in and
 * F_pre from H_mid. Q and K are after rotary, when the config has it. */
typedef struct {
    double *H_norm1;    size_t H_norm1_len;     /* (B, T, d_model) LN1 output */
    double *Q;          size_t Q_len;           /* (B, T, d_model) */
    double *K;          size_t K_len;           /* (B, T, d_kv) */
    double *V;          size_t V_len;           /* (B, T, d_kv) */
    double *A;          size_t A_len;           /* (B, n_heads, T, T) attention probabilities */
    double *out_concat; size_t out_concat_len;  /* (B, T, d_model) head outputs side by side */
    double *A_out;      size_t A_out_len;       /* (B, T, d_model) out_concat @ w_o (+ b_o) */
    double *H_mid;      size_t H_mid_len;       /* (B, T, d_model) stream after the first sublayer */
    double *H_norm2;    size_t H_norm2_len;     /* (B, T, d_model) LN2 output */
    double *F_pre;      size_t F_pre_len;       /* (B, T, d_ff) */
    double *F_post;     size_t F_post_len;      /* (B, T, d_ff) */
    double *F_out;      size_t F_out_len;       /* (B, T, d_model) */
    double *H_out;      size_t H_out_len;       /* (B, T, d_model) block output */
    double *F_gate;     size_t F_gate_len;      /* (B, T, d_ff) the gated FFN's X @ w_gate (+ b_gate) */
} tb_trace;

/* A fixed English sentence for a status code (any int; unknown codes get one too). */
const char *tb_status_message(int status);
/* The code's enum name, e.g. "TB_ERR_DIM" ("TB_UNKNOWN_STATUS" for unknown codes). */
const char *tb_status_name(int status);

/* *len = doubles of scratch tb_block_forward needs for sequences of T tokens. */
tb_status tb_scratch_len(const tb_config *cfg, int64_t T, size_t *len);

/* out (rows, cols) = each row of X standardised: population variance over the
 * row, eps inside the sqrt; then * gamma + beta when both are given (each
 * (cols,), affine_len their length; both NULL for none). */
tb_status tb_layernorm_rows(double *out, size_t out_len,
                            const double *X, size_t X_len,
                            int64_t rows, int64_t cols,
                            const double *gamma, const double *beta, size_t affine_len,
                            double eps);

/* out (rows, cols) = each row scaled to unit root mean square: x / sqrt(mean(x^2) + eps);
 * then * gamma when it is given ((cols,), gamma_len its length; NULL for none). */
tb_status tb_rmsnorm_rows(double *out, size_t out_len,
                          const double *X, size_t X_len,
                          int64_t rows, int64_t cols,
                          const double *gamma, size_t gamma_len,
                          double eps);

/* out (rows, cols) = X with rotary positions: each of its cols / d_k heads turned as the
 * header's comment says, row t at position first + t. Uses cfg's d_model, n_heads
 * (d_k = d_model / n_heads), rope_theta and rope_scale; cfg->positions must be rotary,
 * cols a multiple of d_k (TB_ERR_HEADS otherwise), first >= 0 (TB_ERR_CACHE_RANGE). */
tb_status tb_rotary_rows(double *out, size_t out_len,
                         const double *X, size_t X_len,
                         int64_t rows, int64_t cols, int64_t first, const tb_config *cfg);

/* out (rows, cols) = row-wise softmax of S, max-subtracted. With causal = 1,
 * row t keeps only columns i <= t and the others are exactly 0. */
tb_status tb_masked_softmax_rows(double *out, size_t out_len,
                                 const double *S, size_t S_len,
                                 int64_t rows, int64_t cols, int causal);

/* One head: S (T, T) = Q_h K_g^T / sqrt(d_k); A_h (T, T) = masked softmax of S;
 * columns head*d_k .. head*d_k+d_k-1 of out_concat (T, d_model) = A_h V_g, where g =
 * head / (n_heads / n_kv_heads) is the K/V head it reads. Q is (T, d_model), K and V
 * (T, d_kv); the other columns of out_concat are left as they are. Q and K are taken
 * as given (rotated already, if the block rotates them). Uses cfg's d_model, n_heads,
 * n_kv_heads and causal (the whole cfg must be valid). */
tb_status tb_attention_head(double *out_concat, size_t out_concat_len,
                            double *A_h, size_t A_h_len,
                            double *S, size_t S_len,
                            const double *Q, size_t Q_len,
                            const double *K, size_t K_len,
                            const double *V, size_t V_len,
                            int64_t T, int64_t head, const tb_config *cfg);

/* FFN of X (T, d_model): F_pre (T, d_ff) = X w_ff1 (+ b_ff1); F_post (T, d_ff) =
 * act(F_pre); F_out (T, d_model) = F_post w_ff2 (+ b_ff2). Reads only the FFN
 * weights of w (w_q .. w_o and the LayerNorm ones may be anything). The two-matrix
 * FFN only: a gated cfg is TB_ERR_FFN (see tb_gated_ffn). */
tb_status tb_ffn(double *F_out, size_t F_out_len,
                 double *F_pre, size_t F_pre_len,
                 double *F_post, size_t F_post_len,
                 const double *X, size_t X_len,
                 int64_t T, const tb_config *cfg, const tb_weights *w);

/* The gated FFN of X (T, d_model): F_pre (T, d_ff) = X w_ff1 (+ b_ff1); F_gate (T, d_ff) =
 * X w_gate (+ b_gate); F_post (T, d_ff) = act(F_gate) * F_pre; F_out (T, d_model) =
 * F_post w_ff2 (+ b_ff2). cfg->ffn must be TB_FFN_GATED (TB_ERR_FFN otherwise). */
tb_status tb_gated_ffn(double *F_out, size_t F_out_len,
                       double *F_pre, size_t F_pre_len,
                       double *F_gate, size_t F_gate_len,
                       double *F_post, size_t F_post_len,
                       const double *X, size_t X_len,
                       int64_t T, const tb_config *cfg, const tb_weights *w);

/* The block on a batch: out (B, T, d_model) = block(in (B, T, d_model)),
 * each sequence on its own. trace may be NULL; when given, the intermediates
 * are written there too. */
tb_status tb_block_forward(double *out, size_t out_len,
                           const double *in, size_t in_len,
                           int64_t B, int64_t T,
                           const tb_config *cfg, const tb_weights *w,
                           const tb_scratch *scratch, const tb_trace *trace);

/* *len = doubles of scratch tb_block_forward_cached needs for T_new new tokens after
 * past cached ones (T_new >= 1, past >= 0; cfg must be causal). With past = 0 it is
 * what tb_scratch_len gives for T = T_new. */
tb_status tb_scratch_len_cached(const tb_config *cfg, int64_t T_new, int64_t past, size_t *len);

/* The block with a key/value cache, for incremental decoding (causal configs only).
 *
 * in (B, T_new, d_model) holds tokens past .. past+T_new-1 of B sequences whose first
 * past tokens' keys and values are in the caches. K_cache and V_cache are
 * (B, n_kv_heads, max_T, d_k) each (the K/V heads only): the key of token i, K/V head h,
 * sequence b is the d_k doubles at K_cache + ((b * n_kv_heads + h) * max_T + i) * d_k, the
 * value likewise; keys are stored after rotary, turned for their own positions.
 * The call writes the new tokens' keys and values at positions past .. past+T_new-1
 * (nothing else of the caches), and out (B, T_new, d_model) gets the rows that
 * tb_block_forward on the whole sequence of past + T_new tokens gives for them: new
 * token i attends to keys 0 .. past+i. The caches count as outputs for the overlap
 * check, each over its whole (B, n_kv_heads, max_T, d_k) extent. */
tb_status tb_block_forward_cached(double *out, size_t out_len,
                                  const double *in, size_t in_len,
                                  int64_t B, int64_t T_new, int64_t past, int64_t max_T,
                                  double *K_cache, size_t K_cache_len,
                                  double *V_cache, size_t V_cache_len,
                                  const tb_config *cfg, const tb_weights *w,
                                  const tb_scratch *scratch);

/* out (d_in, d_out) = the matrix W that data stores in `format` (a tb_format),
 * row-major doubles in the row convention (X @ W): out[i * d_out + o] is input i
 * of stored row o. Exact: every stored value is a double. data_len must be exactly
 * the stored size in bytes (d_out * d_in * 2 for BF16, d_out * d_in / 32 * 34 for
 * Q8_0, d_out * d_in / 32 * 18 for Q4_0), out_len >= d_in * d_out. A NaN or
 * infinite scale (or bf16 value) is TB_ERR_NOT_FINITE, found before anything is
 * written. */
tb_status tb_dequantize(double *out, size_t out_len, const uint8_t *data, size_t data_len,
                        int format, int64_t d_in, int64_t d_out);

/* ---- cffi-cdef-end ---- */

#ifdef __cplusplus
}
#endif

#endif /* TBLOCK_REF_H */
