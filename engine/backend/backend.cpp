#include "engine/backend/backend.h"

#include "engine/common/error.h"

namespace ds4 {

size_t act_width(const ModelConfig &c, Act a) {
    const size_t D = c.n_embd, hc = c.hc_mult, hq = (size_t)c.n_head * c.head_dim;
    switch (a) {
    case Act::H: return hc * D;
    case Act::X: case Act::XN: case Act::A: return D;
    case Act::Post: return hc;
    case Act::Comb: return hc * hc;
    case Act::QR: return c.q_lora;
    case Act::Q: case Act::O: return hq;
    }
    fail("internal: unknown activation");
}

}  // namespace ds4
