/* Pillow's BILINEAR resize of a box, bit for bit, written straight into a CHW sample.
 *
 * resize_into(src, width, height, channels, box, out, out_width, out_height, flip,
 *             vertical_first[, simd])
 * resizes the box (left, top, right, bottom: floats, as Pillow takes them) of an 8-bit RGB
 * (channels=3) or RGBX (channels=4, Pillow's and libjpeg's layout) image to
 * out_width x out_height and writes the three planes into `out` (3 * out_height *
 * out_width bytes, C order), mirrored left to right when `flip` is true.
 *
 * The arithmetic is Pillow's (Resample.c): the same double-precision filter weights from
 * the same float box, the same 22-bit fixed-point coefficients, two passes with the
 * intermediate clipped to 8 bits.  `vertical_first` says which pass Pillow runs first (the
 * caller knows the rule of the Pillow it matches).  Integer sums do not depend on their
 * order, so the vector kernels give exactly the scalar result: Pillow's pixels.  The
 * horizontal pass, the costly one (it runs over every source row the box spans), has
 * three on x86-64: scalar; SSE4.1 (a 4-byte pixel's channels in one vector, a 32-bit
 * multiply a tap); AVX2 (two rows at once, two taps a 16-bit multiply-add, the 22-bit
 * weights split in two 11-bit parts whose sums recombine exactly: split_pairs); and two on
 * AArch64: scalar and NEON (3- and 4-byte pixels, two taps a step, each tap's channels in
 * one vector, a 32-bit multiply-add a tap).  The vertical pass has plain loops the compiler
 * vectorises (an AVX2 clone where the CPU has it; NEON on AArch64) and, with the AVX2
 * kernels, 16 bytes a row at a time with the same split weights, the sums kept in
 * registers over the taps.  What is faster than Pillow: no image objects, no 4th channel
 * after the horizontal pass, the flip and the HWC -> CHW copy folded into the passes,
 * vector instructions where Pillow's portable build has none.  The GIL is released while
 * it works.
 *
 * `simd` picks the kernels: 0 scalar (the plain vertical loops), 1 SSE4.1 (4-byte pixels;
 * 3-byte ones go scalar) or on AArch64 NEON, 2 AVX2 (both passes); by default, and at
 * most, the module's SIMD: the best this CPU runs (tests compare each with Pillow; the NEON
 * kernels are built and run under qemu by tests/test_resize_arm.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define RESIZE_X86 1
#if defined(__GLIBC__) /* target_clones resolves through an ifunc: glibc's */
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR_CLONES
#endif
#else
#define RESIZE_X86 0
#define VECTOR_CLONES
#endif

#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define RESIZE_NEON 1 /* every AArch64 CPU has it: no dispatch */
#else
#define RESIZE_NEON 0
#endif

#define PRECISION_BITS (32 - 8 - 2)
#define HALF (1 << (PRECISION_BITS - 1))

typedef struct {
    int ksize;       /* coefficients per output pixel (some are zero) */
    int *bounds;     /* per output pixel: first input pixel, input pixel count */
    int32_t *coeffs; /* per output pixel: ksize fixed-point weights */
    int32_t *pairs;  /* for the AVX2 kernel (NULL until split_pairs): per output pixel,
                        (ksize + 1) / 2 taps pairs, each two words: the pair's high parts
                        (k >> 11) as two int16, then its low parts (k & 2047) */
} filter_plan;

