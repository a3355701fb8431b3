/* fastload.near._index: fastload.near.search's multi-index in C (the same answers; the decisions of a
 * conversion 67x faster at 12,000 signatures, ~190x at 100,000: benchmarks/bench_near_dupes.py).
 *
 * Index(threshold, tolerance, bands): bands is a list of (shift, width, flips): the band is the
 * hash's bits shift..shift+width-1 and flips every mask of width bits within the band's search
 * radius, at most MAX_WIDTH bits. Each band is a table of 2**width buckets; a bucket holds the
 * hash and slot of every stored signature with that band value, hashes apart (8 bytes scanned a
 * candidate: the scan is bound by memory, 1.5-3 ns a candidate at 1.28M signatures).
 * closest(hash, colour) looks up the query's band value xor each flip in every band and checks
 * each candidate's full Hamming distance, then its colours (every byte within tolerance), keeping
 * the smallest (distance, ident): what search.MultiIndex.closest returns, found without Python
 * objects per candidate. A candidate found in several bands is checked again: the same answer.
 * Callers add each ident once (the Python index keeps the last signature of an ident; this one
 * would keep both). On x86-64 the scan uses the POPCNT instruction where the CPU has it (module
 * attribute kernel: "popcnt", else "plain"; FASTLOAD_NO_POPCNT=1 forces the latter).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BANDS 64
#define MAX_WIDTH 16 /* bits a band: 64k buckets (1.5 MB) */

typedef struct { /* the stored signatures with one band value: their hashes, scanned, and slots apart */
    uint64_t *hashes;
    uint32_t *slots; /* into colours and idents */
    uint32_t count, capacity;
} Bucket;

typedef struct {
    int shift, width;
    uint64_t mask;
    uint64_t *flips;
    Py_ssize_t flip_count;
    Bucket *buckets;
} Band;

typedef struct {
    PyObject_HEAD int threshold, tolerance, band_count;
    Band bands[MAX_BANDS];
    uint64_t *colours;
    int64_t *idents;
    uint32_t size, capacity;
} Index;

/* Whether each of the 8 colour bytes of a and b differ by at most tolerance. */
static inline int colours_match(uint64_t a, uint64_t b, int tolerance) {
    for (int i = 0; i < 8; i++) {
        int d = (int)((a >> (8 * i)) & 0xff) - (int)((b >> (8 * i)) & 0xff);
        if (d > tolerance || d < -tolerance) return 0;
    }
    return 1;
}

/* The smallest (distance, ident) within the threshold whose colours match; 0 if there is none. */
static inline __attribute__((always_inline)) int search(const Index *self, uint64_t hash, uint64_t colour, int *distance,
                                                        int64_t *ident) {
    int best = self->threshold + 1;
    int64_t best_ident = INT64_MAX;
    for (int b = 0; b < self->band_count; b++) {
        const Band *band = &self->bands[b];
        uint64_t value = (hash >> band->shift) & band->mask;
        for (Py_ssize_t f = 0; f < band->flip_count; f++) {
            const Bucket *bucket = &band->buckets[value ^ band->flips[f]];
            for (uint32_t i = 0; i < bucket->count; i++) {
                int d = __builtin_popcountll(hash ^ bucket->hashes[i]);
                if (d > best) continue;
                uint32_t slot = bucket->slots[i];
                int64_t id = self->idents[slot];
                if ((d < best || id < best_ident) && colours_match(colour, self->colours[slot], self->tolerance)) {
                    best = d;
                    best_ident = id;
                }
            }
        }
    }
    if (best > self->threshold) return 0;
    *distance = best;
    *ident = best_ident;
    return 1;
}

static int search_plain(const Index *self, uint64_t hash, uint64_t colour, int *distance, int64_t *ident) {
    return search(self, hash, colour, distance, ident);
}

#if defined(__GNUC__) && defined(__x86_64__)
/* The same loop with the POPCNT instruction (x86-64 CPUs since 2008), picked at run time. */
__attribute__((target("popcnt"))) static int search_popcnt(const Index *self, uint64_t hash, uint64_t colour, int *distance,
                                                            int64_t *ident) {
    return search(self, hash, colour, distance, ident);
}
#endif

static int (*search_kernel)(const Index *, uint64_t, uint64_t, int *, int64_t *) = search_plain;

