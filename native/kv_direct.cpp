/* The direct KV data path: a block's cells copied between the KV cache's own layer tensors and host bytes.
 *
 * Owns: finding the cells a sequence's positions occupy (llama.cpp's cell table, read through the internal
 * headers of the llama.cpp the installed llama-cpp-python was built from: build/llama-src), copying their K and
 * V rows with ggml_backend_tensor_get / _set (one run per layer and per K and V where the cells are contiguous,
 * else one per run of contiguous cells; V stored transposed: one run per channel), and placing restored cells.
 * On a host buffer (the CPU backend) the RoPE re-anchor is fused with the copy: K rows are rotated where they
 * land, with exactly the arithmetic of native/rope_reanchor.c (the engine calibrates that rotation against
 * llama.cpp's own K-shift). Elsewhere (a GPU) the rows are copied as saved and the cells carry the shift, which
 * llama.cpp's K-shift graph applies on the device at the next decode. On a host buffer the engine also applies an
 * eviction's pending K-shift here (evoke_kvd_apply_shift): only the moved cells' K rows, where llama.cpp's K-shift
 * graph rotates every cell of the cache.
 *
 * The host bytes are llama.cpp's one-sequence state format (llama_state_seq_get_data: magic, seq id, n_stream,
 * n_cells, 12-byte cell records in cell order, v_trans, n_layer, per layer K then V), byte for byte, so KV files,
 * the 8/4-bit packer, state_cells.cut and the serialised fallback read what this writes and the reverse.
 *
 * Invariants: only a plain llama_kv_cache (no SWA, no shared cells with another cache, no per-cell extension)
 * is served: evoke_kvd_open says why not otherwise and the engine keeps the serialised path; nothing is written
 * unless the whole blob fits this cache (types, row sizes, layer count, length); a restore never takes cells
 * that are in use nor positions the sequence already holds. Only the engine thread calls in.
 */
#include <algorithm>
#include <bitset>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ggml.h"
#include "ggml-backend.h"
#include "llama.h"

// The cell table and the layer tensors are private members of llama_kv_cache: the layout is the one libllama
// was compiled with (the same headers), only access changes.
#define private public
#include "llama-kv-cache.h"
#undef private

#if defined(__F16C__)
#include <immintrin.h>
static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
static inline uint16_t f2h(float f) { return _cvtss_sh(f, 0); }   // round to nearest even, as (_Float16)
#else
static inline float h2f(uint16_t h) { return ggml_fp16_to_fp32((ggml_fp16_t) h); }
static inline uint16_t f2h(float f) { return (uint16_t) ggml_fp32_to_fp16(f); }
#endif

namespace {

constexpr uint32_t kStateMagic = 0xaf143cd8u;   // llama-context.cpp's io_magic
constexpr int kMaxRot = 1024;

enum Status : int64_t {
    kOk = 0,
    kBadRange = -1,       // the sequence does not hold every position of the range once
    kUnfit = -2,          // the blob is not a one-sequence state of this cache's shape
    kNoRoom = -3,         // not enough free cells
    kTaken = -4,          // the sequence already holds a target position
    kSmallBuffer = -5,
    kBadSeq = -6,
};

struct Rope {
    int mode = 0, n_head_kv = 0, head_dim = 0, n_rot = 0;
    float cos_t[kMaxRot / 2], sin_t[kMaxRot / 2];
    float cos_pairs[kMaxRot], sin_pairs[kMaxRot];      // NORM's vector lanes: (c, c) and (-s, s) per pair

    /* the rotation tables of rope_reanchor.c, same recurrence */
    bool init(int n_head_kv_, int head_dim_, int n_rot_, int mode_, float delta, float freq_base,
              float freq_scale) {
        if (n_rot_ > kMaxRot || n_rot_ > head_dim_ || n_rot_ % 2) return false;
        mode = mode_, n_head_kv = n_head_kv_, head_dim = head_dim_, n_rot = n_rot_;
        const float theta_scale = ::powf(freq_base, -2.0f / (float) n_rot);
        float theta = delta * freq_scale;
        for (int i = 0; i < n_rot / 2; ++i) {
            cos_t[i] = ::cosf(theta);
            sin_t[i] = ::sinf(theta);
            theta *= theta_scale;
        }
        for (int i = 0; i < n_rot / 2; ++i) {
            cos_pairs[2 * i] = cos_pairs[2 * i + 1] = cos_t[i];
            sin_pairs[2 * i] = -sin_t[i];
            sin_pairs[2 * i + 1] = sin_t[i];
        }
        return true;
    }

