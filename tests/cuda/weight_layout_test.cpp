// The placement of a model's weights in one shareable device allocation (cuda/cuda_weight_layout.h):
// ds4d and an importer open the same drafter through different paths (ds4d's memfd link, the
// importer's received descriptor) and must compute the same layout and hash, or the importer
// would read weights at wrong offsets; another model must hash differently. Host code: runs
// without a GPU.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "cuda/cuda_weight_layout.h"
#include "engine/model/model.h"

namespace {

const std::string kModel = std::string(DS4_SOURCE_DIR) + "/models/ds4-pystd-q8_0.gguf";
const std::string kDrafter = std::string(DS4_SOURCE_DIR) + "/models/ds4-pystd-drafter-q8_0.gguf";

ds4::cuda::WeightLayout layout_of(const ds4::Model &m) {
    const auto &a = m.rope(false).inv_freq, &b = m.rope(true).inv_freq;
    return ds4::cuda::plan_weight_layout(m.reader(), m.weights(),
                                         {{a.data(), a.size() * sizeof(float)}, {b.data(), b.size() * sizeof(float)}});
}

TEST(CudaWeightLayout, SameFileThroughAMemfdLaysOutTheSame) {
    ds4::ModelOptions cpu;
    cpu.backend = ds4::BackendKind::Cpu;
    cpu.n_threads = 1;
    const auto by_path = ds4::Model::open(kDrafter, cpu);

    const int src = open(kDrafter.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(src, 0);
    struct stat st {};
    ASSERT_EQ(fstat(src, &st), 0);
    const int mfd = memfd_create("layout-test", MFD_CLOEXEC);
    ASSERT_GE(mfd, 0);
    // sendfile may move less than asked (the H200 host's kernel moves 256 KiB a call).
    for (off_t done = 0; done < st.st_size;) {
        const ssize_t n = sendfile(mfd, src, nullptr, size_t(st.st_size - done));
        ASSERT_GT(n, 0);
        done += n;
    }
    close(src);
    const auto by_memfd = ds4::Model::open("/proc/self/fd/" + std::to_string(mfd), cpu);

    const ds4::cuda::WeightLayout a = layout_of(*by_path), b = layout_of(*by_memfd);
    EXPECT_EQ(a.hash, b.hash);
    EXPECT_EQ(a.bytes, b.bytes);
    ASSERT_EQ(a.ranges.size(), b.ranges.size());
    uint64_t end = 0, file_ranges = 0;
    for (size_t i = 0; i < a.ranges.size(); ++i) {
        EXPECT_EQ(a.ranges[i].offset, b.ranges[i].offset) << i;
        EXPECT_EQ(a.ranges[i].n, b.ranges[i].n) << i;
        EXPECT_EQ(a.ranges[i].offset % ds4::cuda::WeightLayout::kAlign, 0u) << i;
        EXPECT_GE(a.ranges[i].offset, end) << "range " << i << " overlaps the one before";
        end = a.ranges[i].offset + a.ranges[i].n;
        file_ranges += a.ranges[i].derived ? 0 : 1;
    }
    EXPECT_LE(end, a.bytes);
    EXPECT_EQ(file_ranges, by_path->reader().tensors().size());

    const auto other = ds4::Model::open(kModel, cpu);
    EXPECT_NE(layout_of(*other).hash, a.hash);
    close(mfd);
}

}  // namespace