static double bilinear(double x) {
    if (x < 0.0) {
        x = -x;
    }
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* Pillow's precompute_coeffs + normalize_coeffs_8bpc for BILINEAR (support 1): the same
 * operations in the same precision, so the same weights.  0 on a failed allocation. */
static int plan_filter(int in_size, float in0, float in1, int out_size, filter_plan *plan) {
    double scale, filterscale, support, center, ww, ss;
    filterscale = scale = (double)(in1 - in0) / out_size;
    if (filterscale < 1.0) {
        filterscale = 1.0;
    }
    support = 1.0 * filterscale;
    int ksize = (int)ceil(support) * 2 + 1;
    if (out_size > INT_MAX / (ksize * (int)sizeof(double))) {
        return 0;
    }
    double *kk = malloc((size_t)out_size * ksize * sizeof(double));
    int *bounds = malloc((size_t)out_size * 2 * sizeof(int));
    int32_t *coeffs = malloc((size_t)out_size * ksize * sizeof(int32_t));
    if (kk == NULL || bounds == NULL || coeffs == NULL) {
        free(kk);
        free(bounds);
        free(coeffs);
        return 0;
    }
    for (int xx = 0; xx < out_size; xx++) {
        center = in0 + (xx + 0.5) * scale;
        ww = 0.0;
        ss = 1.0 / filterscale;
        int xmin = (int)(center - support + 0.5);
        if (xmin < 0) {
            xmin = 0;
        }
        int xmax = (int)(center + support + 0.5);
        if (xmax > in_size) {
            xmax = in_size;
        }
        xmax -= xmin;
        double *k = &kk[(size_t)xx * ksize];
        int x;
        for (x = 0; x < xmax; x++) {
            double w = bilinear((x + xmin - center + 0.5) * ss);
            k[x] = w;
            ww += w;
        }
        for (x = 0; x < xmax; x++) {
            if (ww != 0.0) {
                k[x] /= ww;
            }
        }
        for (; x < ksize; x++) {
            k[x] = 0;
        }
        bounds[xx * 2] = xmin;
        bounds[xx * 2 + 1] = xmax;
    }
    for (size_t i = 0; i < (size_t)out_size * ksize; i++) {
        coeffs[i] = kk[i] < 0 ? (int32_t)(-0.5 + kk[i] * (1 << PRECISION_BITS))
                              : (int32_t)(0.5 + kk[i] * (1 << PRECISION_BITS));
    }
    free(kk);
    plan->ksize = ksize;
    plan->bounds = bounds;
    plan->coeffs = coeffs;
    plan->pairs = NULL;
    return 1;
}

static void free_plan(filter_plan *plan) {
    free(plan->bounds);
    free(plan->coeffs);
    free(plan->pairs);
}

/* Each weight k (|k| <= 2^22: a weight of at most 1) as k = (k >> 11) * 2048 + (k & 2047),
 * both parts int16, two taps' parts a word: sum(p * k) = 2048 * sum(p * hi) + sum(p * lo)
 * exactly (no sum overflows an int32: p <= 255 and the weights sum to 2^22), so the 16-bit
 * multiply-adds give the 32-bit sums Pillow computes.  0 on a failed allocation. */
static int split_pairs(filter_plan *plan, int out_size) {
    int npairs = (plan->ksize + 1) / 2;
    plan->pairs = malloc((size_t)out_size * npairs * 2 * sizeof(int32_t));
    if (plan->pairs == NULL) {
        return 0;
    }
    for (int xx = 0; xx < out_size; xx++) {
        const int32_t *k = &plan->coeffs[(size_t)xx * plan->ksize];
        int32_t *w = &plan->pairs[(size_t)xx * npairs * 2];
        for (int j = 0; j < npairs; j++) {
            int32_t k0 = k[2 * j], k1 = 2 * j + 1 < plan->ksize ? k[2 * j + 1] : 0;
            uint16_t h0 = (uint16_t)(int16_t)(k0 >> 11), h1 = (uint16_t)(int16_t)(k1 >> 11);
            uint16_t l0 = (uint16_t)(k0 & 2047), l1 = (uint16_t)(k1 & 2047);
            w[2 * j] = (int32_t)((uint32_t)h0 | (uint32_t)h1 << 16);
            w[2 * j + 1] = (int32_t)((uint32_t)l0 | (uint32_t)l1 << 16);
        }
    }
    return 1;
}

static inline uint8_t clip8(int32_t v) {
    v >>= PRECISION_BITS;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* Two taps of one pixel's channels (`channels` bytes each) in the low bytes of a word: both
 * pixels when `taps` is 2; when it is 1, the first alone (nothing past it is read, the rest
 * is zero).  `channels` is a constant where it is inlined: fixed-size copies, no calls. */
static inline __attribute__((always_inline)) uint64_t two_taps(const uint8_t *p, int channels,
                                                               int taps) {
    uint64_t v = 0;
    if (channels == 4) {
        if (taps == 2) {
            memcpy(&v, p, 8);
        } else {
            memcpy(&v, p, 4);
        }
    } else if (taps == 2) {
        uint32_t a = 0;
        uint16_t b = 0;
        memcpy(&a, p, 4);
        memcpy(&b, p + 4, 2);
        v = (uint64_t)a | (uint64_t)b << 32;
    } else {
        uint16_t a = 0;
        memcpy(&a, p, 2);
        v = (uint64_t)a | (uint64_t)p[2] << 16;
    }
    return v;
}

/* One output pixel of a row: `n` taps from `p` (pixels `channels` bytes each), weights
 * `k`; its R, G and B into `rgb`.  The scalar sums, Pillow's. */
static inline __attribute__((always_inline)) void pixel_scalar(const uint8_t *p, int channels,
                                                               int n, const int32_t *k,
                                                               uint8_t rgb[3]) {
    int32_t s0 = HALF, s1 = HALF, s2 = HALF;
    for (int x = 0; x < n; x++, p += channels) {
        s0 += p[0] * k[x];
        s1 += p[1] * k[x];
        s2 += p[2] * k[x];
    }
    rgb[0] = clip8(s0);
    rgb[1] = clip8(s1);
    rgb[2] = clip8(s2);
}

#if RESIZE_NEON
/* The same for NEON, 3- and 4-byte pixels: two taps a step, each tap's channels widened to a
 * vector of four int32 and multiplied by its 32-bit weight (NEON multiplies 32-bit lanes at
 * full rate: no split weights), the scalar sums exactly.  `channels` is a constant where
 * it is inlined. */
static inline __attribute__((always_inline)) void pixel_neon(const uint8_t *p,
                                                             const int channels, int n,
                                                             const int32_t *k, uint8_t rgb[3]) {
    /* 3-byte pixels: a word of two taps (two_taps) to r0 g0 b0 x0 r1 g1 b1 x1, each tap's
       channels in four bytes (x is index 255, which vtbl reads as zero).  4-byte pixels
       are in that order already: two taps are one 8-byte load. */
    static const uint8_t spread3[8] = {0, 1, 2, 255, 3, 4, 5, 255};
    const uint8x8_t spread = vld1_u8(spread3);
    int32x4_t even = vdupq_n_s32(HALF), odd = vdupq_n_s32(0);
    for (int x = 0; x < n; x += 2, p += 2 * channels) {
        int taps = n - x >= 2 ? 2 : 1;
        uint8x8_t b;
        if (channels == 4 && taps == 2) {
            b = vld1_u8(p);
        } else if (channels == 4) { /* the last tap alone: nothing past it is read */
            uint32_t one;
            memcpy(&one, p, 4);
            b = vreinterpret_u8_u32(vdup_n_u32(one)); /* the upper copy's weight is zero */
        } else {
            b = vtbl1_u8(vcreate_u8(two_taps(p, channels, taps)), spread);
        }
        uint16x8_t w = vmovl_u8(b);
        int32x4_t t0 = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(w)));
        int32x4_t t1 = vreinterpretq_s32_u32(vmovl_high_u16(w));
        even = vmlaq_n_s32(even, t0, k[x]);
        odd = vmlaq_n_s32(odd, t1, taps == 2 ? k[x + 1] : 0); /* k[n] may not exist */
    }
    int32x4_t sum = vshrq_n_s32(vaddq_s32(even, odd), PRECISION_BITS);
    uint16x4_t u16 = vqmovun_s32(sum);                 /* below 0 to 0 */
    uint8x8_t u8 = vqmovn_u16(vcombine_u16(u16, u16)); /* above 255 to 255 */
    rgb[0] = vget_lane_u8(u8, 0);
    rgb[1] = vget_lane_u8(u8, 1);
    rgb[2] = vget_lane_u8(u8, 2);
}
#endif

