/* Region-of-interest JPEG decoding over libjpeg-turbo's libjpeg API.
 *
 * decode(data, scale, x0, y0, x1, y1) decodes, at 1/scale (1, 2, 4 or 8: libjpeg's DCT
 * scaling), only the rows y0..y1 and (at least) the columns x0..x1 of the scaled image:
 * rows above the region are skipped (entropy-decoded, not transformed: jpeg_skip_scanlines),
 * rows below it are never read (the decompression is aborted), and columns are cropped to
 * the iMCU columns that hold the region (jpeg_crop_scanline).  The pixels are libjpeg's own
 * (ISLOW IDCT, fancy upsampling, YCbCr or grayscale to RGB), the same as a full decode at
 * the same scale.
 *
 * Returns (canvas, left, top, width, height, canvas_width, canvas_height): the scaled image's
 * size in RGBX pixels (Pillow's layout), of which only the region actually decoded is
 * written (its left edge aligned down to an iMCU column), or None for what the caller should decode
 * another way (CMYK/YCCK, any libjpeg warning such as extraneous bytes).  Raises ValueError
 * for data libjpeg cannot decode.  The GIL is released while libjpeg works.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>

#ifndef LIBJPEG_TURBO_VERSION_NUMBER
#error "libjpeg-turbo's headers are needed (jpeg_crop_scanline, jpeg_skip_scanlines)"
#endif

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    int warned;
    char message[JMSG_LENGTH_MAX];
} roi_error;

static void roi_error_exit(j_common_ptr cinfo) {
    roi_error *err = (roi_error *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void roi_emit_message(j_common_ptr cinfo, int level) {
    roi_error *err = (roi_error *)cinfo->err;
    if (level < 0 && !err->warned) { /* a warning: corrupt data libjpeg would paper over */
        err->warned = 1;
        (*cinfo->err->format_message)(cinfo, err->message);
    }
}

typedef struct {
    struct jpeg_decompress_struct cinfo;
    roi_error err;
    const unsigned char *data;
    unsigned long len;
    int scale, x0, y0, x1, y1;
    JDIMENSION left, top, width, height;
    JDIMENSION full_w, full_h; /* the scaled image (jpeg_crop_scanline narrows output_width) */
    int unsupported, bad_region;
} roi_job;

/* The header of data; whether its colour space is one this module handles (YCbCr, RGB,
   grayscale; not CMYK/YCCK).  Errors jump to the caller's setjmp. */
static int read_header(j_decompress_ptr cinfo, const unsigned char *data, unsigned long len) {
    jpeg_mem_src(cinfo, data, len);
    jpeg_read_header(cinfo, TRUE);
    return cinfo->jpeg_color_space == JCS_YCbCr || cinfo->jpeg_color_space == JCS_GRAYSCALE ||
           cinfo->jpeg_color_space == JCS_RGB;
}

/* Phase 1, without the GIL: the header, the scale, the region's columns.  0: failed. */
static int roi_start(roi_job *job) {
    struct jpeg_decompress_struct *cinfo = &job->cinfo;
    if (setjmp(job->err.jump)) {
        return 0;
    }
    if (!read_header(cinfo, job->data, job->len)) {
        job->unsupported = 1;
        return 1;
    }
    cinfo->out_color_space = JCS_EXT_RGBX; /* Pillow's own pixel layout: no conversion */
    cinfo->scale_num = 1;
    cinfo->scale_denom = (unsigned int)job->scale;
    jpeg_start_decompress(cinfo);
    if (job->x0 < 0 || job->y0 < 0 || job->x1 <= job->x0 || job->y1 <= job->y0 ||
        (JDIMENSION)job->x1 > cinfo->output_width || (JDIMENSION)job->y1 > cinfo->output_height) {
        job->bad_region = 1;
        return 1;
    }
    /* One iMCU column more on each side: fancy upsampling makes a cropped edge's columns
       from their own samples only, so the region's own columns stay as a full decode's. */
#if JPEG_LIB_VERSION >= 70
    int margin = cinfo->max_h_samp_factor * cinfo->min_DCT_h_scaled_size;
#else
    int margin = cinfo->max_h_samp_factor * cinfo->min_DCT_scaled_size;
#endif
    int x0 = job->x0 > margin ? job->x0 - margin : 0;
    int x1 = job->x1 + margin < (int)cinfo->output_width ? job->x1 + margin
                                                         : (int)cinfo->output_width;
    job->full_w = cinfo->output_width;
    job->full_h = cinfo->output_height;
    job->left = (JDIMENSION)x0;
    job->width = (JDIMENSION)(x1 - x0);
    job->top = (JDIMENSION)job->y0;
    job->height = (JDIMENSION)(job->y1 - job->y0);
    if (job->left > 0 || job->width < cinfo->output_width) {
        jpeg_crop_scanline(cinfo, &job->left, &job->width); /* left aligned down, width up */
    }
    return 1;
}

