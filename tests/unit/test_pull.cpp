// dsv4 pull's download (src/pull/download.h) against a local cpp-httplib server: a whole file, a
// resumed .part (Range), a connection that drops halfway (the next request resumes), a server that
// ignores ranges (restart from zero), a redirect, a 404, and a .part longer than the file (416).
// The published catalogue: every short name resolves, an unknown one lists them.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

#include "pull/download.h"
#include "pull/published.h"

using namespace dsv4;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
}

class PullServer : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 g(5);
    body_.resize(300000);
    for (auto& c : body_) c = static_cast<char>(g());
    // /file: ranges honoured (cpp-httplib answers Range requests of set_content with 206).
    server_.Get("/file", [this](const httplib::Request& req, httplib::Response& res) {
      ranges_.push_back(req.get_header_value("Range"));
      res.set_content(body_, "application/octet-stream");
    });
    // /drop: the first request sends a third of the body then drops the connection.
    server_.Get("/drop", [this](const httplib::Request& req, httplib::Response& res) {
      ranges_.push_back(req.get_header_value("Range"));
      if (drops_++ > 0) {
        res.set_content(body_, "application/octet-stream");
        return;
      }
      res.set_content_provider(body_.size(), "application/octet-stream",
                               [this](size_t offset, size_t, httplib::DataSink& sink) {
                                 if (offset >= body_.size() / 3) return false;  // drop
                                 sink.write(body_.data() + offset, body_.size() / 3 - offset);
                                 return true;
                               });
    });
    // /norange: always 200 with the whole body, chunked (no Content-Length: the stream's end is the file's).
    server_.Get("/norange", [this](const httplib::Request& req, httplib::Response& res) {
      ranges_.push_back(req.get_header_value("Range"));
      res.status = 200;
      res.set_chunked_content_provider("application/octet-stream", [this](size_t offset, httplib::DataSink& sink) {
        if (offset >= body_.size()) {
          sink.done();
          return true;
        }
        sink.write(body_.data() + offset, std::min<size_t>(65536, body_.size() - offset));
        return true;
      });
    });
    server_.Get("/moved", [](const httplib::Request&, httplib::Response& res) { res.set_redirect("/file"); });
    port_ = server_.bind_to_any_port("127.0.0.1");
    ASSERT_GT(port_, 0);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    dir_ = std::filesystem::temp_directory_path() / ("dsv4_test_pull_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    server_.stop();
    thread_.join();
    std::filesystem::remove_all(dir_);
  }
  DownloadOptions options(const std::string& route, const std::string& name) {
    DownloadOptions o;
    o.url = "http://127.0.0.1:" + std::to_string(port_) + route;
    o.path = (dir_ / name).string();
    o.retry_delay_ms = 10;
    o.max_attempts = 3;
    return o;
  }

  std::string body_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::filesystem::path dir_;
  std::vector<std::string> ranges_;  // the Range header of each request
  std::atomic<int> drops_{0};
};

}  // namespace

TEST_F(PullServer, WholeFileWithProgress) {
  DownloadOptions o = options("/file", "a.gguf");
  uint64_t last = 0, seen_total = 0;
  o.progress = [&](uint64_t done, uint64_t total) {
    EXPECT_GE(done, last);
    last = done;
    seen_total = total;
  };
  auto r = download_resumable(o);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->bytes, body_.size());
  EXPECT_EQ(r->resumed_from, 0u);
  EXPECT_EQ(r->attempts, 1);
  EXPECT_EQ(last, body_.size());
  EXPECT_EQ(seen_total, body_.size());
  EXPECT_EQ(read_file(o.path), body_);
  EXPECT_FALSE(std::filesystem::exists(o.path + ".part"));
  EXPECT_EQ(ranges_, std::vector<std::string>{""});
}

TEST_F(PullServer, APartFileIsResumedWithARangeRequest) {
  DownloadOptions o = options("/file", "b.gguf");
  write_file(o.path + ".part", body_.substr(0, 123457));
  auto r = download_resumable(o);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->resumed_from, 123457u);
  EXPECT_EQ(read_file(o.path), body_);
  EXPECT_EQ(ranges_, std::vector<std::string>{"bytes=123457-"});
}

TEST_F(PullServer, ADroppedConnectionResumesOnTheNextRequest) {
  DownloadOptions o = options("/drop", "c.gguf");
  auto r = download_resumable(o);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->attempts, 2);
  EXPECT_EQ(read_file(o.path), body_);
  ASSERT_EQ(ranges_.size(), 2u);
  EXPECT_EQ(ranges_[0], "");
  EXPECT_EQ(ranges_[1], "bytes=" + std::to_string(body_.size() / 3) + "-");
}

TEST_F(PullServer, AServerIgnoringRangesRestartsTheFile) {
  DownloadOptions o = options("/norange", "d.gguf");
  write_file(o.path + ".part", std::string(5000, 'x'));  // not even the right bytes: rewritten from zero
  auto r = download_resumable(o);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(read_file(o.path), body_);
  EXPECT_EQ(ranges_, std::vector<std::string>{"bytes=5000-"});  // asked for the rest, got the whole file
}

TEST_F(PullServer, RedirectsAreFollowed) {
  DownloadOptions o = options("/moved", "e.gguf");
  auto r = download_resumable(o);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(read_file(o.path), body_);
}

TEST_F(PullServer, ClearErrors) {
  DownloadOptions o = options("/missing", "f.gguf");
  auto r = download_resumable(o);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("HTTP 404"), std::string::npos) << r.error().message;
  EXPECT_FALSE(std::filesystem::exists(o.path + ".part"));  // no empty .part left behind
  EXPECT_FALSE(std::filesystem::exists(o.path));
  // A .part longer than the file: the server cannot satisfy the range.
  DownloadOptions l = options("/file", "g.gguf");
  write_file(l.path + ".part", body_ + "extra");
  r = download_resumable(l);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("HTTP 416"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("delete it"), std::string::npos) << r.error().message;
  // Nobody listening: the attempts run out, the message says so.
  DownloadOptions d = options("/file", "h.gguf");
  d.url = "http://127.0.0.1:1/file";
  d.max_attempts = 2;
  r = download_resumable(d);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("nothing downloaded after 2 requests"), std::string::npos) << r.error().message;
  d.url = "ftp://example.com/x";
  r = download_resumable(d);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("want http:// or https://"), std::string::npos) << r.error().message;
}

TEST(Published, EveryNameResolvesAndUnknownNamesListThem) {
  for (const PublishedFile& f : published_files()) {
    auto p = find_published(f.name);
    ASSERT_TRUE(p.has_value()) << f.name;
    EXPECT_STREQ(p->file, f.file);
    EXPECT_NE(std::string(f.file).find(".gguf"), std::string::npos) << f.name;
  }
  auto bad = find_published("q3");
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("q2, q2-q4, q4, mxfp4, dspark, mtp, pro-q2"), std::string::npos)
      << bad.error().message;
}
