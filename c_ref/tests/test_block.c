/*
 * test_block.c: tests of the C reference that need no Python.
 *
 * Calls every entry point of tblock_ref.h: small cases checked against values
 * worked out by hand, and every kind of bad argument, checking the returned
 * code and that no output byte changed. Every buffer is malloc'ed at exactly
 * the length the shapes need, so under -fsanitize=address a read or write one
 * past the end is caught. tests/test_c_sanitizers.py builds and runs it:
 *
 *   gcc -std=c99 -fsanitize=address,undefined -fno-omit-frame-pointer \
 *       -Ic_ref c_ref/tests/test_block.c c_ref/tblock_ref.c -lm -o test_block
 *
 * Prints one line per failure and closes with "N passed, M failed";
 * exits 0 only when nothing failed.
 */
#include "tblock_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int n_passed = 0, n_failed = 0;

static void check_at(int ok, const char *what, int line)
{
    if (ok) {
        n_passed++;
    } else {
        n_failed++;
        printf("FAIL line %d: %s\n", line, what);
    }
}
#define CHECK(cond) check_at((cond) != 0, #cond, __LINE__)

static void check_close_at(double got, double want, double tol, const char *what, int line)
{
    int ok = fabs(got - want) <= tol;
    if (!ok)
        printf("FAIL line %d: %s = %.17g, want %.17g (tol %g)\n", line, what, got, want, tol);
    check_at(ok, what, line);
}
#define CHECK_CLOSE(got, want) check_close_at((got), (want), 1e-15, #got, __LINE__)

static void check_status_at(tb_status got, tb_status want, const char *what, int line)
{
    if (got != want)
        printf("FAIL line %d: %s returned %s, want %s\n", line, what, tb_status_name(got), tb_status_name(want));
    check_at(got == want, what, line);
}
#define CHECK_STATUS(call, want) check_status_at((call), (want), #call, __LINE__)

/* ---- buffers ---- */

static const double SENTINEL = 777.25;   /* what an untouched output holds */

static double *alloc_doubles(size_t n)
{
    double *p = malloc(n * sizeof(double));
    if (p == NULL) {
        printf("out of memory\n");
        exit(2);
    }
    return p;
}

static void fill(double *p, size_t n, double v)
{
    for (size_t i = 0; i < n; i++)
        p[i] = v;
}

static int all_equal(const double *p, size_t n, double v)
{
    for (size_t i = 0; i < n; i++)
        if (!(p[i] == v))
            return 0;
    return 1;
}

static int all_finite(const double *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(p[i]))
            return 0;
    return 1;
}

/* Deterministic values in [-1, 1) from a local LCG state. */
static double next_value(unsigned long *state)
{
    *state = (*state * 1103515245UL + 12345UL) % 2147483648UL;
    return (double)*state / 1073741824.0 - 1.0;
}

static void fill_values(double *p, size_t n, unsigned long *state)
{
    for (size_t i = 0; i < n; i++)
        p[i] = next_value(state);
}

/* ---- status messages ---- */

static void test_status_strings(void)
{
    for (int code = 0; code < TB_STATUS_COUNT; code++) {
        CHECK(strcmp(tb_status_name(code), "TB_UNKNOWN_STATUS") != 0);
        CHECK(strncmp(tb_status_name(code), "TB_", 3) == 0);
        CHECK(strcmp(tb_status_message(code), "unknown status code") != 0);
        CHECK(strlen(tb_status_message(code)) > 0);
    }
    CHECK(strcmp(tb_status_name(TB_OK), "TB_OK") == 0);
    CHECK(strcmp(tb_status_name(TB_ERR_DIM), "TB_ERR_DIM") == 0);
    CHECK(strcmp(tb_status_name(TB_ERR_OVERLAP), "TB_ERR_OVERLAP") == 0);
    CHECK(strcmp(tb_status_name(-1), "TB_UNKNOWN_STATUS") == 0);
    CHECK(strcmp(tb_status_name(TB_STATUS_COUNT), "TB_UNKNOWN_STATUS") == 0);
    CHECK(strcmp(tb_status_message(-1), "unknown status code") == 0);
    CHECK(strcmp(tb_status_message(1000), "unknown status code") == 0);
}

/* ---- tb_layernorm_rows ---- */

static void test_layernorm(void)
{
    /* row [1, 2, 3]: mean 2, population variance 2/3; eps = 1/3 makes sqrt(var + eps) = 1,
     * so LN = [-1, 0, 1]. Row [5, 5, 5]: variance 0, so LN = [0, 0, 0] (eps keeps it finite). */
    double *X = alloc_doubles(6), *out = alloc_doubles(6);
    double *gamma = alloc_doubles(3), *beta = alloc_doubles(3);
    const double x[6] = {1, 2, 3, 5, 5, 5};
    const double g[3] = {2, 2, 2}, b[3] = {1, -1, 0.5};
    const double eps = 1.0 / 3.0;
    memcpy(X, x, sizeof x);
    memcpy(gamma, g, sizeof g);
    memcpy(beta, b, sizeof b);

    CHECK_STATUS(tb_layernorm_rows(out, 6, X, 6, 2, 3, NULL, NULL, 0, eps), TB_OK);
    CHECK_CLOSE(out[0], -1.0);
    CHECK_CLOSE(out[1], 0.0);
    CHECK_CLOSE(out[2], 1.0);
    CHECK(out[3] == 0.0 && out[4] == 0.0 && out[5] == 0.0);

    /* with gamma, beta: y * gamma + beta */
    CHECK_STATUS(tb_layernorm_rows(out, 6, X, 6, 2, 3, gamma, beta, 3, eps), TB_OK);
    CHECK_CLOSE(out[0], -1.0);   /* -1 * 2 + 1 */
    CHECK_CLOSE(out[1], -1.0);   /*  0 * 2 - 1 */
    CHECK_CLOSE(out[2], 2.5);    /*  1 * 2 + 0.5 */
    CHECK(out[3] == 1.0 && out[4] == -1.0 && out[5] == 0.5);

    /* eps matters: eps = 1e-5 gives 1 / sqrt(2/3 + 1e-5) for the last element of row 0 */
    CHECK_STATUS(tb_layernorm_rows(out, 6, X, 6, 2, 3, NULL, NULL, 0, 1e-5), TB_OK);
    CHECK_CLOSE(out[2], 1.0 / sqrt(2.0 / 3.0 + 1e-5));

    /* bad arguments: the status, and out untouched */
#define LN_BAD(call, want)                     \
    do {                                       \
        fill(out, 6, SENTINEL);                \
        CHECK_STATUS(call, want);              \
        CHECK(all_equal(out, 6, SENTINEL));    \
    } while (0)
    LN_BAD(tb_layernorm_rows(NULL, 6, X, 6, 2, 3, NULL, NULL, 0, eps), TB_ERR_NULL_ARG);
    LN_BAD(tb_layernorm_rows(out, 6, NULL, 6, 2, 3, NULL, NULL, 0, eps), TB_ERR_NULL_ARG);
    LN_BAD(tb_layernorm_rows(out, 6, X, 6, 2, 3, gamma, NULL, 3, eps), TB_ERR_NULL_WEIGHT);
    LN_BAD(tb_layernorm_rows(out, 6, X, 6, 2, 3, NULL, beta, 3, eps), TB_ERR_NULL_WEIGHT);
    LN_BAD(tb_layernorm_rows(out, 6, X, 6, 2, 3, NULL, NULL, 0, 0.0), TB_ERR_EPS);
    LN_BAD(tb_layernorm_rows(out, 6, X, 6, 2, 3, NULL, NULL, 0, -1e-5), TB_ERR_EPS);
    LN_BAD(tb_layernorm_rows(out, 6, X, 6, 2, 3, NULL, NULL, 0, NAN), TB_ERR_EPS);
    LN_BAD(tb_layernorm_rows(out, 6, X, 6, 2, 3, NULL, NULL, 0, INFINITY), TB_ERR_EPS);
    LN_BAD(tb_layernorm_rows(out, 6, X, 6, 0, 3, NULL, NULL, 0, eps), TB_ERR_DIM);
    LN_BAD(tb_layernorm_rows(out, 6, X, 6, 2, -3, NULL, NULL, 0, eps), TB_ERR_DIM);
    LN_BAD(tb_layernorm_rows(out, 6, X, 6, INT64_MAX, INT64_MAX, NULL, NULL, 0, eps), TB_ERR_OVERFLOW);
    LN_BAD(tb_layernorm_rows(out, 6, X, 6, INT64_MAX, 1, NULL, NULL, 0, eps), TB_ERR_OVERFLOW);
    LN_BAD(tb_layernorm_rows(out, 6, X, 5, 2, 3, NULL, NULL, 0, eps), TB_ERR_INPUT_SIZE);
    LN_BAD(tb_layernorm_rows(out, 5, X, 6, 2, 3, NULL, NULL, 0, eps), TB_ERR_OUTPUT_SIZE);
    LN_BAD(tb_layernorm_rows(out, 6, X, 6, 2, 3, gamma, beta, 2, eps), TB_ERR_WEIGHT_SIZE);
    LN_BAD(tb_layernorm_rows(out, 6, out, 6, 2, 3, NULL, NULL, 0, eps), TB_ERR_OVERLAP);
    LN_BAD(tb_layernorm_rows(out + 1, 5, out, 6, 1, 3, NULL, NULL, 0, eps), TB_ERR_OVERLAP);
#undef LN_BAD
    /* in place is refused, but rows of distinct buffers may sit next to each other */
    CHECK_STATUS(tb_layernorm_rows(out, 3, out + 3, 3, 1, 3, NULL, NULL, 0, eps), TB_OK);

    free(X);
    free(out);
    free(gamma);
    free(beta);
}

/* ---- tb_masked_softmax_rows ---- */

static void test_softmax(void)
{
    double *S = alloc_doubles(9), *A = alloc_doubles(9);

    /* unmasked row [0, ln 2, ln 3]: exp gives 1 : 2 : 3, so [1/6, 2/6, 3/6] */
    S[0] = 0.0;
    S[1] = log(2.0);
    S[2] = log(3.0);
    CHECK_STATUS(tb_masked_softmax_rows(A, 3, S, 3, 1, 3, 0), TB_OK);
    CHECK_CLOSE(A[0], 1.0 / 6.0);
    CHECK_CLOSE(A[1], 2.0 / 6.0);
    CHECK_CLOSE(A[2], 3.0 / 6.0);

    /* max subtraction: [1000, 1000, -1000] would overflow exp() without it */
    S[0] = 1000.0;
    S[1] = 1000.0;
    S[2] = -1000.0;
    CHECK_STATUS(tb_masked_softmax_rows(A, 3, S, 3, 1, 3, 0), TB_OK);
    CHECK_CLOSE(A[0], 0.5);
    CHECK_CLOSE(A[1], 0.5);
    CHECK(A[2] >= 0.0 && A[2] < 1e-300);

    /* causal 3 x 3 with equal scores: uniform over keys i <= t, masked exactly 0 */
    fill(S, 9, 0.0);
    S[1] = 1e300;     /* a masked score, however large, contributes nothing */
    S[2] = 1e300;
    S[5] = 1e300;
    CHECK_STATUS(tb_masked_softmax_rows(A, 9, S, 9, 3, 3, 1), TB_OK);
    CHECK(A[0] == 1.0 && A[1] == 0.0 && A[2] == 0.0);
    CHECK(A[3] == 0.5 && A[4] == 0.5 && A[5] == 0.0);
    CHECK_CLOSE(A[6], 1.0 / 3.0);
    CHECK_CLOSE(A[7], 1.0 / 3.0);
    CHECK_CLOSE(A[8], 1.0 / 3.0);

    /* causal on a wide (2 x 3) block: row t keeps columns i <= t */
    fill(S, 6, 0.0);
    CHECK_STATUS(tb_masked_softmax_rows(A, 6, S, 6, 2, 3, 1), TB_OK);
    CHECK(A[0] == 1.0 && A[1] == 0.0 && A[2] == 0.0 && A[3] == 0.5 && A[4] == 0.5 && A[5] == 0.0);

#define SM_BAD(call, want)                     \
    do {                                       \
        fill(A, 9, SENTINEL);                  \
        CHECK_STATUS(call, want);              \
        CHECK(all_equal(A, 9, SENTINEL));      \
    } while (0)
    SM_BAD(tb_masked_softmax_rows(NULL, 9, S, 9, 3, 3, 1), TB_ERR_NULL_ARG);
    SM_BAD(tb_masked_softmax_rows(A, 9, NULL, 9, 3, 3, 1), TB_ERR_NULL_ARG);
    SM_BAD(tb_masked_softmax_rows(A, 9, S, 9, 3, 3, 2), TB_ERR_FLAG);
    SM_BAD(tb_masked_softmax_rows(A, 9, S, 9, 3, 3, -1), TB_ERR_FLAG);
    SM_BAD(tb_masked_softmax_rows(A, 9, S, 9, 0, 3, 1), TB_ERR_DIM);
    SM_BAD(tb_masked_softmax_rows(A, 9, S, 9, 3, -1, 1), TB_ERR_DIM);
    SM_BAD(tb_masked_softmax_rows(A, 9, S, 9, INT64_MAX, 2, 1), TB_ERR_OVERFLOW);
    SM_BAD(tb_masked_softmax_rows(A, 9, S, 8, 3, 3, 1), TB_ERR_INPUT_SIZE);
    SM_BAD(tb_masked_softmax_rows(A, 8, S, 9, 3, 3, 1), TB_ERR_OUTPUT_SIZE);
    SM_BAD(tb_masked_softmax_rows(A, 9, A, 9, 3, 3, 1), TB_ERR_OVERLAP);
#undef SM_BAD
    free(S);
    free(A);
}

/* ---- tb_attention_head ---- */

static tb_config small_config(int64_t d_model, int64_t n_heads, int64_t d_ff, int causal)
{
    tb_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.d_model = d_model;
    cfg.n_heads = n_heads;
    cfg.d_ff = d_ff;
    cfg.causal = causal;
    cfg.norm = TB_NORM_PRE;
    cfg.activation = TB_ACT_GELU_TANH;
    cfg.eps = 1e-5;
    cfg.has_ffn_bias = 0;
    cfg.has_ln_affine = 0;
    cfg.has_attn_bias = 0;
    return cfg;
}