/* Horizontal pass: `rows` rows of interleaved pixels (`channels` bytes each, `stride` bytes
 * a row) into three planes of rows x ow bytes, `plane` bytes apart, each output column
 * mirrored when flip; each pixel by pixel_scalar, or by pixel_neon where `neon` (a constant
 * where inlined, as `channels` may be). */
static inline __attribute__((always_inline)) void
horizontal_rows(const uint8_t *src, size_t stride, const int channels, int rows, int ow,
                const filter_plan *h, uint8_t *out, size_t plane, int flip, const int neon) {
    for (int r = 0; r < rows; r++) {
        const uint8_t *line = src + (size_t)r * stride;
        uint8_t *o = out + (size_t)r * ow;
        for (int xx = 0; xx < ow; xx++) {
            const uint8_t *p = line + (size_t)h->bounds[xx * 2] * channels;
            int n = h->bounds[xx * 2 + 1];
            const int32_t *k = &h->coeffs[(size_t)xx * h->ksize];
            uint8_t rgb[3];
#if RESIZE_NEON
            if (neon) {
                pixel_neon(p, channels, n, k, rgb);
            } else {
                pixel_scalar(p, channels, n, k, rgb);
            }
#else
            (void)neon;
            pixel_scalar(p, channels, n, k, rgb);
#endif
            int d = flip ? ow - 1 - xx : xx;
            o[d] = rgb[0];
            o[plane + d] = rgb[1];
            o[2 * plane + d] = rgb[2];
        }
    }
}