static void free_band(Band *band) {
    if (band->buckets) {
        for (size_t i = 0; i < ((size_t)1 << band->width); i++) {
            free(band->buckets[i].hashes);
            free(band->buckets[i].slots);
        }
    }
    free(band->buckets);
    free(band->flips);
    memset(band, 0, sizeof(*band));
}

static void Index_dealloc(Index *self) {
    for (int b = 0; b < MAX_BANDS; b++) free_band(&self->bands[b]); /* zeroed at allocation: any set up is freed */
    free(self->colours);
    free(self->idents);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A Python int as 64 unsigned bits for "O&": a TypeError or OverflowError (negative, over 64 bits)
 * rather than the silent masking of the "K" format. */
static int as_u64(PyObject *value, void *out) {
    if (!PyLong_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "hash and colour bits must be ints");
        return 0;
    }
    uint64_t bits = PyLong_AsUnsignedLongLong(value);
    if (bits == (uint64_t)-1 && PyErr_Occurred()) return 0;
    *(uint64_t *)out = bits;
    return 1;
}

/* Set up one band from (shift, width, flips); on failure the band holds nothing. */
static int set_band(Band *band, PyObject *spec) {
    PyObject *flips;
    int shift, width;
    if (!PyTuple_Check(spec)) {
        PyErr_SetString(PyExc_TypeError, "a band is a tuple (shift, width, flips)");
        return -1;
    }
    if (!PyArg_ParseTuple(spec, "iiO", &shift, &width, &flips)) return -1;
    if (width < 1 || width > MAX_WIDTH || shift < 0 || shift > 64 - width) {
        PyErr_SetString(PyExc_ValueError, "a band must be 1..16 bits within the 64 hash bits");
        return -1;
    }
    PyObject *seq = PySequence_Fast(flips, "flips must be a sequence of ints");
    if (!seq) return -1;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    uint64_t mask = (UINT64_C(1) << width) - 1;
    uint64_t *masks = malloc(sizeof(uint64_t) * (size_t)(count ? count : 1));
    Bucket *buckets = masks ? calloc((size_t)1 << width, sizeof(Bucket)) : NULL;
    if (!buckets) {
        free(masks);
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t f = 0; f < count; f++) {
        uint64_t flip;
        if (!as_u64(PySequence_Fast_GET_ITEM(seq, f), &flip)) {
            free(masks);
            free(buckets);
            Py_DECREF(seq);
            return -1;
        }
        masks[f] = flip & mask;
    }
    Py_DECREF(seq);
    *band = (Band){.shift = shift, .width = width, .mask = mask, .flips = masks, .flip_count = count, .buckets = buckets};
    return 0;
}

