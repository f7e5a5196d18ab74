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
    auto quantize = [&](float iscale, uint8_t *out) {
        for (int i = 0; i < n; ++i) out[i] = uint8_t(std::clamp(nearest_int(iscale * (x[i] - lo)), 0, nmax));
    };
    auto error = [&](const uint8_t *q, float a, float b) {
        double e = 0;
        for (int i = 0; i < n; ++i) {
            const double d = double(a) * q[i] + b - x[i];
            e += w[i] * d * d;
        }
        return e;
    };
    quantize(nmax / range, L);
    float best_scale = range / nmax, best_min = lo;
    double best = error(L, best_scale, best_min);

    double sw = 0, sx = 0;
    for (int i = 0; i < n; ++i) {
        sw += w[i];
        sx += double(w[i]) * x[i];
    }
    uint8_t aux[256];
    for (int k = 0; k <= nstep; ++k) {
        quantize((nmax + rmin + rdelta * k) / range, aux);
        double sl = 0, sl2 = 0, sxl = 0;
        for (int i = 0; i < n; ++i) {
            sl += double(w[i]) * aux[i];
            sl2 += double(w[i]) * aux[i] * aux[i];
            sxl += double(w[i]) * aux[i] * x[i];
        }
        const double det = sw * sl2 - sl * sl;
        if (!(det > 0)) continue;
        double a = (sw * sxl - sx * sl) / det, b = (sl2 * sx - sl * sxl) / det;
        if (b > 0) {   // the offset may only pull values down
            b = 0;
            a = sxl / sl2;
        }
        if (!(a > 0)) continue;
        const double e = error(aux, float(a), float(b));
        if (e < best) {
            best = e;
            best_scale = float(a);
            best_min = float(b);
            std::copy(aux, aux + n, L);
        }
    }
    *offset = -best_min;
    return best_scale;
}

}  // namespace ds4::quant::detail