static void horizontal_scalar(const uint8_t *src, size_t stride, int channels, int rows, int ow,
                              const filter_plan *h, uint8_t *out, size_t plane, int flip) {
    horizontal_rows(src, stride, channels, rows, ow, h, out, plane, flip, 0);
}

#if RESIZE_NEON
/* The NEON pass for 3- and 4-byte pixels, each compiled with its own constant. */
static void horizontal_neon(const uint8_t *src, size_t stride, int channels, int rows, int ow,
                            const filter_plan *h, uint8_t *out, size_t plane, int flip) {
    if (channels == 4) {
        horizontal_rows(src, stride, 4, rows, ow, h, out, plane, flip, 1);
    } else {
        horizontal_rows(src, stride, 3, rows, ow, h, out, plane, flip, 1);
    }
}
#endif

#if RESIZE_X86
/* The same for 4-byte pixels, a pixel's channels in one vector. */
__attribute__((target("sse4.1"))) static void horizontal_sse41(const uint8_t *src, size_t stride,
                                                               int rows, int ow,
                                                               const filter_plan *h,
                                                               uint8_t *out, size_t plane,
                                                               int flip) {
    for (int r = 0; r < rows; r++) {
        const uint8_t *line = src + (size_t)r * stride;
        uint8_t *o = out + (size_t)r * ow;
        for (int xx = 0; xx < ow; xx++) {
            const uint8_t *p = line + (size_t)h->bounds[xx * 2] * 4;
            int n = h->bounds[xx * 2 + 1];
            const int32_t *k = &h->coeffs[(size_t)xx * h->ksize];
            __m128i acc = _mm_set1_epi32(HALF);
            for (int x = 0; x < n; x++) {
                int32_t px;
                memcpy(&px, p + (size_t)x * 4, 4);
                __m128i v = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(px));
                acc = _mm_add_epi32(acc, _mm_mullo_epi32(v, _mm_set1_epi32(k[x])));
            }
            acc = _mm_srai_epi32(acc, PRECISION_BITS);
            acc = _mm_packus_epi16(_mm_packs_epi32(acc, acc), acc); /* clamp to 0..255 */
            uint32_t rgb = (uint32_t)_mm_cvtsi128_si32(acc);
            int d = flip ? ow - 1 - xx : xx;
            o[d] = (uint8_t)rgb;
            o[plane + d] = (uint8_t)(rgb >> 8);
            o[2 * plane + d] = (uint8_t)(rgb >> 16);
        }
    }
}

/* One step of the split sums (split_pairs): the int16 pairs of `v` (two taps side by side)
 * times the pair's high parts `kh` added to `hi`, times its low parts `kl` to `lo`. */
static inline __attribute__((always_inline, target("avx2"))) void
madd_split(__m256i *hi, __m256i *lo, __m256i v, __m256i kh, __m256i kl) {
    *hi = _mm256_add_epi32(*hi, _mm256_madd_epi16(v, kh));
    *lo = _mm256_add_epi32(*lo, _mm256_madd_epi16(v, kl));
}

/* The split sums recombined, 2048 * hi + lo (exactly the 32-bit sum), rounded and shifted
 * as Pillow does: still to be clamped to 0..255. */
static inline __attribute__((always_inline, target("avx2"))) __m256i
split_result(__m256i hi, __m256i lo) {
    __m256i sum = _mm256_add_epi32(_mm256_slli_epi32(hi, 11), lo);
    return _mm256_srai_epi32(_mm256_add_epi32(sum, _mm256_set1_epi32(HALF)), PRECISION_BITS);
}

/* One output pixel `xx` of four rows (`l0` and the next three, `stride` bytes apart): its
 * four RGBX results, row by row, in one vector.  `channels` is a constant where inlined. */