static void test_attention_head(void)
{
    /* T = 2, d_model = 2, two heads of d_k = 1; head 1 reads column 1.
     * Q[:,1] = [1, 1], K[:,1] = [0, ln 3], scale 1/sqrt(1): S = [[0, ln 3], [0, ln 3]].
     * causal: A = [[1, 0], [1/4, 3/4]]; V[:,1] = [2, 6]: out[:,1] = [2, 2/4 + 18/4 = 5].
     * unmasked: both rows [1/4, 3/4], out[:,1] = [5, 5]. Column 0 of out is not touched. */
    double *Q = alloc_doubles(4), *K = alloc_doubles(4), *V = alloc_doubles(4);
    double *out = alloc_doubles(4), *A = alloc_doubles(4), *S = alloc_doubles(4);
    tb_config cfg = small_config(2, 2, 8, 1);
    const double q[4] = {9, 1, 9, 1}, k[4] = {9, 0, 9, log(3.0)}, v[4] = {9, 2, 9, 6};
    memcpy(Q, q, sizeof q);
    memcpy(K, k, sizeof k);
    memcpy(V, v, sizeof v);

    fill(out, 4, SENTINEL);
    CHECK_STATUS(tb_attention_head(out, 4, A, 4, S, 4, Q, 4, K, 4, V, 4, 2, 1, &cfg), TB_OK);
    CHECK(out[0] == SENTINEL && out[2] == SENTINEL);
    CHECK_CLOSE(S[1], log(3.0));
    CHECK(A[0] == 1.0 && A[1] == 0.0);
    CHECK_CLOSE(A[2], 0.25);
    CHECK_CLOSE(A[3], 0.75);
    CHECK_CLOSE(out[1], 2.0);
    CHECK_CLOSE(out[3], 5.0);

    cfg.causal = 0;
    CHECK_STATUS(tb_attention_head(out, 4, A, 4, S, 4, Q, 4, K, 4, V, 4, 2, 1, &cfg), TB_OK);
    CHECK_CLOSE(A[0], 0.25);
    CHECK_CLOSE(out[1], 5.0);
    CHECK_CLOSE(out[3], 5.0);
    cfg.causal = 1;

#define AH_BAD(call, want)                                        \
    do {                                                          \
        fill(out, 4, SENTINEL);                                   \
        fill(A, 4, SENTINEL);                                     \
        fill(S, 4, SENTINEL);                                     \
        CHECK_STATUS(call, want);                                 \
        CHECK(all_equal(out, 4, SENTINEL) && all_equal(A, 4, SENTINEL) && all_equal(S, 4, SENTINEL)); \
    } while (0)
    AH_BAD(tb_attention_head(NULL, 4, A, 4, S, 4, Q, 4, K, 4, V, 4, 2, 1, &cfg), TB_ERR_NULL_ARG);
    AH_BAD(tb_attention_head(out, 4, NULL, 4, S, 4, Q, 4, K, 4, V, 4, 2, 1, &cfg), TB_ERR_NULL_ARG);
    AH_BAD(tb_attention_head(out, 4, A, 4, NULL, 4, Q, 4, K, 4, V, 4, 2, 1, &cfg), TB_ERR_NULL_ARG);
    AH_BAD(tb_attention_head(out, 4, A, 4, S, 4, NULL, 4, K, 4, V, 4, 2, 1, &cfg), TB_ERR_NULL_ARG);
    AH_BAD(tb_attention_head(out, 4, A, 4, S, 4, Q, 4, NULL, 4, V, 4, 2, 1, &cfg), TB_ERR_NULL_ARG);
    AH_BAD(tb_attention_head(out, 4, A, 4, S, 4, Q, 4, K, 4, NULL, 4, 2, 1, &cfg), TB_ERR_NULL_ARG);
    AH_BAD(tb_attention_head(out, 4, A, 4, S, 4, Q, 4, K, 4, V, 4, 2, 1, NULL), TB_ERR_NULL_ARG);
    AH_BAD(tb_attention_head(out, 4, A, 4, S, 4, Q, 4, K, 4, V, 4, 0, 1, &cfg), TB_ERR_DIM);
    AH_BAD(tb_attention_head(out, 4, A, 4, S, 4, Q, 4, K, 4, V, 4, 2, 2, &cfg), TB_ERR_HEAD_INDEX);
    AH_BAD(tb_attention_head(out, 4, A, 4, S, 4, Q, 4, K, 4, V, 4, 2, -1, &cfg), TB_ERR_HEAD_INDEX);
    AH_BAD(tb_attention_head(out, 4, A, 4, S, 4, Q, 3, K, 4, V, 4, 2, 1, &cfg), TB_ERR_INPUT_SIZE);
    AH_BAD(tb_attention_head(out, 4, A, 4, S, 4, Q, 4, K, 3, V, 4, 2, 1, &cfg), TB_ERR_INPUT_SIZE);
    AH_BAD(tb_attention_head(out, 4, A, 4, S, 4, Q, 4, K, 4, V, 3, 2, 1, &cfg), TB_ERR_INPUT_SIZE);
    AH_BAD(tb_attention_head(out, 3, A, 4, S, 4, Q, 4, K, 4, V, 4, 2, 1, &cfg), TB_ERR_OUTPUT_SIZE);
    AH_BAD(tb_attention_head(out, 4, A, 3, S, 4, Q, 4, K, 4, V, 4, 2, 1, &cfg), TB_ERR_OUTPUT_SIZE);
    AH_BAD(tb_attention_head(out, 4, A, 4, S, 3, Q, 4, K, 4, V, 4, 2, 1, &cfg), TB_ERR_SCRATCH_SIZE);
    AH_BAD(tb_attention_head(out, 4, A, 4, S, 4, out, 4, K, 4, V, 4, 2, 1, &cfg), TB_ERR_OVERLAP);
    AH_BAD(tb_attention_head(out, 4, A, 4, A, 4, Q, 4, K, 4, V, 4, 2, 1, &cfg), TB_ERR_OVERLAP);
    AH_BAD(tb_attention_head(out, 4, A, 4, S, 4, Q, 4, K, 4, S, 4, 2, 1, &cfg), TB_ERR_OVERLAP);
    /* a bad config is refused whole, even in fields this function does not use */
    cfg.d_model = 3;
    AH_BAD(tb_attention_head(out, 4, A, 4, S, 4, Q, 4, K, 4, V, 4, 2, 1, &cfg), TB_ERR_HEADS);
    cfg.d_model = 2;
    cfg.activation = 7;
    AH_BAD(tb_attention_head(out, 4, A, 4, S, 4, Q, 4, K, 4, V, 4, 2, 1, &cfg), TB_ERR_ACTIVATION);
    cfg.activation = TB_ACT_RELU;
    cfg.causal = 3;
    AH_BAD(tb_attention_head(out, 4, A, 4, S, 4, Q, 4, K, 4, V, 4, 2, 1, &cfg), TB_ERR_FLAG);
#undef AH_BAD
    free(Q);
    free(K);
    free(V);
    free(out);
    free(A);
    free(S);
}

/* ---- tb_ffn ---- */

static void test_ffn(void)
{
    /* d_model = d_ff = 1 so every step is a scalar */
    double *X = alloc_doubles(2), *F_pre = alloc_doubles(2), *F_post = alloc_doubles(2), *F_out = alloc_doubles(2);
    double *w1 = alloc_doubles(1), *w2 = alloc_doubles(1), *b1 = alloc_doubles(1), *b2 = alloc_doubles(1);
    tb_config cfg = small_config(1, 1, 1, 1);
    tb_weights w;
    memset(&w, 0, sizeof w);
    w.w_ff1 = w1;
    w.w_ff1_len = 1;
    w.w_ff2 = w2;
    w.w_ff2_len = 1;

    /* relu with biases: X = [1, -1], W1 = 2, b1 = -1: F_pre = [1, -3], F_post = [1, 0];
     * W2 = 3, b2 = 0.5: F_out = [3.5, 0.5] */
    cfg.activation = TB_ACT_RELU;
    cfg.has_ffn_bias = 1;
    X[0] = 1.0;
    X[1] = -1.0;
    w1[0] = 2.0;
    b1[0] = -1.0;
    w2[0] = 3.0;
    b2[0] = 0.5;
    w.b_ff1 = b1;
    w.b_ff1_len = 1;
    w.b_ff2 = b2;
    w.b_ff2_len = 1;
    CHECK_STATUS(tb_ffn(F_out, 2, F_pre, 2, F_post, 2, X, 2, 2, &cfg, &w), TB_OK);
    CHECK(F_pre[0] == 1.0 && F_pre[1] == -3.0);
    CHECK(F_post[0] == 1.0 && F_post[1] == 0.0);
    CHECK(F_out[0] == 3.5 && F_out[1] == 0.5);

    /* the GELUs without biases: X = [0.5, -0.5], W1 = 2 gives F_pre = [1, -1], W2 = 1.
     * gelu_erf(1) = Phi(1) = 0.8413447460685429, gelu_erf(-1) = -(1 - Phi(1));
     * gelu_tanh(1) = 0.5 (1 + tanh(sqrt(2/pi) 1.044715)) = 0.8411919906082768 */
    cfg.has_ffn_bias = 0;
    w.b_ff1 = NULL;
    w.b_ff1_len = 0;
    w.b_ff2 = NULL;
    w.b_ff2_len = 0;
    X[0] = 0.5;
    X[1] = -0.5;
    w2[0] = 1.0;
    cfg.activation = TB_ACT_GELU_ERF;
    CHECK_STATUS(tb_ffn(F_out, 2, F_pre, 2, F_post, 2, X, 2, 2, &cfg, &w), TB_OK);
    CHECK_CLOSE(F_post[0], 0.8413447460685429);
    CHECK_CLOSE(F_post[1], -0.15865525393145707);
    CHECK_CLOSE(F_out[0], 0.8413447460685429);
    cfg.activation = TB_ACT_GELU_TANH;
    CHECK_STATUS(tb_ffn(F_out, 2, F_pre, 2, F_post, 2, X, 2, 2, &cfg, &w), TB_OK);
    CHECK_CLOSE(F_post[0], 0.8411919906082768);
    CHECK_CLOSE(F_post[1], -0.15880800939172324);

    /* huge inputs stay finite: x^3 overflows to -inf, tanh(-inf) = -1, 0.5 x (1 - 1) = 0 */
    X[0] = -1e200;
    X[1] = 1e200;
    w1[0] = 1.0;
    w2[0] = 0.0;
    CHECK_STATUS(tb_ffn(F_out, 2, F_pre, 2, F_post, 2, X, 2, 2, &cfg, &w), TB_OK);
    CHECK(F_post[0] == 0.0 && F_post[1] == 1e200);
    cfg.activation = TB_ACT_GELU_ERF;
    CHECK_STATUS(tb_ffn(F_out, 2, F_pre, 2, F_post, 2, X, 2, 2, &cfg, &w), TB_OK);
    CHECK(F_post[0] == 0.0 && F_post[1] == 1e200);

#define FFN_BAD(call, want)                                                              \
    do {                                                                                 \
        fill(F_out, 2, SENTINEL);                                                        \
        fill(F_pre, 2, SENTINEL);                                                        \
        fill(F_post, 2, SENTINEL);                                                       \
        CHECK_STATUS(call, want);                                                        \
        CHECK(all_equal(F_out, 2, SENTINEL) && all_equal(F_pre, 2, SENTINEL) &&          \
              all_equal(F_post, 2, SENTINEL));                                           \
    } while (0)
    FFN_BAD(tb_ffn(NULL, 2, F_pre, 2, F_post, 2, X, 2, 2, &cfg, &w), TB_ERR_NULL_ARG);
    FFN_BAD(tb_ffn(F_out, 2, NULL, 2, F_post, 2, X, 2, 2, &cfg, &w), TB_ERR_NULL_ARG);
    FFN_BAD(tb_ffn(F_out, 2, F_pre, 2, NULL, 2, X, 2, 2, &cfg, &w), TB_ERR_NULL_ARG);
    FFN_BAD(tb_ffn(F_out, 2, F_pre, 2, F_post, 2, NULL, 2, 2, &cfg, &w), TB_ERR_NULL_ARG);
    FFN_BAD(tb_ffn(F_out, 2, F_pre, 2, F_post, 2, X, 2, 2, NULL, &w), TB_ERR_NULL_ARG);
    FFN_BAD(tb_ffn(F_out, 2, F_pre, 2, F_post, 2, X, 2, 2, &cfg, NULL), TB_ERR_NULL_ARG);
    FFN_BAD(tb_ffn(F_out, 2, F_pre, 2, F_post, 2, X, 2, 0, &cfg, &w), TB_ERR_DIM);
    FFN_BAD(tb_ffn(F_out, 2, F_pre, 2, F_post, 2, X, 2, INT64_MAX, &cfg, &w), TB_ERR_OVERFLOW);
    FFN_BAD(tb_ffn(F_out, 2, F_pre, 2, F_post, 2, X, 1, 2, &cfg, &w), TB_ERR_INPUT_SIZE);
    FFN_BAD(tb_ffn(F_out, 1, F_pre, 2, F_post, 2, X, 2, 2, &cfg, &w), TB_ERR_OUTPUT_SIZE);
    FFN_BAD(tb_ffn(F_out, 2, F_pre, 1, F_post, 2, X, 2, 2, &cfg, &w), TB_ERR_OUTPUT_SIZE);
    FFN_BAD(tb_ffn(F_out, 2, F_pre, 2, F_post, 1, X, 2, 2, &cfg, &w), TB_ERR_OUTPUT_SIZE);
    FFN_BAD(tb_ffn(F_out, 2, F_pre, 2, F_post, 2, F_out, 2, 2, &cfg, &w), TB_ERR_OVERLAP);
    FFN_BAD(tb_ffn(F_out, 2, F_pre, 2, F_pre, 2, X, 2, 2, &cfg, &w), TB_ERR_OVERLAP);
    cfg.activation = 4;
    FFN_BAD(tb_ffn(F_out, 2, F_pre, 2, F_post, 2, X, 2, 2, &cfg, &w), TB_ERR_ACTIVATION);
    cfg.activation = -1;
    FFN_BAD(tb_ffn(F_out, 2, F_pre, 2, F_post, 2, X, 2, 2, &cfg, &w), TB_ERR_ACTIVATION);
    cfg.activation = TB_ACT_RELU;
    w.w_ff1 = NULL;
    FFN_BAD(tb_ffn(F_out, 2, F_pre, 2, F_post, 2, X, 2, 2, &cfg, &w), TB_ERR_NULL_WEIGHT);
    w.w_ff1 = w1;
    w.w_ff2_len = 0;
    FFN_BAD(tb_ffn(F_out, 2, F_pre, 2, F_post, 2, X, 2, 2, &cfg, &w), TB_ERR_WEIGHT_SIZE);
    w.w_ff2_len = 1;
    w.b_ff2 = b2;                        /* a bias although has_ffn_bias = 0 */
    w.b_ff2_len = 1;
    FFN_BAD(tb_ffn(F_out, 2, F_pre, 2, F_post, 2, X, 2, 2, &cfg, &w), TB_ERR_UNEXPECTED_WEIGHT);
    cfg.has_ffn_bias = 1;                /* now b_ff1 is missing */
    FFN_BAD(tb_ffn(F_out, 2, F_pre, 2, F_post, 2, X, 2, 2, &cfg, &w), TB_ERR_NULL_WEIGHT);
    w.b_ff1 = b1;
    w.b_ff1_len = 0;
    FFN_BAD(tb_ffn(F_out, 2, F_pre, 2, F_post, 2, X, 2, 2, &cfg, &w), TB_ERR_WEIGHT_SIZE);
    w.b_ff1_len = 1;
    w.b_ff2 = F_pre;                     /* a weight the call would overwrite */
    FFN_BAD(tb_ffn(F_out, 2, F_pre, 2, F_post, 2, X, 2, 2, &cfg, &w), TB_ERR_OVERLAP);
    w.b_ff2 = b2;
    CHECK_STATUS(tb_ffn(F_out, 2, F_pre, 2, F_post, 2, X, 2, 2, &cfg, &w), TB_OK);
#undef FFN_BAD
    free(X);
    free(F_pre);
    free(F_post);
    free(F_out);
    free(w1);
    free(w2);
    free(b1);
    free(b2);
}

