#include "bridge/payload_header.h"

#include <gtest/gtest.h>

#include <cstring>

#include "tests/kvstore/test_util.h"

namespace ds4::payload {
namespace {

using kvstore::testing::TempDir;

// Bit-at-a-time CRC-32C, the definition, independent of the code under test.
uint32_t ref_crc32c(const uint8_t *p, size_t n, uint32_t crc = 0) {
    crc = ~crc;
    for (size_t i = 0; i < n; ++i) {
        crc ^= p[i];
        for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
    }
    return ~crc;
}

void put32(std::vector<uint8_t> &v, uint32_t x) {
    for (int i = 0; i < 4; ++i) v.push_back(uint8_t(x >> (8 * i)));
}

Header sample_header(uint32_t n_tokens, uint64_t tail) {
    Header h;
    h.ctx_size = 512;
    h.n_tokens = n_tokens;
    h.n_layer = 43;
    h.n_embd = 4096;
    h.n_vocab = 129280;
    h.head_dim = 512;
    h.fingerprint = 0xFEEDFACECAFEBEEFull;
    h.tail_bytes = tail;
    return h;
}

std::vector<uint8_t> whole_payload(const Header &h, const std::vector<int32_t> &toks) {
    std::vector<uint8_t> out;
    std::string err;
    EXPECT_TRUE(encode_prefix(h, toks.data(), toks.size(), &out, &err)) << err;
    for (uint64_t i = 0; i < h.tail_bytes; ++i) out.push_back(uint8_t(i * 7 + 1));
    return out;
}

TEST(Crc32c, KnownVectors) {
    EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
    const std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF);
    EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);  // RFC 3720 B.4
    EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
    std::vector<uint8_t> inc(32);
    for (int i = 0; i < 32; ++i) inc[size_t(i)] = uint8_t(i);
    EXPECT_EQ(crc32c(inc.data(), 32), 0x46DD794Eu);
    EXPECT_EQ(crc32c(nullptr, 0), 0u);
}

TEST(Crc32c, ChainsAndMatchesReference) {
    std::vector<uint8_t> d(1000);
    for (size_t i = 0; i < d.size(); ++i) d[i] = uint8_t(i * 131 + 7);
    for (size_t split : {size_t(0), size_t(1), size_t(7), size_t(8), size_t(333), size_t(1000)}) {
        const uint32_t a = crc32c(d.data(), split);
        EXPECT_EQ(crc32c(d.data() + split, d.size() - split, a), ref_crc32c(d.data(), d.size())) << split;
    }
}

TEST(PayloadHeader, LayoutIsTheDocumentedOne) {
    const Header h = sample_header(3, 10);
    const std::vector<int32_t> toks = {5, 0, 129279};
    std::vector<uint8_t> got;
    std::string err;
    ASSERT_TRUE(encode_prefix(h, toks.data(), toks.size(), &got, &err)) << err;

    std::vector<uint8_t> want;
    for (uint32_t w : {0x34565344u, 3u, 512u, 3u, 43u, 4096u, 129280u, 512u, 0xCAFEBEEFu, 0xFEEDFACEu, 10u, 0u})
        put32(want, w);
    std::vector<uint8_t> tokbytes;
    for (int32_t t : toks) put32(tokbytes, uint32_t(t));
    const uint32_t crc = ref_crc32c(tokbytes.data(), tokbytes.size(), ref_crc32c(want.data(), want.size()));
    put32(want, crc);
    want.insert(want.end(), tokbytes.begin(), tokbytes.end());
    EXPECT_EQ(got, want);
    EXPECT_EQ(memcmp(got.data(), "DSV4", 4), 0);
    EXPECT_EQ(got.size(), prefix_bytes(3));
    EXPECT_EQ(total_bytes(h), 52u + 12u + 10u);
}

TEST(PayloadHeader, RoundTrip) {
    const Header h = sample_header(4, 1234567);
    const std::vector<int32_t> toks = {1, 2, 3, 129279};
    const auto p = whole_payload(h, toks);
    Header d;
    std::vector<int32_t> t;
    std::string err;
    ASSERT_TRUE(decode_payload(p.data(), p.size(), &d, &t, &err)) << err;
    EXPECT_EQ(d.ctx_size, h.ctx_size);
    EXPECT_EQ(d.n_tokens, h.n_tokens);
    EXPECT_EQ(d.n_layer, h.n_layer);
    EXPECT_EQ(d.n_embd, h.n_embd);
    EXPECT_EQ(d.n_vocab, h.n_vocab);
    EXPECT_EQ(d.head_dim, h.head_dim);
    EXPECT_EQ(d.fingerprint, h.fingerprint);
    EXPECT_EQ(d.tail_bytes, h.tail_bytes);
    EXPECT_EQ(t, toks);
    // The prefix alone validates against the full range length.
    ASSERT_TRUE(decode_prefix(p.data(), size_t(prefix_bytes(4)), p.size(), &d, &err)) << err;
}

