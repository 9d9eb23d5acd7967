// Encoder attention over packed rows on CPU, float32: every head of every row (a whole sequence lying as a run of
// consecutive packed tokens) attends to its own row, without a mask, a gather or padding. One CPython function,
// no torch headers: model/kernels/native.py passes the tensors' addresses.
//
// Why: torch's CPU flash kernel spends about 9 cycles per score on 32-wide heads (small GEMM calls per block). Here a
// row's queries, keys (transposed) and values are first copied into compact per-head buffers (reading each token's
// projections once, in order), then a register-blocked kernel computes 8 queries × 32 keys of scores at a time,
// the softmax on the whole row of scores (rows are at most MAX_KEYS long, so no online rescaling), and the weighted
// sum of values. About 1.5× torch's kernel on MiniLM's shapes (docs/benchmarks.md).
//
// Compiled twice from the same source, for AVX-512 (W = 16 floats per register) and AVX2 + FMA (W = 8), by
// `#pragma GCC target`; the caller picks the variant (torch's own CPU capability, so ATEN_CPU_CAPABILITY caps it).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <thread>
#include <vector>

namespace {

constexpr int MAX_KEYS = 1024;  // longer rows go to torch's kernel (native.py), which blocks over keys
constexpr int KEY_TILE = 32;    // keys per score tile

struct Rows {
    const float *q, *k, *v;
    float* out;
    int64_t stride, out_stride;  // floats between consecutive tokens (q, k and v share one; `out` its own)
    int heads, dim;
    const int64_t* spans;  // [rows][2]: first packed token, length
    float scale;
};

// One thread's share: rows [row0, row1], the first from head0, the last up to head1 (exclusive); its scratch
// buffer (64-byte aligned, SCRATCH floats).
struct Share {
    int64_t row0, head0, row1, head1;
    float* scratch;
};

constexpr int MAX_QUERY_BLOCK = 8;

// Floats of scratch a share needs: per head, queries, keys and values of the longest row, padded to the key tile;
// and one block of score rows.
size_t scratch_floats(int heads, int dim, int64_t longest) {
    const size_t padded = (size_t)(longest + KEY_TILE - 1) / KEY_TILE * KEY_TILE;
    return ((size_t)heads * padded * dim * 3 + MAX_QUERY_BLOCK * padded + 15) / 16 * 16;
}

}  // namespace

#define ATTEND_VARIANT attend_avx512
#define ATTEND_NAMESPACE avx512
#define ATTEND_TARGET "avx512f,avx512dq,fma"
#define W 16
#include "encoder_attention_kernel.h"
#undef ATTEND_VARIANT
#undef ATTEND_NAMESPACE
#undef ATTEND_TARGET
#undef W

#define ATTEND_VARIANT attend_avx2
#define ATTEND_NAMESPACE avx2
#define ATTEND_TARGET "avx2,fma"
#define W 8
#include "encoder_attention_kernel.h"
#undef ATTEND_VARIANT
#undef ATTEND_NAMESPACE
#undef ATTEND_TARGET
#undef W

namespace {

using Variant = void (*)(const Rows&, const Share&);

// Split rows × heads into `threads` contiguous shares of about equal work (a head of a row costs length²).
std::vector<Share> split(const Rows& rows, int64_t count, int threads) {
    double total = 0;
    for (int64_t r = 0; r < count; r++) total += (double)rows.spans[2 * r + 1] * rows.spans[2 * r + 1] * rows.heads;
    std::vector<Share> shares;
    Share current{0, 0, count - 1, rows.heads, nullptr};
    double done = 0;
    for (int64_t r = 0; r < count && (int)shares.size() < threads - 1; r++) {
        double per_head = (double)rows.spans[2 * r + 1] * rows.spans[2 * r + 1];
        for (int h = 0; h < rows.heads && (int)shares.size() < threads - 1; h++) {
            done += per_head;
            if (done >= total * (shares.size() + 1) / threads) {
                int64_t next_row = h + 1 < rows.heads ? r : r + 1;
                int64_t next_head = h + 1 < rows.heads ? h + 1 : 0;
                shares.push_back(Share{current.row0, current.head0, r, h + 1, nullptr});
                current.row0 = next_row;
                current.head0 = next_head;
            }
        }
    }
    if (current.row0 < count) shares.push_back(current);
    return shares;
}

PyObject* attend(PyObject*, PyObject* args) {
    unsigned long long q, k, v, out, spans;
    long long stride, out_stride, count;
    int heads, dim, threads, avx512;
    float scale;
    if (!PyArg_ParseTuple(args, "KKKKLLiiKLfii", &q, &k, &v, &out, &stride, &out_stride, &heads, &dim, &spans, &count,
                          &scale, &threads, &avx512))
        return nullptr;
    Rows rows{(const float*)q, (const float*)k, (const float*)v, (float*)out, stride, out_stride, heads, dim,
              (const int64_t*)spans, scale};
    if (dim != 32 && dim != 64) {
        PyErr_SetString(PyExc_ValueError, "head dim must be 32 or 64");
        return nullptr;
    }
    int64_t longest = 0;
    for (int64_t r = 0; r < count; r++) {
        if (rows.spans[2 * r + 1] < 1 || rows.spans[2 * r + 1] > MAX_KEYS) {
            PyErr_SetString(PyExc_ValueError, "row length must be 1 to MAX_KEYS");
            return nullptr;
        }
        longest = std::max(longest, rows.spans[2 * r + 1]);
    }
    if (count == 0) Py_RETURN_NONE;
    Variant variant = avx512 ? attend_avx512 : attend_avx2;
    std::vector<Share> shares = split(rows, count, std::max(1, threads));
    // Kept by the calling thread (the model thread) from call to call: no allocation, no page faults per layer.
    static thread_local std::vector<float> scratch;
    const size_t each = scratch_floats(heads, dim, longest);
    if (scratch.size() < each * shares.size() + 16) scratch.resize(each * shares.size() + 16);
    float* aligned = (float*)(((uintptr_t)scratch.data() + 63) & ~(uintptr_t)63);
    for (size_t t = 0; t < shares.size(); t++) shares[t].scratch = aligned + t * each;
    Py_BEGIN_ALLOW_THREADS;
    std::vector<std::thread> helpers;
    for (size_t t = 1; t < shares.size(); t++) helpers.emplace_back(variant, std::cref(rows), std::cref(shares[t]));
    variant(rows, shares[0]);
    for (std::thread& helper : helpers) helper.join();
    Py_END_ALLOW_THREADS;
    Py_RETURN_NONE;
}

PyObject* max_keys(PyObject*, PyObject*) { return PyLong_FromLong(MAX_KEYS); }

PyMethodDef methods[] = {
    {"attend", attend, METH_VARARGS,
     "attend(q, k, v, out, stride, out_stride, heads, dim, spans, rows, scale, threads, avx512): addresses of "
     "float32 tensors (token-major, head h at h·dim), spans int64 [rows][2]"},
    {"max_keys", max_keys, METH_NOARGS, "the longest row attend() takes"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_encoder_attention", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__encoder_attention() { return PyModule_Create(&module); }
