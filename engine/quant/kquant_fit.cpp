#include "engine/quant/kquant_fit.h"

#include <algorithm>
#include <cmath>

namespace ds4::quant::detail {

void sanitize(const float *src, float *dst, int n) {
    for (int i = 0; i < n; ++i) dst[i] = std::isfinite(src[i]) ? src[i] : 0.f;
}

float fit_scale_offset(int n, int nmax, const float *x, const float *w, uint8_t *L, float *offset, float rmin,
                       float rdelta, int nstep) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; ++i) {
        lo = std::min(lo, x[i]);
        hi = std::max(hi, x[i]);
    }
    lo = std::min(lo, 0.f);
    if (!(hi > lo)) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        *offset = -lo;
        return 0.f;
    }
    const float range = hi - lo;
    float sw = 0, sx = 0, sx2 = 0;
    for (int i = 0; i < n; ++i) {
        sw += w[i];
        sx += w[i] * x[i];
        sx2 += w[i] * x[i] * x[i];
    }
    // Quantizes on the grid iscale and returns the weighted sums the fit needs.
    auto quantize = [&](float iscale, uint8_t *out, float *sl, float *sl2, float *sxl) {
        float a = 0, b = 0, c = 0;
        for (int i = 0; i < n; ++i) {
            const int l = std::clamp(nearest_int(iscale * (x[i] - lo)), 0, nmax);
            out[i] = uint8_t(l);
            a += w[i] * float(l);
            b += w[i] * float(l * l);
            c += w[i] * float(l) * x[i];
        }
        *sl = a;
        *sl2 = b;
        *sxl = c;
    };
    // sum w (a*L + b - x)^2 expanded over the sums
    auto error = [&](float sl, float sl2, float sxl, float a, float b) {
        return a * a * sl2 + 2 * a * b * sl + b * b * sw - 2 * a * sxl - 2 * b * sx + sx2;
    };
    float sl, sl2, sxl;
    quantize(nmax / range, L, &sl, &sl2, &sxl);
    float best_scale = range / nmax, best_min = lo;
    float best = error(sl, sl2, sxl, best_scale, best_min);
    uint8_t aux[256];
    for (int k = 0; k <= nstep; ++k) {
        quantize((nmax + rmin + rdelta * k) / range, aux, &sl, &sl2, &sxl);
        const float det = sw * sl2 - sl * sl;
        if (!(det > 0)) continue;
        float a = (sw * sxl - sx * sl) / det, b = (sl2 * sx - sl * sxl) / det;
        if (b > 0) {   // the offset may only pull values down
            b = 0;
            a = sxl / sl2;
        }
        if (!(a > 0)) continue;
        const float e = error(sl, sl2, sxl, a, b);
        if (e < best) {
            best = e;
            best_scale = a;
            best_min = b;
            std::copy(aux, aux + n, L);
        }
    }
    *offset = -best_min;
    return best_scale;
}

}  // namespace ds4::quant::detail
