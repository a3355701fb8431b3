/* fastload.decode._turbo's mask kernel: a PNG mask's class ids sampled into the crop.
 *
 * mask_into(raw, height, width, bit_depth, box, out, out_height, out_width, flip) takes a PNG's
 * inflated image data (`raw`: a filter byte then the row's bytes, row after row, one channel of
 * 1, 2, 4, 8 or 16 bits, not interlaced; it may stop after the last row the crop reads), undoes
 * the PNG filters row by row keeping only the previous row, and writes each output pixel the
 * value under its centre (nearest neighbour: class ids are never interpolated) into `out`, a
 * writable C-contiguous buffer of out_height x out_width uint8 or uint16 (native byte order; a
 * 16-bit mask needs uint16), mirrored when `flip`. The centres are
 * computed exactly as fastload.transforms.nearest_into computes them, so both give the same
 * pixels. Sub-byte samples are the stored values (palette indices, 0/1), never rescaled. The
 * GIL is released while it works; malformed data is a ValueError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

PyObject *fastload_mask_into(PyObject *self, PyObject *args);

/* The Paeth predictor without branches (they mispredict on noisy rows): a unless b or c is nearer
 * p = a + b - c, b before c; ties go to a, then b, as the PNG specification orders them. */
static inline unsigned char paeth(int a, int b, int c) {
    int pa = abs(b - c), pb = abs(a - c), pc = abs(a + b - 2 * c);
    int use_b = pb < pa, best = use_b ? pb : pa, value = use_b ? b : a;
    return (unsigned char)(pc < best ? c : value);
}

/* Undo one row's filter in place for one byte a pixel (grey, palette): the left neighbour is the
 * byte before, carried in a register (through memory, each byte waited on the previous store). */
static int unfilter1(int type, unsigned char *row, const unsigned char *prev, size_t n) {
    size_t i;
    unsigned char a = 0;
    switch (type) {
    case 0:
        return 0;
    case 1:
        for (i = 0; i < n; i++) row[i] = a = (unsigned char)(row[i] + a);
        return 0;
    case 2:
        for (i = 0; i < n; i++) row[i] = (unsigned char)(row[i] + prev[i]);
        return 0;
    case 3:
        for (i = 0; i < n; i++) row[i] = a = (unsigned char)(row[i] + ((a + prev[i]) >> 1));
        return 0;
    case 4:
        for (i = 0; i < n; i++) row[i] = a = (unsigned char)(row[i] + paeth(a, prev[i], i ? prev[i - 1] : 0));
        return 0;
    default:
        return -1;
    }
}

/* The same for `bpp` bytes a pixel (16-bit grey: 2): the left neighbour is `bpp` bytes before. */
static int unfilter(int type, unsigned char *row, const unsigned char *prev, size_t n, size_t bpp) {
    size_t i, first = bpp < n ? bpp : n;
    if (bpp == 1) return unfilter1(type, row, prev, n);
    switch (type) {
    case 0:
        return 0;
    case 1:
        for (i = bpp; i < n; i++) row[i] = (unsigned char)(row[i] + row[i - bpp]);
        return 0;
    case 2:
        for (i = 0; i < n; i++) row[i] = (unsigned char)(row[i] + prev[i]);
        return 0;
    case 3:
        for (i = 0; i < first; i++) row[i] = (unsigned char)(row[i] + (prev[i] >> 1));
        for (i = bpp; i < n; i++) row[i] = (unsigned char)(row[i] + ((row[i - bpp] + prev[i]) >> 1));
        return 0;
    case 4:
        for (i = 0; i < first; i++) row[i] = (unsigned char)(row[i] + prev[i]);
        for (i = bpp; i < n; i++) row[i] = (unsigned char)(row[i] + paeth(row[i - bpp], prev[i], prev[i - bpp]));
        return 0;
    default:
        return -1;
    }
}