TEST(PayloadHeader, ZeroTokensAndEmptyTail) {
    const Header h = sample_header(0, 0);
    const auto p = whole_payload(h, {});
    ASSERT_EQ(p.size(), kHeaderBytes);
    std::vector<int32_t> t = {9};
    std::string err;
    ASSERT_TRUE(decode_payload(p.data(), p.size(), nullptr, &t, &err)) << err;
    EXPECT_TRUE(t.empty());
}

TEST(PayloadHeader, EncodeRejectsBadInput) {
    std::vector<uint8_t> out;
    std::string err;
    Header h = sample_header(2, 0);
    const std::vector<int32_t> toks = {1, 2};
    EXPECT_FALSE(encode_prefix(h, toks.data(), 1, &out, &err));
    EXPECT_NE(err.find("n_tokens"), std::string::npos) << err;
    const std::vector<int32_t> bad = {1, 129280};
    EXPECT_FALSE(encode_prefix(h, bad.data(), 2, &out, &err));
    EXPECT_NE(err.find("token 1"), std::string::npos) << err;
    const std::vector<int32_t> neg = {-1, 2};
    EXPECT_FALSE(encode_prefix(h, neg.data(), 2, &out, &err));
    Header big = sample_header(600, 0);  // ctx 512
    std::vector<int32_t> many(600, 1);
    EXPECT_FALSE(encode_prefix(big, many.data(), many.size(), &out, &err));
    EXPECT_NE(err.find("ctx_size"), std::string::npos) << err;
    uint8_t small[59];
    EXPECT_FALSE(encode_prefix(h, toks.data(), 2, small, sizeof small, &err));
    EXPECT_NE(err.find("need 60"), std::string::npos) << err;
    Header zero = h;
    zero.n_layer = 0;
    EXPECT_FALSE(encode_prefix(zero, toks.data(), 2, &out, &err));
    EXPECT_NE(err.find("n_layer"), std::string::npos) << err;
}

struct Mutation {
    const char *name;
    size_t word;
    uint32_t value;
    const char *expect;
};

TEST(PayloadHeader, DecodeNamesEachProblem) {
    const Header h = sample_header(2, 16);
    const auto good = whole_payload(h, {7, 8});
    const Mutation cases[] = {
        {"magic", 0, 0x34565345u, "bad magic"},
        {"version", 1, 2u, "unsupported version 2"},
        {"ctx 0", 2, 0u, "ctx_size is 0"},
        {"n_tokens > ctx", 3, 513u, "exceeds ctx_size"},
        {"n_layer 0", 4, 0u, "n_layer is 0"},
        {"n_vocab 0", 6, 0u, "n_vocab is 0"},
        {"n_vocab past int32", 6, 0x80000000u, "exceeds the int32 token id range"},
        {"tail larger", 10, 17u, "truncated"},
        {"tail smaller", 10, 15u, "trailing bytes"},
        {"fingerprint", 8, 1u, "checksum mismatch"},
        {"crc", 12, 0u, "checksum mismatch"},
    };
    for (const Mutation &m : cases) {
        auto p = good;
        for (int i = 0; i < 4; ++i) p[m.word * 4 + size_t(i)] = uint8_t(m.value >> (8 * i));
        std::string err;
        EXPECT_FALSE(decode_payload(p.data(), p.size(), nullptr, nullptr, &err)) << m.name;
        EXPECT_NE(err.find(m.expect), std::string::npos) << m.name << ": " << err;
    }
    auto p = good;
    for (size_t i = 40; i < 48; ++i) p[i] = 0xFF;  // tail_bytes = 2^64 - 1
    std::string err;
    EXPECT_FALSE(decode_payload(p.data(), p.size(), nullptr, nullptr, &err));
    EXPECT_NE(err.find("overflows"), std::string::npos) << err;
}

// Found by fuzz_payload_header: with n_vocab >= 2^31 and a valid CRC, a token id >= 2^31
// decoded (as a negative int32) and the payload did not re-encode; both sides now refuse it.
TEST(PayloadHeader, VocabularyPastTheInt32TokenRangeIsRejectedBothWays) {
    Header h = sample_header(1, 0);
    h.n_vocab = 0x80000001u;
    std::vector<uint8_t> p;
    std::string err;
    const int32_t tok = 5;
    EXPECT_FALSE(encode_prefix(h, &tok, 1, &p, &err));
    EXPECT_NE(err.find("int32 token id range"), std::string::npos) << err;
    // The same bytes written by hand with a valid CRC and token id 2^31.
    h.n_vocab = 1000;
    ASSERT_TRUE(encode_prefix(h, &tok, 1, &p, &err));
    const uint32_t vocab = 0x80000001u, id = 0x80000000u;
    for (int i = 0; i < 4; ++i) {
        p[24 + size_t(i)] = uint8_t(vocab >> (8 * i));
        p[52 + size_t(i)] = uint8_t(id >> (8 * i));
    }
    const uint32_t crc = ref_crc32c(p.data() + 52, 4, ref_crc32c(p.data(), 48));
    for (int i = 0; i < 4; ++i) p[48 + size_t(i)] = uint8_t(crc >> (8 * i));
    std::vector<int32_t> toks;
    EXPECT_FALSE(decode_payload(p.data(), p.size(), nullptr, &toks, &err));
    EXPECT_NE(err.find("int32 token id range"), std::string::npos) << err;
}

