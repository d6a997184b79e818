/* RoPE re-anchoring of saved K rows: rotate f16 K by `delta` positions in place.
 *
 * Owns one job: the rotation llama.cpp's K-shift would apply at the next decode, done on a
 * saved block's bytes instead (cost O(block tokens), not O(n_ctx)). The engine checks it
 * against llama.cpp's own shift when a model loads and falls back to that shift on mismatch.
 * mode 0 = NORM (adjacent pairs), 2 = NEOX (pairs i and i + n_rot/2), as in ggml.
 */
#include <math.h>
#include <stdint.h>

#define MAX_ROT 1024

void evoke_rope_shift_f16(_Float16 *rows, int64_t n_rows, int32_t n_head, int32_t head_dim,
                          int32_t n_rot, int32_t mode, float delta, float freq_base,
                          float freq_scale) {
    float cos_t[MAX_ROT / 2], sin_t[MAX_ROT / 2];
    if (n_rot > MAX_ROT || n_rot > head_dim || n_rot % 2) return;
    const float theta_scale = powf(freq_base, -2.0f / (float) n_rot);
    float theta = delta * freq_scale;
    for (int32_t i = 0; i < n_rot / 2; ++i) {   /* same recurrence as ggml's rope cache */
        cos_t[i] = cosf(theta);
        sin_t[i] = sinf(theta);
        theta *= theta_scale;
    }
    const int64_t n_vec = n_rows * n_head;
    const int32_t half = n_rot / 2;
    for (int64_t v = 0; v < n_vec; ++v) {
        _Float16 *x = rows + v * head_dim;
        if (mode == 2) {
            for (int32_t i = 0; i < half; ++i) {
                const float x0 = (float) x[i], x1 = (float) x[i + half];
                x[i]        = (_Float16) (x0 * cos_t[i] - x1 * sin_t[i]);
                x[i + half] = (_Float16) (x0 * sin_t[i] + x1 * cos_t[i]);
            }
        } else {
            for (int32_t i = 0; i < half; ++i) {
                const float x0 = (float) x[2 * i], x1 = (float) x[2 * i + 1];
                x[2 * i]     = (_Float16) (x0 * cos_t[i] - x1 * sin_t[i]);
                x[2 * i + 1] = (_Float16) (x0 * sin_t[i] + x1 * cos_t[i]);
            }
        }
    }
}