/* TB_DOT_Q8: the FFN's input rounded to int8 blocks of 32 before W1. With W1 = I (d = 32),
 * F_pre is the rounded row itself: amax 127 gives d = 1, so each input goes to its nearest
 * integer, ties to even; a zero row stays zero. d_model 48 (not a multiple of 32) is refused. */
static void test_ffn_q8_dot(void)
{
    enum { D = 32 };
    double *X = alloc_doubles(2 * D), *F_pre = alloc_doubles(2 * D), *F_post = alloc_doubles(2 * D);
    double *F_out = alloc_doubles(2 * D), *eye = alloc_doubles(D * D);
    const double x[8] = {127.0, 63.5, 62.5, -0.5, 0.5, 1.5, -2.5, 3.49};
    const double want[8] = {127.0, 64.0, 62.0, 0.0, 0.0, 2.0, -2.0, 3.0};
    tb_config cfg = small_config(D, 1, D, 1);
    tb_weights w;
    memset(&w, 0, sizeof w);
    fill(eye, D * D, 0.0);
    for (int i = 0; i < D; i++)
        eye[i * D + i] = 1.0;
    w.w_ff1 = w.w_ff2 = eye;
    w.w_ff1_len = w.w_ff2_len = D * D;
    fill(X, 2 * D, 0.0);
    memcpy(X, x, sizeof x);
    cfg.activation = TB_ACT_RELU;
    cfg.dot = TB_DOT_Q8;
    CHECK_STATUS(tb_ffn(F_out, 2 * D, F_pre, 2 * D, F_post, 2 * D, X, 2 * D, 2, &cfg, &w), TB_OK);
    int same = 1;
    for (int i = 0; i < 2 * D; i++)
        same &= F_pre[i] == (i < 8 ? want[i] : 0.0);
    CHECK(same);
    cfg.dot = 3;
    CHECK_STATUS(tb_ffn(F_out, 2 * D, F_pre, 2 * D, F_post, 2 * D, X, 2 * D, 2, &cfg, &w), TB_ERR_DOT);
    cfg = small_config(48, 1, D, 1);
    cfg.dot = TB_DOT_Q8;
    size_t len;
    CHECK_STATUS(tb_scratch_len(&cfg, 2, &len), TB_ERR_DOT);
    free(X);
    free(F_pre);
    free(F_post);
    free(F_out);
    free(eye);
}

/* ---- tb_block_forward ---- */

#define N_WEIGHTS 18
#define N_TRACE 14

/* Everything one tb_block_forward call needs, each buffer malloc'ed at exactly its shape. */
typedef struct {
    tb_config cfg;
    int64_t B, T;
    size_t n_seq;                        /* B * T * d_model */
    double *in, *out;
    tb_weights w;
    tb_scratch scratch;
    tb_trace trace;
    const double **weight[N_WEIGHTS];    /* the weight pointers of w, to loop over */
    size_t *weight_len[N_WEIGHTS];
    double **trace_buf[N_TRACE];         /* the array pointers of trace */
    size_t *trace_len[N_TRACE];
    size_t dkv;                          /* columns of K and V: n_kv_heads * d_k */
} fixture;

/* The K/V heads of cfg (n_kv_heads, 0 meaning n_heads) and their columns. */
static size_t kv_heads_of(const tb_config *cfg)
{
    return (size_t)(cfg->n_kv_heads == 0 ? cfg->n_heads : cfg->n_kv_heads);
}

static size_t dkv_of(const tb_config *cfg)
{
    return kv_heads_of(cfg) * (size_t)(cfg->d_model / cfg->n_heads);
}

static double *fixture_alloc(size_t n, unsigned long *state)
{
    double *p = alloc_doubles(n);
    fill_values(p, n, state);
    return p;
}

static void fixture_init(fixture *fx, tb_config cfg, int64_t B, int64_t T, unsigned long seed)
{
    const size_t b = (size_t)B, t = (size_t)T, d = (size_t)cfg.d_model, f = (size_t)cfg.d_ff,
                 h = (size_t)cfg.n_heads, kv = dkv_of(&cfg);
    const int gated = cfg.ffn == TB_FFN_GATED, betas = cfg.has_ln_affine && cfg.norm_type == TB_LAYERNORM;
    unsigned long state = seed;
    size_t n;
    memset(fx, 0, sizeof *fx);
    fx->cfg = cfg;
    fx->dkv = kv;
    fx->B = B;
    fx->T = T;
    fx->n_seq = b * t * d;
    fx->in = fixture_alloc(fx->n_seq, &state);
    fx->out = alloc_doubles(fx->n_seq);

    {
        const double **weight[N_WEIGHTS] = {
            &fx->w.w_q, &fx->w.w_k, &fx->w.w_v, &fx->w.w_o, &fx->w.w_ff1, &fx->w.w_ff2,
            &fx->w.b_ff1, &fx->w.b_ff2, &fx->w.ln1_gamma, &fx->w.ln1_beta, &fx->w.ln2_gamma, &fx->w.ln2_beta,
            &fx->w.b_q, &fx->w.b_k, &fx->w.b_v, &fx->w.b_o, &fx->w.w_gate, &fx->w.b_gate};
        size_t *weight_len[N_WEIGHTS] = {
            &fx->w.w_q_len, &fx->w.w_k_len, &fx->w.w_v_len, &fx->w.w_o_len, &fx->w.w_ff1_len, &fx->w.w_ff2_len,
            &fx->w.b_ff1_len, &fx->w.b_ff2_len, &fx->w.ln1_gamma_len, &fx->w.ln1_beta_len,
            &fx->w.ln2_gamma_len, &fx->w.ln2_beta_len,
            &fx->w.b_q_len, &fx->w.b_k_len, &fx->w.b_v_len, &fx->w.b_o_len, &fx->w.w_gate_len, &fx->w.b_gate_len};
        const size_t shape[N_WEIGHTS] = {d * d, d * kv, d * kv, d * d, d * f, f * d, f, d, d, d, d, d,
                                         d, kv, kv, d, d * f, f};
        const int present[N_WEIGHTS] = {1, 1, 1, 1, 1, 1, cfg.has_ffn_bias, cfg.has_ffn_bias,
                                        cfg.has_ln_affine, betas, cfg.has_ln_affine, betas,
                                        cfg.has_attn_bias != TB_BIAS_NONE, cfg.has_attn_bias != TB_BIAS_NONE,
                                        cfg.has_attn_bias != TB_BIAS_NONE, cfg.has_attn_bias == TB_BIAS_QKVO,
                                        gated, gated && cfg.has_ffn_bias};
        for (int i = 0; i < N_WEIGHTS; i++) {
            fx->weight[i] = weight[i];
            fx->weight_len[i] = weight_len[i];
            if (present[i]) {
                *weight[i] = fixture_alloc(shape[i], &state);
                *weight_len[i] = shape[i];
            }
        }
    }

    CHECK_STATUS(tb_scratch_len(&cfg, T, &n), TB_OK);
    fx->scratch.data = alloc_doubles(n);
    fx->scratch.len = n;

    {
        double **buf[N_TRACE] = {
            &fx->trace.H_norm1, &fx->trace.Q, &fx->trace.K, &fx->trace.V, &fx->trace.A,
            &fx->trace.out_concat, &fx->trace.A_out, &fx->trace.H_mid, &fx->trace.H_norm2,
            &fx->trace.F_pre, &fx->trace.F_post, &fx->trace.F_out, &fx->trace.H_out, &fx->trace.F_gate};
        size_t *len[N_TRACE] = {
            &fx->trace.H_norm1_len, &fx->trace.Q_len, &fx->trace.K_len, &fx->trace.V_len, &fx->trace.A_len,
            &fx->trace.out_concat_len, &fx->trace.A_out_len, &fx->trace.H_mid_len, &fx->trace.H_norm2_len,
            &fx->trace.F_pre_len, &fx->trace.F_post_len, &fx->trace.F_out_len, &fx->trace.H_out_len,
            &fx->trace.F_gate_len};
        const size_t shape[N_TRACE] = {b * t * d, b * t * d, b * t * kv, b * t * kv, b * h * t * t,
                                       b * t * d, b * t * d, b * t * d, b * t * d, b * t * f, b * t * f,
                                       b * t * d, b * t * d, b * t * f};
        for (int i = 0; i < N_TRACE; i++) {
            fx->trace_buf[i] = buf[i];
            fx->trace_len[i] = len[i];
            if (i < N_TRACE - 1 || gated) {     /* F_gate: the gated FFN's only */
                *buf[i] = alloc_doubles(shape[i]);
                *len[i] = shape[i];
            }
        }
    }
}

static void fixture_free(fixture *fx)
{
    free(fx->in);
    free(fx->out);
    for (int i = 0; i < N_WEIGHTS; i++)
        free((void *)*fx->weight[i]);
    free(fx->scratch.data);
    for (int i = 0; i < N_TRACE; i++)
        free(*fx->trace_buf[i]);
}

/* Output, scratch and every (non-NULL) trace array all SENTINEL. */
static void fixture_mark(fixture *fx)
{
    fill(fx->out, fx->n_seq, SENTINEL);
    fill(fx->scratch.data, fx->scratch.len, SENTINEL);
    for (int i = 0; i < N_TRACE; i++)
        if (*fx->trace_buf[i] != NULL)
            fill(*fx->trace_buf[i], *fx->trace_len[i], SENTINEL);
}

static int fixture_untouched(const fixture *fx)
{
    if (!all_equal(fx->out, fx->n_seq, SENTINEL) || !all_equal(fx->scratch.data, fx->scratch.len, SENTINEL))
        return 0;
    for (int i = 0; i < N_TRACE; i++)
        if (*fx->trace_buf[i] != NULL && !all_equal(*fx->trace_buf[i], *fx->trace_len[i], SENTINEL))
            return 0;
    return 1;
}

static tb_status fixture_run(fixture *fx, int with_trace)
{
    return tb_block_forward(fx->out, fx->n_seq, fx->in, fx->n_seq, fx->B, fx->T, &fx->cfg, &fx->w,
                            &fx->scratch, with_trace ? &fx->trace : NULL);
}

/* d_model = 1 by hand. A row of one element has mean = itself, so LN gives exactly
 * beta; all scores of a head are then equal and attention averages equal values. */