TEST(PayloadHeader, TokenOutOfVocabIsRejectedEvenWithAValidCrc) {
    Header h = sample_header(2, 0);
    h.n_vocab = 100;
    std::vector<uint8_t> p;
    std::string err;
    const std::vector<int32_t> toks = {1, 2};
    ASSERT_TRUE(encode_prefix(h, toks.data(), 2, &p, &err));
    // Rewrite token 1 to 100 and fix up the CRC by hand.
    p[56] = 100;
    const uint32_t crc = ref_crc32c(p.data() + 52, 8, ref_crc32c(p.data(), 48));
    for (int i = 0; i < 4; ++i) p[48 + size_t(i)] = uint8_t(crc >> (8 * i));
    EXPECT_FALSE(decode_payload(p.data(), p.size(), nullptr, nullptr, &err));
    EXPECT_NE(err.find("token 1 has id 100"), std::string::npos) << err;
}

TEST(PayloadHeader, EveryTruncationAndEveryExtensionIsRejected) {
    const auto p = whole_payload(sample_header(5, 40), {1, 2, 3, 4, 5});
    std::string err;
    for (size_t n = 0; n < p.size(); ++n) EXPECT_FALSE(decode_payload(p.data(), n, nullptr, nullptr, &err)) << n;
    auto longer = p;
    longer.push_back(0);
    EXPECT_FALSE(decode_payload(longer.data(), longer.size(), nullptr, nullptr, &err));
    EXPECT_NE(err.find("1 trailing bytes"), std::string::npos) << err;
}

TEST(PayloadHeader, EveryBitFlipInHeaderAndTokensIsRejected) {
    const auto p = whole_payload(sample_header(3, 8), {10, 20, 30});
    const size_t covered = size_t(prefix_bytes(3));
    for (size_t byte = 0; byte < covered; ++byte) {
        for (int bit = 0; bit < 8; ++bit) {
            auto q = p;
            q[byte] ^= uint8_t(1 << bit);
            std::string err;
            EXPECT_FALSE(decode_payload(q.data(), q.size(), nullptr, nullptr, &err)) << byte << ":" << bit;
        }
    }
}

// tests/kvstore/corpus/three_tokens was written by a separate Python encoder.
TEST(PayloadHeader, DecodesAPayloadWrittenByAnIndependentEncoder) {
    const auto p = kvstore::testing::read_file(DS4_KVSTORE_CORPUS_DIR "/three_tokens");
    ASSERT_EQ(p.size(), 52u + 12u + 40u);
    Header h;
    std::vector<int32_t> t;
    std::string err;
    ASSERT_TRUE(decode_payload(p.data(), p.size(), &h, &t, &err)) << err;
    EXPECT_EQ(t, (std::vector<int32_t>{1, 2, 999}));
    EXPECT_EQ(h.fingerprint, 0x0123456789ABCDEFull);
    EXPECT_EQ(h.tail_bytes, 40u);
    EXPECT_EQ(h.n_vocab, 1000u);
}

TEST(PayloadHeader, ReadsTokensFromAFileRange) {
    TempDir dir;
    const Header h = sample_header(3, 100);
    const std::vector<int32_t> toks = {11, 22, 33};
    const auto p = whole_payload(h, toks);
    std::vector<uint8_t> file(1000, 0xAB);
    file.insert(file.end(), p.begin(), p.end());
    file.resize(file.size() + 500, 0xCD);
    const std::string path = dir.sub("big.bin");
    kvstore::testing::write_file(path, file.data(), file.size());

    Header d;
    std::vector<int32_t> t;
    std::string err;
    ASSERT_TRUE(read_file_prefix(path.c_str(), 1000, p.size(), &d, &t, &err)) << err;
    EXPECT_EQ(t, toks);
    EXPECT_EQ(d.fingerprint, h.fingerprint);
    // Range one byte longer: trailing byte inside the range.
    EXPECT_FALSE(read_file_prefix(path.c_str(), 1000, p.size() + 1, &d, &t, &err));
    EXPECT_NE(err.find("trailing"), std::string::npos) << err;
    EXPECT_FALSE(read_file_prefix(path.c_str(), 999, p.size(), &d, &t, &err));
    EXPECT_NE(err.find("magic"), std::string::npos) << err;
    EXPECT_FALSE(read_file_prefix(path.c_str(), 1000, file.size(), &d, &t, &err));
    EXPECT_NE(err.find("outside"), std::string::npos) << err;
    EXPECT_FALSE(read_file_prefix(dir.sub("missing").c_str(), 0, 52, &d, &t, &err));
    EXPECT_NE(err.find("missing"), std::string::npos) << err;
}

}  // namespace
}  // namespace ds4::payload
