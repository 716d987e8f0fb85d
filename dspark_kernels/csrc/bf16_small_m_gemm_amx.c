/* y[M, N] = x[M, K] @ W[N, K]^T (+ bias), x and W in bf16, y and bias in fp32, for small M, on CPUs with AMX-BF16.
 *
 * Why: on a Xeon with AMX, torch's bf16 GEMM (oneDNN) costs about the same for 2 rows as for 8, but ~1.4x what the
 * AVX512-BF16 kernel needs for one row, and that kernel's cost grows with its rows (its horizontal sums and dot
 * products are per row): every verify pass, whatever its length, paid ~1.47x a plain step (BENCHMARKS log,
 * 2026-12-05). Tile multiplies are ~free at these sizes, so here a 2-16-row call costs what streaming W costs.
 *
 * Layout: the product is computed transposed, C[n, m] = W[n, :] . x[m, :], so that W's rows load straight into
 * the A tile (16 weight rows x 32 k, stride K) with no repacking of the weights; x, a few KB, is repacked per call
 * into the B tiles' pair-interleaved layout (16 k-pairs x 16 rows of x x 2), zero-padded past M. Each thread
 * takes 16-row blocks of W and runs every 16-row tile of x against one while it is in L2, so W is streamed once
 * for any M; two accumulator tiles (even / odd k-chunks) keep consecutive tile products
 * independent. Needs K % 32 == 0 and N % 16 == 0 (the caller checks; other shapes take the AVX512-BF16 kernel).
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* Linux hands out the tile state only on request; 0 when granted. */
int bf16_amx_init(void) { return (int)syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); }

struct tile_config {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

static void configure_tiles(void) {
    struct tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int t = 0; t < 6; t++) { /* 0, 1: C (16 x 16 fp32); 2, 3: A (16 x 32 bf16); 4, 5: B (16 x 16 x 2 bf16) */
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
}

/* xp[mc][kc][r][j][p] = x[16 mc + j, 32 kc + 2 r + p], zero for rows past M. */
static void pack_x(const uint16_t *x, uint16_t *xp, long M, long K, long ldx, long mchunks) {
    long kchunks = K / 32;
    memset(xp, 0, (size_t)mchunks * kchunks * 512 * sizeof(uint16_t));
    for (long m = 0; m < M; m++) {
        uint16_t *dst = xp + (m / 16) * kchunks * 512 + (m % 16) * 2;
        const uint16_t *src = x + m * ldx;
        for (long k = 0; k < K; k += 2) {
            uint16_t *d = dst + (k / 32) * 512 + ((k % 32) / 2) * 32;
            d[0] = src[k];
            d[1] = src[k + 1];
        }
    }
}

void bf16_small_m_gemm_amx(const uint16_t *x, const uint16_t *w, const float *bias, float *y, long M, long K, long N,
                           long ldx, int threads) {
    long kchunks = K / 32, mchunks = (M + 15) / 16, nblocks = N / 16;
    uint16_t *xp = aligned_alloc(64, (size_t)mchunks * kchunks * 512 * sizeof(uint16_t));
    if (!xp) return;
    pack_x(x, xp, M, K, ldx, mchunks);
    const long wstride = K * (long)sizeof(uint16_t);
#pragma omp parallel num_threads(threads)
    {
        configure_tiles();
        float c0[16][16], c1[16][16];
#pragma omp for schedule(static)
        for (long nb = 0; nb < nblocks; nb++) {
            long n0 = nb * 16;
            const uint16_t *wb = w + n0 * K;
            for (long mc = 0; mc < mchunks; mc++) { /* W's block (28-152 KB here) stays in L2 across row tiles */
                const uint16_t *xb = xp + mc * kchunks * 512;
                _tile_zero(0);
                _tile_zero(1);
                long kc = 0;
                for (; kc + 1 < kchunks; kc += 2) {
                    _tile_loadd(2, wb + kc * 32, wstride);
                    _tile_loadd(4, xb + kc * 512, 64);
                    _tile_loadd(3, wb + (kc + 1) * 32, wstride);
                    _tile_loadd(5, xb + (kc + 1) * 512, 64);
                    _tile_dpbf16ps(0, 2, 4);
                    _tile_dpbf16ps(1, 3, 5);
                }
                if (kc < kchunks) {
                    _tile_loadd(2, wb + kc * 32, wstride);
                    _tile_loadd(4, xb + kc * 512, 64);
                    _tile_dpbf16ps(0, 2, 4);
                }
                _tile_stored(0, c0, 64);
                _tile_stored(1, c1, 64);
                long rows = M - mc * 16 < 16 ? M - mc * 16 : 16;
                for (long j = 0; j < rows; j++) {
                    float *yr = y + (mc * 16 + j) * N + n0;
                    for (int i = 0; i < 16; i++) yr[i] = c0[i][j] + c1[i][j] + (bias ? bias[n0 + i] : 0.0f);
                }
            }
        }
        _tile_release();
    }
    free(xp);
}
