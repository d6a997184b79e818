/* The 8/4-bit host tier's kernels: pack and unpack every layer's K (or V) of a saved block in one pass.
 *
 * Owns the arithmetic of evoke_engine/kvcache/kvquant.py's numpy path, bit for bit (the Python module checks the
 * two agree when it loads this library and keeps numpy otherwise): per group, minimum and step in f16, the step
 * one f16 ulp up where its rounding fell short of the span, codes = clip(rint((x - min) / step), 0, levels);
 * unpacked values f16(code * step + min). f32 arithmetic, no fused multiply-add (-ffp-contract=off), rounding
 * to nearest even throughout. Layout per layer: minimums, steps (f16, in the order of the groups of each line),
 * codes in line order (a line is a row when scaled per row, a column otherwise), at 4 bits two per byte, low
 * nibble first, the layer's codes padded to a whole byte.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float h2f(uint16_t h) { _Float16 v; memcpy(&v, &h, 2); return (float) v; }
static inline uint16_t f2h(float f) { _Float16 v = (_Float16) f; uint16_t h; memcpy(&h, &v, 2); return h; }

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define KVQ_SIMD 1
static inline __m256 load8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) p)); }
static inline int nonfinite8(const uint16_t *p) {
    const __m128i e = _mm_and_si128(_mm_loadu_si128((const __m128i *) p), _mm_set1_epi16(0x7C00));
    return _mm_movemask_epi8(_mm_cmpeq_epi16(e, _mm_set1_epi16(0x7C00)));
}
/* 8 codes: clip(rint((x - lo) / div), 0, levels) as bytes (the scalar path's arithmetic, lane by lane) */
static inline void codes8(__m256 x, __m256 lo, __m256 div, __m256 levels, uint8_t *dst) {
    __m256 q = _mm256_div_ps(_mm256_sub_ps(x, lo), div);
    q = _mm256_round_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm256_min_ps(_mm256_max_ps(q, _mm256_setzero_ps()), levels);
    const __m256i qi = _mm256_cvtps_epi32(q);
    const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(qi), _mm256_extracti128_si256(qi, 1));
    _mm_storel_epi64((__m128i *) dst, _mm_packus_epi16(w, w));
}
/* 8 values f16(code * step + lo) */
static inline void values8(const uint8_t *codes, __m256 step, __m256 lo, uint16_t *dst) {
    const __m256 c = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *) codes)));
    _mm_storeu_si128((__m128i *) dst, _mm256_cvtps_ph(_mm256_add_ps(_mm256_mul_ps(c, step), lo), 0));
}
#endif

/* the step of a group of span `span` (one f16 ulp up where rounding fell short) and its divisor */
static inline uint16_t step_of(float span, int32_t levels, float *div) {
    uint16_t step = f2h(span / (float) levels);
    if (h2f(step) * (float) levels < span) step = (uint16_t) (step + 1);    /* one ulp up (step >= +0) */
    *div = h2f(step) > 0.0f ? h2f(step) : 1.0f;
    return step;
}

static inline uint8_t code_of(float x, float lo, float div, int32_t levels) {
    float q = nearbyintf((x - lo) / div);
    q = q < 0.0f ? 0.0f : (q > (float) levels ? (float) levels : q);
    return (uint8_t) q;
}

/* Fast path, per column (keys; transposed V): groups run down the rows, lines are columns. Vector over columns.
 * Codes go to `t` in row order ([row][col]), for the caller to transpose into line order. */
static int pack_columns(const uint16_t *m, int32_t rows, int32_t cols, int32_t g, int32_t levels, uint16_t *mins,
                        uint16_t *steps, uint8_t *t, float *lo, float *hi, float *div) {
    const int32_t n_groups = rows / g;
    for (int32_t k = 0; k < n_groups; ++k) {
        for (int32_t i = 0; i < cols; ++i) { lo[i] = INFINITY; hi[i] = -INFINITY; }
        for (int32_t j = k * g; j < (k + 1) * g; ++j) {
            const uint16_t *r = m + (int64_t) j * cols;
            int32_t i = 0;
#ifdef KVQ_SIMD
            for (; i + 8 <= cols; i += 8) {
                if (nonfinite8(r + i)) return 1;
                const __m256 x = load8(r + i);
                _mm256_storeu_ps(lo + i, _mm256_min_ps(_mm256_loadu_ps(lo + i), x));
                _mm256_storeu_ps(hi + i, _mm256_max_ps(_mm256_loadu_ps(hi + i), x));
            }
#endif
            for (; i < cols; ++i) {
                const float x = h2f(r[i]);
                if (!isfinite(x)) return 1;
                lo[i] = x < lo[i] ? x : lo[i];
                hi[i] = x > hi[i] ? x : hi[i];
            }
        }
        for (int32_t i = 0; i < cols; ++i) {
            const int64_t s = (int64_t) i * n_groups + k;
            mins[s] = f2h(lo[i]);
            steps[s] = step_of(hi[i] - lo[i], levels, &div[i]);
        }
        for (int32_t j = k * g; j < (k + 1) * g; ++j) {
            const uint16_t *r = m + (int64_t) j * cols;
            uint8_t *out = t + (int64_t) j * cols;
            int32_t i = 0;
#ifdef KVQ_SIMD
            const __m256 lv = _mm256_set1_ps((float) levels);
            for (; i + 8 <= cols; i += 8) {
                codes8(load8(r + i), _mm256_loadu_ps(lo + i), _mm256_loadu_ps(div + i), lv, out + i);
            }
#endif
            for (; i < cols; ++i) out[i] = code_of(h2f(r[i]), lo[i], div[i], levels);
        }
    }
    return 0;
}

