/* The model's own attention as an eviction signal, read through llama.cpp's stock `cb_eval`.
 *
 * Owns: a callback that asks the scheduler only for the chosen layers' post-RoPE `Qcur-<il>` and
 * `Kcur-<il>` (op GGML_OP_ROPE: the same names label the tensors before RoPE), copies them to host
 * (ggml_backend_tensor_get, so any backend works), and a per-sequence K store keyed by position
 * that the engine keeps in step with llama.cpp's sequence operations (rm / add / cp / state load).
 * For each scored query token it computes softmax(q.K^T * scale) per head over the sequence's
 * stored positions <= the query's, reduces query heads to KV heads (GQA: group mean or max), and
 * folds two per-position masses into decaying averages: the mean over heads and Ada-KV's adaptive
 * aggregation (per-head floor alpha of the uniform share, the rest top-B over all heads at once).
 *
 * Invariants: K rows are stored f16-rounded exactly as llama.cpp writes them into an f16 cache;
 * a shift re-rotates them with the recurrence of ggml's rope cache (as native/rope_reanchor.c);
 * nothing here depends on llama.cpp's cell layout. Only the engine thread calls in (llama_decode
 * runs the callback on that thread), so there is no locking.
 */
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ggml.h"
#include "ggml-backend.h"

#if defined(__F16C__)
#include <immintrin.h>
static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
static inline uint16_t f2h(float f) { return _cvtss_sh(f, 0); }   // round to nearest even, as ggml
#else
static inline float h2f(uint16_t h) { return ggml_fp16_to_fp32((ggml_fp16_t) h); }
static inline uint16_t f2h(float f) { return (uint16_t) ggml_fp32_to_fp16(f); }
#endif

/* q (f32) . k (f16), f32 accumulation in 8 lanes (llama.cpp's CPU f16 dot also sums in f32). */
static inline float dot_f16(const float *q, const uint16_t *k, int n) {
    int d = 0;
    float s = 0.f;
#if defined(__F16C__) && defined(__AVX__)
    __m256 acc = _mm256_setzero_ps();
    for (; d + 8 <= n; d += 8) {
        const __m256 kv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (k + d)));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(q + d), kv));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    s = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
#endif
    for (; d < n; ++d) s += q[d] * h2f(k[d]);
    return s;
}

namespace {

constexpr int kMaxRot = 1024;
constexpr int kMaxLayers = 16;

struct SeqStore {
    std::vector<uint8_t> present;     // [pos]
    std::vector<uint16_t> k;          // [pos][layer][n_head_kv * head_dim] f16
    std::vector<float> ew_mean;       // [pos] decaying mass, mean over heads
    std::vector<float> ew_ada;        // [pos] decaying share of Ada-KV picks
    std::vector<int32_t> shift;       // [pos] rotation owed to the row (llama.cpp's pending K-shift)
    bool has_shift = false;
    bool scored = false;
    int64_t steps = 0;

    int32_t n_pos() const { return (int32_t) present.size(); }
};

struct Capture {
    // geometry
    int n_layers = 0;
    int layers[kMaxLayers] = {0};
    int n_head = 0, n_head_kv = 0, head_dim = 0, n_rot = 0, rope_mode = 0;
    float freq_base = 10000.f, freq_scale = 1.f, kq_scale = 1.f;
    // options
    bool enabled = true;
    bool gqa_max = false;
    bool round_q = true;              // llama.cpp's CPU mul_mat rounds q to f16 against an f16 K
    float decay = 0.95f;
    float keep_fraction = 0.5f;
    float alpha = 0.2f;
    int prompt_queries = 8;
    bool probe = false;
    // per-decode state
    int target_seq = -1;
    std::vector<SeqStore> seqs;
    std::vector<float> q_buf[kMaxLayers];
    std::vector<float> k_buf[kMaxLayers];
    std::vector<int32_t> pos_buf[kMaxLayers];
    bool have_q[kMaxLayers] = {false}, have_k[kMaxLayers] = {false};
    int layers_done = 0;
    int n_queries = 0;
    // scratch
    std::vector<float> logits, weights, grouped, step_mean, step_ada;
    std::vector<int32_t> cand_pos;
    // last query of the last scored ubatch, first chosen layer: per query head, per candidate
    std::vector<float> last_w;
    std::vector<int32_t> last_pos;
    int32_t last_query_pos = -1;
    int64_t queries_scored = 0;
    // probe: llama.cpp's own kq_soft_max row (last token) and mask row for the first chosen layer
    std::vector<float> probe_w, probe_mask;
    int32_t probe_n_kv = 0, probe_n_head = 0;

