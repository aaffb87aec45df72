// ExpertStreamer (backend/host/expert_stream.h): the host side of streaming routed experts from the model file,
// driven by a thread that plays the GPU's part of the protocol (post a request, copy each slot out once it is
// ready, hand it back). Every staged expert must arrive intact and in order, through rings smaller and larger
// than the request, with one and several copying threads, over many requests in a row.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "backend/host/expert_stream.h"
#include "backend/host/request_poll.h"
#include "core/spin_team.h"

namespace dsv4 {
namespace {

// Three stacked matrices of E experts (sizes multiples of 16, as the GPU's copies need), filled with bytes that
// name their matrix, expert and offset.
struct Stacks {
  int32_t E;
  int64_t bytes[3];
  std::vector<uint8_t> mat[3];
  Stacks(int32_t e, int64_t b0, int64_t b1, int64_t b2) : E(e), bytes{b0, b1, b2} {
    std::mt19937 rng(static_cast<unsigned>(e * 31 + b0));
    for (int m = 0; m < 3; ++m) {
      mat[m].resize(static_cast<size_t>(E * bytes[m]));
      for (auto& v : mat[m]) v = static_cast<uint8_t>(rng());
    }
  }
};

// The GPU's part for one request (an empty list is not posted, as on the GPU): posts `list` as request s, then consumes
// every position in order into `out`
// ([count][b0 + b1 + b2]), handing each slot back.
void gpu_request(ExpertStreamBox& box, const uint8_t* staging, int slots, size_t slot_bytes, uint32_t s,
                 const Stacks& st, const std::vector<int32_t>& list, std::vector<uint8_t>& out) {
  const size_t total = static_cast<size_t>(st.bytes[0] + st.bytes[1] + st.bytes[2]);
  out.assign(list.size() * total, 0);
  if (list.empty()) return;  // never posted
  box.count = static_cast<int32_t>(list.size());
  box.n_expert = st.E;
  std::copy(list.begin(), list.end(), box.list);
  for (int m = 0; m < 3; ++m) {
    box.src[m] = reinterpret_cast<uint64_t>(st.mat[m].data());
    box.bytes[m] = st.bytes[m];
  }
  __atomic_store_n(&box.request, s, __ATOMIC_RELEASE);
  for (size_t c = 0; c < list.size(); ++c) {
    const size_t r = c % static_cast<size_t>(slots);
    const uint64_t tag = stream_tag(s, static_cast<int32_t>(c));
    while (__atomic_load_n(&box.ready[r], __ATOMIC_ACQUIRE) != tag) std::this_thread::yield();
    std::memcpy(out.data() + c * total, staging + r * slot_bytes, total);
    __atomic_store_n(&box.consumed[r], tag, __ATOMIC_RELEASE);
  }
}

void expect_staged(const Stacks& st, const std::vector<int32_t>& list, const std::vector<uint8_t>& out) {
  const size_t total = static_cast<size_t>(st.bytes[0] + st.bytes[1] + st.bytes[2]);
  for (size_t c = 0; c < list.size(); ++c) {
    const uint8_t* got = out.data() + c * total;
    for (int m = 0; m < 3; ++m) {
      const auto n = static_cast<size_t>(st.bytes[m]);
      ASSERT_EQ(std::memcmp(got, st.mat[m].data() + static_cast<size_t>(list[c]) * n, n), 0)
          << "position " << c << " (expert " << list[c] << "), matrix " << m;
      got += n;
    }
  }
}

struct Shape {
  int slots, threads;
};

class ExpertStreamTest : public ::testing::TestWithParam<Shape> {};

TEST_P(ExpertStreamTest, StagesEveryListedExpertInOrder) {
  const auto [slots, threads] = GetParam();
  const Stacks st(40, 1024, 1024, 2048);
  const size_t slot_bytes = 4096 + 256;
  auto box = std::make_unique<ExpertStreamBox>();
  std::vector<uint8_t> staging(static_cast<size_t>(slots) * slot_bytes);
  ExpertStreamer streamer(box.get(), staging.data(), slots, slot_bytes, threads);
  EXPECT_EQ(streamer.threads(), threads);

  std::mt19937 rng(7);
  std::vector<int32_t> all(static_cast<size_t>(st.E));
  std::iota(all.begin(), all.end(), 0);
  uint64_t staged = 0;
  uint32_t s = 0;
  // Requests shorter and longer than the ring, empty ones, and every expert; several in a row.
  for (const int count : {1, 3, slots, slots + 1, 3 * slots + 2, 0, st.E, 6, 6, 6}) {
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<int32_t> list(all.begin(), all.begin() + std::min(count, st.E));
    std::vector<uint8_t> out;
    if (!list.empty()) ++s;
    gpu_request(*box, staging.data(), slots, slot_bytes, s, st, list, out);
    expect_staged(st, list, out);
    staged += list.size();
  }
  // The worker counts a request after its last slot is ready: wait for the count.
  for (int i = 0; i < 2000 && streamer.served() < s; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const ExpertStreamer::Stats stats = streamer.stats();
  EXPECT_EQ(stats.requests, s);
  EXPECT_EQ(stats.experts, staged);
  EXPECT_DOUBLE_EQ(stats.bytes, static_cast<double>(staged) * 4096.0);
}

INSTANTIATE_TEST_SUITE_P(Rings, ExpertStreamTest,
                         ::testing::Values(Shape{1, 1}, Shape{4, 1}, Shape{4, 3}, Shape{16, 2}, Shape{2, 4}),
                         [](const ::testing::TestParamInfo<Shape>& i) {
                           return "slots" + std::to_string(i.param.slots) + "_threads" +
                                  std::to_string(i.param.threads);
                         });

TEST(ExpertStream, TagsNeverRepeatAcrossRequestsOrPositions) {
  EXPECT_NE(stream_tag(1, 0), 0u);
  EXPECT_NE(stream_tag(1, 5), stream_tag(2, 5));
  EXPECT_NE(stream_tag(1, 5), stream_tag(1, 6));
  EXPECT_EQ(stream_tag(3, 2) >> 32, 3u);
}

TEST(ExpertStream, RequestPollSeesEachNewValueAndStops) {
  // The mailbox poll both host workers use: a value other than the last is returned once; stop ends it with 0.
  uint32_t word = 7;
  std::atomic<bool> stop{false};
  RequestPoll poll(7);
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    __atomic_store_n(&word, 8u, __ATOMIC_RELEASE);
  });
  EXPECT_EQ(poll.next(&word, stop), 8u);
  writer.join();
  poll.served();
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));  // past the busy window: napping
    stop.store(true);
  });
  EXPECT_EQ(poll.next(&word, stop), 0u);
  stopper.join();
}

TEST(ExpertStreamDeath, AnExpertOutsideTheStackIsFatal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        const Stacks st(4, 16, 16, 16);
        auto box = std::make_unique<ExpertStreamBox>();
        std::vector<uint8_t> staging(2 * 256);
        ExpertStreamer streamer(box.get(), staging.data(), 2, 256, 1);
        std::vector<uint8_t> out;
        gpu_request(*box, staging.data(), 2, 256, 1, st, {9}, out);
      },
      "lists expert 9 of 4");
}

}  // namespace
}  // namespace dsv4
