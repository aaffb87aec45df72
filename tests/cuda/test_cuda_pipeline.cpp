// test_cuda_pipeline: the layer pipeline (Model::create_pipeline, model/pipeline.h) on CUDA backends: the tiny
// synthetic model split over two and three backends against one backend, a 150-token prompt in batches of 64
// then 32 decode steps (each stage replays its recorded step), logits at every position:
//   * stages on the same GPU (the one-GPU check of the code path; the stages' state moves by
//     Backend::copy_to, a device-to-device copy ordered by events), and on devices 0 and 1 when the machine
//     has two GPUs (a peer copy);
//   * bitwise equal to the one-backend run (the same kernels on the same inputs), both numerics.
//   test_cuda_pipeline [--seed N]
// Exit code non-zero on any failure (77 without a CUDA device).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "model/forward.h"
#include "model/model_file.h"
#include "model/pipeline.h"
#include "synth/synth.h"
#include "tiny_model.h"

using namespace dsv4;
using namespace dsv4::cudatest;

namespace {

constexpr int64_t k_prompt = 150, k_steps = 32;

std::unique_ptr<Backend> cuda_backend(int device) {
  CudaBackendOptions o;
  o.print_properties = false;
  auto be = make_cuda_backend(device, o);
  DSV4_ASSERT(be.has_value(), "make_cuda_backend(%d): %s", device, be ? "" : be.error().message.c_str());
  return std::move(*be);
}

// Every prompt position's logits, then k_steps decode steps fed tokens[k_prompt + i].
std::vector<float> run(Model& m, const std::vector<int32_t>& tokens) {
  const auto V = static_cast<size_t>(m.spec().n_vocab);
  std::vector<float> out((k_prompt + k_steps) * V);
  KvState s = m.new_state(512);
  const Status st = m.forward(s, tokens.data(), k_prompt, 0, out.data(), true);
  DSV4_ASSERT(st.has_value(), "prefill: %s", st ? "" : st.error().message.c_str());
  for (int64_t i = k_prompt; i < k_prompt + k_steps; ++i) {
    const Status d = m.forward(s, tokens.data() + i, 1, i, out.data() + static_cast<size_t>(i) * V, false);
    DSV4_ASSERT(d.has_value(), "decode: %s", d ? "" : d.error().message.c_str());
  }
  m.free_state(s);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t seed = tiny_test_seed("test_cuda_pipeline", argc, argv, 17);
  std::printf("test_cuda_pipeline: %d CUDA devices\n", cuda_device_count());
  const TinyModelFile tiny("test_cuda_pipeline", seed);
  const ModelFile* mf = tiny.mf.get();
  const std::vector<int32_t> tokens = seeded_tokens(seed, static_cast<size_t>(k_prompt + k_steps), mf->spec().n_vocab);
  int ok = 0, fail = 0;
  auto check = [&](bool good, const std::string& line) {
    std::printf("%-72s %s\n", line.c_str(), good ? "ok" : "FAIL");
    std::fflush(stdout);
    (good ? ok : fail)++;
  };
  struct Split {
    std::vector<int> devices;
    std::vector<uint32_t> first;
  };
  std::vector<Split> splits = {{{0, 0}, {0, 3}}, {{0, 0, 0}, {0, 2, 4}}};
  if (cuda_device_count() >= 2) splits.push_back({{0, 1}, {0, 3}});
  for (Numerics num : {Numerics::REFERENCE, Numerics::PLAIN}) {
    ModelOptions mo;
    mo.numerics = num;
    mo.max_batch = 64;
    auto one = cuda_backend(0);
    auto whole = Model::create(*one, mf->weights, nullptr, mo);
    DSV4_ASSERT(whole.has_value(), "create: %s", whole ? "" : whole.error().message.c_str());
    const std::vector<float> want = run(**whole, tokens);
    for (const Split& sp : splits) {
      std::vector<std::unique_ptr<Backend>> bes;
      std::vector<Backend*> ptrs;
      std::string where;
      for (int d : sp.devices) {
        bes.push_back(cuda_backend(d));
        ptrs.push_back(bes.back().get());
        where += (where.empty() ? "cuda:" : ",") + std::to_string(d);
      }
      auto pl = Model::create_pipeline(ptrs, mf->weights, sp.first, mo);
      DSV4_ASSERT(pl.has_value(), "create_pipeline: %s", pl ? "" : pl.error().message.c_str());
      const std::vector<float> got = run(**pl, tokens);
      size_t differ = 0;
      for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
      check(differ == 0, strfmt("%s: %zu stages on %s == one backend (%zu of %zu logits differ)", numerics_name(num),
                                sp.first.size(), where.c_str(), differ, got.size()));
    }
  }
  std::printf("SUMMARY test_cuda_pipeline: %d passed, %d failed (seed %llu)\n", ok, fail,
              static_cast<unsigned long long>(seed));
  return fail == 0 ? 0 : 1;
}