/* Phase 2, without the GIL: skip the rows above, read the region's rows.  0: failed. */
static int roi_read(roi_job *job, unsigned char *pixels) {
    struct jpeg_decompress_struct *cinfo = &job->cinfo;
    if (setjmp(job->err.jump)) {
        return 0;
    }
    /* Skip whole iMCU rows only, and one fewer than fits above the region: fancy upsampling
       needs the rows beside the first one read, and the rows between are read and dropped,
       so every row of the region is what a full decode gives. */
#if JPEG_LIB_VERSION >= 70
    JDIMENSION imcu = (JDIMENSION)(cinfo->max_v_samp_factor * cinfo->min_DCT_v_scaled_size);
#else
    JDIMENSION imcu = (JDIMENSION)(cinfo->max_v_samp_factor * cinfo->min_DCT_scaled_size);
#endif
    JDIMENSION skip = job->top / imcu;
    skip = skip > 0 ? (skip - 1) * imcu : 0;
    if (skip > 0) {
        jpeg_skip_scanlines(cinfo, skip);
    }
    /* Rows go to their place in the canvas (the scaled image, 4 bytes a pixel), from the
       region's left edge; a dropped row goes where the region's first row will. */
    size_t stride = (size_t)job->full_w * 4;
    unsigned char *base = pixels + (size_t)job->left * 4;
    while (cinfo->output_scanline < job->top) {
        JSAMPROW row = base + job->top * stride;
        jpeg_read_scanlines(cinfo, &row, 1);
    }
    JSAMPROW rows[16];
    while (cinfo->output_scanline < job->top + job->height) {
        JDIMENSION first = cinfo->output_scanline;
        JDIMENSION n = job->top + job->height - first < 16 ? job->top + job->height - first : 16;
        for (JDIMENSION i = 0; i < n; i++) {
            rows[i] = base + (first + i) * stride;
        }
        jpeg_read_scanlines(cinfo, rows, n);
    }
    return 1;
}

static PyObject *roi_decode(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer data;
    roi_job job;
    memset(&job, 0, sizeof(job));
    if (!PyArg_ParseTuple(args, "y*iiiii", &data, &job.scale, &job.x0, &job.y0, &job.x1,
                          &job.y1)) {
        return NULL;
    }
    if (job.scale != 1 && job.scale != 2 && job.scale != 4 && job.scale != 8) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "scale must be 1, 2, 4 or 8");
        return NULL;
    }
    job.data = (const unsigned char *)data.buf;
    job.len = (unsigned long)data.len;
    job.cinfo.err = jpeg_std_error(&job.err.pub);
    job.err.pub.error_exit = roi_error_exit;
    job.err.pub.emit_message = roi_emit_message;
    jpeg_create_decompress(&job.cinfo);

    PyObject *out = NULL;
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = roi_start(&job);
    Py_END_ALLOW_THREADS
    if (ok && !job.unsupported && !job.bad_region && !job.err.warned) {
        /* Not initialised: only the region's rows are written (and read by the caller). */
        out = PyByteArray_FromStringAndSize(
            NULL, (Py_ssize_t)job.full_w * job.full_h * 4);
        if (out == NULL) {
            jpeg_destroy_decompress(&job.cinfo);
            PyBuffer_Release(&data);
            return NULL;
        }
        unsigned char *pixels = (unsigned char *)PyByteArray_AS_STRING(out);
        Py_BEGIN_ALLOW_THREADS
        ok = roi_read(&job, pixels);
        Py_END_ALLOW_THREADS
    }
    JDIMENSION out_w = job.cinfo.output_width, out_h = job.cinfo.output_height;
    jpeg_destroy_decompress(&job.cinfo); /* also ends a decompression stopped early */
    PyBuffer_Release(&data);
    if (!ok) {
        Py_XDECREF(out);
        PyErr_Format(PyExc_ValueError, "%s", job.err.message);
        return NULL;
    }
    if (job.bad_region) {
        PyErr_Format(PyExc_ValueError, "region %d,%d-%d,%d is outside the %ux%u image", job.x0,
                     job.y0, job.x1, job.y1, out_w, out_h);
        return NULL;
    }
    if (job.unsupported || job.err.warned) {
        Py_XDECREF(out);
        Py_RETURN_NONE;
    }
    return Py_BuildValue(
        "(NIIIIII)", out, job.left, job.top, job.width, job.height, job.full_w, job.full_h);
}