    int row_floats() const { return n_head_kv * head_dim; }
    int store_row() const { return n_layers * row_floats(); }

    int layer_slot(int il) const {
        for (int i = 0; i < n_layers; ++i) if (layers[i] == il) return i;
        return -1;
    }

    SeqStore *seq(int s) {
        if (s < 0) return nullptr;
        if ((size_t) s >= seqs.size()) seqs.resize(s + 1);
        return &seqs[s];
    }

    void ensure(SeqStore &st, int32_t pos) {
        if (pos < st.n_pos()) return;
        size_t n = (size_t) pos + 1;
        st.present.resize(n, 0);
        st.k.resize(n * store_row(), 0);
        st.ew_mean.resize(n, 0.f);
        st.ew_ada.resize(n, 0.f);
        st.shift.resize(n, 0);
    }

    /* Rotate every row that owes a shift, once by its total, as llama.cpp's K-shift does at the next
     * decode (two shifts applied one by one would round twice and drift from llama.cpp's K). */
    void apply_shifts(SeqStore &st) {
        if (!st.has_shift) return;
        for (int32_t p = 0; p < st.n_pos(); ++p) {
            if (!st.present[p] || st.shift[p] == 0) continue;
            rotate_rows(st.k.data() + (size_t) p * store_row(), (int64_t) n_layers * n_head_kv, (float) st.shift[p]);
            st.shift[p] = 0;
        }
        st.has_shift = false;
    }

    void rotate_rows(uint16_t *rows, int64_t n_vec, float delta) const;
};

/* Rotate n_vec f16 vectors of head_dim by delta positions (ggml NORM = 0 or NEOX = 2). */
void rotate_f16(uint16_t *rows, int64_t n_vec, int head_dim, int n_rot, int mode, float delta,
                float freq_base, float freq_scale) {
    float cos_t[kMaxRot / 2], sin_t[kMaxRot / 2];
    if (n_rot > kMaxRot || n_rot > head_dim || n_rot % 2) return;
    const float theta_scale = powf(freq_base, -2.0f / (float) n_rot);
    float theta = delta * freq_scale;
    for (int i = 0; i < n_rot / 2; ++i) {
        cos_t[i] = cosf(theta);
        sin_t[i] = sinf(theta);
        theta *= theta_scale;
    }
    const int half = n_rot / 2;
    for (int64_t v = 0; v < n_vec; ++v) {
        uint16_t *x = rows + v * head_dim;
        for (int i = 0; i < half; ++i) {
            const int a = mode == 2 ? i : 2 * i, b = mode == 2 ? i + half : 2 * i + 1;
            const float x0 = h2f(x[a]), x1 = h2f(x[b]);
            x[a] = f2h(x0 * cos_t[i] - x1 * sin_t[i]);
            x[b] = f2h(x0 * sin_t[i] + x1 * cos_t[i]);
        }
    }
}

/* Ada-KV budget allocation over A[H][N] (each head's weights): every head first keeps its top
 * floor(alpha * b) positions, then the remaining H*b - H*floor picks go to the largest weights of
 * all heads together. Writes picks per head and per-position pick counts. Returns picks made. */
int64_t adakv_select(const float *A, int H, int N, int per_head_budget, float alpha,
                     int32_t *picks_per_head, float *counts) {
    if (H <= 0 || N <= 0) return 0;
    const int b = std::max(0, std::min(per_head_budget, N));
    const int floor_k = std::min(b, (int) std::floor(alpha * (float) b));
    std::vector<uint8_t> chosen((size_t) H * N, 0);
    std::vector<int32_t> idx(N);
    for (int h = 0; h < H; ++h) {
        picks_per_head[h] = 0;
        if (floor_k == 0) continue;
        const float *row = A + (size_t) h * N;
        for (int j = 0; j < N; ++j) idx[j] = j;
        std::nth_element(idx.begin(), idx.begin() + (floor_k - 1), idx.end(),
                         [row](int32_t x, int32_t y) { return row[x] > row[y] || (row[x] == row[y] && x > y); });
        for (int r = 0; r < floor_k; ++r) chosen[(size_t) h * N + idx[r]] = 1;
        picks_per_head[h] = floor_k;
    }
    int64_t remaining = (int64_t) H * b - (int64_t) H * floor_k;
    if (remaining > 0) {
        std::vector<int64_t> rest;
        rest.reserve((size_t) H * N);
        for (int64_t i = 0; i < (int64_t) H * N; ++i) if (!chosen[i]) rest.push_back(i);
        remaining = std::min<int64_t>(remaining, (int64_t) rest.size());
        if (remaining > 0) {
            std::nth_element(rest.begin(), rest.begin() + (remaining - 1), rest.end(),
                             [A](int64_t x, int64_t y) { return A[x] > A[y] || (A[x] == A[y] && x > y); });
            for (int64_t r = 0; r < remaining; ++r) {
                chosen[rest[r]] = 1;
                picks_per_head[rest[r] / N] += 1;
            }
        }
    }
    int64_t total = 0;
    for (int j = 0; j < N; ++j) counts[j] = 0.f;
    for (int h = 0; h < H; ++h)
        for (int j = 0; j < N; ++j)
            if (chosen[(size_t) h * N + j]) { counts[j] += 1.f; ++total; }
    return total;
}

void Capture::rotate_rows(uint16_t *rows, int64_t n_vec, float delta) const {
    rotate_f16(rows, n_vec, head_dim, n_rot, rope_mode, delta, freq_base, freq_scale);
}

bool copy_rows(const ggml_tensor *t, std::vector<float> &out) {
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) return false;
    out.resize(ggml_nelements(t));
    ggml_backend_tensor_get(t, out.data(), 0, ggml_nbytes(t));
    return true;
}

