// Resumable HTTP(S) download of one large file (`dsv4 pull`).
//
// The bytes go to PATH.part; each request asks for the rest of it (`Range: bytes=N-`), so an
// interrupted download (a dropped connection, Ctrl-C, a reboot) continues where it stopped. A
// server that ignores the range (200 instead of 206) restarts the file from zero. The total size
// comes from Content-Range / Content-Length; the download checks that the disk has room for what
// is left before writing, and that exactly the total arrived, then fsyncs and renames PATH.part
// to PATH. Redirects are followed (the Hugging Face URLs redirect to a CDN).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/error.h"

namespace dsv4 {

struct DownloadOptions {
  std::string url;   // http:// or https://
  std::string path;  // the finished file (written as path + ".part" until complete)
  // Called as bytes arrive: bytes of the file present so far, and the total (0 until known).
  std::function<void(uint64_t done, uint64_t total)> progress;
  int max_attempts = 8;       // requests before giving up; each after a failure resumes
  int retry_delay_ms = 2000;  // wait between attempts (doubling, at most 30 s)
  int read_timeout_s = 60;    // a connection silent this long counts as dropped
};

struct DownloadResult {
  uint64_t bytes = 0;         // the file's size
  uint64_t resumed_from = 0;  // bytes of PATH.part present before the first request
  int attempts = 0;           // requests made
};

expected<DownloadResult> download_resumable(const DownloadOptions& options);

}  // namespace dsv4