static inline __attribute__((always_inline, target("avx2"))) __m128i
four_rows(const uint8_t *l0, size_t stride, const int channels, const filter_plan *h, int xx,
          int npairs, __m128i order) {
    const uint8_t *l1 = l0 + stride, *l2 = l1 + stride, *l3 = l2 + stride;
    size_t at = (size_t)h->bounds[xx * 2] * channels;
    int n = h->bounds[xx * 2 + 1];
    const int32_t *w = &h->pairs[(size_t)xx * npairs * 2];
    __m256i hi01 = _mm256_setzero_si256(), lo01 = _mm256_setzero_si256();
    __m256i hi23 = _mm256_setzero_si256(), lo23 = _mm256_setzero_si256();
    for (int x = 0; x < n; x += 2, w += 2) {
        int taps = n - x >= 2 ? 2 : 1;
        size_t off = at + (size_t)x * channels;
        __m128i a01 = _mm_set_epi64x((long long)two_taps(l1 + off, channels, taps),
                                     (long long)two_taps(l0 + off, channels, taps));
        __m128i a23 = _mm_set_epi64x((long long)two_taps(l3 + off, channels, taps),
                                     (long long)two_taps(l2 + off, channels, taps));
        __m256i v01 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(a01, order));
        __m256i v23 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(a23, order));
        __m256i kh = _mm256_set1_epi32(w[0]), kl = _mm256_set1_epi32(w[1]);
        madd_split(&hi01, &lo01, v01, kh, kl);
        madd_split(&hi23, &lo23, v23, kh, kl);
    }
    __m256i s01 = split_result(hi01, lo01), s23 = split_result(hi23, lo23);
    /* Lane 0: rows 0 and 2, lane 1: rows 1 and 3, as int16; then bytes clamped to 0..255. */
    __m256i b = _mm256_packus_epi16(_mm256_packs_epi32(s01, s23), _mm256_setzero_si256());
    /* Words 0 (row 0), 4 (row 1), 1 (row 2), 5 (row 3) to the low four. */
    b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0));
    return _mm256_castsi256_si128(b);
}

/* The same pass as horizontal_scalar, four rows at a time (they share each output pixel's
 * taps and weights; two rows to an AVX2 vector, one to a lane), two taps at a time by 16-bit
 * multiply-adds of the weights' split parts (split_pairs): the scalar pass's integer sums
 * exactly.  Four output pixels' results are turned from pixels to planes in registers and
 * stored four bytes at a time.  The last rows (fewer than four) go through the scalar
 * pass. */
static inline __attribute__((always_inline, target("avx2"))) void
horizontal_avx2_body(const uint8_t *src, size_t stride, const int channels, int rows, int ow,
                     const filter_plan *h, uint8_t *out, size_t plane, int flip) {
    const int npairs = (h->ksize + 1) / 2;
    /* Bytes r0 g0 b0 [x0] r1 g1 b1 [x1] of each lane's two pixels to r0 r1 g0 g1 b0 b1
       [x0 x1]: each channel's two taps side by side (-128: zero). */
    const __m128i order =
        channels == 4 ? _mm_setr_epi8(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15)
                      : _mm_setr_epi8(0, 3, 1, 4, 2, 5, -128, -128, 8, 11, 9, 12, 10, 13, -128,
                                      -128);
    /* Four RGBX pixels to their R, G, B bytes (in the planes' order: reversed if flip). */
    const __m128i planar =
        flip ? _mm_setr_epi8(12, 8, 4, 0, 13, 9, 5, 1, 14, 10, 6, 2, 15, 11, 7, 3)
             : _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    int r = 0;
    for (; r + 3 < rows; r += 4) {
        const uint8_t *l0 = src + (size_t)r * stride;
        uint8_t *o0 = out + (size_t)r * ow;
        int xx = 0;
        for (; xx + 3 < ow; xx += 4) {
            __m128i q0 = four_rows(l0, stride, channels, h, xx, npairs, order);
            __m128i q1 = four_rows(l0, stride, channels, h, xx + 1, npairs, order);
            __m128i q2 = four_rows(l0, stride, channels, h, xx + 2, npairs, order);
            __m128i q3 = four_rows(l0, stride, channels, h, xx + 3, npairs, order);
            /* Transposed: each row's four pixels, then its planes' four bytes each. */
            __m128i t0 = _mm_unpacklo_epi32(q0, q1), t1 = _mm_unpacklo_epi32(q2, q3);
            __m128i t2 = _mm_unpackhi_epi32(q0, q1), t3 = _mm_unpackhi_epi32(q2, q3);
            __m128i row[4] = {_mm_unpacklo_epi64(t0, t1), _mm_unpackhi_epi64(t0, t1),
                              _mm_unpacklo_epi64(t2, t3), _mm_unpackhi_epi64(t2, t3)};
            int d = flip ? ow - 4 - xx : xx;
            for (int i = 0; i < 4; i++) {
                __m128i p = _mm_shuffle_epi8(row[i], planar);
                uint8_t *o = o0 + (size_t)i * ow + d;
                uint32_t c0 = (uint32_t)_mm_cvtsi128_si32(p);
                uint32_t c1 = (uint32_t)_mm_extract_epi32(p, 1);
                uint32_t c2 = (uint32_t)_mm_extract_epi32(p, 2);
                memcpy(o, &c0, 4);
                memcpy(o + plane, &c1, 4);
                memcpy(o + 2 * plane, &c2, 4);
            }
        }
        for (; xx < ow; xx++) {
            __m128i q = four_rows(l0, stride, channels, h, xx, npairs, order);
            int d = flip ? ow - 1 - xx : xx;
            for (int i = 0; i < 4; i++) {
                uint32_t px = (uint32_t)_mm_cvtsi128_si32(q);
                q = _mm_srli_si128(q, 4);
                uint8_t *o = o0 + (size_t)i * ow;
                o[d] = (uint8_t)px;
                o[plane + d] = (uint8_t)(px >> 8);
                o[2 * plane + d] = (uint8_t)(px >> 16);
            }
        }
    }
    if (r < rows) {
        horizontal_scalar(src + (size_t)r * stride, stride, channels, rows - r, ow, h,
                          out + (size_t)r * ow, plane, flip);
    }
}