static void test_block_by_hand(void)
{
    fixture fx;
    tb_config cfg = small_config(1, 1, 1, 1);
    const double H_in[6] = {1, 2, 3, -1, 0, 10};      /* B = 2 sequences of T = 3 tokens */
    cfg.activation = TB_ACT_RELU;
    cfg.has_ffn_bias = 1;
    cfg.has_ln_affine = 1;
    cfg.has_attn_bias = 1;
    fixture_init(&fx, cfg, 2, 3, 1);
    memcpy(fx.in, H_in, sizeof H_in);
    /* LN1 -> beta1 = 0.5; Q = 0.5*2 + 0.5 = 1.5, K = 0.5*3 + 1 = 2.5, V = 0.5*4 - 1 = 1;
     * A_out = 1*0.25 + 0.25 = 0.5;
     * LN2 -> beta2 = -1; F_pre = -1*2 + 3 = 1; F_post = 1; F_out = 1*0.5 + 0.25 = 0.75 */
    *(double *)fx.w.ln1_gamma = 7.0;
    *(double *)fx.w.ln1_beta = 0.5;
    *(double *)fx.w.w_q = 2.0;
    *(double *)fx.w.w_k = 3.0;
    *(double *)fx.w.w_v = 4.0;
    *(double *)fx.w.w_o = 0.25;
    *(double *)fx.w.b_q = 0.5;
    *(double *)fx.w.b_k = 1.0;
    *(double *)fx.w.b_v = -1.0;
    *(double *)fx.w.b_o = 0.25;
    *(double *)fx.w.ln2_gamma = 7.0;
    *(double *)fx.w.ln2_beta = -1.0;
    *(double *)fx.w.w_ff1 = 2.0;
    *(double *)fx.w.b_ff1 = 3.0;
    *(double *)fx.w.w_ff2 = 0.5;
    *(double *)fx.w.b_ff2 = 0.25;

    /* Pre-LN: H_mid = H_in + 0.5, H_out = H_mid + 0.75 */
    fill(fx.scratch.data, fx.scratch.len, NAN);   /* a scratch value read before written would show */
    CHECK_STATUS(fixture_run(&fx, 1), TB_OK);
    for (int i = 0; i < 6; i++) {
        CHECK(fx.trace.H_norm1[i] == 0.5);
        CHECK(fx.trace.Q[i] == 1.5 && fx.trace.K[i] == 2.5 && fx.trace.V[i] == 1.0);
        CHECK_CLOSE(fx.trace.out_concat[i], 1.0);
        CHECK_CLOSE(fx.trace.A_out[i], 0.5);
        CHECK_CLOSE(fx.trace.H_mid[i], H_in[i] + 0.5);
        CHECK(fx.trace.H_norm2[i] == -1.0);
        CHECK(fx.trace.F_pre[i] == 1.0 && fx.trace.F_post[i] == 1.0 && fx.trace.F_out[i] == 0.75);
        CHECK_CLOSE(fx.trace.H_out[i], H_in[i] + 1.25);
        CHECK(fx.out[i] == fx.trace.H_out[i]);
    }
    for (int seq = 0; seq < 2; seq++) {   /* causal, equal scores: uniform over keys i <= t */
        const double *A = fx.trace.A + seq * 9;
        CHECK(A[0] == 1.0 && A[1] == 0.0 && A[2] == 0.0);
        CHECK(A[3] == 0.5 && A[4] == 0.5 && A[5] == 0.0);
        CHECK_CLOSE(A[6], 1.0 / 3.0);
        CHECK_CLOSE(A[8], 1.0 / 3.0);
    }

    /* Post-LN: H_mid = LN1(...) = beta1 = 0.5 and H_out = LN2(...) = beta2 = -1 whatever the sums;
     * F_pre = 0.5*2 + 3 = 4; Q, K, V read H_in: Q = 2 H_in + 0.5, V = 4 H_in - 1 */
    fx.cfg.norm = TB_NORM_POST;
    CHECK_STATUS(fixture_run(&fx, 1), TB_OK);
    for (int i = 0; i < 6; i++) {
        CHECK(fx.trace.H_mid[i] == 0.5 && fx.trace.H_norm1[i] == 0.5);
        CHECK(fx.trace.H_out[i] == -1.0 && fx.trace.H_norm2[i] == -1.0 && fx.out[i] == -1.0);
        CHECK(fx.trace.F_pre[i] == 4.0 && fx.trace.F_out[i] == 4.0 * 0.5 + 0.25);
        CHECK(fx.trace.Q[i] == 2.0 * H_in[i] + 0.5 && fx.trace.V[i] == 4.0 * H_in[i] - 1.0);
    }
    /* token 0 sees only itself: its head output is its own value */
    CHECK(fx.trace.out_concat[0] == 4.0 * H_in[0] - 1.0 && fx.trace.out_concat[3] == 4.0 * H_in[3] - 1.0);
    fixture_free(&fx);
}

/* A batch is its sequences one by one; the trace does not change the output; a longer
 * output buffer is written only within its shape. */
static tb_config with_variant(tb_config cfg, int v);

static void test_block_consistency(int norm, int activation, int causal, int bias, int affine,
                                   int attn_bias, int variant)
{
    tb_config cfg = small_config(6, 3, 10, causal);
    fixture fx;
    double *one_out, *padded;
    size_t per_seq;
    cfg.norm = norm;
    cfg.activation = activation;
    cfg.has_ffn_bias = bias;
    cfg.has_ln_affine = affine;
    cfg.has_attn_bias = attn_bias;
    cfg = with_variant(cfg, variant);
    fixture_init(&fx, cfg, 3, 5, 42);
    per_seq = fx.n_seq / 3;

    fill(fx.scratch.data, fx.scratch.len, NAN);
    CHECK_STATUS(fixture_run(&fx, 0), TB_OK);
    CHECK(all_finite(fx.out, fx.n_seq));

    one_out = alloc_doubles(per_seq);
    for (int seq = 0; seq < 3; seq++) {
        CHECK_STATUS(tb_block_forward(one_out, per_seq, fx.in + (size_t)seq * per_seq, per_seq, 1, 5,
                                      &fx.cfg, &fx.w, &fx.scratch, NULL), TB_OK);
        CHECK(memcmp(one_out, fx.out + (size_t)seq * per_seq, per_seq * sizeof(double)) == 0);
    }
    free(one_out);

    padded = alloc_doubles(fx.n_seq + 4);
    fill(padded, fx.n_seq + 4, SENTINEL);
    CHECK_STATUS(tb_block_forward(padded, fx.n_seq + 4, fx.in, fx.n_seq, 3, 5, &fx.cfg, &fx.w,
                                  &fx.scratch, &fx.trace), TB_OK);
    CHECK(memcmp(padded, fx.out, fx.n_seq * sizeof(double)) == 0);
    CHECK(all_equal(padded + fx.n_seq, 4, SENTINEL));
    CHECK(memcmp(fx.trace.H_out, fx.out, fx.n_seq * sizeof(double)) == 0);
    free(padded);

    /* the trace agrees with itself: rows of A sum to 1, masked entries are 0, the residual adds up */
    for (size_t r = 0; r < 3 * 3 * 5; r++) {
        double sum = 0.0;
        for (size_t i = 0; i < 5; i++) {
            sum += fx.trace.A[r * 5 + i];
            if (causal && i > r % 5)
                CHECK(fx.trace.A[r * 5 + i] == 0.0);
        }
        check_close_at(sum, 1.0, 1e-14, "row of A sums to 1", __LINE__);
    }
    if (norm == TB_NORM_PRE) {
        for (size_t i = 0; i < fx.n_seq; i++) {
            CHECK(fx.trace.H_mid[i] == fx.in[i] + fx.trace.A_out[i]);
            CHECK(fx.trace.H_out[i] == fx.trace.H_mid[i] + fx.trace.F_out[i]);
        }
    } else {
        CHECK(memcmp(fx.trace.H_norm1, fx.trace.H_mid, fx.n_seq * sizeof(double)) == 0);
        CHECK(memcmp(fx.trace.H_norm2, fx.trace.H_out, fx.n_seq * sizeof(double)) == 0);
    }
    fixture_free(&fx);
}

/* Every bad argument of tb_block_forward: its status, and not one output, trace or scratch value written. */
static void test_block_bad_arguments(void)
{
    fixture fx;
    tb_config good = small_config(4, 2, 6, 1);
    good.has_ffn_bias = 1;
    good.has_ln_affine = 1;
    good.has_attn_bias = 1;
    fixture_init(&fx, good, 2, 3, 7);

#define BF_BAD(call, want)                     \
    do {                                       \
        fixture_mark(&fx);                     \
        CHECK_STATUS(call, want);              \
        CHECK(fixture_untouched(&fx));         \
    } while (0)
#define RUN(out, out_len, in, in_len, B, T, cfg, w, scratch, trace) \
    tb_block_forward(out, out_len, in, in_len, B, T, cfg, w, scratch, trace)

    /* the good call works, so each failure below is the one argument's fault */
    fixture_mark(&fx);
    CHECK_STATUS(fixture_run(&fx, 1), TB_OK);

    /* pointers */
    BF_BAD(RUN(NULL, fx.n_seq, fx.in, fx.n_seq, 2, 3, &fx.cfg, &fx.w, &fx.scratch, &fx.trace), TB_ERR_NULL_ARG);
    BF_BAD(RUN(fx.out, fx.n_seq, NULL, fx.n_seq, 2, 3, &fx.cfg, &fx.w, &fx.scratch, &fx.trace), TB_ERR_NULL_ARG);
    BF_BAD(RUN(fx.out, fx.n_seq, fx.in, fx.n_seq, 2, 3, NULL, &fx.w, &fx.scratch, &fx.trace), TB_ERR_NULL_ARG);
    BF_BAD(RUN(fx.out, fx.n_seq, fx.in, fx.n_seq, 2, 3, &fx.cfg, NULL, &fx.scratch, &fx.trace), TB_ERR_NULL_ARG);
    BF_BAD(RUN(fx.out, fx.n_seq, fx.in, fx.n_seq, 2, 3, &fx.cfg, &fx.w, NULL, &fx.trace), TB_ERR_NULL_ARG);
    {
        tb_scratch no_data = {NULL, 0};
        no_data.len = fx.scratch.len;
        BF_BAD(RUN(fx.out, fx.n_seq, fx.in, fx.n_seq, 2, 3, &fx.cfg, &fx.w, &no_data, &fx.trace), TB_ERR_NULL_ARG);
    }
    for (int i = 0; i < N_WEIGHTS; i++) {      /* every weight missing, then one double short */
        const double *saved = *fx.weight[i];
        if (saved == NULL)                     /* absent from this config */
            continue;
        *fx.weight[i] = NULL;
        BF_BAD(fixture_run(&fx, 1), TB_ERR_NULL_WEIGHT);
        *fx.weight[i] = saved;
        *fx.weight_len[i] -= 1;
        BF_BAD(fixture_run(&fx, 1), TB_ERR_WEIGHT_SIZE);
        *fx.weight_len[i] += 1;
    }
    for (int i = 0; i < N_TRACE; i++) {        /* every trace array missing, then one double short */
        double *saved = *fx.trace_buf[i];
        if (saved == NULL)                     /* F_gate without the gated FFN */
            continue;
        *fx.trace_buf[i] = NULL;
        BF_BAD(fixture_run(&fx, 1), TB_ERR_NULL_TRACE);
        *fx.trace_buf[i] = saved;
        *fx.trace_len[i] -= 1;
        BF_BAD(fixture_run(&fx, 1), TB_ERR_TRACE_SIZE);
        *fx.trace_len[i] += 1;
    }
    /* optional weights given although the flags say absent */
    fx.cfg.has_ffn_bias = 0;
    BF_BAD(fixture_run(&fx, 1), TB_ERR_UNEXPECTED_WEIGHT);
    fx.cfg.has_ffn_bias = 1;
    fx.cfg.has_ln_affine = 0;
    BF_BAD(fixture_run(&fx, 1), TB_ERR_UNEXPECTED_WEIGHT);
    fx.cfg.has_ln_affine = 1;
    fx.cfg.has_attn_bias = 0;
    BF_BAD(fixture_run(&fx, 1), TB_ERR_UNEXPECTED_WEIGHT);
    fx.cfg.has_attn_bias = 3;
    BF_BAD(fixture_run(&fx, 1), TB_ERR_FLAG);
    fx.cfg.has_attn_bias = 1;

    /* dimensions */
    BF_BAD(RUN(fx.out, fx.n_seq, fx.in, fx.n_seq, 0, 3, &fx.cfg, &fx.w, &fx.scratch, &fx.trace), TB_ERR_DIM);
    BF_BAD(RUN(fx.out, fx.n_seq, fx.in, fx.n_seq, -2, 3, &fx.cfg, &fx.w, &fx.scratch, &fx.trace), TB_ERR_DIM);
    BF_BAD(RUN(fx.out, fx.n_seq, fx.in, fx.n_seq, 2, 0, &fx.cfg, &fx.w, &fx.scratch, &fx.trace), TB_ERR_DIM);
    BF_BAD(RUN(fx.out, fx.n_seq, fx.in, fx.n_seq, 2, -3, &fx.cfg, &fx.w, &fx.scratch, &fx.trace), TB_ERR_DIM);
    {
        const int64_t saved_d = fx.cfg.d_model, saved_h = fx.cfg.n_heads, saved_f = fx.cfg.d_ff;
        fx.cfg.d_model = 0;
        BF_BAD(fixture_run(&fx, 1), TB_ERR_DIM);
        fx.cfg.d_model = -4;
        BF_BAD(fixture_run(&fx, 1), TB_ERR_DIM);
        fx.cfg.d_model = saved_d;
        fx.cfg.n_heads = 0;
        BF_BAD(fixture_run(&fx, 1), TB_ERR_DIM);
        fx.cfg.n_heads = 3;                    /* 4 % 3 != 0 */
        BF_BAD(fixture_run(&fx, 1), TB_ERR_HEADS);
        fx.cfg.n_heads = saved_h;
        fx.cfg.d_ff = 0;
        BF_BAD(fixture_run(&fx, 1), TB_ERR_DIM);
        fx.cfg.d_ff = saved_f;
        /* sizes that overflow size_t: T * d_model, n_heads * T * T, B * T * d_model, d_model^2 */
        BF_BAD(RUN(fx.out, fx.n_seq, fx.in, fx.n_seq, 2, INT64_MAX / 2, &fx.cfg, &fx.w, &fx.scratch, &fx.trace),
               TB_ERR_OVERFLOW);
        BF_BAD(RUN(fx.out, fx.n_seq, fx.in, fx.n_seq, 2, (int64_t)1 << 31, &fx.cfg, &fx.w, &fx.scratch, &fx.trace),
               TB_ERR_OVERFLOW);
        BF_BAD(RUN(fx.out, fx.n_seq, fx.in, fx.n_seq, INT64_MAX, 3, &fx.cfg, &fx.w, &fx.scratch, &fx.trace),
               TB_ERR_OVERFLOW);
        fx.cfg.d_model = fx.cfg.n_heads = (int64_t)1 << 32;
        BF_BAD(fixture_run(&fx, 1), TB_ERR_OVERFLOW);
        fx.cfg.d_model = saved_d;
        fx.cfg.n_heads = saved_h;
        fx.cfg.d_ff = INT64_MAX;
        BF_BAD(fixture_run(&fx, 1), TB_ERR_OVERFLOW);
        fx.cfg.d_ff = saved_f;
    }

    /* enums, flags, eps */
    fx.cfg.norm = 2;
    BF_BAD(fixture_run(&fx, 1), TB_ERR_NORM);
    fx.cfg.norm = -1;
    BF_BAD(fixture_run(&fx, 1), TB_ERR_NORM);
    fx.cfg.norm = TB_NORM_PRE;
    fx.cfg.activation = 4;
    BF_BAD(fixture_run(&fx, 1), TB_ERR_ACTIVATION);
    fx.cfg.activation = TB_ACT_GELU_TANH;
    fx.cfg.causal = 2;
    BF_BAD(fixture_run(&fx, 1), TB_ERR_FLAG);
    fx.cfg.causal = 1;
    fx.cfg.has_ffn_bias = -1;
    BF_BAD(fixture_run(&fx, 1), TB_ERR_FLAG);
    fx.cfg.has_ffn_bias = 1;
    fx.cfg.has_ln_affine = 2;
    BF_BAD(fixture_run(&fx, 1), TB_ERR_FLAG);
    fx.cfg.has_ln_affine = 1;
    {
        const double bad_eps[4] = {0.0, -1e-5, NAN, INFINITY};
        for (int i = 0; i < 4; i++) {
            fx.cfg.eps = bad_eps[i];
            BF_BAD(fixture_run(&fx, 1), TB_ERR_EPS);
        }
        fx.cfg.eps = 1e-5;
    }

    /* lengths */
    BF_BAD(RUN(fx.out, fx.n_seq, fx.in, fx.n_seq - 1, 2, 3, &fx.cfg, &fx.w, &fx.scratch, &fx.trace),
           TB_ERR_INPUT_SIZE);
    BF_BAD(RUN(fx.out, fx.n_seq - 1, fx.in, fx.n_seq, 2, 3, &fx.cfg, &fx.w, &fx.scratch, &fx.trace),
           TB_ERR_OUTPUT_SIZE);
    fx.scratch.len -= 1;
    BF_BAD(fixture_run(&fx, 1), TB_ERR_SCRATCH_SIZE);
    BF_BAD(fixture_run(&fx, 0), TB_ERR_SCRATCH_SIZE);
    fx.scratch.len += 1;

    /* overlaps: output on input, output in scratch, trace on output, trace on trace, scratch on a weight */
    BF_BAD(RUN(fx.out, fx.n_seq, fx.out, fx.n_seq, 2, 3, &fx.cfg, &fx.w, &fx.scratch, &fx.trace), TB_ERR_OVERLAP);
    {
        const double *saved_wq = fx.w.w_q;
        double *saved_q = fx.trace.Q;
        BF_BAD(RUN(fx.scratch.data, fx.n_seq, fx.in, fx.n_seq, 2, 3, &fx.cfg, &fx.w, &fx.scratch, NULL),
               TB_ERR_OVERLAP);
        fx.trace.Q = fx.out;
        BF_BAD(fixture_run(&fx, 1), TB_ERR_OVERLAP);
        fx.trace.Q = fx.trace.K;
        BF_BAD(fixture_run(&fx, 1), TB_ERR_OVERLAP);
        fx.trace.Q = saved_q;
        fx.w.w_q = fx.scratch.data + 1;
        BF_BAD(fixture_run(&fx, 1), TB_ERR_OVERLAP);
        fx.w.w_q = saved_wq;
    }

    /* and all is well again */
    fixture_mark(&fx);
    CHECK_STATUS(fixture_run(&fx, 1), TB_OK);
    CHECK(all_finite(fx.out, fx.n_seq));
#undef RUN
#undef BF_BAD
    fixture_free(&fx);
}

