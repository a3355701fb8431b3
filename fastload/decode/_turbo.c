/* fastload.decode._turbo: decode only the part of a JPEG a crop needs, then resample it.
 *
 * decode_crop_into(data, box, out, flip) decodes the JPEG in `data` with libjpeg-turbo at the
 * smallest DCT scale (1/8, 1/4, 1/2, 1) that still gives the crop `box` (x0, y0, x1, y1 in source pixels)
 * at least the output's resolution, skipping the scanlines above and below the crop and the
 * columns beside it (jpeg_skip_scanlines, jpeg_crop_scanline), then resamples it into `out`, a
 * writable C-contiguous uint8 buffer of shape (3, H, W), with an antialiased bilinear (triangle)
 * filter computed like Pillow's, mirrored when `flip`. The GIL is released while it works.
 * Corrupt-data warnings are errors, as in simplejpeg's strict mode.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
    int failed;
} ErrorManager;

static void error_exit(j_common_ptr cinfo) {
    ErrorManager *err = (ErrorManager *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void emit_message(j_common_ptr cinfo, int level) {
    ErrorManager *err = (ErrorManager *)cinfo->err;
    if (level < 0) { /* a corrupt-data warning: treat it as an error */
        (*cinfo->err->format_message)(cinfo, err->message);
        longjmp(err->jump, 1);
    }
}

/* Resampling weights along one axis, as Pillow's precompute_coeffs with the bilinear filter. */
typedef struct {
    int *start;   /* first input index of each output */
    int *count;   /* number of inputs of each output */
    float *weight; /* out_size x taps */
    int taps;     /* stride of `weight` */
    int used;     /* the most non-zero taps any output has */
} Weights;

static float triangle(float x) {
    if (x < 0) x = -x;
    return x < 1.0f ? 1.0f - x : 0.0f;
}

static int make_weights(double in0, double in1, int in_size, int out_size, Weights *w) {
    double scale = (in1 - in0) / out_size;
    double filterscale = scale < 1.0 ? 1.0 : scale;
    double support = filterscale;
    int taps = (int)ceil(support) * 2 + 1;
    w->taps = taps;
    w->used = 1;
    w->start = malloc(sizeof(int) * out_size);
    w->count = malloc(sizeof(int) * out_size);
    w->weight = calloc((size_t)out_size * taps, sizeof(float));
    if (!w->start || !w->count || !w->weight) return -1;
    for (int xx = 0; xx < out_size; xx++) {
        double center = in0 + (xx + 0.5) * scale;
        int xmin = (int)(center - support + 0.5);
        int xmax = (int)(center + support + 0.5);
        if (xmin < 0) xmin = 0;
        if (xmax > in_size) xmax = in_size;
        int n = xmax - xmin;
        if (n > taps) n = taps;
        if (n < 1) { /* degenerate box: take the nearest pixel */
            xmin = (int)center;
            if (xmin >= in_size) xmin = in_size - 1;
            if (xmin < 0) xmin = 0;
            n = 1;
            w->weight[(size_t)xx * taps] = 1.0f;
        } else {
            float total = 0;
            float *k = w->weight + (size_t)xx * taps;
            for (int x = 0; x < n; x++) {
                k[x] = triangle((float)((x + xmin - center + 0.5) / filterscale));
                total += k[x];
            }
            if (total > 0)
                for (int x = 0; x < n; x++) k[x] /= total;
            /* drop zero weights at both ends: a scale just above 1 then needs 3 taps, not 5 */
            int lead = 0;
            while (lead < n - 1 && k[lead] == 0) lead++;
            while (n - 1 > lead && k[n - 1] == 0) n--;
            if (lead) {
                memmove(k, k + lead, sizeof(float) * (n - lead));
                memset(k + n - lead, 0, sizeof(float) * lead);
                xmin += lead;
                n -= lead;
            }
        }
        w->start[xx] = xmin;
        w->count[xx] = n;
        if (n > w->used) w->used = n;
    }
    return 0;
}

static void free_weights(Weights *w) {
    free(w->start);
    free(w->count);
    free(w->weight);
}

static inline unsigned char clamp_u8(float v) {
    v += 0.5f;
    if (v <= 0) return 0;
    if (v >= 255) return 255;
    return (unsigned char)v;
}

/* One output row of the horizontal pass with K taps (outputs with fewer non-zero weights have
 * zeros after them, so the loop has no data-dependent bounds). With SSE one 4-lane multiply-add handles the R, G
 * and B of a tap at once (the 4th lane reads the next pixel and is discarded). */