/* horizontal_avx2_body for 3- and 4-byte pixels, each compiled with its own constant. */
__attribute__((target("avx2"))) static void horizontal_avx2(const uint8_t *src, size_t stride,
                                                             int channels, int rows, int ow,
                                                             const filter_plan *h,
                                                             uint8_t *out, size_t plane,
                                                             int flip) {
    if (channels == 4) {
        horizontal_avx2_body(src, stride, 4, rows, ow, h, out, plane, flip);
    } else {
        horizontal_avx2_body(src, stride, 3, rows, ow, h, out, plane, flip);
    }
}
#endif

static void horizontal(const uint8_t *src, size_t stride, int channels, int rows, int ow,
                       const filter_plan *h, uint8_t *out, size_t plane, int flip, int simd) {
#if RESIZE_X86
    if (simd >= 2 && h->pairs != NULL) {
        horizontal_avx2(src, stride, channels, rows, ow, h, out, plane, flip);
        return;
    }
    if (simd >= 1 && channels == 4) {
        horizontal_sse41(src, stride, rows, ow, h, out, plane, flip);
        return;
    }
#endif
#if RESIZE_NEON
    if (simd >= 1) {
        horizontal_neon(src, stride, channels, rows, ow, h, out, plane, flip);
        return;
    }
#endif
    horizontal_scalar(src, stride, channels, rows, ow, h, out, plane, flip);
}

/* Vertical pass over `width` bytes of each row (a plane's, or interleaved pixels'): rows
 * `stride` bytes apart in, oh rows `out_stride` bytes apart out.  Plain loops over a row,
 * which the compiler vectorises (an AVX2 clone where the CPU has it); `acc` holds `width`
 * sums. */
VECTOR_CLONES static void vertical_plain(const uint8_t *src, size_t stride, size_t width,
                                         int oh, const filter_plan *v, int32_t *acc,
                                         uint8_t *out, size_t out_stride) {
    for (int yy = 0; yy < oh; yy++) {
        const int32_t *k = &v->coeffs[(size_t)yy * v->ksize];
        int ymin = v->bounds[yy * 2], n = v->bounds[yy * 2 + 1];
        for (size_t x = 0; x < width; x++) {
            acc[x] = HALF;
        }
        for (int y = 0; y < n; y++) {
            const uint8_t *row = src + (size_t)(ymin + y) * stride;
            int32_t ky = k[y];
            for (size_t x = 0; x < width; x++) {
                acc[x] += row[x] * ky;
            }
        }
        uint8_t *o = out + (size_t)yy * out_stride;
        for (size_t x = 0; x < width; x++) {
            int32_t s = acc[x] >> PRECISION_BITS;
            o[x] = (uint8_t)(s < 0 ? 0 : s > 255 ? 255 : s);
        }
    }
}

#if RESIZE_X86
/* The vertical pass for AVX2: 16 bytes of a row at a time, their sums in registers over
 * all the taps, two taps (two source rows) a 16-bit multiply-add of the weights' split
 * parts (split_pairs): the scalar sums exactly.  The last bytes of a row (fewer than 16) go
 * the plain way. */
