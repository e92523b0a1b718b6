/*
 * test_formats.c: tests of tb_dequantize that need no Python.
 *
 * Hand-written bytes of each stored format against values worked out by hand,
 * every float16 and bfloat16 bit pattern against the textbook formula, random
 * matrices element by element against a per-element reading of the layout,
 * and every kind of bad argument (the returned code, and no output changed).
 * Every buffer is malloc'ed at exactly its length, so under -fsanitize=address
 * a byte read or a double written one past the end is caught.
 * tests/test_c_sanitizers.py builds and runs it:
 *
 *   gcc -std=c99 -fsanitize=address,undefined -fno-omit-frame-pointer \
 *       -Ic_ref c_ref/tests/test_formats.c c_ref/tblock_ref.c -lm -o test_formats
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

static void check_status_at(tb_status got, tb_status want, const char *what, int line)
{
    if (got != want)
        printf("FAIL line %d: %s returned %s, want %s\n", line, what, tb_status_name(got), tb_status_name(want));
    check_at(got == want, what, line);
}
#define CHECK_STATUS(call, want) check_status_at((call), (want), #call, __LINE__)

/* got == want, the sign of a zero included (0.0 == -0.0 would hide a sign bug) */
static int same_double(double got, double want)
{
    return got == want && signbit(got) == signbit(want);
}

/* ---- buffers, each malloc'ed at exactly its length ---- */

static const double SENTINEL = 777.25;   /* what an untouched output holds */

static void *alloc_bytes(size_t n)
{
    void *p = malloc(n);
    if (p == NULL) {
        printf("out of memory\n");
        exit(2);
    }
    return p;
}

static double *alloc_out(size_t n)
{
    double *p = alloc_bytes(n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        p[i] = SENTINEL;
    return p;
}

static uint8_t *copy_bytes(const uint8_t *src, size_t n)
{
    uint8_t *p = alloc_bytes(n);
    memcpy(p, src, n);
    return p;
}

static int untouched(const double *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!(p[i] == SENTINEL))
            return 0;
    return 1;
}

/* Deterministic bytes from a local LCG state. */
static uint8_t next_byte(unsigned long *state)
{
    *state = (*state * 1103515245UL + 12345UL) % 2147483648UL;
    return (uint8_t)(*state >> 16);
}

/* ---- hand-written bytes ---- */

/* bf16, d_in = 3, d_out = 2. Stored row 0 = W's column 0, row 1 = column 1. */
static void test_hand_bf16(void)
{
    const uint8_t bytes[] = {
        0x80, 0x3F,   0x00, 0xC0,   0x00, 0x3E,   /* row 0: 1.0, -2.0, 0.125 */
        0x01, 0x00,   0x7F, 0x7F,   0x00, 0x80,   /* row 1: 2^-133 (smallest subnormal), largest finite, -0.0 */
    };
    const double want[3 * 2] = {                  /* W (3, 2) row-major */
        1.0,   0x1p-133,
        -2.0,  0x1.fep127,
        0.125, -0.0,
    };
    uint8_t *data = copy_bytes(bytes, sizeof bytes);
    double *out = alloc_out(6);
    CHECK_STATUS(tb_dequantize(out, 6, data, sizeof bytes, TB_FMT_BF16, 3, 2), TB_OK);
    for (size_t k = 0; k < 6; k++)
        CHECK(same_double(out[k], want[k]));
    free(data);
    free(out);
}

