/* Neox-style rotary embedding for CPU, out of place: q_out / k_out [T, H * D] contiguous from q / k rows with
 * their own strides, cos and sin rows of a [max_pos, rot] cache (cos in the first half, sin in the second).
 *
 * Why: SGLang's torch path (forward_native, used on CPUs without its sgl_kernel build) is ~30 small tensor ops per
 * call, ~0.45 ms per layer for one token on a 2-core Xeon, 10.8 ms of a ~98 ms decode step (BENCHMARKS log,
 * 2026-12-05); this is one call.
 *
 * Numerics are the torch path's, bit for bit: bf16 operands are multiplied in fp32 and each product rounded to
 * bf16 (round to nearest even, NaN to 0x7FC0, as torch does), then the difference / sum is taken in fp32 and
 * rounded again; fp32 does the same without the roundings. Built with -ffp-contract=off so that no product is
 * fused into the following add.
 */
#include <stdint.h>
#include <string.h>

static inline float bf2f(uint16_t v) {
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if (f != f) return 0x7FC0;
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static inline float rbf(float f) { return bf2f(f2bf(f)); }

static void rotate_bf16(const uint16_t *x, uint16_t *out, const uint16_t *cs, long H, long D, long rot) {
    long half = rot / 2;
    for (long h = 0; h < H; h++) {
        const uint16_t *xh = x + h * D;
        uint16_t *oh = out + h * D;
        for (long i = 0; i < half; i++) {
            float x1 = bf2f(xh[i]), x2 = bf2f(xh[i + half]), c = bf2f(cs[i]), s = bf2f(cs[half + i]);
            oh[i] = f2bf(rbf(x1 * c) - rbf(x2 * s));
            oh[i + half] = f2bf(rbf(x2 * c) + rbf(x1 * s));
        }
        for (long i = rot; i < D; i++) oh[i] = xh[i];
    }
}

static void rotate_f32(const float *x, float *out, const float *cs, long H, long D, long rot) {
    long half = rot / 2;
    for (long h = 0; h < H; h++) {
        const float *xh = x + h * D;
        float *oh = out + h * D;
        for (long i = 0; i < half; i++) {
            float x1 = xh[i], x2 = xh[i + half], c = cs[i], s = cs[half + i];
            oh[i] = x1 * c - x2 * s;
            oh[i + half] = x2 * c + x1 * s;
        }
        for (long i = rot; i < D; i++) oh[i] = xh[i];
    }
}

/* is_bf16: element type of q, k, outputs and cache (all one type). Strides in elements. */
void rotary_neox(const int64_t *pos, const void *q, long ldq, const void *k, long ldk, void *q_out, void *k_out,
                 const void *cache, long T, long Hq, long Hk, long D, long rot, int is_bf16) {
    for (long t = 0; t < T; t++) {
        if (is_bf16) {
            const uint16_t *cs = (const uint16_t *)cache + pos[t] * rot;
            rotate_bf16((const uint16_t *)q + t * ldq, (uint16_t *)q_out + t * Hq * D, cs, Hq, D, rot);
            rotate_bf16((const uint16_t *)k + t * ldk, (uint16_t *)k_out + t * Hk * D, cs, Hk, D, rot);
        } else {
            const float *cs = (const float *)cache + pos[t] * rot;
            rotate_f32((const float *)q + t * ldq, (float *)q_out + t * Hq * D, cs, Hq, D, rot);
            rotate_f32((const float *)k + t * ldk, (float *)k_out + t * Hk * D, cs, Hk, D, rot);
        }
    }
}