static int Index_init(Index *self, PyObject *args, PyObject *kwargs) {
    PyObject *bands;
    int threshold, tolerance;
    static char *names[] = {"threshold", "tolerance", "bands", NULL};
    if (self->band_count) {
        PyErr_SetString(PyExc_RuntimeError, "an Index is set up once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iiO", names, &threshold, &tolerance, &bands)) return -1;
    if (threshold < 0 || threshold > 64 || tolerance < 0) {
        PyErr_SetString(PyExc_ValueError, "threshold must be 0..64 and tolerance >= 0");
        return -1;
    }
    PyObject *seq = PySequence_Fast(bands, "bands must be a sequence of (shift, width, flips)");
    if (!seq) return -1;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    if (count < 1 || count > MAX_BANDS) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "an Index needs 1..64 bands");
        return -1;
    }
    for (Py_ssize_t b = 0; b < count; b++) {
        if (set_band(&self->bands[b], PySequence_Fast_GET_ITEM(seq, b)) < 0) {
            while (--b >= 0) free_band(&self->bands[b]);
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    self->threshold = threshold;
    self->tolerance = tolerance;
    self->band_count = (int)count; /* set up: add and closest work from here on */
    return 0;
}

static int push(Bucket *bucket, uint64_t hash, uint32_t slot) {
    if (bucket->count == bucket->capacity) {
        if (bucket->capacity > UINT32_MAX / 2) return -1;
        uint32_t capacity = bucket->capacity ? bucket->capacity * 2 : 4;
        uint64_t *hashes = realloc(bucket->hashes, sizeof(uint64_t) * capacity);
        if (hashes) bucket->hashes = hashes;
        uint32_t *slots = hashes ? realloc(bucket->slots, sizeof(uint32_t) * capacity) : NULL;
        if (!slots) return -1;
        bucket->slots = slots;
        bucket->capacity = capacity;
    }
    bucket->hashes[bucket->count] = hash;
    bucket->slots[bucket->count++] = slot;
    return 0;
}

static PyObject *Index_add(Index *self, PyObject *args) {
    uint64_t hash, colour;
    long long ident;
    if (!PyArg_ParseTuple(args, "O&O&L", as_u64, &hash, as_u64, &colour, &ident)) return NULL;
    if (!self->band_count) {
        PyErr_SetString(PyExc_RuntimeError, "the Index was not set up");
        return NULL;
    }
    if (self->size == UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "an Index holds at most 2**32 - 1 signatures");
        return NULL;
    }
    if (self->size == self->capacity) {
        uint32_t capacity = self->capacity ? (self->capacity > UINT32_MAX / 2 ? UINT32_MAX : self->capacity * 2) : 1024;
        uint64_t *colours = realloc(self->colours, sizeof(uint64_t) * capacity);
        if (colours) self->colours = colours;
        int64_t *idents = colours ? realloc(self->idents, sizeof(int64_t) * capacity) : NULL;
        if (!idents) return PyErr_NoMemory();
        self->idents = idents;
        self->capacity = capacity;
    }
    for (int b = 0; b < self->band_count; b++) {
        Band *band = &self->bands[b];
        if (push(&band->buckets[(hash >> band->shift) & band->mask], hash, self->size) < 0) {
            while (--b >= 0) { /* undo: the buckets of the bands before hold it last */
                band = &self->bands[b];
                band->buckets[(hash >> band->shift) & band->mask].count--;
            }
            return PyErr_NoMemory();
        }
    }
    self->colours[self->size] = colour;
    self->idents[self->size] = ident;
    self->size++;
    Py_RETURN_NONE;
}

static PyObject *Index_closest(Index *self, PyObject *args) {
    uint64_t hash, colour;
    if (!PyArg_ParseTuple(args, "O&O&", as_u64, &hash, as_u64, &colour)) return NULL;
    int distance;
    int64_t ident;
    if (!self->band_count) {
        PyErr_SetString(PyExc_RuntimeError, "the Index was not set up");
        return NULL;
    }
    if (!search_kernel(self, hash, colour, &distance, &ident)) Py_RETURN_NONE;
    return Py_BuildValue("(iL)", distance, (long long)ident);
}

static Py_ssize_t Index_len(Index *self) { return self->size; }

static PyMethodDef Index_methods[] = {
    {"add", (PyCFunction)Index_add, METH_VARARGS, "add(hash, colour, ident): store a signature's 64 hash and colour bits."},
    {"closest", (PyCFunction)Index_closest, METH_VARARGS,
     "closest(hash, colour) -> (distance, ident) | None: the nearest stored signature within the threshold whose "
     "colours match (ties: the smaller ident)."},
    {NULL, NULL, 0, NULL}};

static PySequenceMethods Index_sequence = {.sq_length = (lenfunc)Index_len};

static PyTypeObject IndexType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fastload.near._index.Index",
    .tp_doc = "Index(threshold, tolerance, bands): signatures by band, answering the closest within the threshold.",
    .tp_basicsize = sizeof(Index),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Index_init,
    .tp_dealloc = (destructor)Index_dealloc,
    .tp_methods = Index_methods,
    .tp_as_sequence = &Index_sequence,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_index", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__index(void) {
#if defined(__GNUC__) && defined(__x86_64__)
    __builtin_cpu_init();
    const char *off = getenv("FASTLOAD_NO_POPCNT");
    if (__builtin_cpu_supports("popcnt") && !(off && *off && strcmp(off, "0"))) search_kernel = search_popcnt;
#endif
    if (PyType_Ready(&IndexType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddStringConstant(m, "kernel", search_kernel == search_plain ? "plain" : "popcnt") < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&IndexType);
    if (PyModule_AddObject(m, "Index", (PyObject *)&IndexType) < 0) {
        Py_DECREF(&IndexType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