/* Q8_0, d_in = 32, d_out = 3: one block per row. */
static void test_hand_q8_0(void)
{
    uint8_t *data = alloc_bytes(3 * 34);
    double *out = alloc_out(32 * 3);
    memset(data, 0, 3 * 34);
    /* row 0: scale 0.5 (float16 0x3800), q[0..5] = 1, -1, 127, -128, 0, 2 */
    data[0] = 0x00; data[1] = 0x38;
    data[2] = 0x01; data[3] = 0xFF; data[4] = 0x7F; data[5] = 0x80; data[6] = 0x00; data[7] = 0x02;
    /* row 1: scale 2^-24 (0x0001, the smallest subnormal), q[0] = 3, q[31] = -2 */
    data[34] = 0x01; data[35] = 0x00;
    data[36] = 0x03; data[36 + 31] = 0xFE;
    /* row 2: scale -2.0 (0xC000), q[5] = 7 */
    data[68] = 0x00; data[69] = 0xC0;
    data[70 + 5] = 0x07;
    CHECK_STATUS(tb_dequantize(out, 96, data, 102, TB_FMT_Q8_0, 32, 3), TB_OK);
    /* W[i][o] = out[i * 3 + o] */
    CHECK(out[0 * 3 + 0] == 0.5 && out[1 * 3 + 0] == -0.5 && out[2 * 3 + 0] == 63.5);
    CHECK(out[3 * 3 + 0] == -64.0 && out[4 * 3 + 0] == 0.0 && out[5 * 3 + 0] == 1.0);
    CHECK(out[0 * 3 + 1] == 0x3p-24 && out[31 * 3 + 1] == -0x2p-24);
    CHECK(out[5 * 3 + 2] == -14.0);
    /* everything else is zero; row 2's scale is negative, so its zeros are -0.0 (-2.0 * 0) */
    for (size_t i = 0; i < 32; i++) {
        if (i > 5)
            CHECK(same_double(out[i * 3 + 0], 0.0));
        if (i != 0 && i != 31)
            CHECK(same_double(out[i * 3 + 1], 0.0));
        if (i != 5)
            CHECK(same_double(out[i * 3 + 2], -0.0));
    }
    free(data);
    free(out);
}

/* Q4_0, d_in = 64, d_out = 1: two blocks, so the block order is checked too. */
static void test_hand_q4_0(void)
{
    uint8_t *data = alloc_bytes(2 * 18);
    double *out = alloc_out(64);
    memset(data, 0x88, 2 * 18);            /* nibble 8 everywhere: value 0 */
    /* block 0: scale 0.5; byte 0 = 0x9F: input 0 = (15 - 8) * 0.5, input 16 = (9 - 8) * 0.5;
     * byte 15 = 0x08: input 15 = 0, input 31 = (0 - 8) * 0.5 */
    data[0] = 0x00; data[1] = 0x38;
    data[2 + 0] = 0x9F; data[2 + 15] = 0x08;
    /* block 1: scale 1.0 (0x3C00); byte 3 = 0x1E: input 35 = 14 - 8, input 51 = 1 - 8 */
    data[18] = 0x00; data[19] = 0x3C;
    data[20 + 3] = 0x1E;
    CHECK_STATUS(tb_dequantize(out, 64, data, 36, TB_FMT_Q4_0, 64, 1), TB_OK);
    CHECK(out[0] == 3.5 && out[16] == 0.5 && out[15] == 0.0 && out[31] == -4.0);
    CHECK(out[35] == 6.0 && out[51] == -7.0);
    for (size_t i = 0; i < 64; i++)
        if (i != 0 && i != 16 && i != 31 && i != 35 && i != 51)
            CHECK(same_double(out[i], 0.0));
    free(data);
    free(out);
}

/* ---- every bit pattern of the two small floats ---- */

/* The textbook value of a finite float16: (-1)^s 2^(e-15) (1 + m/1024), or (-1)^s 2^-14 (m/1024)
 * when e = 0. */
static double fp16_textbook(unsigned h)
{
    const unsigned s = h >> 15, e = (h >> 10) & 31u, m = h & 1023u;
    const double mag = e == 0 ? pow(2.0, -14) * ((double)m / 1024.0)
                              : pow(2.0, (double)e - 15.0) * (1.0 + (double)m / 1024.0);
    return s ? -mag : mag;
}

/* Every float16 as the scale of a Q8_0 block whose q are all 1: finite ones come back as
 * their textbook value, Inf and NaN (exponent 31) as TB_ERR_NOT_FINITE. */
static void test_every_fp16_scale(void)
{
    uint8_t *data = alloc_bytes(34);
    double *out = alloc_out(32);
    int wrong = 0, refused_right = 0;
    double previous = -1.0;
    memset(data, 1, 34);
    for (unsigned h = 0; h < 65536u; h++) {
        const int finite = ((h >> 10) & 31u) != 31u;
        data[0] = (uint8_t)(h & 0xFFu);
        data[1] = (uint8_t)(h >> 8);
        const tb_status st = tb_dequantize(out, 32, data, 34, TB_FMT_Q8_0, 32, 1);
        if (!finite) {
            refused_right += st == TB_ERR_NOT_FINITE;
            continue;
        }
        if (st != TB_OK || !same_double(out[0], fp16_textbook(h)) || !same_double(out[31], out[0]))
            wrong++;
        if (h < 0x7C00u) {                   /* the positive finite ones increase strictly */
            wrong += !(out[0] > previous);
            previous = out[0];
        }
    }
    CHECK(wrong == 0);
    CHECK(refused_right == 2 * 1024);
    free(data);
    free(out);
}

