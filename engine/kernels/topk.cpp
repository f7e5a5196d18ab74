// ops::top_k_scores (ops.h): the indexer's per-row pick of the k best-scored entries.
//
// The entries come in index order, so one that arrives later loses every tie: it enters the
// kept k only if its score is strictly above the worst kept one's, a compare that almost
// always fails once the first entries are in. std::partial_sort's heap spent ~5% of the
// default model's 4K-prompt prefill on the same picks, comparing both fields each time.
#include <algorithm>
#include <cmath>

#include "engine/kernels/ops.h"

namespace ds4::ops {

namespace {

// Score descending, then index ascending; NaN below every number (std::partial_sort had no
// defined order for NaN).
bool ranks_before(const IndexScore &a, const IndexScore &b) {
    const bool an = std::isnan(a.score), bn = std::isnan(b.score);
    if (an != bn) return bn;
    if (!an && a.score != b.score) return a.score > b.score;
    return a.idx < b.idx;
}

}  // namespace

void top_k_scores(IndexScore *first, IndexScore *last, size_t k) {
    const size_t n = size_t(last - first);
    k = std::min(k, n);
    if (k == 0) return;
    std::sort(first, first + k, ranks_before);
    if (k == n) return;
    float worst = first[k - 1].score;
    for (const IndexScore *p = first + k; p < last; ++p) {
        const float s = p->score;
        if (!(s > worst || (std::isnan(worst) && !std::isnan(s)))) continue;
        const IndexScore c = *p;
        size_t i = k - 1;
        while (i > 0 && ranks_before(c, first[i - 1])) {
            first[i] = first[i - 1];
            --i;
        }
        first[i] = c;
        worst = first[k - 1].score;
    }
}

}  // namespace ds4::ops