static void test_scratch_len(void)
{
    tb_config cfg = small_config(6, 3, 10, 1);
    size_t n = 12345;
    /* 11 (T, d) arrays + S (T, T) + A (h, T, T) + F_pre, F_post (T, f) */
    CHECK_STATUS(tb_scratch_len(&cfg, 5, &n), TB_OK);
    CHECK(n == 11 * 5 * 6 + 5 * 5 + 3 * 5 * 5 + 2 * 5 * 10);
    n = 12345;
    CHECK_STATUS(tb_scratch_len(NULL, 5, &n), TB_ERR_NULL_ARG);
    CHECK_STATUS(tb_scratch_len(&cfg, 5, NULL), TB_ERR_NULL_ARG);
    CHECK_STATUS(tb_scratch_len(&cfg, 0, &n), TB_ERR_DIM);
    CHECK_STATUS(tb_scratch_len(&cfg, (int64_t)1 << 40, &n), TB_ERR_OVERFLOW);
    cfg.eps = -1.0;
    CHECK_STATUS(tb_scratch_len(&cfg, 5, &n), TB_ERR_EPS);
    CHECK(n == 12345);
}

/* ---- tb_block_forward_cached ---- */

/* Key and value caches for a fixture's B sequences, (B, n_kv_heads, max_T, d_k) each,
 * malloc'ed at exactly that length. */
typedef struct {
    int64_t max_T;
    size_t len;
    double *K, *V;
} caches;

static caches caches_alloc(const fixture *fx, int64_t max_T, double value)
{
    caches c;
    c.max_T = max_T;
    c.len = (size_t)fx->B * (size_t)max_T * fx->dkv;
    c.K = alloc_doubles(c.len);
    c.V = alloc_doubles(c.len);
    fill(c.K, c.len, value);
    fill(c.V, c.len, value);
    return c;
}

static void caches_free(caches *c)
{
    free(c->K);
    free(c->V);
}

/* Offset of token t, K/V head h, sequence b in a cache (B, n_kv_heads, max_T, d_k). */
static size_t cache_at(const fixture *fx, const caches *c, size_t b, size_t h, size_t t)
{
    const size_t n_kv = kv_heads_of(&fx->cfg), dk = (size_t)(fx->cfg.d_model / fx->cfg.n_heads);
    return ((b * n_kv + h) * (size_t)c->max_T + t) * dk;
}

/* 1 when the cache rows of tokens from .. max_T-1 are all NaN (never written) in both caches. */
static int cache_rows_nan(const fixture *fx, const caches *c, size_t from)
{
    const size_t dk = (size_t)(fx->cfg.d_model / fx->cfg.n_heads);
    for (size_t b = 0; b < (size_t)fx->B; b++)
        for (size_t h = 0; h < kv_heads_of(&fx->cfg); h++)
            for (size_t t = from; t < (size_t)c->max_T; t++)
                for (size_t i = 0; i < dk; i++)
                    if (!isnan(c->K[cache_at(fx, c, b, h, t) + i]) || !isnan(c->V[cache_at(fx, c, b, h, t) + i]))
                        return 0;
    return 1;
}

/* 1 when cache rows 0 .. T-1 hold the full forward's K and V (fx's trace; keys after
 * rotary), K/V head h's d_k columns of row t at token t of its (max_T, d_k) block. */
static int cache_holds_trace(const fixture *fx, const caches *c)
{
    const size_t dk = (size_t)(fx->cfg.d_model / fx->cfg.n_heads), T = (size_t)fx->T;
    for (size_t b = 0; b < (size_t)fx->B; b++)
        for (size_t h = 0; h < kv_heads_of(&fx->cfg); h++)
            for (size_t t = 0; t < T; t++)
                for (size_t i = 0; i < dk; i++) {
                    const size_t row = (b * T + t) * fx->dkv + h * dk + i;
                    if (c->K[cache_at(fx, c, b, h, t) + i] != fx->trace.K[row] ||
                        c->V[cache_at(fx, c, b, h, t) + i] != fx->trace.V[row])
                        return 0;
                }
    return 1;
}

/* Tokens past .. past+T_new-1 of fx's B sequences through tb_block_forward_cached into
 * out (B, T_new, d_model); input and scratch malloc'ed at exactly their lengths, the
 * scratch NaN so a value read before written would show. */
static tb_status run_chunk(const fixture *fx, const caches *c, int64_t past, int64_t T_new, double *out)
{
    const size_t d = (size_t)fx->cfg.d_model, rows = (size_t)T_new, n = (size_t)fx->B * rows * d;
    double *in = alloc_doubles(n);
    tb_scratch scratch;
    tb_status status;
    for (size_t b = 0; b < (size_t)fx->B; b++)
        memcpy(in + b * rows * d, fx->in + (b * (size_t)fx->T + (size_t)past) * d, rows * d * sizeof(double));
    CHECK_STATUS(tb_scratch_len_cached(&fx->cfg, T_new, past, &scratch.len), TB_OK);
    scratch.data = alloc_doubles(scratch.len);
    fill(scratch.data, scratch.len, NAN);
    status = tb_block_forward_cached(out, n, in, n, fx->B, T_new, past, c->max_T, c->K, c->len, c->V, c->len,
                                     &fx->cfg, &fx->w, &scratch);
    free(in);
    free(scratch.data);
    return status;
}

/* Fed in chunks through the caches, the sequences give the very doubles of the full
 * forward, and the caches end up holding its K and V. Rows past the chunk are NaN: a
 * read of one would turn the output NaN. */
static void test_cached_matches_full(int norm, int activation, int bias, int affine, int attn_bias, int variant)
{
    static const int64_t schedules[][8] = {{7}, {1, 1, 1, 1, 1, 1, 1}, {3, 1, 2, 1}, {2, 5}, {6, 1}};
    const int64_t B = 2, T = 7, slack = 2;
    tb_config cfg = small_config(6, 3, 10, 1);
    fixture fx;
    cfg.norm = norm;
    cfg.activation = activation;
    cfg.has_ffn_bias = bias;
    cfg.has_ln_affine = affine;
    cfg.has_attn_bias = attn_bias;
    cfg = with_variant(cfg, variant);
    fixture_init(&fx, cfg, B, T, 99);
    CHECK_STATUS(fixture_run(&fx, 1), TB_OK);    /* the full forward and its K, V */

    for (size_t k = 0; k < sizeof schedules / sizeof schedules[0]; k++) {
        caches c = caches_alloc(&fx, T + slack, NAN);
        int64_t past = 0;
        for (const int64_t *chunk = schedules[k]; past < T; chunk++) {
            const size_t d = (size_t)cfg.d_model, rows = (size_t)*chunk;
            double *out = alloc_doubles((size_t)B * rows * d);
            CHECK_STATUS(run_chunk(&fx, &c, past, *chunk, out), TB_OK);
            for (size_t b = 0; b < (size_t)B; b++)
                CHECK(memcmp(out + b * rows * d, fx.out + (b * (size_t)T + (size_t)past) * d,
                             rows * d * sizeof(double)) == 0);
            past += *chunk;
            CHECK(cache_rows_nan(&fx, &c, (size_t)past));
            free(out);
        }
        CHECK(cache_holds_trace(&fx, &c));
        caches_free(&c);
    }
    fixture_free(&fx);
}

/* With kv = BF16 or Q8, a chunk attends to its own keys and values rounded (each output
 * moves off the full forward's, a little), while the caches still receive the exact rows
 * (the full forward's K and V): the caller rounds them into its own format. */
static void test_cached_kv_rounding(int kv)
{
    const int64_t B = 2, T = 7;
    tb_config cfg = small_config(6, 3, 10, 1);
    fixture fx;
    cfg.kv = kv;
    fixture_init(&fx, cfg, B, T, 7);
    CHECK_STATUS(fixture_run(&fx, 1), TB_OK);
    caches c = caches_alloc(&fx, T, NAN);
    const size_t n = (size_t)(B * T * cfg.d_model);
    double *out = alloc_doubles(n);
    CHECK_STATUS(run_chunk(&fx, &c, 0, T, out), TB_OK);
    CHECK(cache_holds_trace(&fx, &c));
    double worst = 0.0, largest = 0.0;
    for (size_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs(out[i] - fx.out[i]));
        largest = fmax(largest, fabs(fx.out[i]));
    }
    CHECK(all_finite(out, n));
    CHECK(worst > 1e-9 * largest && worst < 0.05 * largest);
    free(out);
    caches_free(&c);
    fixture_free(&fx);
}

static void test_scratch_len_cached(void)
{
    tb_config cfg = small_config(6, 3, 10, 1);
    size_t n = 12345, full = 0;
    /* 11 (T_new, d) arrays + S (T_new, keys) + A (h, T_new, keys) + F_pre, F_post (T_new, f), keys = past + T_new */
    CHECK_STATUS(tb_scratch_len_cached(&cfg, 2, 3, &n), TB_OK);
    CHECK(n == 11 * 2 * 6 + 2 * 5 + 3 * 2 * 5 + 2 * 2 * 10);
    CHECK_STATUS(tb_scratch_len_cached(&cfg, 5, 0, &n), TB_OK);
    CHECK_STATUS(tb_scratch_len(&cfg, 5, &full), TB_OK);
    CHECK(n == full);
    n = 12345;
    CHECK_STATUS(tb_scratch_len_cached(NULL, 2, 3, &n), TB_ERR_NULL_ARG);
    CHECK_STATUS(tb_scratch_len_cached(&cfg, 2, 3, NULL), TB_ERR_NULL_ARG);
    CHECK_STATUS(tb_scratch_len_cached(&cfg, 0, 3, &n), TB_ERR_DIM);
    CHECK_STATUS(tb_scratch_len_cached(&cfg, 2, -1, &n), TB_ERR_CACHE_RANGE);
    CHECK_STATUS(tb_scratch_len_cached(&cfg, 2, INT64_MAX, &n), TB_ERR_OVERFLOW);
    CHECK_STATUS(tb_scratch_len_cached(&cfg, 2, (int64_t)1 << 60, &n), TB_ERR_OVERFLOW);   /* T_new * keys */
    cfg.causal = 0;
    CHECK_STATUS(tb_scratch_len_cached(&cfg, 2, 3, &n), TB_ERR_NOT_CAUSAL);
    cfg.causal = 1;
    cfg.norm = 5;
    CHECK_STATUS(tb_scratch_len_cached(&cfg, 2, 3, &n), TB_ERR_NORM);
    CHECK(n == 12345);
}

/* Every bad argument of tb_block_forward_cached: its status, and not one double of the
 * output, the caches or the scratch written. */