/* Every bfloat16: a finite one is the float32 with those 16 bits on top and zeros below. */
static void test_every_bf16(void)
{
    const size_t n = 65536;
    uint8_t *data = alloc_bytes(2 * n);
    uint8_t *one = alloc_bytes(2);
    double *out = alloc_out(n);
    int wrong = 0, refused_right = 0;
    for (size_t h = 0; h < n; h++) {
        data[2 * h] = (uint8_t)(h & 0xFFu);
        data[2 * h + 1] = (uint8_t)(h >> 8);
    }
    /* one pattern at a time: the non-finite ones refuse the whole matrix */
    for (size_t h = 0; h < n; h++) {
        const int finite = ((h >> 7) & 0xFFu) != 0xFFu;
        one[0] = data[2 * h];
        one[1] = data[2 * h + 1];
        const tb_status st = tb_dequantize(out + h, 1, one, 2, TB_FMT_BF16, 1, 1);
        if (!finite) {
            refused_right += st == TB_ERR_NOT_FINITE && out[h] == SENTINEL;
            continue;
        }
        const uint32_t bits = (uint32_t)h << 16;
        float f;
        memcpy(&f, &bits, sizeof f);         /* IEEE float32, as C99's Annex F hosts have */
        if (st != TB_OK || !same_double(out[h], (double)f))
            wrong++;
    }
    CHECK(wrong == 0);
    CHECK(refused_right == 2 * 128);
    /* the whole table in one call holds Infs and NaNs: refused, nothing written */
    for (size_t h = 0; h < n; h++)
        out[h] = SENTINEL;
    CHECK_STATUS(tb_dequantize(out, n, data, 2 * n, TB_FMT_BF16, 256, 256), TB_ERR_NOT_FINITE);
    CHECK(untouched(out, n));
    free(data);
    free(one);
    free(out);
}

/* ---- random matrices, element by element ---- */

static unsigned le16_at(const uint8_t *p) { return (unsigned)p[0] + 256u * (unsigned)p[1]; }

/* Element W[i][o] read straight from the bytes: a gather, where tb_dequantize scatters rows. */
static double element(const uint8_t *data, int format, size_t d_in, size_t i, size_t o)
{
    if (format == TB_FMT_BF16) {
        const uint32_t bits = (uint32_t)le16_at(data + (o * d_in + i) * 2) << 16;
        float f;
        memcpy(&f, &bits, sizeof f);
        return (double)f;
    }
    {
        const size_t block_bytes = format == TB_FMT_Q8_0 ? 34 : 18, k = i % 32;
        const uint8_t *block = data + (o * (d_in / 32) + i / 32) * block_bytes;
        const double d = fp16_textbook(le16_at(block));
        if (format == TB_FMT_Q8_0) {
            const unsigned byte = block[2 + k];
            return d * (double)((int)byte - ((byte & 0x80u) ? 256 : 0));
        } else {
            const unsigned byte = block[2 + k % 16];
            return d * (double)((int)(k < 16 ? byte & 15u : byte >> 4) - 8);
        }
    }
}

/* Random bytes of a (d_in, d_out) matrix, each unit's leading float made finite (its
 * exponent's top bit cleared) and every fifth block's scale set to zero. */
static uint8_t *random_matrix(int format, size_t d_in, size_t d_out, size_t *bytes, unsigned long *state)
{
    const size_t unit = format == TB_FMT_BF16 ? 2 : format == TB_FMT_Q8_0 ? 34 : 18;
    const size_t per_row = format == TB_FMT_BF16 ? d_in : d_in / 32;
    uint8_t *data;
    *bytes = d_out * per_row * unit;
    data = alloc_bytes(*bytes);
    for (size_t k = 0; k < *bytes; k++)
        data[k] = next_byte(state);
    for (size_t u = 0; u < d_out * per_row; u++) {
        uint8_t *lead = data + u * unit;
        lead[1] &= 0xBF;
        if (format != TB_FMT_BF16 && u % 5 == 4)
            lead[0] = lead[1] = 0;
    }
    return data;
}