__attribute__((target("avx2"))) static void vertical_avx2(const uint8_t *src, size_t stride,
                                                           size_t width, int oh,
                                                           const filter_plan *v, uint8_t *out,
                                                           size_t out_stride) {
    const int npairs = (v->ksize + 1) / 2;
    size_t vector_width = width & ~(size_t)15;
    for (int yy = 0; yy < oh; yy++) {
        int ymin = v->bounds[yy * 2], n = v->bounds[yy * 2 + 1];
        const int32_t *w0 = &v->pairs[(size_t)yy * npairs * 2];
        uint8_t *o = out + (size_t)yy * out_stride;
        for (size_t x = 0; x < vector_width; x += 16) {
            __m256i hi0 = _mm256_setzero_si256(), lo0 = _mm256_setzero_si256();
            __m256i hi1 = _mm256_setzero_si256(), lo1 = _mm256_setzero_si256();
            const int32_t *w = w0;
            for (int y = 0; y < n; y += 2, w += 2) {
                const uint8_t *ra = src + (size_t)(ymin + y) * stride + x;
                const uint8_t *rb = y + 1 < n ? ra + stride : ra; /* its weight is zero */
                __m128i a = _mm_loadu_si128((const __m128i *)ra);
                __m128i b = _mm_loadu_si128((const __m128i *)rb);
                /* Each byte's two taps side by side, as int16 pairs. */
                __m256i p0 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(a, b));
                __m256i p1 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(a, b));
                __m256i kh = _mm256_set1_epi32(w[0]), kl = _mm256_set1_epi32(w[1]);
                madd_split(&hi0, &lo0, p0, kh, kl);
                madd_split(&hi1, &lo1, p1, kh, kl);
            }
            __m256i s0 = split_result(hi0, lo0); /* bytes x .. x + 7 */
            __m256i s1 = split_result(hi1, lo1); /* bytes x + 8 .. x + 15 */
            /* int16 in lanes' order (0-3, 8-11 | 4-7, 12-15), put in order, then bytes. */
            __m256i t = _mm256_permute4x64_epi64(_mm256_packs_epi32(s0, s1), 0xD8);
            __m128i bytes =
                _mm_packus_epi16(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
            _mm_storeu_si128((__m128i *)(o + x), bytes);
        }
        const int32_t *k = &v->coeffs[(size_t)yy * v->ksize];
        for (size_t x = vector_width; x < width; x++) {
            int32_t sum = HALF;
            for (int y = 0; y < n; y++) {
                sum += src[(size_t)(ymin + y) * stride + x] * k[y];
            }
            o[x] = clip8(sum);
        }
    }
}
#endif

/* The vertical pass: vertical_avx2 where the kernels may be AVX2 (simd 2), else the plain
 * loops (the compiler's vectors). */
static void vertical(const uint8_t *src, size_t stride, size_t width, int oh,
                     const filter_plan *v, int32_t *acc, uint8_t *out, size_t out_stride,
                     int simd) {
#if RESIZE_X86
    if (simd >= 2 && v->pairs != NULL) {
        vertical_avx2(src, stride, width, oh, v, out, out_stride);
        return;
    }
#else
    (void)simd; /* the plain loops alone here */
#endif
    vertical_plain(src, stride, width, oh, v, acc, out, out_stride);
}

/* The best kernels this CPU runs: 2 (AVX2), 1 (SSE4.1 for 4-byte pixels; on AArch64, NEON)
 * or 0 (scalar). */
static int best_simd(void) {
#if RESIZE_X86
    if (__builtin_cpu_supports("avx2")) {
        return 2;
    }
    if (__builtin_cpu_supports("sse4.1")) {
        return 1;
    }
#endif
#if RESIZE_NEON
    return 1;
#endif
    return 0;
}

typedef struct {
    const uint8_t *src;
    int width, height, channels, ow, oh, flip, vertical_first, simd;
    float box[4];
    uint8_t *out;
} resize_job;