/* Fast path, per row (V per token): groups along each row; codes in row order, which is line order. */
static int pack_rows(const uint16_t *m, int32_t rows, int32_t cols, int32_t g, int32_t levels, uint16_t *mins,
                     uint16_t *steps, uint8_t *codes) {
    const int32_t n_groups = cols / g;
    for (int32_t i = 0; i < rows; ++i) {
        for (int32_t k = 0; k < n_groups; ++k) {
            const uint16_t *r = m + (int64_t) i * cols + (int64_t) k * g;
            float lo = INFINITY, hi = -INFINITY;
            int32_t j = 0;
#ifdef KVQ_SIMD
            if (g >= 8) {
                __m256 vlo = _mm256_set1_ps(INFINITY), vhi = _mm256_set1_ps(-INFINITY);
                for (; j + 8 <= g; j += 8) {
                    if (nonfinite8(r + j)) return 1;
                    const __m256 x = load8(r + j);
                    vlo = _mm256_min_ps(vlo, x);
                    vhi = _mm256_max_ps(vhi, x);
                }
                float a[8], b[8];
                _mm256_storeu_ps(a, vlo);
                _mm256_storeu_ps(b, vhi);
                for (int l = 0; l < 8; ++l) { lo = a[l] < lo ? a[l] : lo; hi = b[l] > hi ? b[l] : hi; }
            }
#endif
            for (; j < g; ++j) {
                const float x = h2f(r[j]);
                if (!isfinite(x)) return 1;
                lo = x < lo ? x : lo;
                hi = x > hi ? x : hi;
            }
            const int64_t s = (int64_t) i * n_groups + k;
            float div;
            mins[s] = f2h(lo);
            steps[s] = step_of(hi - lo, levels, &div);
            uint8_t *out = codes + (int64_t) i * cols + (int64_t) k * g;
            j = 0;
#ifdef KVQ_SIMD
            const __m256 vl = _mm256_set1_ps(lo), vd = _mm256_set1_ps(div), lv = _mm256_set1_ps((float) levels);
            for (; j + 8 <= g; j += 8) codes8(load8(r + j), vl, vd, lv, out + j);
#endif
            for (; j < g; ++j) out[j] = code_of(h2f(r[j]), lo, div, levels);
        }
    }
    return 0;
}

static int64_t layer_bytes(int32_t rows, int32_t cols, int32_t per_row, int32_t group, int32_t bits) {
    const int32_t length = per_row ? cols : rows, lines = per_row ? rows : cols;
    const int64_t n_scales = (int64_t) lines * (length / (group ? group : length));
    return 4 * n_scales + ((int64_t) rows * cols * bits + 7) / 8;
}

int64_t evoke_kvq_layer_bytes(int32_t rows, int32_t cols, int32_t per_row, int32_t group, int32_t bits) {
    return layer_bytes(rows, cols, per_row, group, bits);
}

/* n_layers matrices (rows x cols f16, `spacing` bytes apart from src) packed into out, one layer after another
 * (evoke_kvq_layer_bytes each). Returns 0, or 1 when a value is not finite (out is then undefined). */
