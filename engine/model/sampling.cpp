#include "engine/model/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/common/error.h"
#include "engine/kernels/ops.h"

namespace ds4 {

static uint64_t next_rand(uint64_t *s) {
    // splitmix64: a tiny, well-mixed generator; the caller owns the state.
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int argmax(const std::vector<float> &l) {
    // a vector scan: std::max_element's compare-and-branch per logit was ~2% of a decode
    // step of the default model (8192 logits)
    return l.empty() ? 0 : (int)ops::argmax_first(l.data(), (int64_t)l.size());
}

void check_sampling(const SamplingParams &p) {
    if (!(p.top_p > 0.f && p.top_p <= 1.f)) failf("sample: top_p %g must be in (0, 1]", p.top_p);
    if (!(p.min_p >= 0.f && p.min_p < 1.f)) failf("sample: min_p %g must be in [0, 1)", p.min_p);
    if (p.top_k < 0) failf("sample: top_k %d must be >= 0", p.top_k);
}

double uniform01(uint64_t *rng) { return (double)(next_rand(rng) >> 11) * (1.0 / 9007199254740992.0); }

// The candidates that survive top-k / top-p / min-p, most likely first (lowest id on ties),
// with unnormalised weights exp((l - max) / T) in pr. Returns how many are kept.
static size_t kept_candidates(const std::vector<float> &l, const SamplingParams &p, std::vector<int> &idx,
                              std::vector<double> &pr) {
    idx.resize(l.size());
    std::iota(idx.begin(), idx.end(), 0);
    auto by_logit = [&](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
    size_t k = idx.size();
    if (p.top_k > 0 && (size_t)p.top_k < k) {
        k = p.top_k;
        std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), by_logit);
    } else {
        std::sort(idx.begin(), idx.end(), by_logit);
    }
    idx.resize(k);
    pr.resize(k);
    const double mx = l[idx[0]];
    double sum = 0;
    for (size_t i = 0; i < k; ++i) sum += pr[i] = std::exp(((double)l[idx[i]] - mx) / p.temperature);
    size_t keep = k;
    if (p.top_p < 1.f) {
        double acc = 0;
        for (size_t i = 0; i < k; ++i) {
            acc += pr[i] / sum;
            if (acc >= p.top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    if (p.min_p > 0.f) {
        size_t j = 1;
        while (j < keep && pr[j] >= p.min_p * pr[0]) ++j;
        keep = j;
    }
    return keep;
}

int sample(const std::vector<float> &l, const SamplingParams &p, uint64_t *rng) {
    if (p.temperature <= 0.f) return argmax(l);
    if (!rng) fail("sample: rng state is required when temperature > 0");
    check_sampling(p);
    std::vector<int> idx;
    std::vector<double> pr;
    const size_t keep = kept_candidates(l, p, idx, pr);
    double tot = 0;
    for (size_t i = 0; i < keep; ++i) tot += pr[i];
    const double u = uniform01(rng) * tot;
    double acc = 0;
    for (size_t i = 0; i < keep; ++i) {
        acc += pr[i];
        if (u < acc) return idx[i];
    }
    return idx[keep - 1];
}

void sampling_probs(const std::vector<float> &l, const SamplingParams &p, std::vector<double> *probs) {
    if (!(p.temperature > 0.f)) fail("sampling_probs: temperature must be > 0");
    check_sampling(p);
    std::vector<int> idx;
    std::vector<double> pr;
    const size_t keep = kept_candidates(l, p, idx, pr);
    double tot = 0;
    for (size_t i = 0; i < keep; ++i) tot += pr[i];
    probs->assign(l.size(), 0.0);
    for (size_t i = 0; i < keep; ++i) (*probs)[idx[i]] = pr[i] / tot;
}

int sample_from(const std::vector<double> &probs, uint64_t *rng) {
    double tot = 0;
    for (double v : probs) tot += v;
    if (!(tot > 0)) fail("sample_from: the distribution is empty");
    const double u = uniform01(rng) * tot;
    double acc = 0;
    int last = -1;
    for (size_t i = 0; i < probs.size(); ++i) {
        if (probs[i] <= 0) continue;
        acc += probs[i];
        last = (int)i;
        if (u < acc) return (int)i;
    }
    return last;
}

std::vector<std::pair<int, float>> top_logprobs(const std::vector<float> &l, int n) {
    const float mx = *std::max_element(l.begin(), l.end());
    double s = 0;
    for (float v : l) s += std::exp((double)v - mx);
    const float lse = mx + (float)std::log(s);
    n = std::max(0, std::min<int>(n, (int)l.size()));
    std::vector<int> idx(l.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(),
                      [&](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    std::vector<std::pair<int, float>> out;
    for (int i = 0; i < n; ++i) out.emplace_back(idx[i], l[idx[i]] - lse);
    return out;
}

}  // namespace ds4