/* Without the GIL.  0 on a failed allocation. */
static int run_resize(const resize_job *job) {
    filter_plan h, v;
    if (!plan_filter(job->width, job->box[0], job->box[2], job->ow, &h)) {
        return 0;
    }
    if (!plan_filter(job->height, job->box[1], job->box[3], job->oh, &v)) {
        free_plan(&h);
        return 0;
    }
    if (job->simd >= 2 && !(split_pairs(&h, job->ow) && split_pairs(&v, job->oh))) {
        free_plan(&h);
        free_plan(&v);
        return 0;
    }
    int ch = job->channels, ow = job->ow, oh = job->oh;
    size_t stride = (size_t)job->width * ch, out_plane = (size_t)oh * ow;
    uint8_t *tmp = NULL;
    int32_t *acc = NULL;
    if (!job->vertical_first) {
        /* Horizontal pass over the rows the vertical pass reads, into planes; then the
           vertical pass, plane by plane. */
        int first = v.bounds[0];
        int rows = v.bounds[(oh - 1) * 2] + v.bounds[(oh - 1) * 2 + 1] - first;
        for (int yy = 0; yy < oh; yy++) {
            v.bounds[yy * 2] -= first;
        }
        size_t plane = (size_t)rows * ow;
        tmp = malloc(plane * 3 + 1);
        acc = malloc((size_t)ow * sizeof(int32_t));
        if (tmp != NULL && acc != NULL) {
            horizontal(job->src + first * stride, stride, ch, rows, ow, &h, tmp, plane,
                       job->flip, job->simd);
            for (int c = 0; c < 3; c++) {
                vertical(tmp + c * plane, (size_t)ow, (size_t)ow, oh, &v, acc,
                         job->out + c * out_plane, (size_t)ow, job->simd);
            }
        }
    } else {
        /* Pillow's order when the height shrinks much more than the width: the vertical
           pass first, over the columns the horizontal pass reads, pixels interleaved. */
        int left = h.bounds[0];
        int cols = h.bounds[(ow - 1) * 2] + h.bounds[(ow - 1) * 2 + 1] - left;
        for (int xx = 0; xx < ow; xx++) {
            h.bounds[xx * 2] -= left;
        }
        size_t width = (size_t)cols * ch;
        tmp = malloc(width * oh + 1);
        acc = malloc(width * sizeof(int32_t));
        if (tmp != NULL && acc != NULL) {
            vertical(job->src + (size_t)left * ch, stride, width, oh, &v, acc, tmp, width,
                     job->simd);
            horizontal(tmp, width, ch, oh, ow, &h, job->out, out_plane, job->flip, job->simd);
        }
    }
    int ok = tmp != NULL && acc != NULL;
    free(tmp);
    free(acc);
    free_plan(&h);
    free_plan(&v);
    return ok;
}

static PyObject *resize_into(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer src, out;
    resize_job job;
    memset(&job, 0, sizeof(job));
    job.simd = best_simd();
    if (!PyArg_ParseTuple(args, "y*iii(ffff)w*iipp|i", &src, &job.width, &job.height,
                          &job.channels, &job.box[0], &job.box[1], &job.box[2], &job.box[3],
                          &out, &job.ow, &job.oh, &job.flip, &job.vertical_first,
                          &job.simd)) {
        return NULL;
    }
    const char *error = NULL;
    if (job.channels != 3 && job.channels != 4) {
        error = "channels must be 3 or 4";
    } else if (job.width <= 0 || job.height <= 0 || job.ow <= 0 || job.oh <= 0) {
        error = "sizes must be positive";
    } else if (src.len < (Py_ssize_t)job.width * job.height * job.channels) {
        error = "the source is smaller than width * height * channels";
    } else if (out.len != (Py_ssize_t)job.ow * job.oh * 3 || !PyBuffer_IsContiguous(&out, 'C')) {
        error = "out must be 3 * out_height * out_width contiguous bytes";
    } else if (!(job.box[0] >= 0 && job.box[1] >= 0 && job.box[2] <= job.width &&
                 job.box[3] <= job.height && job.box[2] - job.box[0] >= 0 &&
                 job.box[3] - job.box[1] >= 0)) { /* Pillow's checks, and no NaN */
        error = "the box must lie within the image, right of and below its corner";
    }
    if (job.simd < 0 || job.simd > best_simd()) {
        error = "simd must be 0 (scalar) up to this CPU's SIMD";
    }
    int ok = 1;
    if (error == NULL) {
        job.src = (const uint8_t *)src.buf;
        job.out = (uint8_t *)out.buf;
        Py_BEGIN_ALLOW_THREADS
        ok = run_resize(&job);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    if (error != NULL) {
        PyErr_SetString(PyExc_ValueError, error);
        return NULL;
    }
    if (!ok) {
        return PyErr_NoMemory();
    }
    Py_RETURN_NONE;
}

static PyMethodDef resize_methods[] = {
    {"resize_into", resize_into, METH_VARARGS,
     "resize_into(src, width, height, channels, box, out, out_width, out_height, flip, "
     "vertical_first[, simd]) -> None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef resize_module = {
    PyModuleDef_HEAD_INIT,
    "_resize",
    "Pillow's BILINEAR box resize, bit for bit, into a CHW sample (see the C source).",
    -1,
    resize_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__resize(void) {
    PyObject *module = PyModule_Create(&resize_module);
    if (module != NULL && PyModule_AddIntConstant(module, "SIMD", best_simd()) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
