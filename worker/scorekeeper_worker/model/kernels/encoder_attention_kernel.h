// The kernel of encoder_attention.cpp for one instruction set: included once per variant with ATTEND_VARIANT (the
// entry point's name), ATTEND_NAMESPACE (its helpers'), ATTEND_TARGET (GCC target options) and W (floats per vector
// register) defined. No include guard: each inclusion is another variant.

#define HELPER static inline __attribute__((target(ATTEND_TARGET), always_inline))
#define KERNEL static __attribute__((target(ATTEND_TARGET)))

namespace {
namespace ATTEND_NAMESPACE {

typedef float vf __attribute__((vector_size(W * 4)));
typedef int32_t vi __attribute__((vector_size(W * 4)));

HELPER vf splat(float x) { return x - (vf){}; }  // x − 0 is x exactly (also −0), so it folds to a broadcast
HELPER vf load(const float* p) {
    vf r;
    memcpy(&r, p, sizeof r);
    return r;
}
HELPER void store(float* p, vf x) { memcpy(p, &x, sizeof x); }

// exp(x) for x ≤ 0 (scores minus their row's maximum): Cephes' expf, 2^n · p(r) with |r| ≤ ln2/2, within 2 ulp.
HELPER vf vexp(vf x) {
    x = x > splat(-87.33654f) ? x : splat(-87.33654f);  // exp underflows to 0 below; keeps 2^n a normal float
    vf fx = x * 1.44269504088896341f + 0.5f;
    vf n = __builtin_convertvector(__builtin_convertvector(fx, vi), vf);
    n = n > fx ? n - 1.0f : n;  // floor (conversion truncates towards zero)
    vf r = x - n * 0.693359375f - n * -2.12194440e-4f;
    vf y = splat(1.9875691500E-4f);
    y = y * r + 1.3981999507E-3f;
    y = y * r + 8.3334519073E-3f;
    y = y * r + 4.1665795894E-2f;
    y = y * r + 1.6666665459E-1f;
    y = y * r + 5.0000001201E-1f;
    y = y * r * r + r + 1.0f;
    vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
    vf scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

// One head of one row: qc [L][DIM] (scaled queries), kt [DIM][Lp] (keys transposed, zero past L; Lp: L rounded up
// to KEY_TILE), vc [L][DIM];
// scores [QB][Lp] scratch; out at the row's first token for this head, `out_stride` floats between tokens.
template <int DIM, int QB>
KERNEL void head(const float* qc, const float* kt, const float* vc, float* scores, float* out, int64_t out_stride,
                 int length, int padded) {
    constexpr int KV = KEY_TILE / W;  // vectors per key tile
    constexpr int DV = DIM / W;       // vectors per head
    for (int i0 = 0; i0 < length; i0 += QB) {
        const int queries = std::min(QB, length - i0);
        float qs[DIM][QB];
        for (int i = 0; i < QB; i++)
            for (int d = 0; d < DIM; d++) qs[d][i] = i < queries ? qc[(i0 + i) * DIM + d] : 0.f;
        vf top[QB];
        for (int i = 0; i < QB; i++) top[i] = splat(-INFINITY);
        for (int j = 0; j < padded; j += KEY_TILE) {
            vf acc[QB][KV];
            for (int i = 0; i < QB; i++)
                for (int b = 0; b < KV; b++) acc[i][b] = splat(0.f);
            for (int d = 0; d < DIM; d++) {
                vf keys[KV];
                for (int b = 0; b < KV; b++) keys[b] = load(kt + d * padded + j + b * W);
                for (int i = 0; i < QB; i++) {
                    vf query = splat(qs[d][i]);
                    for (int b = 0; b < KV; b++) acc[i][b] += query * keys[b];
                }
            }
            if (j + KEY_TILE > length) {  // the last tile: keys past the row get no weight
                for (int b = 0; b < KV; b++) {
                    vi key;
                    for (int l = 0; l < W; l++) key[l] = j + b * W + l;
                    vi inside = key < (length - (vi){});
                    for (int i = 0; i < QB; i++) acc[i][b] = inside ? acc[i][b] : splat(-INFINITY);
                }
            }
            for (int i = 0; i < QB; i++)
                for (int b = 0; b < KV; b++) {
                    store(scores + i * padded + j + b * W, acc[i][b]);
                    top[i] = top[i] > acc[i][b] ? top[i] : acc[i][b];
                }
        }
        float total[QB];
        for (int i = 0; i < QB; i++) {
            float m = -INFINITY;
            for (int l = 0; l < W; l++) m = std::max(m, top[i][l]);
            vf sum0 = splat(0.f), sum1 = splat(0.f);
            float* row = scores + i * padded;
            for (int j = 0; j < padded; j += 2 * W) {  // padded is a multiple of 32 ≥ 2W
                vf e0 = vexp(load(row + j) - m), e1 = vexp(load(row + j + W) - m);
                store(row + j, e0);
                store(row + j + W, e1);
                sum0 += e0;
                sum1 += e1;
            }
            sum0 += sum1;
            float t = 0;
            for (int l = 0; l < W; l++) t += sum0[l];
            total[i] = t;
        }
        vf acc[QB][DV];
        for (int i = 0; i < QB; i++)
            for (int b = 0; b < DV; b++) acc[i][b] = splat(0.f);
        for (int j = 0; j < length; j++) {
            vf values[DV];
            for (int b = 0; b < DV; b++) values[b] = load(vc + j * DIM + b * W);
            for (int i = 0; i < QB; i++) {
                vf p = splat(scores[i * padded + j]);
                for (int b = 0; b < DV; b++) acc[i][b] += p * values[b];
            }
        }
        for (int i = 0; i < queries; i++) {
            const float inverse = 1.f / total[i];
            for (int b = 0; b < DV; b++) store(out + (i0 + i) * out_stride + b * W, acc[i][b] * inverse);
        }
    }
}

// Heads [h0, h1) of row r: copy each token's projections once, in order, into compact per-head buffers; then attend.
template <int DIM, int QB>
KERNEL void row(const Rows& rows, int64_t r, int h0, int h1, float* scratch) {
    const int64_t first = rows.spans[2 * r];
    const int length = (int)rows.spans[2 * r + 1];
    const int padded = (length + KEY_TILE - 1) / KEY_TILE * KEY_TILE;
    const int heads = h1 - h0;
    float* qc = scratch;                           // [heads][padded][DIM]
    float* kt = qc + (size_t)heads * padded * DIM;  // [heads][DIM][padded]
    float* vc = kt + (size_t)heads * padded * DIM;  // [heads][padded][DIM]
    float* scores = vc + (size_t)heads * padded * DIM;  // [QB][padded]
    for (int j = 0; j < length; j++) {
        const int64_t at = (first + j) * rows.stride;
        for (int h = 0; h < heads; h++) {
            const int64_t from = at + (int64_t)(h0 + h) * DIM;
            for (int d = 0; d < DIM; d++) qc[((size_t)h * padded + j) * DIM + d] = rows.q[from + d] * rows.scale;
            for (int d = 0; d < DIM; d++) kt[((size_t)h * DIM + d) * padded + j] = rows.k[from + d];
            memcpy(vc + ((size_t)h * padded + j) * DIM, rows.v + from, DIM * sizeof(float));
        }
    }
    for (int h = 0; h < heads; h++)
        for (int d = 0; d < DIM; d++)
            for (int j = length; j < padded; j++) kt[((size_t)h * DIM + d) * padded + j] = 0.f;
    for (int h = 0; h < heads; h++)
        head<DIM, QB>(qc + (size_t)h * padded * DIM, kt + (size_t)h * DIM * padded, vc + (size_t)h * padded * DIM,
                      scores, rows.out + first * rows.out_stride + (int64_t)(h0 + h) * DIM, rows.out_stride, length,
                      padded);
}

template <int DIM, int QB>
KERNEL void share(const Rows& rows, const Share& s) {
    for (int64_t r = s.row0; r <= s.row1; r++) {
        const int h0 = r == s.row0 ? (int)s.head0 : 0;
        const int h1 = r == s.row1 ? (int)s.head1 : rows.heads;
        if (h0 < h1) row<DIM, QB>(rows, r, h0, h1, s.scratch);
    }
}

}  // namespace ATTEND_NAMESPACE
}  // namespace

// Queries per block: as many as keep the score and output accumulators in registers (32 of them with AVX-512, 16
// with AVX2).
static void ATTEND_VARIANT(const Rows& rows, const Share& s) {
    if (rows.dim == 32)
        ATTEND_NAMESPACE::share<32, W == 16 ? 8 : 3>(rows, s);
    else
        ATTEND_NAMESPACE::share<64, W == 16 ? 4 : 2>(rows, s);
}

#undef HELPER
#undef KERNEL
