// The CUDA backend's switches (backend/options/cuda_options.h) as the CLI parses, checks and prints them;
// plain C++, so they are tested on every build.
#include <gtest/gtest.h>

#include "backend/options/cuda_options.h"

namespace dsv4 {
namespace {

TEST(CudaOptions, ExpertGemmParsesAutoOnOffAndCounts) {
  EXPECT_EQ(*parse_expert_gemm("auto"), k_expert_gemm_auto);
  EXPECT_EQ(*parse_expert_gemm("on"), 1);
  EXPECT_EQ(*parse_expert_gemm("off"), 0);
  EXPECT_EQ(*parse_expert_gemm("48"), 48);
  EXPECT_EQ(*parse_expert_gemm("1000000"), 1000000);
  for (const char* bad : {"", "0", "-1", "1000001", "12x", "Auto", "64 "}) {
    const auto r = parse_expert_gemm(bad);
    ASSERT_FALSE(r.has_value()) << '"' << bad << '"';
    EXPECT_NE(r.error().message.find("want auto, on, off"), std::string::npos) << r.error().message;
  }
}

TEST(CudaOptions, ExpertGemmDefaultIsAutoAndOnlyOtherValuesArePrinted) {
  CudaOptions o;
  EXPECT_EQ(o.expert_gemm_min, k_expert_gemm_auto);
  EXPECT_TRUE(o.check().has_value());
  EXPECT_EQ(o.describe().find("expert_gemm"), std::string::npos) << o.describe();
  o.expert_gemm_min = 32;
  EXPECT_TRUE(o.check().has_value());
  EXPECT_NE(o.describe().find("expert_gemm=32"), std::string::npos) << o.describe();
  o.expert_gemm_min = 0;
  EXPECT_NE(o.describe().find("expert_gemm=off"), std::string::npos) << o.describe();
  o.expert_gemm_min = -2;  // neither auto nor a count
  const Status s = o.check();
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.error().message.find("--expert-gemm -2"), std::string::npos) << s.error().message;
}

TEST(CudaOptions, ExpertGemmAutoThresholdFollowsTheWeightType) {
  // Where the grouped GEMM overtakes the tile (docs/design-notes/moe-grouped-gemm.md): the q2 files'
  // IQ2_XXS and Q4_K experts from 24 assignments on (lose at 18; 32 taken).
  EXPECT_EQ(expert_gemm_auto_min(GgmlType::IQ2_XXS), 32);
  EXPECT_EQ(expert_gemm_auto_min(GgmlType::Q4_K), 32);
  EXPECT_EQ(expert_gemm_auto_min(GgmlType::Q8_0), 64);
  EXPECT_EQ(expert_gemm_auto_min(GgmlType::Q2_K), 64);
  for (GgmlType t : {GgmlType::IQ2_XXS, GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::MXFP4})
    EXPECT_GE(expert_gemm_auto_min(t), 2) << "auto never means every expert (1) or none (0)";
  EXPECT_EQ(expert_gemm_auto_text(), "32 IQ2_XXS and Q4_K, else 64");  // as --help and the device banner say
}

TEST(CudaOptions, FastAttentionTermsAreOneToThreeAndPrintedWhenNotOne) {
  CudaOptions o;
  EXPECT_EQ(o.fast_attention_terms, 1);  // bf16 q and P under `fast` (measured: faster, no less accurate)
  EXPECT_EQ(o.describe().find("fast_attention_terms"), std::string::npos) << o.describe();
  for (int t : {2, 3}) {
    o.fast_attention_terms = t;
    EXPECT_TRUE(o.check().has_value()) << t;
    EXPECT_NE(o.describe().find("fast_attention_terms=" + std::to_string(t)), std::string::npos) << o.describe();
  }
  for (int bad : {0, 4, -1}) {
    o.fast_attention_terms = bad;
    const Status s = o.check();
    ASSERT_FALSE(s.has_value()) << bad;
    EXPECT_NE(s.error().message.find("--fast-attention-terms"), std::string::npos) << s.error().message;
  }
}

}  // namespace
}  // namespace dsv4