static void test_cached_bad_arguments(void)
{
    const int64_t B = 2, T_new = 2, past = 1, max_T = 4;
    tb_config good = small_config(4, 2, 6, 1);
    fixture fx;
    caches c;
    tb_scratch scratch;
    double *out, *in;
    size_t n;
    good.has_ffn_bias = 1;
    good.has_ln_affine = 1;
    good.has_attn_bias = 1;
    fixture_init(&fx, good, B, T_new, 11);
    c = caches_alloc(&fx, max_T, SENTINEL);
    n = (size_t)(B * T_new * good.d_model);
    out = alloc_doubles(n);
    in = fx.in;
    CHECK_STATUS(tb_scratch_len_cached(&good, T_new, past, &scratch.len), TB_OK);
    scratch.data = alloc_doubles(scratch.len);

#define MARK()                                                                              \
    do {                                                                                    \
        fill(out, n, SENTINEL);                                                             \
        fill(c.K, c.len, SENTINEL);                                                         \
        fill(c.V, c.len, SENTINEL);                                                         \
        fill(scratch.data, scratch.len, SENTINEL);                                          \
    } while (0)
#define UNTOUCHED()                                                                         \
    (all_equal(out, n, SENTINEL) && all_equal(c.K, c.len, SENTINEL) &&                      \
     all_equal(c.V, c.len, SENTINEL) && all_equal(scratch.data, scratch.len, SENTINEL))
#define FC_BAD(call, want)                                                                  \
    do {                                                                                    \
        MARK();                                                                             \
        CHECK_STATUS(call, want);                                                           \
        CHECK(UNTOUCHED());                                                                 \
    } while (0)
#define RUN(o, o_len, i, i_len, b, t, p, m, K, K_len, V, V_len, cf, wt, sc) \
    tb_block_forward_cached(o, o_len, i, i_len, b, t, p, m, K, K_len, V, V_len, cf, wt, sc)
#define GOOD() RUN(out, n, in, n, B, T_new, past, max_T, c.K, c.len, c.V, c.len, &fx.cfg, &fx.w, &scratch)

    /* the good call works, and writes only rows past .. past+T_new-1 of the caches */
    MARK();
    CHECK_STATUS(GOOD(), TB_OK);
    CHECK(all_finite(out, n));
    for (size_t b = 0; b < (size_t)B; b++)
        for (size_t h = 0; h < 2; h++)
            for (size_t t = 0; t < (size_t)max_T; t++) {
                const double *k = c.K + cache_at(&fx, &c, b, h, t), *v = c.V + cache_at(&fx, &c, b, h, t);
                const int written = t >= (size_t)past && t < (size_t)(past + T_new);
                CHECK(written ? all_finite(k, 2) && all_finite(v, 2)
                              : all_equal(k, 2, SENTINEL) && all_equal(v, 2, SENTINEL));
            }

    /* pointers */
    FC_BAD(RUN(NULL, n, in, n, B, T_new, past, max_T, c.K, c.len, c.V, c.len, &fx.cfg, &fx.w, &scratch),
           TB_ERR_NULL_ARG);
    FC_BAD(RUN(out, n, NULL, n, B, T_new, past, max_T, c.K, c.len, c.V, c.len, &fx.cfg, &fx.w, &scratch),
           TB_ERR_NULL_ARG);
    FC_BAD(RUN(out, n, in, n, B, T_new, past, max_T, NULL, c.len, c.V, c.len, &fx.cfg, &fx.w, &scratch),
           TB_ERR_NULL_ARG);
    FC_BAD(RUN(out, n, in, n, B, T_new, past, max_T, c.K, c.len, NULL, c.len, &fx.cfg, &fx.w, &scratch),
           TB_ERR_NULL_ARG);
    FC_BAD(RUN(out, n, in, n, B, T_new, past, max_T, c.K, c.len, c.V, c.len, NULL, &fx.w, &scratch),
           TB_ERR_NULL_ARG);
    FC_BAD(RUN(out, n, in, n, B, T_new, past, max_T, c.K, c.len, c.V, c.len, &fx.cfg, NULL, &scratch),
           TB_ERR_NULL_ARG);
    FC_BAD(RUN(out, n, in, n, B, T_new, past, max_T, c.K, c.len, c.V, c.len, &fx.cfg, &fx.w, NULL),
           TB_ERR_NULL_ARG);
    {
        tb_scratch no_data = {NULL, 0};
        no_data.len = scratch.len;
        FC_BAD(RUN(out, n, in, n, B, T_new, past, max_T, c.K, c.len, c.V, c.len, &fx.cfg, &fx.w, &no_data),
               TB_ERR_NULL_ARG);
    }
    for (int i = 0; i < N_WEIGHTS; i++) {      /* every weight missing, then one double short */
        const double *saved = *fx.weight[i];
        if (saved == NULL)                     /* absent from this config */
            continue;
        *fx.weight[i] = NULL;
        FC_BAD(GOOD(), TB_ERR_NULL_WEIGHT);
        *fx.weight[i] = saved;
        *fx.weight_len[i] -= 1;
        FC_BAD(GOOD(), TB_ERR_WEIGHT_SIZE);
        *fx.weight_len[i] += 1;
    }

    /* config: checked whole, and it must be causal */
    fx.cfg.causal = 0;
    FC_BAD(GOOD(), TB_ERR_NOT_CAUSAL);
    fx.cfg.causal = 2;
    FC_BAD(GOOD(), TB_ERR_FLAG);
    fx.cfg.causal = 1;
    fx.cfg.n_heads = 3;
    FC_BAD(GOOD(), TB_ERR_HEADS);
    fx.cfg.n_heads = 2;
    fx.cfg.eps = 0.0;
    FC_BAD(GOOD(), TB_ERR_EPS);
    fx.cfg.eps = 1e-5;
    fx.cfg.has_attn_bias = 0;
    FC_BAD(GOOD(), TB_ERR_UNEXPECTED_WEIGHT);
    fx.cfg.has_attn_bias = 1;

    /* dimensions and the cache positions */
    FC_BAD(RUN(out, n, in, n, 0, T_new, past, max_T, c.K, c.len, c.V, c.len, &fx.cfg, &fx.w, &scratch),
           TB_ERR_DIM);
    FC_BAD(RUN(out, n, in, n, B, 0, past, max_T, c.K, c.len, c.V, c.len, &fx.cfg, &fx.w, &scratch), TB_ERR_DIM);
    FC_BAD(RUN(out, n, in, n, B, -1, past, max_T, c.K, c.len, c.V, c.len, &fx.cfg, &fx.w, &scratch), TB_ERR_DIM);
    FC_BAD(RUN(out, n, in, n, B, T_new, past, 0, c.K, c.len, c.V, c.len, &fx.cfg, &fx.w, &scratch), TB_ERR_DIM);
    FC_BAD(RUN(out, n, in, n, B, T_new, -1, max_T, c.K, c.len, c.V, c.len, &fx.cfg, &fx.w, &scratch),
           TB_ERR_CACHE_RANGE);
    FC_BAD(RUN(out, n, in, n, B, T_new, INT64_MIN, max_T, c.K, c.len, c.V, c.len, &fx.cfg, &fx.w, &scratch),
           TB_ERR_CACHE_RANGE);
    FC_BAD(RUN(out, n, in, n, B, T_new, max_T - T_new + 1, max_T, c.K, c.len, c.V, c.len, &fx.cfg, &fx.w,
               &scratch), TB_ERR_CACHE_RANGE);                      /* one token past the end */
    FC_BAD(RUN(out, n, in, n, B, T_new, INT64_MAX, max_T, c.K, c.len, c.V, c.len, &fx.cfg, &fx.w, &scratch),
           TB_ERR_CACHE_RANGE);
    FC_BAD(RUN(out, n, in, n, B, max_T + 1, 0, max_T, c.K, c.len, c.V, c.len, &fx.cfg, &fx.w, &scratch),
           TB_ERR_CACHE_RANGE);
    FC_BAD(RUN(out, n, in, n, B, T_new, past, INT64_MAX, c.K, c.len, c.V, c.len, &fx.cfg, &fx.w, &scratch),
           TB_ERR_OVERFLOW);
    FC_BAD(RUN(out, n, in, n, B, T_new, past, (int64_t)1 << 60, c.K, c.len, c.V, c.len, &fx.cfg, &fx.w, &scratch),
           TB_ERR_OVERFLOW);                                         /* B * max_T * d_model */
    FC_BAD(RUN(out, n, in, n, INT64_MAX, T_new, past, max_T, c.K, c.len, c.V, c.len, &fx.cfg, &fx.w, &scratch),
           TB_ERR_OVERFLOW);

    /* lengths: a cache for max_T - 1 tokens is short, as is one double less */
    FC_BAD(RUN(out, n, in, n - 1, B, T_new, past, max_T, c.K, c.len, c.V, c.len, &fx.cfg, &fx.w, &scratch),
           TB_ERR_INPUT_SIZE);
    FC_BAD(RUN(out, n - 1, in, n, B, T_new, past, max_T, c.K, c.len, c.V, c.len, &fx.cfg, &fx.w, &scratch),
           TB_ERR_OUTPUT_SIZE);
    FC_BAD(RUN(out, n, in, n, B, T_new, past, max_T, c.K, c.len - 1, c.V, c.len, &fx.cfg, &fx.w, &scratch),
           TB_ERR_CACHE_SIZE);
    FC_BAD(RUN(out, n, in, n, B, T_new, past, max_T, c.K, c.len, c.V, c.len - 1, &fx.cfg, &fx.w, &scratch),
           TB_ERR_CACHE_SIZE);
    FC_BAD(RUN(out, n, in, n, B, T_new, past, max_T + 1, c.K, c.len, c.V, c.len, &fx.cfg, &fx.w, &scratch),
           TB_ERR_CACHE_SIZE);
    scratch.len -= 1;
    FC_BAD(GOOD(), TB_ERR_SCRATCH_SIZE);
    scratch.len += 1;
    {
        size_t for_past0 = 0;   /* the scratch of a first chunk is too short for a later one */
        CHECK_STATUS(tb_scratch_len_cached(&good, T_new, 0, &for_past0), TB_OK);
        CHECK(for_past0 < scratch.len);
        scratch.len = for_past0;
        FC_BAD(GOOD(), TB_ERR_SCRATCH_SIZE);
        CHECK_STATUS(tb_scratch_len_cached(&good, T_new, past, &scratch.len), TB_OK);
    }

    /* overlaps: the caches are outputs, over their whole extent */
    FC_BAD(RUN(out, n, in, n, B, T_new, past, max_T, c.K, c.len, c.K, c.len, &fx.cfg, &fx.w, &scratch),
           TB_ERR_OVERLAP);                                          /* K and V one buffer */
    FC_BAD(RUN(c.K, n, in, n, B, T_new, past, max_T, c.K, c.len, c.V, c.len, &fx.cfg, &fx.w, &scratch),
           TB_ERR_OVERLAP);                                          /* out in the key cache */
    FC_BAD(RUN(out, n, c.V + c.len - n, n, B, T_new, past, max_T, c.K, c.len, c.V, c.len, &fx.cfg, &fx.w,
               &scratch), TB_ERR_OVERLAP);                           /* input at the value cache's end */
    FC_BAD(RUN(out, n, out, n, B, T_new, past, max_T, c.K, c.len, c.V, c.len, &fx.cfg, &fx.w, &scratch),
           TB_ERR_OVERLAP);
    {
        tb_scratch in_cache;        /* the scratch inside the key cache (the cache is long enough) */
        double *big = alloc_doubles(scratch.len + 8);
        in_cache.data = big + 4;
        in_cache.len = scratch.len;
        fill(big, scratch.len + 8, SENTINEL);
        FC_BAD(RUN(out, n, in, n, B, T_new, past, max_T, big, c.len, c.V, c.len, &fx.cfg, &fx.w, &in_cache),
               TB_ERR_OVERLAP);
        CHECK(all_equal(big, scratch.len + 8, SENTINEL));
        free(big);
    }
    {
        const double *saved_wq = fx.w.w_q, *saved_bo = fx.w.b_o;
        fx.w.w_q = c.K + 1;                                          /* a weight inside a cache */
        FC_BAD(GOOD(), TB_ERR_OVERLAP);
        fx.w.w_q = saved_wq;
        fx.w.b_o = c.V + c.len - 1;                                  /* a bias straddling a cache's end */
        fx.w.b_o_len = 4;
        FC_BAD(GOOD(), TB_ERR_OVERLAP);
        fx.w.b_o = saved_bo;
    }

    /* and all is well again */
    MARK();
    CHECK_STATUS(GOOD(), TB_OK);
    CHECK(all_finite(out, n));
#undef GOOD
#undef RUN
#undef FC_BAD
#undef UNTOUCHED
#undef MARK
    free(out);
    free(scratch.data);
    caches_free(&c);
    fixture_free(&fx);
}

/* ---- the variants of the blocks in use today (RMSNorm, gated FFN, rotary, GQA, Q/K/V biases) ---- */

/* cfg with variant bits: 1 RMSNorm, 2 the gated FFN, 4 rotary positions, 8 one K/V head,
 * 16 Q/K/V-only biases (where cfg has attention biases). */
static tb_config with_variant(tb_config cfg, int v)
{
    if (v & 1)
        cfg.norm_type = TB_RMSNORM;
    if (v & 2)
        cfg.ffn = TB_FFN_GATED;
    if (v & 4) {
        cfg.positions = TB_POS_ROTARY;
        cfg.rope_theta = 10000.0;
        cfg.rope_scale = 2.0;
    }
    if (v & 8)
        cfg.n_kv_heads = 1;
    if ((v & 16) && cfg.has_attn_bias)
        cfg.has_attn_bias = TB_BIAS_QKV;
    return cfg;
}