/* The source index under each output pixel's centre along one axis, clipped to [0, size). */
static void centres(double start, double end, int out, int size, int *index) {
    double step = (end - start) / out;
    for (int i = 0; i < out; i++) {
        double at = floor(start + ((double)i + 0.5) * step);
        index[i] = at < 0 ? 0 : at > size - 1 ? size - 1 : (int)at;
    }
}

static unsigned sample_at(const unsigned char *row, int column, int bits) {
    if (bits == 8) return row[column];
    if (bits == 16) return (unsigned)row[2 * (size_t)column] << 8 | row[2 * (size_t)column + 1]; /* big-endian */
    size_t bit = (size_t)column * bits;
    return (row[bit >> 3] >> (8 - bits - (bit & 7))) & ((1u << bits) - 1);
}

static int mask_crop(const unsigned char *raw, size_t raw_len, int height, int width, int bits, double x0, double y0,
                     double x1, double y1, void *out, int wide, int out_h, int out_w, int flip, const char **message) {
    size_t stride = ((size_t)width * bits + 7) / 8, bpp = bits == 16 ? 2 : 1;
    int *rows = malloc(sizeof(int) * (size_t)out_h), *cols = malloc(sizeof(int) * (size_t)out_w);
    unsigned char *prev = calloc(stride + 1, 1), *row = malloc(stride + 1);
    int status = 0;
    if (!rows || !cols || !prev || !row) {
        *message = "out of memory";
        status = -1;
        goto done;
    }
    centres(y0, y1, out_h, height, rows);
    centres(x0, x1, out_w, width, cols);
    int r = 0;
    for (int y = 0; r < out_h; y++) {
        size_t at = (size_t)y * (stride + 1);
        if (at + stride + 1 > raw_len) {
            *message = "truncated image data";
            status = -1;
            goto done;
        }
        memcpy(row, raw + at + 1, stride);
        if (unfilter(raw[at], row, prev, stride, bpp)) {
            *message = "unknown row filter";
            status = -1;
            goto done;
        }
        for (; r < out_h && rows[r] == y; r++) {
            size_t line = (size_t)r * out_w;
            for (int c = 0; c < out_w; c++) {
                size_t at_out = line + (size_t)(flip ? out_w - 1 - c : c);
                unsigned value = sample_at(row, cols[c], bits);
                if (wide)
                    ((uint16_t *)out)[at_out] = (uint16_t)value;
                else
                    ((unsigned char *)out)[at_out] = (unsigned char)value;
            }
        }
        unsigned char *swap = prev;
        prev = row;
        row = swap;
    }
done:
    free(rows);
    free(cols);
    free(prev);
    free(row);
    return status;
}

PyObject *fastload_mask_into(PyObject *self, PyObject *args) {
    Py_buffer raw, out;
    int height, width, bits, out_h, out_w, flip;
    double x0, y0, x1, y1;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*iii(dddd)w*iip", &raw, &height, &width, &bits, &x0, &y0, &x1, &y1, &out, &out_h,
                          &out_w, &flip))
        return NULL;
    const char *message = NULL;
    int status = -1;
    int wide = out.len == (Py_ssize_t)out_h * out_w * 2;
    if (height < 1 || width < 1 || out_h < 1 || out_w < 1 || (bits & (bits - 1)) || bits < 1 || bits > 16) {
        message = "bad mask geometry";
    } else if (out.len != (Py_ssize_t)out_h * out_w && !wide) {
        message = "output buffer holds neither out_height x out_width uint8 nor uint16";
    } else if (bits == 16 && !wide) {
        message = "a 16-bit mask needs a uint16 output";
    } else {
        Py_BEGIN_ALLOW_THREADS
        status = mask_crop(raw.buf, (size_t)raw.len, height, width, bits, x0, y0, x1, y1, out.buf, wide, out_h, out_w,
                           flip, &message);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&raw);
    PyBuffer_Release(&out);
    if (status) {
        PyErr_SetString(PyExc_ValueError, message);
        return NULL;
    }
    Py_RETURN_NONE;
}