    /* n_rows K rows (f16) from src rotated into dst (may be the same rows), as evoke_rope_shift_f16 computes
     * them: products rounded to f32, then summed, no fused multiply-add, so the vector lanes give the same bits */
    void apply(uint16_t *dst, const uint16_t *src, int64_t n_rows) const {
        const int64_t n_vec = n_rows * n_head_kv;
        const int half = n_rot / 2;
        for (int64_t v = 0; v < n_vec; ++v) {
            const uint16_t *x = src + v * head_dim;
            uint16_t *y = dst + v * head_dim;
            int i = 0;
            if (mode == 2) {
#if defined(__F16C__) && defined(__AVX__)
                for (; i + 8 <= half; i += 8) {
                    const __m256 x0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (x + i)));
                    const __m256 x1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (x + i + half)));
                    const __m256 c = _mm256_loadu_ps(cos_t + i), sn = _mm256_loadu_ps(sin_t + i);
                    const __m256 lo = _mm256_sub_ps(_mm256_mul_ps(x0, c), _mm256_mul_ps(x1, sn));
                    const __m256 hi = _mm256_add_ps(_mm256_mul_ps(x0, sn), _mm256_mul_ps(x1, c));
                    _mm_storeu_si128((__m128i *) (y + i), _mm256_cvtps_ph(lo, 0));
                    _mm_storeu_si128((__m128i *) (y + i + half), _mm256_cvtps_ph(hi, 0));
                }
#endif
                for (; i < half; ++i) {
                    const float x0 = h2f(x[i]), x1 = h2f(x[i + half]);
                    y[i] = f2h(x0 * cos_t[i] - x1 * sin_t[i]);
                    y[i + half] = f2h(x0 * sin_t[i] + x1 * cos_t[i]);
                }
            } else {
#if defined(__F16C__) && defined(__AVX__)
                for (; i + 4 <= half; i += 4) {          // 4 adjacent pairs: lanes (x0 x1) per pair
                    const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (x + 2 * i)));
                    const __m256 b = _mm256_permute_ps(a, 0xB1);                 // (x1 x0) per pair
                    const __m256 c = _mm256_loadu_ps(cos_pairs + 2 * i);          // (c c)
                    const __m256 sn = _mm256_loadu_ps(sin_pairs + 2 * i);         // (-s s)
                    // even lane: x0*c + (-(x1*s)) == x0*c - x1*s; odd lane: x1*c + x0*s == x0*s + x1*c
                    const __m256 out = _mm256_add_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, sn));
                    _mm_storeu_si128((__m128i *) (y + 2 * i), _mm256_cvtps_ph(out, 0));
                }
#endif
                for (; i < half; ++i) {
                    const float x0 = h2f(x[2 * i]), x1 = h2f(x[2 * i + 1]);
                    y[2 * i] = f2h(x0 * cos_t[i] - x1 * sin_t[i]);
                    y[2 * i + 1] = f2h(x0 * sin_t[i] + x1 * cos_t[i]);
                }
            }
            if (y != x) std::memcpy(y + n_rot, x + n_rot, (size_t) (head_dim - n_rot) * 2);
        }
    }
};

int g_test_row_offset = 0;   // tests only: land rows this many cells off the cell table (a wrong-cells bug)

struct Handle {
    llama_context *ctx = nullptr;
    llama_kv_cache *kv = nullptr;
    std::vector<uint32_t> cells;      // scratch: the cells of a range, ascending
    std::vector<llama_pos> positions;
};

struct Run {
    uint32_t cell;    // first cell
    uint32_t first;   // index of its first row in the blob
    uint32_t n;
};

/* maximal runs of consecutive cells, in the (ascending) order given */
void runs_of(const std::vector<uint32_t> &cells, std::vector<Run> &out) {
    out.clear();
    for (uint32_t i = 0; i < cells.size(); ++i) {
        if (!out.empty() && out.back().cell + out.back().n == cells[i]) {
            ++out.back().n;
        } else {
            out.push_back({cells[i], i, 1});
        }
    }
}

bool host(const ggml_tensor *t) { return t->buffer && ggml_backend_buffer_is_host(t->buffer); }