/* Store this ubatch's K rows of one layer into the target sequence (f16-rounded). */
void store_k(Capture &c, SeqStore &st, int slot) {
    const int rf = c.row_floats();
    const std::vector<float> &k = c.k_buf[slot];
    const std::vector<int32_t> &pos = c.pos_buf[slot];
    const int n_tok = (int) pos.size();
    for (int t = 0; t < n_tok; ++t) {
        if (pos[t] < 0) continue;
        c.ensure(st, pos[t]);
        uint16_t *dst = st.k.data() + (size_t) pos[t] * c.store_row() + (size_t) slot * rf;
        const float *src = k.data() + (size_t) t * rf;
        for (int i = 0; i < rf; ++i) dst[i] = f2h(src[i]);
        st.shift[pos[t]] = 0;
        if (!st.present[pos[t]]) {
            st.present[pos[t]] = 1;
            st.ew_mean[pos[t]] = 0.f;
            st.ew_ada[pos[t]] = 0.f;
        }
    }
}

/* Attention of the last queries of this ubatch over the sequence, for one layer. */
void score_layer(Capture &c, SeqStore &st, int slot) {
    const int n_tok = (int) c.pos_buf[slot].size();
    const int nq = c.n_queries;
    const int D = c.head_dim, H = c.n_head, G = c.n_head_kv, rf = c.row_floats();
    const int group = H / G;
    const float inv_layers = 1.0f / (float) c.n_layers;
    std::vector<float> q(D);
    for (int qi = 0; qi < nq; ++qi) {
        const int t = n_tok - nq + qi;
        const int32_t qpos = c.pos_buf[slot][t];
        c.cand_pos.clear();
        for (int32_t p = 0; p < st.n_pos() && p <= qpos; ++p) if (st.present[p]) c.cand_pos.push_back(p);
        const int N = (int) c.cand_pos.size();
        if (N == 0) continue;
        c.weights.assign((size_t) H * N, 0.f);
        for (int h = 0; h < H; ++h) {
            const float *qsrc = c.q_buf[slot].data() + ((size_t) t * H + h) * D;
            for (int d = 0; d < D; ++d) q[d] = c.round_q ? h2f(f2h(qsrc[d])) : qsrc[d];
            const int g = h / group;
            float *w = c.weights.data() + (size_t) h * N;
            float mx = -INFINITY;
            for (int j = 0; j < N; ++j) {
                const uint16_t *kr = st.k.data() + (size_t) c.cand_pos[j] * c.store_row() + (size_t) slot * rf
                                     + (size_t) g * D;
                w[j] = dot_f16(q.data(), kr, D) * c.kq_scale;
                mx = std::max(mx, w[j]);
            }
            double sum = 0.0;
            for (int j = 0; j < N; ++j) { w[j] = expf(w[j] - mx); sum += w[j]; }
            const float inv = (float) (1.0 / sum);
            for (int j = 0; j < N; ++j) w[j] *= inv;
        }
        if (slot == 0 && qi == nq - 1) {
            c.last_w = c.weights;
            c.last_pos = c.cand_pos;
            c.last_query_pos = qpos;
        }
        // query heads -> KV heads
        c.grouped.assign((size_t) G * N, 0.f);
        for (int g = 0; g < G; ++g) {
            float *out = c.grouped.data() + (size_t) g * N;
            for (int m = 0; m < group; ++m) {
                const float *w = c.weights.data() + (size_t) (g * group + m) * N;
                for (int j = 0; j < N; ++j)
                    out[j] = c.gqa_max ? std::max(out[j], w[j]) : out[j] + w[j] / (float) group;
            }
        }
        c.step_mean.assign(N, 0.f);
        for (int g = 0; g < G; ++g)
            for (int j = 0; j < N; ++j) c.step_mean[j] += c.grouped[(size_t) g * N + j] / (float) G;
        c.step_ada.assign(N, 0.f);
        std::vector<int32_t> per_head(G);
        const int b = std::max(1, (int) std::lround(c.keep_fraction * (float) N));
        const int64_t picks = adakv_select(c.grouped.data(), G, N, b, c.alpha, per_head.data(), c.step_ada.data());
        const float inv_picks = picks > 0 ? 1.0f / (float) picks : 0.f;
        const float weight = powf(c.decay, (float) (nq - 1 - qi)) * inv_layers;
        for (int j = 0; j < N; ++j) {
            st.ew_mean[c.cand_pos[j]] += weight * c.step_mean[j];
            st.ew_ada[c.cand_pos[j]] += weight * c.step_ada[j] * inv_picks;
        }
        if (slot == 0) c.queries_scored += 1;
    }
}