static inline void horizontal_row(const float *line, const Weights *wx, int K, int out_w, int flip,
                                  unsigned char *r, unsigned char *g, unsigned char *b) {
    for (int x = 0; x < out_w; x++) {
        const float *kx = wx->weight + (size_t)x * wx->taps;
        const float *p = line + (size_t)wx->start[x] * 3;
        int ox = flip ? out_w - 1 - x : x;
#if defined(__SSE__)
        __m128 acc = _mm_mul_ps(_mm_set1_ps(kx[0]), _mm_loadu_ps(p));
        for (int t = 1; t < K; t++) acc = _mm_add_ps(acc, _mm_mul_ps(_mm_set1_ps(kx[t]), _mm_loadu_ps(p + 3 * t)));
        float lanes[4];
        _mm_storeu_ps(lanes, acc);
        r[ox] = clamp_u8(lanes[0]);
        g[ox] = clamp_u8(lanes[1]);
        b[ox] = clamp_u8(lanes[2]);
#else
        float sr = 0, sg = 0, sb = 0;
        for (int t = 0; t < K; t++) {
            sr += kx[t] * p[3 * t];
            sg += kx[t] * p[3 * t + 1];
            sb += kx[t] * p[3 * t + 2];
        }
        r[ox] = clamp_u8(sr);
        g[ox] = clamp_u8(sg);
        b[ox] = clamp_u8(sb);
#endif
    }
}

/* Vertical pass into one float row (a vectorisable AXPY over the whole row), then the horizontal
 * pass writing planar CHW output. `region` is rows x width x 3 (interleaved RGB). */
static int resample(const unsigned char *region, int rows, int width, double bx0, double by0, double bx1,
                    double by1, unsigned char *out, int out_h, int out_w, int flip) {
    Weights wy = {0}, wx = {0};
    float *line = NULL;
    int status = -1;
    if (make_weights(by0, by1, rows, out_h, &wy) || make_weights(bx0, bx1, width, out_w, &wx)) goto done;
    size_t row_len = (size_t)width * 3;
    /* padded with zeros so a fixed-tap read past the last pixel stays in bounds */
    line = calloc(row_len + (size_t)wx.taps * 3 + 1, sizeof(float));
    if (!line) goto done;
    size_t plane = (size_t)out_h * out_w;
    for (int y = 0; y < out_h; y++) {
        const float *ky = wy.weight + (size_t)y * wy.taps;
        const unsigned char *src = region + (size_t)wy.start[y] * row_len;
        for (size_t i = 0; i < row_len; i++) line[i] = ky[0] * src[i];
        for (int t = 1; t < wy.count[y]; t++) {
            const unsigned char *s = src + (size_t)t * row_len;
            const float kt = ky[t];
            for (size_t i = 0; i < row_len; i++) line[i] += kt * s[i];
        }
        unsigned char *r = out + (size_t)y * out_w, *g = r + plane, *b = g + plane;
        switch (wx.used) { /* constant tap counts let the compiler unroll the inner loop */
            case 2: horizontal_row(line, &wx, 2, out_w, flip, r, g, b); break;
            case 3: horizontal_row(line, &wx, 3, out_w, flip, r, g, b); break;
            case 4: horizontal_row(line, &wx, 4, out_w, flip, r, g, b); break;
            default: horizontal_row(line, &wx, wx.used, out_w, flip, r, g, b);
        }
    }
    status = 0;
done:
    free(line);
    free_weights(&wy);
    free_weights(&wx);
    return status;
}