/* bytes of one sequence's state for n cells of this cache */
int64_t state_size(const llama_kv_cache *kv, uint32_t strm, int64_t n) {
    int64_t size = 4 + 4 + 4 + 4 + 12 * n + 8;
    for (const auto &layer : kv->layers) {
        const ggml_tensor *k = layer.k_stream[strm];
        size += 12 + n * (int64_t) ggml_row_size(k->type, k->ne[0]);
    }
    for (const auto &layer : kv->layers) {
        const ggml_tensor *v = layer.v_stream[strm];
        if (!v) continue;
        size += kv->v_trans ? 12 + n * v->ne[0] * (int64_t) ggml_type_size(v->type)
                            : 12 + n * (int64_t) ggml_row_size(v->type, v->ne[0]);
    }
    return size;
}

/* the cells of positions [p0, p1) of seq, ascending by cell; false unless each position is held once */
bool range_cells(Handle *h, int seq, uint32_t strm, int32_t p0, int32_t p1) {
    const auto &cells = h->kv->v_cells[strm];
    const auto &by_pos = cells.seq_pos_get(seq);
    h->cells.clear();
    int32_t expect = p0;
    for (auto it = by_pos.lower_bound({p0, 0u}); it != by_pos.end() && it->first < p1; ++it) {
        if (it->first != expect) return false;
        h->cells.push_back(it->second);
        ++expect;
    }
    if (expect != p1) return false;
    std::sort(h->cells.begin(), h->cells.end());
    return true;
}

struct Writer {
    uint8_t *p;
    template <typename T> void put(T v) { std::memcpy(p, &v, sizeof v); p += sizeof v; }
};

struct Reader {
    const uint8_t *p, *end;
    template <typename T> bool get(T &v) {
        if (end - p < (ptrdiff_t) sizeof v) return false;
        std::memcpy(&v, p, sizeof v);
        p += sizeof v;
        return true;
    }
    bool skip(int64_t n) {
        if (n < 0 || end - p < n) return false;
        p += n;
        return true;
    }
};

/* copy n rows of `row` bytes between the cache tensor (cell..cell+n) and host memory */
void rows_out(const ggml_tensor *t, size_t row, uint32_t cell, uint32_t n, uint8_t *dst) {
    if (host(t)) {
        std::memcpy(dst, (const uint8_t *) t->data + (size_t) cell * row, (size_t) n * row);
    } else {
        ggml_backend_tensor_get(t, dst, (size_t) cell * row, (size_t) n * row);
    }
}

void rows_in(ggml_tensor *t, size_t row, uint32_t cell, uint32_t n, const uint8_t *src) {
    if (host(t)) {
        std::memcpy((uint8_t *) t->data + (size_t) cell * row, src, (size_t) n * row);
    } else {
        ggml_backend_tensor_set(t, src, (size_t) cell * row, (size_t) n * row);
    }
}

/* fn(l0, l1) over [0, n_layers) in a few threads when `parallel` (host buffers, a block worth it), else at once */
template <typename F> void run_layers(size_t n_layers, bool parallel, F &&fn) {
    static const size_t most = [] {          // EVOKE_KVD_THREADS caps the threads (1: one thread)
        const char *env = std::getenv("EVOKE_KVD_THREADS");
        const long asked = env ? std::strtol(env, nullptr, 10) : 0;
        const size_t cores = std::max(1u, std::thread::hardware_concurrency());
        return asked > 0 ? std::min<size_t>((size_t) asked, cores) : std::min<size_t>(cores, 8);
    }();
    size_t threads = parallel ? most : 1;
    threads = std::min(threads, n_layers);
    if (threads <= 1) {
        fn((size_t) 0, n_layers);
        return;
    }
    const size_t per = (n_layers + threads - 1) / threads;
    std::vector<std::thread> pool;
    for (size_t t = 1; t < threads && t * per < n_layers; ++t) {
        pool.emplace_back([&fn, t, per, n_layers] { fn(t * per, std::min(n_layers, (t + 1) * per)); });
    }
    fn((size_t) 0, std::min(per, n_layers));
    for (auto &thread : pool) thread.join();
}

constexpr int64_t kParallelBytes = 4 << 20;     // below this, threads cost more than they save

bool all_on_host(const llama_kv_cache *kv) {
    for (const auto &layer : kv->layers) {
        if (!host(layer.k) || (layer.v && !host(layer.v))) return false;
    }
    return true;
}

}  // namespace

