/* y[M, N] = x[M, K] @ W[N, K]^T (+ bias) with W in bf16 and x, y, bias in fp32, for small M (decode, verify).
 *
 * Why: on CPUs without bf16 dot products (AVX2-only x86) torch's bf16 GEMM converts the weights once per row of x,
 * so its cost grows with M although one row already reads W at memory speed. Here each weight tile is read from
 * memory once, upcast in registers (bf16 -> fp32 is a 16-bit shift, exact) and used for every row of x, so small
 * M costs about what M = 1 costs. Accumulation is fp32 FMA.
 *
 * Blocking: 4 weight rows x 2 input rows = 8 AVX2 accumulators (plus 4 weight and 1 input register, of 16).
 * Threads split N in 4-row blocks; a thread's weight block (4 x K bf16, 7-39 KB here) stays in L1/L2 while
 * every pair of input rows passes over it.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* Weight rows this far ahead (two 4-row blocks) are prefetched, one cache line per 32 columns, by the first row
 * pair of a call with more than two rows; later pairs find the block in L1/L2. Without it the FMAs of several
 * rows keep the core busy long enough that the hardware prefetcher falls behind: on a 2-core EPYC Zen 4 (this
 * kernel, not the one it serves with there), 24 layers' weights cycled, 4 rows of gate_up took 1.43 ms without
 * and 1.07 ms with it, 8 rows 1.84 vs 1.52 ms, the 8-row lm_head 27.1 vs 22.6 ms. A prefetch past the end of W
 * is a hint, not a load: it cannot fault. */
#define PREFETCH_ROWS 8

static inline __m256 load_bf16x8(const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* rows n0 .. n0+nb-1 (nb <= 4) of W against rows m0 .. m0+mb-1 (mb <= 2) of x. Inlined once per constant mb:
 * a runtime mb left a branch in the inner loop that cost a third of the one-row time. */
static inline __attribute__((always_inline)) void block(const float *x, const uint16_t *w, const float *bias, float *y, long K, long N, long ldx,
                  long n0, int nb, long m0, int mb, int pf) {
    __m256 acc[2][4];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = _mm256_setzero_ps();
    const uint16_t *wr[4];
    for (int j = 0; j < 4; j++) wr[j] = w + (n0 + (j < nb ? j : 0)) * K;
    const float *xr0 = x + m0 * ldx;
    const float *xr1 = x + (m0 + (mb > 1 ? 1 : 0)) * ldx;
    long k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 w0 = load_bf16x8(wr[0] + k), w1 = load_bf16x8(wr[1] + k);
        __m256 w2 = load_bf16x8(wr[2] + k), w3 = load_bf16x8(wr[3] + k);
        if (pf && (k & 31) == 0) {
            _mm_prefetch((const char *)(wr[0] + PREFETCH_ROWS * K + k), _MM_HINT_T0);
            _mm_prefetch((const char *)(wr[1] + PREFETCH_ROWS * K + k), _MM_HINT_T0);
            _mm_prefetch((const char *)(wr[2] + PREFETCH_ROWS * K + k), _MM_HINT_T0);
            _mm_prefetch((const char *)(wr[3] + PREFETCH_ROWS * K + k), _MM_HINT_T0);
        }
        __m256 a = _mm256_loadu_ps(xr0 + k);
        acc[0][0] = _mm256_fmadd_ps(a, w0, acc[0][0]);
        acc[0][1] = _mm256_fmadd_ps(a, w1, acc[0][1]);
        acc[0][2] = _mm256_fmadd_ps(a, w2, acc[0][2]);
        acc[0][3] = _mm256_fmadd_ps(a, w3, acc[0][3]);
        if (mb > 1) {
            __m256 b = _mm256_loadu_ps(xr1 + k);
            acc[1][0] = _mm256_fmadd_ps(b, w0, acc[1][0]);
            acc[1][1] = _mm256_fmadd_ps(b, w1, acc[1][1]);
            acc[1][2] = _mm256_fmadd_ps(b, w2, acc[1][2]);
            acc[1][3] = _mm256_fmadd_ps(b, w3, acc[1][3]);
        }
    }
    for (int i = 0; i < mb; i++) {
        const float *xr = i ? xr1 : xr0;
        for (int j = 0; j < nb; j++) {
            float s = hsum(acc[i][j]);
            for (long kk = k; kk < K; kk++) s += xr[kk] * bf16_to_f32(wr[j][kk]);
            if (bias) s += bias[n0 + j];
            y[(m0 + i) * N + n0 + j] = s;
        }
    }
}

/* x [M, K] fp32 (row stride ldx), w [N, K] bf16 contiguous, bias [N] fp32 or NULL, y [M, N] fp32 contiguous. */
void bf16_small_m_gemm(const float *x, const uint16_t *w, const float *bias, float *y, long M, long K, long N,
                       long ldx, int threads) {
    long nblocks = (N + 3) / 4;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long bi = 0; bi < nblocks; bi++) {
        long n0 = bi * 4;
        int nb = (int)(N - n0 < 4 ? N - n0 : 4);
        for (long m0 = 0; m0 < M; m0 += 2) {
            int mb = (int)(M - m0 < 2 ? M - m0 : 2);
            int prefetch = M > 2 && m0 == 0;
            if (mb == 2)
                block(x, w, bias, y, K, N, ldx, n0, nb, m0, 2, prefetch);
            else
                block(x, w, bias, y, K, N, ldx, n0, nb, m0, 1, prefetch);
        }
    }
}