static void test_rmsnorm(void)
{
    /* row [3, 4]: mean square 12.5, eps 0.5: divided by sqrt(13); row [0, 0] stays 0 */
    double *X = alloc_doubles(4), *out = alloc_doubles(4), *gamma = alloc_doubles(2);
    const double x[4] = {3, 4, 0, 0};
    memcpy(X, x, sizeof x);
    gamma[0] = 2.0;
    gamma[1] = -1.0;
    CHECK_STATUS(tb_rmsnorm_rows(out, 4, X, 4, 2, 2, NULL, 0, 0.5), TB_OK);
    CHECK_CLOSE(out[0], 3.0 / sqrt(13.0));
    CHECK_CLOSE(out[1], 4.0 / sqrt(13.0));
    CHECK(out[2] == 0.0 && out[3] == 0.0);
    CHECK_STATUS(tb_rmsnorm_rows(out, 4, X, 4, 2, 2, gamma, 2, 0.5), TB_OK);
    CHECK_CLOSE(out[0], 6.0 / sqrt(13.0));
    CHECK_CLOSE(out[1], -4.0 / sqrt(13.0));

#define RMS_BAD(call, want)                    \
    do {                                       \
        fill(out, 4, SENTINEL);                \
        CHECK_STATUS(call, want);              \
        CHECK(all_equal(out, 4, SENTINEL));    \
    } while (0)
    RMS_BAD(tb_rmsnorm_rows(NULL, 4, X, 4, 2, 2, NULL, 0, 0.5), TB_ERR_NULL_ARG);
    RMS_BAD(tb_rmsnorm_rows(out, 4, NULL, 4, 2, 2, NULL, 0, 0.5), TB_ERR_NULL_ARG);
    RMS_BAD(tb_rmsnorm_rows(out, 4, X, 4, 2, 2, NULL, 0, 0.0), TB_ERR_EPS);
    RMS_BAD(tb_rmsnorm_rows(out, 4, X, 4, 2, 2, NULL, 0, NAN), TB_ERR_EPS);
    RMS_BAD(tb_rmsnorm_rows(out, 4, X, 4, 0, 2, NULL, 0, 0.5), TB_ERR_DIM);
    RMS_BAD(tb_rmsnorm_rows(out, 4, X, 4, INT64_MAX, INT64_MAX, NULL, 0, 0.5), TB_ERR_OVERFLOW);
    RMS_BAD(tb_rmsnorm_rows(out, 4, X, 3, 2, 2, NULL, 0, 0.5), TB_ERR_INPUT_SIZE);
    RMS_BAD(tb_rmsnorm_rows(out, 3, X, 4, 2, 2, NULL, 0, 0.5), TB_ERR_OUTPUT_SIZE);
    RMS_BAD(tb_rmsnorm_rows(out, 4, X, 4, 2, 2, gamma, 1, 0.5), TB_ERR_WEIGHT_SIZE);
    RMS_BAD(tb_rmsnorm_rows(out, 4, out, 4, 2, 2, NULL, 0, 0.5), TB_ERR_OVERLAP);
    RMS_BAD(tb_rmsnorm_rows(out, 4, X, 4, 2, 2, out + 2, 2, 0.5), TB_ERR_OVERLAP);
#undef RMS_BAD
    free(X);
    free(out);
    free(gamma);
}

static void test_rotary_rows(void)
{
    /* d_k = 4, theta = 16: pair 0 (x0, x2) turns by t / scale, pair 1 (x1, x3) by t / scale / 4.
     * Row 0 at position 3, row 1 at position 4, scale 1.5; two heads turn alike. */
    tb_config cfg = small_config(4, 1, 4, 1);
    double *X = alloc_doubles(16), *out = alloc_doubles(16);
    const double x[4] = {1, 2, 3, 4};
    cfg.positions = TB_POS_ROTARY;
    cfg.rope_theta = 16.0;
    cfg.rope_scale = 1.5;
    for (int r = 0; r < 4; r++)
        memcpy(X + 4 * r, x, sizeof x);
    CHECK_STATUS(tb_rotary_rows(out, 8, X, 8, 2, 4, 3, &cfg), TB_OK);
    for (int r = 0; r < 2; r++) {
        const double a0 = (3.0 + r) / 1.5, a1 = a0 / 4.0;
        CHECK_CLOSE(out[4 * r + 0], 1 * cos(a0) - 3 * sin(a0));
        CHECK_CLOSE(out[4 * r + 1], 2 * cos(a1) - 4 * sin(a1));
        CHECK_CLOSE(out[4 * r + 2], 3 * cos(a0) + 1 * sin(a0));
        CHECK_CLOSE(out[4 * r + 3], 4 * cos(a1) + 2 * sin(a1));
    }
    CHECK_STATUS(tb_rotary_rows(out + 8, 8, X, 8, 1, 8, 3, &cfg), TB_OK);   /* one row of two heads */
    for (int i = 0; i < 4; i++)
        CHECK(out[8 + i] == out[i] && out[12 + i] == out[i]);
    CHECK_STATUS(tb_rotary_rows(out, 16, X, 16, 4, 4, 0, &cfg), TB_OK);    /* position 0: the identity */
    CHECK(memcmp(out, X, 4 * sizeof(double)) == 0);

#define ROT_BAD(call, want)                    \
    do {                                       \
        fill(out, 16, SENTINEL);               \
        CHECK_STATUS(call, want);              \
        CHECK(all_equal(out, 16, SENTINEL));   \
    } while (0)
    ROT_BAD(tb_rotary_rows(NULL, 8, X, 8, 2, 4, 3, &cfg), TB_ERR_NULL_ARG);
    ROT_BAD(tb_rotary_rows(out, 8, NULL, 8, 2, 4, 3, &cfg), TB_ERR_NULL_ARG);
    ROT_BAD(tb_rotary_rows(out, 8, X, 8, 2, 4, 3, NULL), TB_ERR_NULL_ARG);
    ROT_BAD(tb_rotary_rows(out, 8, X, 8, 0, 4, 3, &cfg), TB_ERR_DIM);
    ROT_BAD(tb_rotary_rows(out, 8, X, 8, 2, 4, -1, &cfg), TB_ERR_CACHE_RANGE);
    ROT_BAD(tb_rotary_rows(out, 8, X, 8, 2, 6, 3, &cfg), TB_ERR_HEADS);     /* 6 columns: 1.5 heads */
    ROT_BAD(tb_rotary_rows(out, 8, X, 8, 2, 4, INT64_MAX, &cfg), TB_ERR_OVERFLOW);
    ROT_BAD(tb_rotary_rows(out, 8, X, 7, 2, 4, 3, &cfg), TB_ERR_INPUT_SIZE);
    ROT_BAD(tb_rotary_rows(out, 7, X, 8, 2, 4, 3, &cfg), TB_ERR_OUTPUT_SIZE);
    ROT_BAD(tb_rotary_rows(out, 8, out + 4, 8, 2, 4, 3, &cfg), TB_ERR_OVERLAP);
    cfg.rope_theta = 0.0;
    ROT_BAD(tb_rotary_rows(out, 8, X, 8, 2, 4, 3, &cfg), TB_ERR_ROPE);
    cfg.rope_theta = INFINITY;
    ROT_BAD(tb_rotary_rows(out, 8, X, 8, 2, 4, 3, &cfg), TB_ERR_ROPE);
    cfg.rope_theta = 16.0;
    cfg.rope_scale = NAN;
    ROT_BAD(tb_rotary_rows(out, 8, X, 8, 2, 4, 3, &cfg), TB_ERR_ROPE);
    cfg.rope_scale = 1.5;
    cfg.positions = TB_POS_NONE;
    ROT_BAD(tb_rotary_rows(out, 8, X, 8, 2, 4, 3, &cfg), TB_ERR_POSITIONS);
    cfg.positions = 2;
    ROT_BAD(tb_rotary_rows(out, 8, X, 8, 2, 4, 3, &cfg), TB_ERR_POSITIONS);
    cfg.positions = TB_POS_ROTARY;
    cfg.n_heads = 4;                           /* d_k = 1: no pairs */
    ROT_BAD(tb_rotary_rows(out, 8, X, 8, 2, 4, 3, &cfg), TB_ERR_ROPE);
#undef ROT_BAD
    free(X);
    free(out);
}

static void test_gated_ffn(void)
{
    /* d = 1, f = 2, X = 2: F_pre = 2 * [1, 3] + [0.5, 0] = [2.5, 6]; F_gate = 2 * [1, -1] + [0, 0.5]
     * = [2, -1.5]; relu: F_post = [2 * 2.5, 0] = [5, 0]; F_out = 5 * 0.5 + 0 * 7 + 0.25 = 2.75 */
    tb_config cfg = small_config(1, 1, 2, 1);
    tb_weights w;
    double *X = alloc_doubles(1), *F_out = alloc_doubles(1), *F_pre = alloc_doubles(2);
    double *F_gate = alloc_doubles(2), *F_post = alloc_doubles(2);
    double *w1 = alloc_doubles(2), *wg = alloc_doubles(2), *w2 = alloc_doubles(2);
    double *b1 = alloc_doubles(2), *bg = alloc_doubles(2), *b2 = alloc_doubles(1);
    memset(&w, 0, sizeof w);
    X[0] = 2.0;
    w1[0] = 1.0, w1[1] = 3.0, wg[0] = 1.0, wg[1] = -1.0, w2[0] = 0.5, w2[1] = 7.0;
    b1[0] = 0.5, b1[1] = 0.0, bg[0] = 0.0, bg[1] = 0.5, b2[0] = 0.25;
    w.w_ff1 = w1, w.w_ff1_len = 2, w.w_gate = wg, w.w_gate_len = 2, w.w_ff2 = w2, w.w_ff2_len = 2;
    w.b_ff1 = b1, w.b_ff1_len = 2, w.b_gate = bg, w.b_gate_len = 2, w.b_ff2 = b2, w.b_ff2_len = 1;
    cfg.ffn = TB_FFN_GATED;
    cfg.has_ffn_bias = 1;
    cfg.activation = TB_ACT_RELU;
    CHECK_STATUS(tb_gated_ffn(F_out, 1, F_pre, 2, F_gate, 2, F_post, 2, X, 1, 1, &cfg, &w), TB_OK);
    CHECK(F_pre[0] == 2.5 && F_pre[1] == 6.0 && F_gate[0] == 2.0 && F_gate[1] == -1.5);
    CHECK(F_post[0] == 5.0 && F_post[1] == 0.0 && F_out[0] == 2.75);
    /* silu(x) = x / (1 + e^-x) */
    cfg.activation = TB_ACT_SILU;
    CHECK_STATUS(tb_gated_ffn(F_out, 1, F_pre, 2, F_gate, 2, F_post, 2, X, 1, 1, &cfg, &w), TB_OK);
    CHECK_CLOSE(F_post[0], 2.0 / (1.0 + exp(-2.0)) * 2.5);
    CHECK_CLOSE(F_post[1], -1.5 / (1.0 + exp(1.5)) * 6.0);
    X[0] = -1000.0;                            /* e^1000 overflows: silu is -0, not NaN */
    CHECK_STATUS(tb_gated_ffn(F_out, 1, F_pre, 2, F_gate, 2, F_post, 2, X, 1, 1, &cfg, &w), TB_OK);
    CHECK(F_post[0] == 0.0 && all_finite(F_out, 1));
    X[0] = 2.0;

#define GF_BAD(call, want)                                                         \
    do {                                                                           \
        fill(F_out, 1, SENTINEL);                                                  \
        fill(F_pre, 2, SENTINEL);                                                  \
        fill(F_gate, 2, SENTINEL);                                                 \
        fill(F_post, 2, SENTINEL);                                                 \
        CHECK_STATUS(call, want);                                                  \
        CHECK(all_equal(F_out, 1, SENTINEL) && all_equal(F_pre, 2, SENTINEL) &&    \
              all_equal(F_gate, 2, SENTINEL) && all_equal(F_post, 2, SENTINEL));   \
    } while (0)
#define GF(F_gate_, F_gate_len, cfg_) tb_gated_ffn(F_out, 1, F_pre, 2, F_gate_, F_gate_len, F_post, 2, X, 1, 1, cfg_, &w)
    GF_BAD(GF(NULL, 2, &cfg), TB_ERR_NULL_ARG);
    GF_BAD(GF(F_gate, 1, &cfg), TB_ERR_OUTPUT_SIZE);
    GF_BAD(GF(F_pre, 2, &cfg), TB_ERR_OVERLAP);
    GF_BAD(tb_ffn(F_out, 1, F_pre, 2, F_post, 2, X, 1, 1, &cfg, &w), TB_ERR_FFN);   /* tb_ffn: the MLP only */
    w.w_gate = NULL;
    GF_BAD(GF(F_gate, 2, &cfg), TB_ERR_NULL_WEIGHT);
    w.w_gate = wg;
    w.b_gate_len = 1;
    GF_BAD(GF(F_gate, 2, &cfg), TB_ERR_WEIGHT_SIZE);
    w.b_gate_len = 2;
    w.b_gate = NULL;
    GF_BAD(GF(F_gate, 2, &cfg), TB_ERR_NULL_WEIGHT);
    w.b_gate = bg;
    w.w_gate = w1;                             /* the gate reads the up matrix: allowed (read-only) */
    CHECK_STATUS(GF(F_gate, 2, &cfg), TB_OK);
    w.w_gate = F_gate;                         /* a weight in an output is not */
    GF_BAD(GF(F_gate, 2, &cfg), TB_ERR_OVERLAP);
    w.w_gate = wg;
    cfg.has_ffn_bias = 0;                      /* b_gate given without has_ffn_bias (b_ff1, b_ff2 first) */
    w.b_ff1 = w.b_ff2 = NULL;
    GF_BAD(GF(F_gate, 2, &cfg), TB_ERR_UNEXPECTED_WEIGHT);
    w.b_gate = NULL;
    CHECK_STATUS(GF(F_gate, 2, &cfg), TB_OK);
    cfg.ffn = TB_FFN_MLP;
    GF_BAD(GF(F_gate, 2, &cfg), TB_ERR_FFN);
    w.w_gate = NULL;
    CHECK_STATUS(tb_ffn(F_out, 1, F_pre, 2, F_post, 2, X, 1, 1, &cfg, &w), TB_OK);
    w.w_gate = wg;                             /* and the MLP refuses a gate */
    GF_BAD(tb_ffn(F_out, 1, F_pre, 2, F_post, 2, X, 1, 1, &cfg, &w), TB_ERR_UNEXPECTED_WEIGHT);
    cfg.ffn = 2;
    GF_BAD(GF(F_gate, 2, &cfg), TB_ERR_FFN);
#undef GF
#undef GF_BAD
    free(X), free(F_out), free(F_pre), free(F_gate), free(F_post);
    free(w1), free(wg), free(w2), free(b1), free(bg), free(b2);
}

