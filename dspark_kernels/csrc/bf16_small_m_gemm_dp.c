/* y[M, N] = x[M, K] @ W[N, K]^T (+ bias), x and W in bf16, y and bias in fp32, for small M, on CPUs with
 * AVX512-BF16 dot products (vdpbf16ps: pairs of bf16 products summed into fp32 lanes).
 *
 * Why: torch's bf16 GEMM on such CPUs (oneDNN) reads W at memory speed for one row, but a 2-8-row call costs
 * 1.3-1.7x one row (measured on an EPYC Zen 4): verify passes of 2-8 tokens pay for rows that should be free,
 * since the weights dominate the bytes moved. Here each weight tile is loaded once and used for up to 4 rows of x.
 *
 * Blocking: 4 weight rows x 4 input rows = 16 zmm accumulators, 4 weight and 1 input register (of 32).
 * Threads split N in 4-row blocks; a block's 4 x K bf16 weights (7-39 KB here) stay in L1/L2 while each group
 * of 4 input rows passes over it. K tails use masked loads (zeros contribute nothing).
 */
#include <immintrin.h>
#include <stdint.h>

/* Weight rows this far ahead are prefetched while a block computes, by the first row group of a multi-row call
 * (later groups find the block in L1; a one-row call is pure streaming, which the hardware prefetcher keeps up
 * with). With several rows the dot products keep the core busy long enough that the hardware prefetcher alone
 * falls behind: on a 2-core EPYC Zen 4, 24 layers' weights cycled, 8 rows of gate_up took 1.26 ms without and
 * 1.04 ms with it, the lm_head 18.7 vs 15.9 ms, 4 rows of gate_up 1.03 vs 0.85 ms (one row ~0.78 either way).
 * Two blocks (8 rows) ahead beat one and four. A prefetch past the end of W is a hint, not a load: it cannot
 * fault. */
#define PREFETCH_ROWS 8

static inline __m512bh load_bf16x32(const uint16_t *p, __mmask32 m) {
    return (__m512bh)_mm512_maskz_loadu_epi16(m, p);
}

/* rows n0 .. n0+nb-1 (nb <= 4) of W against rows m0 .. m0+MB-1 of x, one function per MB. The accumulators are
 * named variables, not an array: gcc kept an array's 16 zmm in registers but also stored them to the stack on
 * every k-step, which tripled the 4-row time. */
#define DP_ROW(i)                                                  \
    if (MB > i) {                                                  \
        __m512bh a = load_bf16x32(xr##i + k, m);                   \
        c##i##0 = _mm512_dpbf16_ps(c##i##0, a, w0);                \
        c##i##1 = _mm512_dpbf16_ps(c##i##1, a, w1);                \
        c##i##2 = _mm512_dpbf16_ps(c##i##2, a, w2);                \
        c##i##3 = _mm512_dpbf16_ps(c##i##3, a, w3);                \
    }
#define STORE_ROW(i)                                                                    \
    if (MB > i) {                                                                       \
        float r[4] = {_mm512_reduce_add_ps(c##i##0), _mm512_reduce_add_ps(c##i##1),    \
                      _mm512_reduce_add_ps(c##i##2), _mm512_reduce_add_ps(c##i##3)};   \
        for (int j = 0; j < nb; j++) y[(m0 + i) * N + n0 + j] = r[j] + (bias ? bias[n0 + j] : 0.0f); \
    }
#define BLOCK_FN(MBV)                                                                                           \
    static void block##MBV(const uint16_t *x, const uint16_t *w, const float *bias, float *y, long K, long N,     \
                          long ldx, long n0, int nb, long m0, int prefetch) {                                   \
        const int MB = MBV;                                                                                     \
        __m512 c00 = _mm512_setzero_ps(), c01 = c00, c02 = c00, c03 = c00, c10 = c00, c11 = c00, c12 = c00,      \
               c13 = c00, c20 = c00, c21 = c00, c22 = c00, c23 = c00, c30 = c00, c31 = c00, c32 = c00, c33 = c00; \
        const uint16_t *wr0 = w + n0 * K, *wr1 = w + (n0 + (nb > 1)) * K, *wr2 = w + (n0 + (nb > 2 ? 2 : 0)) * K,  \
                       *wr3 = w + (n0 + (nb > 3 ? 3 : 0)) * K;                                                  \
        const uint16_t *xr0 = x + m0 * ldx, *xr1 = x + (m0 + (MB > 1)) * ldx, *xr2 = x + (m0 + (MB > 2 ? 2 : 0)) * ldx, \
                       *xr3 = x + (m0 + (MB > 3 ? 3 : 0)) * ldx;                                                \
        for (long k = 0; k < K; k += 32) {                                                                      \
            __mmask32 m = K - k >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << (K - k)) - 1u);              \
            __m512bh w0 = load_bf16x32(wr0 + k, m), w1 = load_bf16x32(wr1 + k, m);                               \
            __m512bh w2 = load_bf16x32(wr2 + k, m), w3 = load_bf16x32(wr3 + k, m);                               \
            if (prefetch) {                                                                                     \
                _mm_prefetch((const char *)(wr0 + PREFETCH_ROWS * K + k), _MM_HINT_T0);                          \
                _mm_prefetch((const char *)(wr1 + PREFETCH_ROWS * K + k), _MM_HINT_T0);                          \
                _mm_prefetch((const char *)(wr2 + PREFETCH_ROWS * K + k), _MM_HINT_T0);                          \
                _mm_prefetch((const char *)(wr3 + PREFETCH_ROWS * K + k), _MM_HINT_T0);                          \
            }                                                                                                   \
            DP_ROW(0) DP_ROW(1) DP_ROW(2) DP_ROW(3)                                                             \
        }                                                                                                       \
        STORE_ROW(0) STORE_ROW(1) STORE_ROW(2) STORE_ROW(3)                                                     \
    }
BLOCK_FN(1)
BLOCK_FN(2)
BLOCK_FN(3)
BLOCK_FN(4)

/* x [M, K] bf16 (row stride ldx), w [N, K] bf16 contiguous, bias [N] fp32 or NULL, y [M, N] fp32 contiguous. */
void bf16_small_m_gemm_dp(const uint16_t *x, const uint16_t *w, const float *bias, float *y, long M, long K,
                          long N, long ldx, int threads) {
    long nblocks = (N + 3) / 4;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long bi = 0; bi < nblocks; bi++) {
        long n0 = bi * 4;
        int nb = (int)(N - n0 < 4 ? N - n0 : 4);
        for (long m0 = 0; m0 < M; m0 += 4) {
            long left = M - m0;
            int prefetch = M > 1 && m0 == 0;
            if (left >= 4)
                block4(x, w, bias, y, K, N, ldx, n0, nb, m0, prefetch);
            else if (left == 3)
                block3(x, w, bias, y, K, N, ldx, n0, nb, m0, prefetch);
            else if (left == 2)
                block2(x, w, bias, y, K, N, ldx, n0, nb, m0, prefetch);
            else
                block1(x, w, bias, y, K, N, ldx, n0, nb, m0, prefetch);
        }
    }
}
