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
 * order, so the vector kernels (SSE4.1 for the horizontal pass, the compiler's AVX2 code
 * for the vertical one, chosen at run time) give exactly the scalar result: Pillow's
 * pixels.  What is faster: no image objects, no 4th channel after the horizontal pass, the
 * flip and the HWC -> CHW copy folded into the passes, vector instructions where Pillow's
 * portable build has none.  The GIL is released while it works.  `simd=0` forces the
 * scalar kernels (tests compare both with Pillow).
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

#define PRECISION_BITS (32 - 8 - 2)
#define HALF (1 << (PRECISION_BITS - 1))

typedef struct {
    int ksize;       /* coefficients per output pixel (some are zero) */
    int *bounds;     /* per output pixel: first input pixel, input pixel count */
    int32_t *coeffs; /* per output pixel: ksize fixed-point weights */
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
    return 1;
}

static void free_plan(filter_plan *plan) {
    free(plan->bounds);
    free(plan->coeffs);
}

static inline uint8_t clip8(int32_t v) {
    v >>= PRECISION_BITS;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* Horizontal pass: `rows` rows of interleaved pixels (`channels` bytes each, `stride` bytes
 * a row) into three planes of rows x ow bytes, `plane` bytes apart, each output column
 * mirrored when flip. */
static void horizontal_scalar(const uint8_t *src, size_t stride, int channels, int rows, int ow,
                              const filter_plan *h, uint8_t *out, size_t plane, int flip) {
    for (int r = 0; r < rows; r++) {
        const uint8_t *line = src + (size_t)r * stride;
        uint8_t *o = out + (size_t)r * ow;
        for (int xx = 0; xx < ow; xx++) {
            const uint8_t *p = line + (size_t)h->bounds[xx * 2] * channels;
            int n = h->bounds[xx * 2 + 1];
            const int32_t *k = &h->coeffs[(size_t)xx * h->ksize];
            int32_t s0 = HALF, s1 = HALF, s2 = HALF;
            for (int x = 0; x < n; x++, p += channels) {
                s0 += p[0] * k[x];
                s1 += p[1] * k[x];
                s2 += p[2] * k[x];
            }
            int d = flip ? ow - 1 - xx : xx;
            o[d] = clip8(s0);
            o[plane + d] = clip8(s1);
            o[2 * plane + d] = clip8(s2);
        }
    }
}

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
#endif

static void horizontal(const uint8_t *src, size_t stride, int channels, int rows, int ow,
                       const filter_plan *h, uint8_t *out, size_t plane, int flip, int simd) {
#if RESIZE_X86
    if (simd && channels == 4 && __builtin_cpu_supports("sse4.1")) {
        horizontal_sse41(src, stride, rows, ow, h, out, plane, flip);
        return;
    }
#endif
    horizontal_scalar(src, stride, channels, rows, ow, h, out, plane, flip);
}

/* Vertical pass over `width` bytes of each row (a plane's, or interleaved pixels'): rows
 * `stride` bytes apart in, oh rows `out_stride` bytes apart out.  Plain loops over a row,
 * which the compiler vectorises (an AVX2 clone where the CPU has it); `acc` holds `width`
 * sums. */
VECTOR_CLONES static void vertical(const uint8_t *src, size_t stride, size_t width, int oh,
                                   const filter_plan *v, int32_t *acc, uint8_t *out,
                                   size_t out_stride) {
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
                         job->out + c * out_plane, (size_t)ow);
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
            vertical(job->src + (size_t)left * ch, stride, width, oh, &v, acc, tmp, width);
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
    job.simd = 1;
    if (!PyArg_ParseTuple(args, "y*iii(ffff)w*iipp|p", &src, &job.width, &job.height,
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

PyMODINIT_FUNC PyInit__resize(void) { return PyModule_Create(&resize_module); }