/* scaled(data, scales, max_pixels) -> one copy per scale, or None where there is none.
 *
 * A JPEG decoded at 1/2, 1/4 or 1/8 scale reads only some of each block's DCT coefficients:
 * libjpeg's reduced inverse DCTs (jidctred.c, and their SIMD twins) produce a 4x4 block from
 * every coefficient but row and column 4, a 2x2 block from rows and columns 0, 1, 3, 5, 7,
 * and a 1x1 block from the DC coefficient alone.  Which of these a component gets at a
 * given scale depends on its sampling (chroma is often scaled by the IDCT rather than
 * upsampled).  The copy for 1/s is the same image with every coefficient that libjpeg at
 * 1/s never reads set to zero, entropy-coded again (baseline, optimal Huffman tables): a
 * decode of the copy at 1/s gives the original's pixels at 1/s exactly, from much less
 * data.  The coefficients are read once for all the scales asked for.
 *
 * None for a scale where the copy would not be smaller, and for every scale where the
 * image is not YCbCr, RGB or grayscale, has more than max_pixels pixels (checked from the
 * header, before any coefficient is read: a decompression bomb), or libjpeg warns.  Raises
 * ValueError for data libjpeg cannot read.  The GIL is released while libjpeg works.
 */
#define SCALED_MAX 4

typedef struct {
    struct jpeg_decompress_struct src;
    struct jpeg_compress_struct dst;
    roi_error err; /* one error manager for both: errors jump to the same place */
    const unsigned char *data;
    unsigned long len;
    int count, scales[SCALED_MAX];
    unsigned long long max_pixels;
    int unsupported;
    unsigned char *out[SCALED_MAX];
    unsigned long out_len[SCALED_MAX];
} scaled_job;

/* Which rows/columns of a block libjpeg's IDCT reads at a scaled block size of n. */
static int scaled_keeps(int n, int k) {
    switch (n) {
    case 1:
        return k == 0;
    case 2:
        return k == 0 || k == 1 || k == 3 || k == 5 || k == 7;
    case 4:
        return k != 4;
    default:
        return 1;
    }
}

static int scaled_run(scaled_job *job) {
    struct jpeg_decompress_struct *src = &job->src;
    struct jpeg_compress_struct *dst = &job->dst;
    if (setjmp(job->err.jump)) {
        return 0;
    }
    if (!read_header(src, job->data, job->len) ||
        (unsigned long long)src->image_width * src->image_height > job->max_pixels) {
        job->unsupported = 1;
        return 1;
    }
    /* Each component's scaled block size (rows, columns) at each scale, as the decoder
       will choose it.  libjpeg's version 7 API (libjpeg-turbo built for the jpeg8 ABI, as
       Ubuntu ships it) names the two sizes; version 6b's has one for both. */
    int rows[SCALED_MAX][MAX_COMPONENTS], cols[SCALED_MAX][MAX_COMPONENTS];
    for (int i = 0; i < job->count; i++) {
        src->scale_num = 1;
        src->scale_denom = (unsigned int)job->scales[i];
        jpeg_calc_output_dimensions(src);
        for (int ci = 0; ci < src->num_components; ci++) {
#if JPEG_LIB_VERSION >= 70
            rows[i][ci] = src->comp_info[ci].DCT_v_scaled_size;
            cols[i][ci] = src->comp_info[ci].DCT_h_scaled_size;
#else
            rows[i][ci] = cols[i][ci] = src->comp_info[ci].DCT_scaled_size;
#endif
        }
    }
    /* Back to full size: the entropy decoder keeps no AC coefficients of a component whose
       scaled block size is 1, and every copy needs them all to start from. */
    src->scale_denom = 1;
    jpeg_calc_output_dimensions(src);
    jvirt_barray_ptr *coefs = jpeg_read_coefficients(src);
    if (job->err.warned) {
        return 1;
    }
    /* Largest scale first: what 1/8 keeps, 1/4 keeps too, so zeroing only ever adds. */
    for (int i = 0; i < job->count; i++) {
        for (int ci = 0; ci < src->num_components; ci++) {
            jpeg_component_info *comp = &src->comp_info[ci];
            int nr = rows[i][ci], nc = cols[i][ci];
            if (nr >= DCTSIZE && nc >= DCTSIZE) {
                continue;
            }
            JCOEF keep[DCTSIZE2]; /* natural order: row * 8 + column; all ones or zero */
            for (int k = 0; k < DCTSIZE2; k++) {
                keep[k] = scaled_keeps(nr, k / DCTSIZE) && scaled_keeps(nc, k % DCTSIZE) ? -1 : 0;
            }
            for (JDIMENSION row = 0; row < comp->height_in_blocks; row++) {
                JBLOCKARRAY blocks = (*src->mem->access_virt_barray)(
                    (j_common_ptr)src, coefs[ci], row, 1, TRUE);
                for (JDIMENSION col = 0; col < comp->width_in_blocks; col++) {
                    JCOEF *block = blocks[0][col];
                    for (int k = 0; k < DCTSIZE2; k++) { /* vectorised by the compiler */
                        block[k] &= keep[k];
                    }
                }
            }
        }
        jpeg_mem_dest(dst, &job->out[i], &job->out_len[i]);
        jpeg_copy_critical_parameters(src, dst);
        dst->optimize_coding = TRUE;
        jpeg_write_coefficients(dst, coefs);
        jpeg_finish_compress(dst);
    }
    return 1;
}