extern "C" {

/* A handle on ctx's KV cache, or NULL with the reason in `why`. */
void *evoke_kvd_open(llama_context *ctx, char *why, size_t why_len) {
    auto fail = [&](const char *reason) -> void * {
        if (why && why_len) std::snprintf(why, why_len, "%s", reason);
        return nullptr;
    };
    llama_memory_t mem = llama_get_memory(ctx);
    if (!mem) return fail("the context has no memory");
    auto *base = reinterpret_cast<llama_memory_i *>(mem);
    if (std::strcmp(typeid(*base).name(), "14llama_kv_cache") != 0) {
        return fail("the memory is not a plain KV cache (sliding-window, hybrid or recurrent)");
    }
    auto *kv = static_cast<llama_kv_cache *>(base);
    if (kv->other) return fail("the cache shares its cells with another cache");
    if (kv->n_swa != 0 || kv->swa_type != LLAMA_SWA_TYPE_NONE) return fail("a sliding-window cache");
    if (kv->hparams.ple_n_heads > 0) return fail("the cache keeps per-cell token ids");
    const llama_model *model = llama_get_model(ctx);
    const int rope = llama_model_rope_type(model);
    if (rope != LLAMA_ROPE_TYPE_NONE && rope != LLAMA_ROPE_TYPE_NORM && rope != LLAMA_ROPE_TYPE_NEOX) {
        return fail("multi-axis RoPE keeps 2D positions per cell");
    }
    const uint32_t n_stream = kv->n_stream;
    if (kv->layers.empty() || kv->layers.size() > 4096 || n_stream == 0 || n_stream > LLAMA_MAX_SEQ ||
        kv->v_cells.size() != n_stream || kv->seq_to_stream.empty()) {
        return fail("the cache's layout is not the one these headers describe");
    }
    for (const auto &layer : kv->layers) {
        if (layer.k_stream.size() != n_stream || layer.v_stream.size() != n_stream || !layer.k) {
            return fail("the cache's layer tensors are not the ones these headers describe");
        }
        for (uint32_t s = 0; s < n_stream; ++s) {
            const ggml_tensor *k = layer.k_stream[s], *v = layer.v_stream[s];
            if (!k || !v || k->ne[1] != (int64_t) kv->v_cells[s].size() || v->ne[1] != k->ne[1] ||
                std::strncmp(ggml_get_name(layer.k), "cache_k", 7) != 0) {
                return fail("the cache's tensors do not match its cell table");
            }
            if (ggml_is_quantized(v->type) && kv->v_trans) return fail("a quantised transposed V");
        }
    }
    auto *h = new Handle();
    h->ctx = ctx;
    h->kv = kv;
    return h;
}

void evoke_kvd_close(void *handle) { delete static_cast<Handle *>(handle); }

/* 1 when the cache's tensors live in host memory (the re-anchor can be fused with the copy), else 0 */
int evoke_kvd_on_host(void *handle) {
    auto *h = static_cast<Handle *>(handle);
    for (const auto &layer : h->kv->layers) {
        if (!host(layer.k) || (layer.v && !host(layer.v))) return 0;
    }
    return 1;
}

/* 1 when a K-shift is pending in the cache (cells moved since the last decode) */
int evoke_kvd_has_shift(void *handle) {
    auto *h = static_cast<Handle *>(handle);
    for (const auto &cells : h->kv->v_cells) {
        if (cells.get_has_shift()) return 1;
    }
    return 0;
}

/* Apply every pending K-shift on host buffers, as llama.cpp's K-shift graph would at the next decode, but only
 * over the cells that owe one: their K rows (f16) rotated in place by what they owe, with the arithmetic of the
 * fused restore (the rope_* parameters as evoke_rope_shift_f16's), then every shift cleared. Returns the cells
 * rotated, or kUnfit (nothing changed) where a K tensor is not f16 on a host buffer of that width. */
int64_t evoke_kvd_apply_shift(void *handle, int32_t n_head_kv, int32_t head_dim, int32_t n_rot, int32_t mode,
                              float freq_base, float freq_scale) {
    auto *h = static_cast<Handle *>(handle);
    llama_kv_cache *kv = h->kv;
    for (const auto &layer : kv->layers) {
        for (const ggml_tensor *k : layer.k_stream) {
            if (k && (k->type != GGML_TYPE_F16 || !host(k) || k->ne[0] != (int64_t) n_head_kv * head_dim)) {
                return kUnfit;
            }
        }
    }
    int64_t rotated = 0;
    for (uint32_t strm = 0; strm < kv->v_cells.size(); ++strm) {
        auto &cells = kv->v_cells[strm];
        if (!cells.get_has_shift()) continue;
        std::map<int32_t, std::vector<uint32_t>> owing;          // shift -> its cells, ascending
        for (uint32_t i = 0; i < cells.size(); ++i) {
            if (!cells.is_empty(i) && cells.get_shift(i) != 0) owing[cells.get_shift(i)].push_back(i);
        }
        for (const auto &[shift, list] : owing) {
            Rope rope;
            if (!rope.init(n_head_kv, head_dim, n_rot, mode, (float) shift, freq_base, freq_scale)) return kUnfit;
            std::vector<Run> runs;
            runs_of(list, runs);
            const size_t row = (size_t) n_head_kv * head_dim * 2;
            auto rotate = [&](size_t l0, size_t l1) {
                for (size_t il = l0; il < l1; ++il) {
                    ggml_tensor *k = kv->layers[il].k_stream[strm];
                    for (const Run &run : runs) {
                        auto *rows = (uint16_t *) ((uint8_t *) k->data + (size_t) run.cell * row);
                        rope.apply(rows, rows, run.n);
                    }
                }
            };
            run_layers(kv->layers.size(), (int64_t) list.size() * row * kv->layers.size() >= kParallelBytes, rotate);
            rotated += (int64_t) list.size();
        }
        cells.reset_shift();
    }
    return rotated;
}

/* Bytes the state of [p0, p1) of seq takes, or a negative Status. */
int64_t evoke_kvd_save_size(void *handle, int32_t seq, int32_t p0, int32_t p1) {
    auto *h = static_cast<Handle *>(handle);
    if (seq < 0 || (size_t) seq >= h->kv->seq_to_stream.size() || p1 <= p0) return kBadSeq;
    return state_size(h->kv, h->kv->seq_to_stream[seq], (int64_t) p1 - p0);
}

/* A save planned on the engine thread (cells found, header and cell records written) whose rows any thread may
 * copy, as long as the cells are not written meanwhile (the engine joins before its next decode or restore). */
struct SavePlan {
    llama_kv_cache *kv;
    uint32_t strm;
    uint32_t n;
    std::vector<Run> runs;
    uint8_t *out;
    uint8_t *rows;       // where the first tensor header goes
    int64_t size;
};

/* Plan the save of [p0, p1) of seq into out (cap bytes): the header and cell records written as
 * llama_state_seq_get_data writes them for a sequence `as_seq` holding exactly those cells. Returns the plan
 * (for evoke_kvd_save_rows, which frees it), or NULL with a negative Status in *status. */
void *evoke_kvd_save_plan(void *handle, int32_t seq, int32_t p0, int32_t p1, int32_t as_seq, uint8_t *out,
                          int64_t cap, int64_t *status) {
    auto *h = static_cast<Handle *>(handle);
    llama_kv_cache *kv = h->kv;
    *status = kOk;
    if (seq < 0 || (size_t) seq >= kv->seq_to_stream.size() || p1 <= p0) { *status = kBadSeq; return nullptr; }
    const uint32_t strm = kv->seq_to_stream[seq];
    const int64_t size = state_size(kv, strm, (int64_t) p1 - p0);
    if (cap < size) { *status = kSmallBuffer; return nullptr; }
    if (!range_cells(h, seq, strm, p0, p1)) { *status = kBadRange; return nullptr; }
    const auto &cells = kv->v_cells[strm];
    auto *plan = new SavePlan{kv, strm, (uint32_t) h->cells.size(), {}, out, nullptr, size};
    runs_of(h->cells, plan->runs);
    Writer w{out};
    w.put<uint32_t>(kStateMagic);
    w.put<int32_t>(as_seq);
    w.put<uint32_t>(1);
    w.put<uint32_t>(plan->n);
    for (uint32_t c : h->cells) {
        w.put<int32_t>(cells.pos_get(c));
        w.put<uint32_t>(1);
        w.put<int32_t>(as_seq);
    }
    w.put<uint32_t>(kv->v_trans ? 1 : 0);
    w.put<uint32_t>((uint32_t) kv->layers.size());
    plan->rows = w.p;
    return plan;
}

/* Copy the planned rows (any thread; reads the cache's tensors only) and free the plan. Returns the bytes of the
 * whole state, or kUnfit where the walk did not end at its last byte. */
int64_t evoke_kvd_save_rows(void *plan_ptr) {
    std::unique_ptr<SavePlan> plan(static_cast<SavePlan *>(plan_ptr));
    llama_kv_cache *kv = plan->kv;
    const uint32_t strm = plan->strm, n = plan->n;
    const std::vector<Run> &runs = plan->runs;
    const size_t n_layer = kv->layers.size();
    std::vector<uint8_t *> k_dst(n_layer), v_dst(n_layer, nullptr);
    Writer w{plan->rows};                                  // headers first, each layer's place noted
    for (size_t il = 0; il < n_layer; ++il) {
        const ggml_tensor *k = kv->layers[il].k_stream[strm];
        const size_t row = ggml_row_size(k->type, k->ne[0]);
        w.put<int32_t>((int32_t) k->type);
        w.put<uint64_t>(row);
        k_dst[il] = w.p;
        w.p += (size_t) n * row;
    }
    for (size_t il = 0; il < n_layer; ++il) {
        const ggml_tensor *v = kv->layers[il].v_stream[strm];
        if (!v) continue;
        w.put<int32_t>((int32_t) v->type);
        if (!kv->v_trans) {
            const size_t row = ggml_row_size(v->type, v->ne[0]);
            w.put<uint64_t>(row);
            v_dst[il] = w.p;
            w.p += (size_t) n * row;
        } else {
            const uint32_t el = (uint32_t) ggml_type_size(v->type), n_embd = (uint32_t) v->ne[0];
            w.put<uint32_t>(el);
            w.put<uint32_t>(n_embd);
            v_dst[il] = w.p;
            w.p += (size_t) n * n_embd * el;
        }
    }
    if (w.p - plan->out != plan->size) return kUnfit;
    auto copy = [&](size_t l0, size_t l1) {
        for (size_t il = l0; il < l1; ++il) {
            const ggml_tensor *k = kv->layers[il].k_stream[strm];
            const size_t row = ggml_row_size(k->type, k->ne[0]);
            for (const Run &r : runs) rows_out(k, row, r.cell, r.n, k_dst[il] + (size_t) r.first * row);
            const ggml_tensor *v = kv->layers[il].v_stream[strm];
            if (!v) continue;
            if (!kv->v_trans) {
                const size_t vrow = ggml_row_size(v->type, v->ne[0]);
                for (const Run &r : runs) rows_out(v, vrow, r.cell, r.n, v_dst[il] + (size_t) r.first * vrow);
                continue;
            }
            const uint32_t el = (uint32_t) ggml_type_size(v->type), n_embd = (uint32_t) v->ne[0];
            const size_t kv_size = (size_t) v->ne[1];
            const bool on_host = host(v);
            uint8_t *dst = v_dst[il];
            for (uint32_t j = 0; j < n_embd; ++j, dst += (size_t) n * el) {
                for (const Run &r : runs) {
                    const size_t offset = ((size_t) r.cell + j * kv_size) * el;
                    uint8_t *out = dst + (size_t) r.first * el;
                    if (on_host) std::memcpy(out, (const uint8_t *) v->data + offset, (size_t) r.n * el);
                    else ggml_backend_tensor_get(v, out, offset, (size_t) r.n * el);
                }
            }
        }
    };
    run_layers(n_layer, plan->size >= kParallelBytes && all_on_host(kv), copy);
    return plan->size;
}

/* Drop a plan without copying (the save was abandoned). */
void evoke_kvd_save_cancel(void *plan_ptr) { delete static_cast<SavePlan *>(plan_ptr); }

/* The state of [p0, p1) of seq into out (cap bytes) at once: plan and rows. Returns the bytes written or a
 * negative Status. */
int64_t evoke_kvd_save(void *handle, int32_t seq, int32_t p0, int32_t p1, int32_t as_seq, uint8_t *out,
                       int64_t cap) {
    int64_t status;
    void *plan = evoke_kvd_save_plan(handle, seq, p0, p1, as_seq, out, cap, &status);
    return plan ? evoke_kvd_save_rows(plan) : status;
}

/* Place the cells of `blob` (a state written by evoke_kvd_save or llama_state_seq_get_data) into seq at their
 * positions + delta. rotate != 0: K rows (f16, host buffers only) are rotated by delta as they land (the rope_*
 * parameters as evoke_rope_shift_f16's); else, with delta != 0, the cells take the delta as a pending K-shift.
 * cells_out (n_cells entries, may be NULL) receives the cells used, in blob order. Returns the cells placed or a
 * negative Status (nothing changed then). */
int64_t evoke_kvd_restore(void *handle, const uint8_t *blob, int64_t size, int32_t seq, int32_t delta,
                          int32_t rotate, int32_t n_head_kv, int32_t head_dim, int32_t n_rot, int32_t mode,
                          float freq_base, float freq_scale, uint32_t *cells_out) {
    auto *h = static_cast<Handle *>(handle);
    llama_kv_cache *kv = h->kv;
    if (seq < 0 || (size_t) seq >= kv->seq_to_stream.size()) return kBadSeq;
    const uint32_t strm = kv->seq_to_stream[seq];
    auto &cells = kv->v_cells[strm];

    // 1. the header and the cell records
    Reader r{blob, blob + size};
    uint32_t magic, n_stream, n;
    int32_t saved_seq;
    if (!r.get(magic) || magic != kStateMagic || !r.get(saved_seq) || !r.get(n_stream) || n_stream != 1 ||
        !r.get(n) || n == 0 || n > cells.size()) {
        return kUnfit;
    }
    if (state_size(kv, strm, n) != size) return kUnfit;
    h->positions.resize(n);
    for (uint32_t i = 0; i < n; ++i) {
        int32_t pos, id;
        uint32_t n_seq;
        r.get(pos);
        r.get(n_seq);
        r.get(id);
        if (n_seq != 1) return kUnfit;
        h->positions[i] = pos + delta;
        if (h->positions[i] < 0) return kUnfit;
    }
    uint32_t v_trans, n_layer;
    r.get(v_trans);
    r.get(n_layer);
    if (v_trans != (kv->v_trans ? 1u : 0u) || n_layer != kv->layers.size()) return kUnfit;

    // 2. every tensor header must fit before anything is written
    const uint8_t *data_start = r.p;
    for (const auto &layer : kv->layers) {
        const ggml_tensor *k = layer.k_stream[strm];
        int32_t type;
        uint64_t row;
        if (!r.get(type) || !r.get(row) || type != (int32_t) k->type || row != ggml_row_size(k->type, k->ne[0]) ||
            !r.skip((int64_t) n * row)) {
            return kUnfit;
        }
    }
    for (const auto &layer : kv->layers) {
        const ggml_tensor *v = layer.v_stream[strm];
        if (!v) continue;
        int32_t type;
        if (!r.get(type) || type != (int32_t) v->type) return kUnfit;
        if (!v_trans) {
            uint64_t row;
            if (!r.get(row) || row != ggml_row_size(v->type, v->ne[0]) || !r.skip((int64_t) n * row)) return kUnfit;
        } else {
            uint32_t el, n_embd;
            if (!r.get(el) || !r.get(n_embd) || el != ggml_type_size(v->type) || n_embd != v->ne[0] ||
                !r.skip((int64_t) n * n_embd * el)) {
                return kUnfit;
            }
        }
    }
    Rope rope;
    if (rotate) {
        if (!rope.init(n_head_kv, head_dim, n_rot, mode, (float) delta, freq_base, freq_scale)) return kUnfit;
        for (const auto &layer : kv->layers) {
            const ggml_tensor *k = layer.k_stream[strm];
            if (k->type != GGML_TYPE_F16 || !host(k) || k->ne[0] != (int64_t) n_head_kv * head_dim) return kUnfit;
        }
    }

    // 3. the target positions must be free in seq
    const auto &by_pos = cells.seq_pos_get(seq);
    for (llama_pos p : h->positions) {
        auto it = by_pos.lower_bound({p, 0u});
        if (it != by_pos.end() && it->first == p) return kTaken;
    }
    // the cells llama_kv_cache::find_slot (not contiguous, as a state load asks) would give these tokens, so a
    // block lands where llama.cpp's own load puts it: the same cells, the same attention order, the same logits
    const uint32_t n_cells = cells.size();
    h->cells.clear();
    uint32_t head_cur = kv->v_heads[strm];
    if (head_cur > cells.get_used() + 2 * n) head_cur = 0;
    for (uint32_t n_tested = 0; h->cells.size() < n;) {
        if (head_cur + 1 > n_cells) {
            n_tested += n_cells - head_cur;
            head_cur = 0;
            continue;
        }
        const uint32_t idx = head_cur++;
        ++n_tested;
        if (cells.is_empty(idx)) h->cells.push_back(idx);
        if (h->cells.size() == n) break;
        if (n_tested >= n_cells) return kNoRoom;
    }
    std::vector<Run> runs;
    runs_of(h->cells, runs);

    // 4. the rows, K rotated where they land when asked
    if (g_test_row_offset) {
        for (Run &run : runs) run.cell = (run.cell + g_test_row_offset) % (n_cells - run.n + 1);
    }
    const size_t n_layers = kv->layers.size();
    std::vector<const uint8_t *> k_src(n_layers), v_src(n_layers, nullptr);
    r.p = data_start;                                      // each layer's rows in the blob (checked above)
    for (size_t il = 0; il < n_layers; ++il) {
        const ggml_tensor *k = kv->layers[il].k_stream[strm];
        r.skip(12);
        k_src[il] = r.p;
        r.p += (size_t) n * ggml_row_size(k->type, k->ne[0]);
    }
    for (size_t il = 0; il < n_layers; ++il) {
        const ggml_tensor *v = kv->layers[il].v_stream[strm];
        if (!v) continue;
        r.skip(12);
        v_src[il] = r.p;
        r.p += v_trans ? (size_t) n * v->ne[0] * ggml_type_size(v->type) : (size_t) n * ggml_row_size(v->type, v->ne[0]);
    }
    auto copy = [&](size_t l0, size_t l1) {
        for (size_t il = l0; il < l1; ++il) {
            ggml_tensor *k = kv->layers[il].k_stream[strm];
            const size_t row = ggml_row_size(k->type, k->ne[0]);
            for (const Run &run : runs) {
                const uint8_t *src = k_src[il] + (size_t) run.first * row;
                if (rotate) {       // host buffer (checked above): rotated from the blob straight into its cells
                    rope.apply((uint16_t *) ((uint8_t *) k->data + (size_t) run.cell * row), (const uint16_t *) src,
                               run.n);
                } else {
                    rows_in(k, row, run.cell, run.n, src);
                }
            }
            ggml_tensor *v = kv->layers[il].v_stream[strm];
            if (!v) continue;
            if (!v_trans) {
                const size_t vrow = ggml_row_size(v->type, v->ne[0]);
                for (const Run &run : runs) rows_in(v, vrow, run.cell, run.n, v_src[il] + (size_t) run.first * vrow);
                continue;
            }
            const uint32_t el = (uint32_t) ggml_type_size(v->type), n_embd = (uint32_t) v->ne[0];
            const size_t kv_size = (size_t) v->ne[1];
            const bool on_host = host(v);
            const uint8_t *src_row = v_src[il];
            for (uint32_t j = 0; j < n_embd; ++j, src_row += (size_t) n * el) {
                for (const Run &run : runs) {
                    const size_t offset = ((size_t) run.cell + j * kv_size) * el;
                    const uint8_t *src = src_row + (size_t) run.first * el;
                    if (on_host) std::memcpy((uint8_t *) v->data + offset, src, (size_t) run.n * el);
                    else ggml_backend_tensor_set(v, src, offset, (size_t) run.n * el);
                }
            }
        }
    };
    run_layers(n_layers, size >= kParallelBytes && all_on_host(kv), copy);

    // 5. the cells: at the saved positions, moved by delta as a pending shift unless K was rotated here
    const int32_t pending = rotate ? 0 : delta;
    for (uint32_t i = 0; i < n; ++i) {
        const uint32_t c = h->cells[i];
        cells.pos_set(c, h->positions[i] - pending);
        cells.seq_add(c, seq);
        if (pending) cells.pos_add(c, pending);
        if (cells_out) cells_out[i] = c;
    }
    return n;                           // the search head stays where it was, as after llama.cpp's own load
}

/* Tests only: make restores copy rows `offset` cells away from the cells they mark (0: off). */
void evoke_kvd_set_test_row_offset(int32_t offset) { g_test_row_offset = offset; }

/* The cell holding position pos of seq, or -1 (tests: where a restore landed). */
int64_t evoke_kvd_cell_of(void *handle, int32_t seq, int32_t pos) {
    auto *h = static_cast<Handle *>(handle);
    if (seq < 0 || (size_t) seq >= h->kv->seq_to_stream.size()) return kBadSeq;
    const auto &by_pos = h->kv->v_cells[h->kv->seq_to_stream[seq]].seq_pos_get(seq);
    auto it = by_pos.lower_bound({pos, 0u});
    return it != by_pos.end() && it->first == pos ? (int64_t) it->second : -1;
}

}  // extern "C"