void finish_layer(Capture &c, int slot) {
    SeqStore *st = c.seq(c.target_seq);
    if (st == nullptr) return;
    const int n_tok = (int) c.pos_buf[slot].size();
    if (c.layers_done == 0) {                          // first layer of this ubatch
        c.n_queries = st->scored ? std::min(n_tok, n_tok == 1 ? 1 : c.prompt_queries) : 0;
        if (c.n_queries > 0) {
            const float d = powf(c.decay, (float) c.n_queries);
            for (int32_t p = 0; p < st->n_pos(); ++p) { st->ew_mean[p] *= d; st->ew_ada[p] *= d; }
            st->steps += c.n_queries;
        }
    }
    store_k(c, *st, slot);
    if (c.n_queries > 0) score_layer(c, *st, slot);
    c.have_q[slot] = c.have_k[slot] = false;
    c.layers_done = (c.layers_done + 1) % c.n_layers;
}

bool parse_name(const char *name, const char *prefix, int *il) {
    const size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) != 0) return false;
    char *end = nullptr;
    const long v = strtol(name + n, &end, 10);
    if (end == name + n || *end != '\0') return false;
    *il = (int) v;
    return true;
}

void take_probe(Capture &c, const ggml_tensor *t) {
    // kq_soft_max: [n_kv, n_tokens, n_head, n_stream]; take the last token's row of every head.
    const ggml_tensor *mask = t->src[1];
    if (t->type != GGML_TYPE_F32 || mask == nullptr) return;
    const int64_t n_kv = t->ne[0], n_tok = t->ne[1], H = t->ne[2];
    c.probe_n_kv = (int32_t) n_kv;
    c.probe_n_head = (int32_t) H;
    c.probe_w.resize((size_t) H * n_kv);
    for (int64_t h = 0; h < H; ++h)
        ggml_backend_tensor_get(t, c.probe_w.data() + h * n_kv, (size_t) ((n_tok - 1) * t->nb[1] + h * t->nb[2]),
                                (size_t) n_kv * sizeof(float));
    c.probe_mask.resize(n_kv);
    const size_t off = (size_t) ((n_tok - 1) * mask->nb[1]);
    if (mask->type == GGML_TYPE_F32) {
        ggml_backend_tensor_get(mask, c.probe_mask.data(), off, (size_t) n_kv * sizeof(float));
    } else if (mask->type == GGML_TYPE_F16) {
        std::vector<uint16_t> tmp(n_kv);
        ggml_backend_tensor_get(mask, tmp.data(), off, (size_t) n_kv * sizeof(uint16_t));
        for (int64_t i = 0; i < n_kv; ++i) c.probe_mask[i] = h2f(tmp[i]);
    }
}

}  // namespace