/* Returns 0 on success; on failure fills `message`. */
static int decode_crop(const unsigned char *data, size_t size, double x0, double y0, double x1, double y1,
                       unsigned char *out, int out_h, int out_w, int flip, char *message, int *scale_used) {
    struct jpeg_decompress_struct cinfo;
    ErrorManager err;
    unsigned char *volatile region = NULL;
    int status = -1;

    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = error_exit;
    err.pub.emit_message = emit_message;
    if (setjmp(err.jump)) {
        strncpy(message, err.message, JMSG_LENGTH_MAX - 1);
        message[JMSG_LENGTH_MAX - 1] = 0;
        jpeg_destroy_decompress(&cinfo);
        free(region);
        return -1;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, data, (unsigned long)size);
    jpeg_read_header(&cinfo, TRUE);
    if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
        strcpy(message, "CMYK JPEG: not handled here");
        jpeg_destroy_decompress(&cinfo);
        return -2; /* the caller falls back to another decoder */
    }
    const int width = (int)cinfo.image_width, height = (int)cinfo.image_height;
    if (x0 < 0) x0 = 0;
    if (y0 < 0) y0 = 0;
    if (x1 > width) x1 = width;
    if (y1 > height) y1 = height;
    if (x1 <= x0 || y1 <= y0) {
        strcpy(message, "empty crop box");
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    /* smallest scale of 1/8, 1/4, 1/2 or 1 keeping the crop at least as large as the output in both
     * directions. Only powers of two: libjpeg-turbo's IDCTs for 3/8, 5/8, 6/8, 7/8 have no SIMD, and
     * measured per image (train(224), real photos, one thread) any-M/8 cost 1.0-1.18 ms against
     * 0.88-0.92 ms for powers of two, although those decode more pixels. */
    double need = fmax(out_h / (y1 - y0), out_w / (x1 - x0));
    int m = 1;
    while (m < 8 && m < need * 8 - 1e-9) m *= 2;
    cinfo.scale_num = (unsigned int)m;
    cinfo.scale_denom = 8;
    cinfo.out_color_space = JCS_RGB;
    cinfo.dct_method = JDCT_ISLOW;
    jpeg_start_decompress(&cinfo);
    const int sw = (int)cinfo.output_width, sh = (int)cinfo.output_height;
    const double sx = (double)sw / width, sy = (double)sh / height;
    double bx0 = x0 * sx, bx1 = x1 * sx, by0 = y0 * sy, by1 = y1 * sy;
    /* the resampling filter reaches up to `support` pixels beyond the box: decode those too */
    double support_x = fmax((bx1 - bx0) / out_w, 1.0) + 1, support_y = fmax((by1 - by0) / out_h, 1.0) + 1;
    int rx0 = (int)floor(bx0 - support_x), rx1 = (int)ceil(bx1 + support_x);
    int ry0 = (int)floor(by0 - support_y), ry1 = (int)ceil(by1 + support_y);
    if (rx0 < 0) rx0 = 0;
    if (ry0 < 0) ry0 = 0;
    if (rx1 > sw) rx1 = sw;
    if (ry1 > sh) ry1 = sh;
    JDIMENSION xoff = (JDIMENSION)rx0, xwidth = (JDIMENSION)(rx1 - rx0);
    if (xoff > 0 || xwidth < (JDIMENSION)sw) jpeg_crop_scanline(&cinfo, &xoff, &xwidth);
    const int rows = ry1 - ry0;
    const size_t stride = (size_t)cinfo.output_width * 3; /* after cropping: xwidth pixels */
    region = malloc(stride * rows);
    if (!region) {
        strcpy(message, "out of memory");
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    if (ry0 > 0) jpeg_skip_scanlines(&cinfo, (JDIMENSION)ry0);
    while ((int)cinfo.output_scanline < ry1) {
        JSAMPROW row = region + stride * (cinfo.output_scanline - ry0);
        jpeg_read_scanlines(&cinfo, &row, 1);
    }
    jpeg_abort_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    status = resample(region, rows, (int)xwidth, bx0 - xoff, by0 - ry0, bx1 - xoff, by1 - ry0, out, out_h, out_w, flip);
    if (status) strcpy(message, "out of memory");
    *scale_used = m;
    free(region);
    return status;
}

static PyObject *py_decode_crop_into(PyObject *self, PyObject *args) {
    Py_buffer data, out;
    double x0, y0, x1, y1;
    int out_h, out_w, flip;
    if (!PyArg_ParseTuple(args, "y*(dddd)w*iip", &data, &x0, &y0, &x1, &y1, &out, &out_h, &out_w, &flip))
        return NULL;
    if (out.len != (Py_ssize_t)out_h * out_w * 3) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&out);
        PyErr_Format(PyExc_ValueError, "output buffer holds %zd bytes, expected 3x%dx%d", out.len, out_h, out_w);
        return NULL;
    }
    char message[JMSG_LENGTH_MAX] = {0};
    int status, scale = 0;
    Py_BEGIN_ALLOW_THREADS
    status = decode_crop(data.buf, (size_t)data.len, x0, y0, x1, y1, out.buf, out_h, out_w, flip, message, &scale);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    if (status == -2) {
        PyErr_SetString(PyExc_NotImplementedError, message);
        return NULL;
    }
    if (status) {
        PyErr_SetString(PyExc_ValueError, message);
        return NULL;
    }
    return PyLong_FromLong(scale);
}

static PyMethodDef methods[] = {
    {"decode_crop_into", py_decode_crop_into, METH_VARARGS,
     "decode_crop_into(jpeg, (x0, y0, x1, y1), out, height, width, flip) -> M: decode the crop's "
     "region at DCT scale M/8 and resample it into out (3 x height x width uint8)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_turbo", NULL, -1, methods};

PyMODINIT_FUNC PyInit__turbo(void) { return PyModule_Create(&module); }