static int scaled_order(const void *a, const void *b) {
    return *(const int *)a - *(const int *)b;
}

static PyObject *roi_scaled(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer data;
    PyObject *wanted;
    scaled_job job;
    memset(&job, 0, sizeof(job));
    if (!PyArg_ParseTuple(args, "y*OK", &data, &wanted, &job.max_pixels)) {
        return NULL;
    }
    PyObject *seq = PySequence_Fast(wanted, "scales must be a sequence of 2, 4 or 8");
    if (seq == NULL) {
        PyBuffer_Release(&data);
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    int asked[SCALED_MAX];
    for (Py_ssize_t i = 0; i < count; i++) {
        long s = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        int seen = 0;
        for (Py_ssize_t j = 0; j < i; j++) {
            seen |= asked[j] == s;
        }
        if ((s != 2 && s != 4 && s != 8) || seen || i >= 3) {
            Py_DECREF(seq);
            PyBuffer_Release(&data);
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError, "scales must be distinct, each 2, 4 or 8");
            }
            return NULL;
        }
        asked[i] = (int)s;
    }
    Py_DECREF(seq);
    job.count = (int)count;
    memcpy(job.scales, asked, sizeof(int) * (size_t)count);
    qsort(job.scales, (size_t)job.count, sizeof(int), scaled_order);
    job.data = (const unsigned char *)data.buf;
    job.len = (unsigned long)data.len;
    job.src.err = jpeg_std_error(&job.err.pub);
    job.err.pub.error_exit = roi_error_exit;
    job.err.pub.emit_message = roi_emit_message;
    job.dst.err = &job.err.pub;
    jpeg_create_decompress(&job.src);
    jpeg_create_compress(&job.dst);
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = scaled_run(&job);
    jpeg_destroy_compress(&job.dst);
    jpeg_destroy_decompress(&job.src);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyObject *result = NULL;
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "%s", job.err.message);
    } else {
        result = PyTuple_New(count);
        for (Py_ssize_t i = 0; result != NULL && i < count; i++) {
            int at = 0;
            while (job.scales[at] != asked[i]) {
                at++;
            }
            PyObject *item;
            if (job.unsupported || job.err.warned || job.out[at] == NULL ||
                job.out_len[at] >= (unsigned long)job.len) {
                item = Py_NewRef(Py_None);
            } else {
                item = PyBytes_FromStringAndSize((const char *)job.out[at],
                                                 (Py_ssize_t)job.out_len[at]);
            }
            if (item == NULL) {
                Py_CLEAR(result);
                break;
            }
            PyTuple_SET_ITEM(result, i, item);
        }
    }
    for (int i = 0; i < SCALED_MAX; i++) {
        free(job.out[i]);
    }
    return result;
}

static PyMethodDef roi_methods[] = {
    {"decode", roi_decode, METH_VARARGS,
     "decode(data, scale, x0, y0, x1, y1) -> (canvas, left, top, width, height, cw, ch) | None"},
    {"scaled", roi_scaled, METH_VARARGS,
     "scaled(data, scales, max_pixels) -> tuple of bytes | None: copies exact at 1/scale"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef roi_module = {
    PyModuleDef_HEAD_INIT,
    "_jpegroi",
    "Region-of-interest JPEG decoding over libjpeg-turbo (see the C source).",
    -1,
    roi_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__jpegroi(void) {
    PyObject *m = PyModule_Create(&roi_module);
    if (m != NULL) {
        PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION_NUMBER", LIBJPEG_TURBO_VERSION_NUMBER);
    }
    return m;
}