extern "C" {

Capture *evoke_attn_new(void) { return new Capture(); }

void evoke_attn_free(Capture *c) { delete c; }

int32_t evoke_attn_configure(Capture *c, const int32_t *layers, int32_t n_layers, int32_t n_head, int32_t n_head_kv,
                             int32_t head_dim, int32_t n_rot, int32_t rope_mode, float freq_base, float freq_scale,
                             float kq_scale) {
    if (n_layers <= 0 || n_layers > kMaxLayers || n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv
        || head_dim <= 0 || n_rot > kMaxRot || (rope_mode != 0 && rope_mode != 2)) return 0;
    c->n_layers = n_layers;
    for (int i = 0; i < n_layers; ++i) c->layers[i] = layers[i];
    c->n_head = n_head;
    c->n_head_kv = n_head_kv;
    c->head_dim = head_dim;
    c->n_rot = n_rot;
    c->rope_mode = rope_mode;
    c->freq_base = freq_base;
    c->freq_scale = freq_scale;
    c->kq_scale = kq_scale;
    c->seqs.clear();
    return 1;
}

void evoke_attn_set_options(Capture *c, int32_t enabled, int32_t gqa_max, float decay, float keep_fraction,
                            float alpha, int32_t prompt_queries, int32_t round_q) {
    c->enabled = enabled != 0;
    c->gqa_max = gqa_max != 0;
    c->decay = decay;
    c->keep_fraction = keep_fraction;
    c->alpha = alpha;
    c->prompt_queries = std::max(1, prompt_queries);
    c->round_q = round_q != 0;
}

void evoke_attn_set_probe(Capture *c, int32_t on) { c->probe = on != 0; }

void evoke_attn_set_scored(Capture *c, int32_t seq, int32_t scored) {
    if (SeqStore *st = c->seq(seq)) st->scored = scored != 0;
}

void evoke_attn_set_target(Capture *c, int32_t seq) {
    for (SeqStore &st : c->seqs) c->apply_shifts(st);     // llama.cpp applies every pending K-shift now
    c->target_seq = seq;
    c->layers_done = 0;
    for (int i = 0; i < kMaxLayers; ++i) c->have_q[i] = c->have_k[i] = false;
}

bool evoke_attn_cb_eval(struct ggml_tensor *t, bool ask, void *user_data) {
    Capture *c = (Capture *) user_data;
    if (c == nullptr || !c->enabled || c->n_layers == 0) return ask ? false : true;
    int il = -1;
    const bool is_q = parse_name(t->name, "Qcur-", &il);
    const bool is_k = !is_q && parse_name(t->name, "Kcur-", &il);
    const bool is_probe = !is_q && !is_k && c->probe && parse_name(t->name, "kq_soft_max-", &il)
                          && il == c->layers[0];
    if (is_probe) {
        if (!ask) take_probe(*c, t);
        return true;
    }
    if ((!is_q && !is_k) || t->op != GGML_OP_ROPE) return ask ? false : true;
    const int slot = c->layer_slot(il);
    if (slot < 0) return ask ? false : true;
    if (ask) return true;
    if (c->target_seq < 0) return true;
    if (is_q) {
        if (t->ne[0] != c->head_dim || t->ne[1] != c->n_head || !copy_rows(t, c->q_buf[slot])) return true;
        c->have_q[slot] = true;
    } else {
        if (t->ne[0] != c->head_dim || t->ne[1] != c->n_head_kv || !copy_rows(t, c->k_buf[slot])) return true;
        const ggml_tensor *pos = t->src[1];
        const int64_t n_tok = t->ne[2];
        if (pos == nullptr || pos->type != GGML_TYPE_I32 || ggml_nelements(pos) < n_tok) return true;
        c->pos_buf[slot].resize(n_tok);
        ggml_backend_tensor_get(pos, c->pos_buf[slot].data(), 0, (size_t) n_tok * sizeof(int32_t));
        c->have_k[slot] = true;
    }
    if (c->have_q[slot] && c->have_k[slot]) finish_layer(*c, slot);
    return true;
}

/* -- the K store kept in step with llama.cpp's sequence operations ----------------------------- */

void evoke_attn_seq_rm(Capture *c, int32_t seq, int32_t p0, int32_t p1) {
    SeqStore *st = c->seq(seq);
    if (st == nullptr) return;
    if (p0 < 0) p0 = 0;
    if (p1 < 0 || p1 > st->n_pos()) p1 = st->n_pos();
    for (int32_t p = p0; p < p1; ++p) {
        st->present[p] = 0;
        st->ew_mean[p] = st->ew_ada[p] = 0.f;
        st->shift[p] = 0;
    }
    int32_t n = st->n_pos();
    while (n > 0 && !st->present[n - 1]) --n;
    if (n < st->n_pos()) {
        st->present.resize(n);
        st->k.resize((size_t) n * c->store_row());
        st->ew_mean.resize(n);
        st->ew_ada.resize(n);
        st->shift.resize(n);
    }
}

/* Positions in [p0, p1) move by delta and owe a rotation by delta (applied before the next decode or
 * read, summed with any other owed shift); those pushed below 0 are dropped. */
void evoke_attn_seq_add(Capture *c, int32_t seq, int32_t p0, int32_t p1, int32_t delta) {
    SeqStore *st = c->seq(seq);
    if (st == nullptr || delta == 0) return;
    if (p0 < 0) p0 = 0;
    if (p1 < 0 || p1 > st->n_pos()) p1 = st->n_pos();
    if (p0 >= p1) return;
    const int row = c->store_row();
    std::vector<int32_t> moving;
    for (int32_t p = p0; p < p1; ++p) if (st->present[p]) moving.push_back(p);
    std::vector<uint16_t> rows(moving.size() * (size_t) row);
    std::vector<float> mean(moving.size()), ada(moving.size());
    std::vector<int32_t> owed(moving.size());
    for (size_t i = 0; i < moving.size(); ++i) {           // lift every moving row out first ...
        const int32_t p = moving[i];
        std::memcpy(rows.data() + i * row, st->k.data() + (size_t) p * row, (size_t) row * 2);
        mean[i] = st->ew_mean[p];
        ada[i] = st->ew_ada[p];
        owed[i] = st->shift[p] + delta;
        st->present[p] = 0;
        st->ew_mean[p] = st->ew_ada[p] = 0.f;
        st->shift[p] = 0;
    }
    for (size_t i = 0; i < moving.size(); ++i) {           // ... then set them down, so overlaps are safe
        const int32_t q = moving[i] + delta;
        if (q < 0) continue;
        c->ensure(*st, q);
        std::memcpy(st->k.data() + (size_t) q * row, rows.data() + i * row, (size_t) row * 2);
        st->present[q] = 1;
        st->ew_mean[q] = mean[i];
        st->ew_ada[q] = ada[i];
        st->shift[q] = owed[i];
        st->has_shift = st->has_shift || owed[i] != 0;
    }
}

void evoke_attn_seq_cp(Capture *c, int32_t src, int32_t dst, int32_t p0, int32_t p1) {
    if (src == dst || src < 0 || dst < 0) return;
    c->seq(std::max(src, dst));                         // grow `seqs` once, before taking pointers
    SeqStore *to = c->seq(dst);
    SeqStore *from = c->seq(src);
    if (from == nullptr || to == nullptr) return;
    if (p0 < 0) p0 = 0;
    if (p1 < 0 || p1 > from->n_pos()) p1 = from->n_pos();
    const int row = c->store_row();
    for (int32_t p = p0; p < p1; ++p) {
        if (!from->present[p]) continue;
        c->ensure(*to, p);
        std::memcpy(to->k.data() + (size_t) p * row, from->k.data() + (size_t) p * row, (size_t) row * 2);
        to->present[p] = 1;
        to->ew_mean[p] = from->ew_mean[p];
        to->ew_ada[p] = from->ew_ada[p];
        to->shift[p] = from->shift[p];
        to->has_shift = to->has_shift || from->shift[p] != 0;
    }
}

/* Rows loaded from llama.cpp's sequence state (f16 K of one chosen layer) at the given positions. */
void evoke_attn_seq_put_f16(Capture *c, int32_t seq, int32_t slot, int64_t n, const int32_t *positions,
                            const uint16_t *rows, int64_t row_stride_bytes) {
    SeqStore *st = c->seq(seq);
    if (st == nullptr || slot < 0 || slot >= c->n_layers) return;
    const int rf = c->row_floats();
    for (int64_t i = 0; i < n; ++i) {
        const int32_t p = positions[i];
        if (p < 0) continue;
        c->ensure(*st, p);
        std::memcpy(st->k.data() + (size_t) p * c->store_row() + (size_t) slot * rf,
                    (const uint8_t *) rows + i * row_stride_bytes, (size_t) rf * 2);
        if (!st->present[p] || slot == 0) { st->ew_mean[p] = 0.f; st->ew_ada[p] = 0.f; }
        st->present[p] = 1;
        st->shift[p] = 0;
    }
}

/* -- reads --------------------------------------------------------------------------------------- */

int32_t evoke_attn_seq_n_pos(Capture *c, int32_t seq) {
    SeqStore *st = c->seq(seq);
    return st ? st->n_pos() : 0;
}

int64_t evoke_attn_seq_steps(Capture *c, int32_t seq) {
    SeqStore *st = c->seq(seq);
    return st ? st->steps : 0;
}

/* Copies [0, n) of present flags, both masses and (if k_out) one layer's f16 K rows. */
int32_t evoke_attn_seq_read(Capture *c, int32_t seq, int32_t n, uint8_t *present, float *ew_mean, float *ew_ada,
                            int32_t slot, uint16_t *k_out) {
    SeqStore *st = c->seq(seq);
    if (st == nullptr) return 0;
    if (k_out) c->apply_shifts(*st);
    n = std::min(n, st->n_pos());
    const int rf = c->row_floats();
    for (int32_t p = 0; p < n; ++p) {
        if (present) present[p] = st->present[p];
        if (ew_mean) ew_mean[p] = st->ew_mean[p];
        if (ew_ada) ew_ada[p] = st->ew_ada[p];
        if (k_out && slot >= 0 && slot < c->n_layers)
            std::memcpy(k_out + (size_t) p * rf, st->k.data() + (size_t) p * c->store_row() + (size_t) slot * rf,
                        (size_t) rf * 2);
    }
    return n;
}

int64_t evoke_attn_queries_scored(Capture *c) { return c->queries_scored; }

/* The last scored query (first chosen layer): per query head weights over its candidate positions. */
int32_t evoke_attn_last(Capture *c, float *weights, int32_t *positions, int32_t cap, int32_t *query_pos) {
    const int32_t n = (int32_t) c->last_pos.size();
    *query_pos = c->last_query_pos;
    if (n > cap) return -n;
    for (int32_t j = 0; j < n; ++j) positions[j] = c->last_pos[j];
    std::memcpy(weights, c->last_w.data(), c->last_w.size() * sizeof(float));
    return n;
}

int32_t evoke_attn_probe(Capture *c, float *weights, float *mask, int32_t cap, int32_t *n_head) {
    *n_head = c->probe_n_head;
    if (c->probe_n_kv > cap) return -c->probe_n_kv;
    std::memcpy(weights, c->probe_w.data(), c->probe_w.size() * sizeof(float));
    std::memcpy(mask, c->probe_mask.data(), c->probe_mask.size() * sizeof(float));
    return c->probe_n_kv;
}

/* Ada-KV on a hand-made or captured matrix (tests, analysis). */
int64_t evoke_attn_adakv(const float *A, int32_t H, int32_t N, int32_t per_head_budget, float alpha,
                         int32_t *picks_per_head, float *counts) {
    return adakv_select(A, H, N, per_head_budget, alpha, picks_per_head, counts);
}

}  // extern "C"