int evoke_kvq_pack(const uint8_t *src, int64_t spacing, int32_t n_layers, int32_t rows, int32_t cols,
                   int32_t per_row, int32_t group, int32_t bits, uint8_t *out) {
    const int32_t length = per_row ? cols : rows, lines = per_row ? rows : cols;
    const int32_t g = group ? group : length;
    const int32_t levels = (1 << bits) - 1;
    const int64_t n_scales = (int64_t) lines * (length / g), n_values = (int64_t) rows * cols;
    uint8_t *codes = malloc((size_t) n_values), *t = per_row ? NULL : malloc((size_t) n_values);
    float *lo = malloc(sizeof(float) * (size_t) cols * 3), *hi = lo + cols, *div = hi + cols;
    int bad = 0;
    for (int32_t l = 0; l < n_layers && !bad; ++l) {
        const uint16_t *m = (const uint16_t *) (src + (int64_t) l * spacing);
        uint8_t *dst = out + (int64_t) l * layer_bytes(rows, cols, per_row, group, bits);
        uint16_t *mins = (uint16_t *) dst, *steps = mins + n_scales;
        uint8_t *line_codes = bits == 8 ? (uint8_t *) (steps + n_scales) : codes;
        if (per_row) {
            bad = pack_rows(m, rows, cols, g, levels, mins, steps, line_codes);
        } else {
            bad = pack_columns(m, rows, cols, g, levels, mins, steps, t, lo, hi, div);
            for (int32_t j = 0; !bad && j < rows; ++j) {          /* [row][col] -> line order [col][row] */
                const uint8_t *r = t + (int64_t) j * cols;
                for (int32_t i = 0; i < cols; ++i) line_codes[(int64_t) i * rows + j] = r[i];
            }
        }
        if (!bad && bits == 4) {
            uint8_t *nib = (uint8_t *) (steps + n_scales);
            for (int64_t v = 0; v < n_values; v += 2) {
                nib[v / 2] = (uint8_t) (codes[v] | ((v + 1 < n_values ? codes[v + 1] : 0) << 4));
            }
        }
    }
    free(codes);
    free(t);
    free(lo);
    return bad;
}

/* The inverse: n_layers packed layers from `packed` into the f16 matrices at dst (`spacing` bytes apart). The
 * caller has checked the scales (finite, steps >= 0, no overflow). */
void evoke_kvq_unpack(const uint8_t *packed, int32_t n_layers, int32_t rows, int32_t cols, int32_t per_row,
                      int32_t group, int32_t bits, uint8_t *dst, int64_t spacing) {
    const int32_t length = per_row ? cols : rows, lines = per_row ? rows : cols;
    const int32_t g = group ? group : length, n_groups = length / g;
    const int64_t n_scales = (int64_t) lines * n_groups, n_values = (int64_t) rows * cols;
    uint8_t *codes = malloc((size_t) n_values), *t = malloc((size_t) n_values);
    float *lo = malloc(sizeof(float) * (size_t) cols * 2), *st = lo + cols;
    for (int32_t l = 0; l < n_layers; ++l) {
        const uint8_t *src = packed + (int64_t) l * layer_bytes(rows, cols, per_row, group, bits);
        const uint16_t *mins = (const uint16_t *) src, *steps = mins + n_scales;
        const uint8_t *line_codes = (const uint8_t *) (steps + n_scales);
        uint16_t *m = (uint16_t *) (dst + (int64_t) l * spacing);
        if (bits == 4) {
            for (int64_t v = 0; v < n_values; ++v) codes[v] = (uint8_t) ((line_codes[v / 2] >> (4 * (v & 1))) & 0x0F);
            line_codes = codes;
        }
        if (per_row) {                      /* line order is row order */
            for (int32_t i = 0; i < rows; ++i) {
                for (int32_t k = 0; k < n_groups; ++k) {
                    const int64_t s = (int64_t) i * n_groups + k;
                    const float vlo = h2f(mins[s]), vst = h2f(steps[s]);
                    const uint8_t *c = line_codes + (int64_t) i * cols + (int64_t) k * g;
                    uint16_t *out = m + (int64_t) i * cols + (int64_t) k * g;
                    int32_t j = 0;
#ifdef KVQ_SIMD
                    const __m256 a = _mm256_set1_ps(vst), b = _mm256_set1_ps(vlo);
                    for (; j + 8 <= g; j += 8) values8(c + j, a, b, out + j);
#endif
                    for (; j < g; ++j) out[j] = f2h((float) c[j] * vst + vlo);
                }
            }
            continue;
        }
        for (int32_t i = 0; i < cols; ++i) {          /* line order [col][row] -> [row][col] */
            const uint8_t *c = line_codes + (int64_t) i * rows;
            for (int32_t j = 0; j < rows; ++j) t[(int64_t) j * cols + i] = c[j];
        }
        for (int32_t k = 0; k < n_groups; ++k) {
            for (int32_t i = 0; i < cols; ++i) {
                lo[i] = h2f(mins[(int64_t) i * n_groups + k]);
                st[i] = h2f(steps[(int64_t) i * n_groups + k]);
            }
            for (int32_t j = k * g; j < (k + 1) * g; ++j) {
                const uint8_t *c = t + (int64_t) j * cols;
                uint16_t *out = m + (int64_t) j * cols;
                int32_t i = 0;
#ifdef KVQ_SIMD
                for (; i + 8 <= cols; i += 8) values8(c + i, _mm256_loadu_ps(st + i), _mm256_loadu_ps(lo + i), out + i);
#endif
                for (; i < cols; ++i) out[i] = f2h((float) c[i] * st[i] + lo[i]);
            }
        }
    }
    free(codes);
    free(t);
    free(lo);
}