static void test_random_matrices(void)
{
    const int formats[] = {TB_FMT_BF16, TB_FMT_Q8_0, TB_FMT_Q4_0};
    const size_t d_ins[] = {32, 64, 96, 160}, d_outs[] = {1, 2, 5, 9};
    unsigned long state = 12345;
    for (size_t f = 0; f < 3; f++) {
        for (size_t a = 0; a < 4; a++) {
            for (size_t b = 0; b < 4; b++) {
                const size_t d_in = d_ins[a], d_out = d_outs[b], n = d_in * d_out;
                size_t bytes;
                uint8_t *data = random_matrix(formats[f], d_in, d_out, &bytes, &state);
                double *out = alloc_out(n + 3);          /* 3 spare doubles: left alone */
                int wrong = 0;
                CHECK_STATUS(tb_dequantize(out, n + 3, data, bytes, formats[f], (int64_t)d_in, (int64_t)d_out),
                             TB_OK);
                for (size_t i = 0; i < d_in; i++)
                    for (size_t o = 0; o < d_out; o++)
                        wrong += !same_double(out[i * d_out + o], element(data, formats[f], d_in, i, o));
                CHECK(wrong == 0);
                CHECK(untouched(out + n, 3));
                free(data);
                free(out);
            }
        }
    }
}

/* ---- bad arguments: the code, and nothing written ---- */

/* A valid Q8_0 (64, 2) or Q4_0 matrix: scales 1.0, q bytes 0x11. */
static uint8_t *good_blocks(int format, size_t *bytes)
{
    const size_t unit = format == TB_FMT_Q8_0 ? 34 : 18;
    uint8_t *data;
    *bytes = 2 * 2 * unit;
    data = alloc_bytes(*bytes);
    memset(data, 0x11, *bytes);
    for (size_t u = 0; u < 4; u++) {
        data[u * unit] = 0x00;
        data[u * unit + 1] = 0x3C;
    }
    return data;
}

static void test_bad_arguments(void)
{
    const int blocked[] = {TB_FMT_Q8_0, TB_FMT_Q4_0};
    const size_t n = 64 * 2;
    double *out = alloc_out(n);
    for (size_t f = 0; f < 2; f++) {
        const int fmt = blocked[f];
        size_t bytes;
        uint8_t *data = good_blocks(fmt, &bytes);
        CHECK_STATUS(tb_dequantize(NULL, n, data, bytes, fmt, 64, 2), TB_ERR_NULL_ARG);
        CHECK_STATUS(tb_dequantize(out, n, NULL, bytes, fmt, 64, 2), TB_ERR_NULL_ARG);
        CHECK_STATUS(tb_dequantize(out, n, data, bytes, 3, 64, 2), TB_ERR_FORMAT);
        CHECK_STATUS(tb_dequantize(out, n, data, bytes, -1, 64, 2), TB_ERR_FORMAT);
        CHECK_STATUS(tb_dequantize(out, n, data, bytes, fmt, 0, 2), TB_ERR_DIM);
        CHECK_STATUS(tb_dequantize(out, n, data, bytes, fmt, -32, 2), TB_ERR_DIM);
        CHECK_STATUS(tb_dequantize(out, n, data, bytes, fmt, 64, 0), TB_ERR_DIM);
        CHECK_STATUS(tb_dequantize(out, n, data, bytes, fmt, 63, 2), TB_ERR_BLOCK);
        CHECK_STATUS(tb_dequantize(out, n, data, bytes, fmt, 16, 2), TB_ERR_BLOCK);
        CHECK_STATUS(tb_dequantize(out, n, data, bytes, fmt, (int64_t)1 << 62, (int64_t)1 << 62),
                     TB_ERR_OVERFLOW);
        CHECK_STATUS(tb_dequantize(out, n, data, bytes, fmt, (int64_t)1 << 61, 1), TB_ERR_OVERFLOW);
        CHECK_STATUS(tb_dequantize(out, n, data, bytes - 1, fmt, 64, 2), TB_ERR_DATA_SIZE);
        CHECK_STATUS(tb_dequantize(out, n, data, bytes, fmt, 32, 2), TB_ERR_DATA_SIZE);    /* too long */
        CHECK_STATUS(tb_dequantize(out, n - 1, data, bytes, fmt, 64, 2), TB_ERR_OUTPUT_SIZE);
        CHECK_STATUS(tb_dequantize(out, n, (const uint8_t *)(const void *)(out + 5), bytes, fmt, 64, 2),
                     TB_ERR_OVERLAP);
        /* a NaN, +Inf or -Inf scale in the last block: found before the first row is written */
        {
            const unsigned bad[] = {0x7E00u, 0x7C00u, 0xFC00u, 0x7C01u, 0xFFFFu};
            const size_t last = bytes - (fmt == TB_FMT_Q8_0 ? 34 : 18);
            for (size_t k = 0; k < 5; k++) {
                data[last] = (uint8_t)(bad[k] & 0xFFu);
                data[last + 1] = (uint8_t)(bad[k] >> 8);
                CHECK_STATUS(tb_dequantize(out, n, data, bytes, fmt, 64, 2), TB_ERR_NOT_FINITE);
            }
        }
        CHECK(untouched(out, n));
        free(data);
    }
    {
        /* bf16 takes any d_in; a NaN or Inf value anywhere refuses the matrix */
        uint8_t *data = alloc_bytes(2 * 33);
        double *out33 = alloc_out(33);
        memset(data, 0x3F, 2 * 33);
        CHECK_STATUS(tb_dequantize(out33, 33, data, 66, TB_FMT_BF16, 33, 1), TB_OK);
        for (size_t k = 0; k < 33; k++)
            out33[k] = SENTINEL;
        data[64] = 0xC0; data[65] = 0x7F;                       /* the last value a NaN */
        CHECK_STATUS(tb_dequantize(out33, 33, data, 66, TB_FMT_BF16, 33, 1), TB_ERR_NOT_FINITE);
        data[64] = 0x80; data[65] = 0xFF;                       /* -Inf */
        CHECK_STATUS(tb_dequantize(out33, 33, data, 66, TB_FMT_BF16, 33, 1), TB_ERR_NOT_FINITE);
        CHECK_STATUS(tb_dequantize(out33, 33, data, 65, TB_FMT_BF16, 33, 1), TB_ERR_DATA_SIZE);
        CHECK(untouched(out33, 33));
        free(data);
        free(out33);
    }
    free(out);
}