static void test_attention_head_grouped(void)
{
    /* T = 2, d_model = 2, two query heads of d_k = 1 sharing one K/V head (K, V are (2, 1)):
     * head 1 reads K/V head 0. Q[:,1] = [1, 1], K = [0, ln 3], V = [2, 6]: as in
     * test_attention_head, out[:,1] = [2, 5]; head 0 with Q[:,0] = [0, 0]: out[:,0] = [2, 4]. */
    double *Q = alloc_doubles(4), *K = alloc_doubles(2), *V = alloc_doubles(2);
    double *out = alloc_doubles(4), *A = alloc_doubles(4), *S = alloc_doubles(4);
    tb_config cfg = small_config(2, 2, 8, 1);
    const double q[4] = {0, 1, 0, 1};
    cfg.n_kv_heads = 1;
    memcpy(Q, q, sizeof q);
    K[0] = 0.0, K[1] = log(3.0), V[0] = 2.0, V[1] = 6.0;
    CHECK_STATUS(tb_attention_head(out, 4, A, 4, S, 4, Q, 4, K, 2, V, 2, 2, 1, &cfg), TB_OK);
    CHECK_STATUS(tb_attention_head(out, 4, A, 4, S, 4, Q, 4, K, 2, V, 2, 2, 0, &cfg), TB_OK);
    CHECK_CLOSE(out[1], 2.0);
    CHECK_CLOSE(out[3], 5.0);
    CHECK_CLOSE(out[0], 2.0);
    CHECK_CLOSE(out[2], 4.0);
    fill(out, 4, SENTINEL);
    CHECK_STATUS(tb_attention_head(out, 4, A, 4, S, 4, Q, 4, K, 1, V, 2, 2, 1, &cfg), TB_ERR_INPUT_SIZE);
    CHECK_STATUS(tb_attention_head(out, 4, A, 4, S, 4, Q, 4, K, 2, V, 1, 2, 1, &cfg), TB_ERR_INPUT_SIZE);
    cfg.n_kv_heads = -1;
    CHECK_STATUS(tb_attention_head(out, 4, A, 4, S, 4, Q, 4, K, 2, V, 2, 2, 1, &cfg), TB_ERR_KV_HEADS);
    cfg.n_kv_heads = 3;
    CHECK_STATUS(tb_attention_head(out, 4, A, 4, S, 4, Q, 4, K, 2, V, 2, 2, 1, &cfg), TB_ERR_KV_HEADS);
    CHECK(all_equal(out, 4, SENTINEL));
    free(Q), free(K), free(V), free(out), free(A), free(S);
}

/* One token at position 0: cos 1 and sin 0 leave Q and K as they are, so the rotary block
 * gives the plain block's very doubles. */
static void test_rotary_at_position_zero(void)
{
    tb_config cfg = with_variant(small_config(6, 3, 10, 1), 1 | 2 | 8);
    fixture fx;
    double *plain;
    fixture_init(&fx, cfg, 3, 1, 5);
    plain = alloc_doubles(fx.n_seq);
    CHECK_STATUS(fixture_run(&fx, 0), TB_OK);
    memcpy(plain, fx.out, fx.n_seq * sizeof(double));
    fx.cfg = with_variant(fx.cfg, 4);
    CHECK_STATUS(fixture_run(&fx, 0), TB_OK);
    CHECK(memcmp(plain, fx.out, fx.n_seq * sizeof(double)) == 0);
    free(plain);
    fixture_free(&fx);
}

/* Grouped-query attention is multi-head attention whose K/V weights repeat each K/V head's
 * columns for its group of query heads: the same doubles out, rotary and biases included. */
static void test_gqa_equals_repeated_mha(int n_kv_heads)
{
    tb_config cfg = small_config(12, 6, 10, 1);   /* d_k = 2, groups of 6 / n_kv_heads */
    fixture fx;
    tb_weights full;
    tb_config mha;
    tb_scratch scratch;
    double *out_mha, *wk, *wv, *bk, *bv;
    const size_t d = 12, dk = 2, group = (size_t)(6 / n_kv_heads), dkv = (size_t)n_kv_heads * dk;
    cfg.has_attn_bias = TB_BIAS_QKV;
    cfg.n_kv_heads = n_kv_heads;
    cfg = with_variant(cfg, 1 | 2 | 4);
    fixture_init(&fx, cfg, 2, 5, 77);
    wk = alloc_doubles(d * d), wv = alloc_doubles(d * d), bk = alloc_doubles(d), bv = alloc_doubles(d);
    for (size_t col = 0; col < d; col++) {        /* column col of head col / dk reads K/V head (col / dk) / group */
        const size_t from = (col / dk) / group * dk + col % dk;
        for (size_t r = 0; r < d; r++) {
            wk[r * d + col] = fx.w.w_k[r * dkv + from];
            wv[r * d + col] = fx.w.w_v[r * dkv + from];
        }
        bk[col] = fx.w.b_k[from];
        bv[col] = fx.w.b_v[from];
    }
    full = fx.w;
    full.w_k = wk, full.w_k_len = d * d, full.w_v = wv, full.w_v_len = d * d;
    full.b_k = bk, full.b_k_len = d, full.b_v = bv, full.b_v_len = d;
    mha = cfg;
    mha.n_kv_heads = 0;
    out_mha = alloc_doubles(fx.n_seq);
    CHECK_STATUS(tb_scratch_len(&mha, fx.T, &scratch.len), TB_OK);     /* MHA's K and V are wider */
    scratch.data = alloc_doubles(scratch.len);
    CHECK_STATUS(fixture_run(&fx, 0), TB_OK);
    CHECK_STATUS(tb_block_forward(out_mha, fx.n_seq, fx.in, fx.n_seq, fx.B, fx.T, &mha, &full, &scratch, NULL),
                 TB_OK);
    CHECK(memcmp(out_mha, fx.out, fx.n_seq * sizeof(double)) == 0);
    free(out_mha), free(wk), free(wv), free(bk), free(bv), free(scratch.data);
    fixture_free(&fx);
}

/* Every bad argument the variants bring to tb_block_forward and tb_block_forward_cached:
 * its status, and nothing written. */
static void test_variant_bad_arguments(void)
{
    fixture fx;
    tb_config good = small_config(6, 3, 10, 1);
    double *extra = alloc_doubles(6);
    good.has_ffn_bias = 1;
    good.has_ln_affine = 1;
    good.has_attn_bias = 1;
    good = with_variant(good, 31);             /* RMSNorm, gated, rotary, one K/V head, Q/K/V biases */
    fill(extra, 6, 1.0);
    fixture_init(&fx, good, 2, 3, 13);
    CHECK(fx.w.w_gate != NULL && fx.w.b_gate != NULL && fx.w.ln1_beta == NULL && fx.w.b_o == NULL);
    CHECK(fx.w.w_k_len == 6 * 2 && fx.trace.K_len == 2 * 3 * 2 && fx.trace.F_gate != NULL);

#define VB_BAD(want)                           \
    do {                                       \
        fixture_mark(&fx);                     \
        CHECK_STATUS(fixture_run(&fx, 1), want); \
        CHECK(fixture_untouched(&fx));         \
    } while (0)
    fixture_mark(&fx);
    CHECK_STATUS(fixture_run(&fx, 1), TB_OK);
    CHECK(all_finite(fx.out, fx.n_seq) && all_finite(fx.trace.F_gate, fx.trace.F_gate_len));
    for (int i = 0; i < N_WEIGHTS; i++) {      /* w_gate and b_gate among them */
        const double *saved = *fx.weight[i];
        if (saved == NULL)
            continue;
        *fx.weight[i] = NULL;
        VB_BAD(TB_ERR_NULL_WEIGHT);
        *fx.weight[i] = saved;
        *fx.weight_len[i] -= 1;
        VB_BAD(TB_ERR_WEIGHT_SIZE);
        *fx.weight_len[i] += 1;
    }
    for (int i = 0; i < N_TRACE; i++) {        /* F_gate among them */
        double *saved = *fx.trace_buf[i];
        *fx.trace_buf[i] = NULL;
        VB_BAD(TB_ERR_NULL_TRACE);
        *fx.trace_buf[i] = saved;
        *fx.trace_len[i] -= 1;
        VB_BAD(TB_ERR_TRACE_SIZE);
        *fx.trace_len[i] += 1;
    }
    /* weights the variants leave out */
    fx.w.ln2_beta = extra, fx.w.ln2_beta_len = 6;
    VB_BAD(TB_ERR_UNEXPECTED_WEIGHT);          /* RMSNorm has no beta */
    fx.w.ln2_beta = NULL, fx.w.ln2_beta_len = 0;
    fx.w.b_o = extra, fx.w.b_o_len = 6;
    VB_BAD(TB_ERR_UNEXPECTED_WEIGHT);          /* Q/K/V-only biases have no b_o */
    fx.cfg.has_attn_bias = TB_BIAS_QKVO;
    CHECK_STATUS(fixture_run(&fx, 1), TB_OK);
    fx.cfg.has_attn_bias = TB_BIAS_QKV;
    fx.w.b_o = NULL, fx.w.b_o_len = 0;
    fx.cfg.ffn = TB_FFN_MLP;
    VB_BAD(TB_ERR_UNEXPECTED_WEIGHT);          /* the MLP has no w_gate */
    fx.cfg.ffn = TB_FFN_GATED;
    /* enums and values */
    fx.cfg.norm_type = 2;
    VB_BAD(TB_ERR_NORM_TYPE);
    fx.cfg.norm_type = TB_RMSNORM;
    fx.cfg.ffn = -1;
    VB_BAD(TB_ERR_FFN);
    fx.cfg.ffn = TB_FFN_GATED;
    fx.cfg.positions = 2;
    VB_BAD(TB_ERR_POSITIONS);
    fx.cfg.positions = TB_POS_ROTARY;
    fx.cfg.activation = 4;
    VB_BAD(TB_ERR_ACTIVATION);
    fx.cfg.activation = TB_ACT_GELU_TANH;
    fx.cfg.has_attn_bias = 3;
    VB_BAD(TB_ERR_FLAG);
    fx.cfg.has_attn_bias = TB_BIAS_QKV;
    {
        const double bad[4] = {0.0, -1.0, NAN, INFINITY};
        for (int i = 0; i < 4; i++) {
            fx.cfg.rope_theta = bad[i];
            VB_BAD(TB_ERR_ROPE);
            fx.cfg.rope_theta = 10000.0;
            fx.cfg.rope_scale = bad[i];
            VB_BAD(TB_ERR_ROPE);
            fx.cfg.rope_scale = 2.0;
        }
    }
    fx.cfg.d_model = 3;                        /* d_k = 1: no pairs to turn */
    VB_BAD(TB_ERR_ROPE);
    fx.cfg.d_model = 6;
    fx.cfg.n_kv_heads = 2;                     /* does not divide 3 */
    VB_BAD(TB_ERR_KV_HEADS);
    fx.cfg.n_kv_heads = -3;
    VB_BAD(TB_ERR_KV_HEADS);
    fx.cfg.n_kv_heads = 3;                     /* MHA: w_k is now short of (d, d) */
    VB_BAD(TB_ERR_WEIGHT_SIZE);
    fx.cfg.n_kv_heads = 1;
    /* overlaps: F_gate is an output */
    {
        double *saved = fx.trace.F_gate;
        const double *saved_w = fx.w.w_gate;
        fx.trace.F_gate = fx.trace.F_pre;
        VB_BAD(TB_ERR_OVERLAP);
        fx.trace.F_gate = saved;
        fx.w.w_gate = fx.scratch.data;
        VB_BAD(TB_ERR_OVERLAP);
        fx.w.w_gate = fx.w.w_ff1;              /* read-only on read-only: allowed */
        CHECK_STATUS(fixture_run(&fx, 1), TB_OK);
        fx.w.w_gate = saved_w;
    }
    /* the cached call: caches of (B, n_kv_heads, max_T, d_k), one double short refused */
    {
        caches c = caches_alloc(&fx, 3, NAN);
        double *out = alloc_doubles(fx.n_seq);
        CHECK(c.len == 2 * 3 * 2);
        CHECK_STATUS(run_chunk(&fx, &c, 0, 3, out), TB_OK);
        c.len -= 1;
        fill(out, fx.n_seq, SENTINEL);
        CHECK_STATUS(run_chunk(&fx, &c, 0, 3, out), TB_ERR_CACHE_SIZE);
        CHECK(all_equal(out, fx.n_seq, SENTINEL));
        c.len += 1;
        caches_free(&c);
        free(out);
    }
#undef VB_BAD
    free(extra);
    fixture_free(&fx);
}

static void test_variant_scratch_len(void)
{
    /* one K/V head: K and V (T, d_kv = 2); the gated FFN: F_gate (T, f) too */
    tb_config cfg = with_variant(small_config(6, 3, 10, 1), 2 | 8);
    size_t n = 0;
    CHECK_STATUS(tb_scratch_len(&cfg, 5, &n), TB_OK);
    CHECK(n == 9 * 5 * 6 + 2 * 5 * 2 + 5 * 5 + 3 * 5 * 5 + 3 * 5 * 10);
}

int main(void)
{
    test_status_strings();
    test_layernorm();
    test_softmax();
    test_attention_head();
    test_ffn();
    test_ffn_q8_dot();
    test_cached_kv_rounding(TB_KV_BF16);
    test_cached_kv_rounding(TB_KV_Q8);
    test_scratch_len();
    test_block_by_hand();
    for (int norm = 0; norm < 2; norm++)
        for (int act = 0; act < 3; act++)
            for (int flags = 0; flags < 16; flags++)
                test_block_consistency(norm, act, flags & 1, (flags >> 1) & 1, (flags >> 2) & 1,
                                       (flags >> 3) & 1, 0);
    test_block_bad_arguments();
    test_scratch_len_cached();
    for (int norm = 0; norm < 2; norm++)
        for (int act = 0; act < 3; act++)
            for (int flags = 0; flags < 8; flags++)
                test_cached_matches_full(norm, act, flags & 1, (flags >> 1) & 1, (flags >> 2) & 1, 0);
    test_cached_bad_arguments();
    /* the variants: every combination, with all flags off and all on, each activation */
    test_rmsnorm();
    test_rotary_rows();
    test_gated_ffn();
    test_attention_head_grouped();
    test_rotary_at_position_zero();
    for (int kv = 1; kv <= 6; kv++)
        if (6 % kv == 0)
            test_gqa_equals_repeated_mha(kv);
    test_variant_bad_arguments();
    test_variant_scratch_len();
    for (int variant = 1; variant < 32; variant++)
        for (int flags = 0; flags < 2; flags++)
            for (int norm = 0; norm < 2; norm++) {
                test_block_consistency(norm, variant % 4, flags, flags, flags, flags, variant);
                test_cached_matches_full(norm, (variant + 1) % 4, flags, flags, flags, variant);
            }
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed == 0 ? 0 : 1;
}