/* Buffers malloc'ed short of the shape, passed with their true lengths: refused before a
 * byte past their ends is touched (AddressSanitizer would report it). */
static void test_short_buffers(void)
{
    const int formats[] = {TB_FMT_BF16, TB_FMT_Q8_0, TB_FMT_Q4_0};
    const size_t stored[] = {2 * 64 * 3, 34 * 2 * 3, 18 * 2 * 3};   /* (64, 3) in each format */
    for (size_t f = 0; f < 3; f++) {
        uint8_t *data = alloc_bytes(stored[f] - 1);
        uint8_t *full = alloc_bytes(stored[f]);
        double *out = alloc_out(64 * 3);
        double *short_out = alloc_out(64 * 3 - 1);
        memset(data, 0, stored[f] - 1);
        memset(full, 0, stored[f]);
        CHECK_STATUS(tb_dequantize(out, 64 * 3, data, stored[f] - 1, formats[f], 64, 3), TB_ERR_DATA_SIZE);
        CHECK_STATUS(tb_dequantize(short_out, 64 * 3 - 1, full, stored[f], formats[f], 64, 3),
                     TB_ERR_OUTPUT_SIZE);
        CHECK(untouched(out, 64 * 3) && untouched(short_out, 64 * 3 - 1));
        CHECK_STATUS(tb_dequantize(out, 64 * 3, full, stored[f], formats[f], 64, 3), TB_OK);
        free(data);
        free(full);
        free(out);
        free(short_out);
    }
}

static void test_status_strings(void)
{
    const tb_status codes[] = {TB_ERR_FORMAT, TB_ERR_BLOCK, TB_ERR_DATA_SIZE, TB_ERR_NOT_FINITE};
    for (size_t k = 0; k < 4; k++) {
        CHECK(strncmp(tb_status_name(codes[k]), "TB_ERR_", 7) == 0);
        CHECK(strcmp(tb_status_message(codes[k]), "unknown status code") != 0);
    }
    CHECK(strcmp(tb_status_name(TB_ERR_NOT_FINITE), "TB_ERR_NOT_FINITE") == 0);
    CHECK(strstr(tb_status_message(TB_ERR_BLOCK), "multiple of 32") != NULL);
}

int main(void)
{
    test_hand_bf16();
    test_hand_q8_0();
    test_hand_q4_0();
    test_every_fp16_scale();
    test_every_bf16();
    test_random_matrices();
    test_bad_arguments();
    test_short_buffers();
    test_status_strings();
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed == 0 ? 0 : 1;
}
