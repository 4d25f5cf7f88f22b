// Progress display of a training run: a one-line bar redrawn in place on a terminal, plain lines
// (at most one per `plain_interval`) otherwise. Rank 0 only. Not thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "dgc/train/trainer.h"

namespace dgc::train {

// "812 B", "1.46 KB", "3.20 MB", "1.10 GB" (powers of 1000).
std::string format_bytes(double bytes);
// "42s", "3m05s", "1h02m".
std::string format_duration(double seconds);

class ProgressPrinter {
 public:
  // `terminal`: draw a bar with '\r' (pass isatty(fileno(out))).
  ProgressPrinter(std::FILE* out, bool terminal,
                  std::chrono::milliseconds plain_interval = std::chrono::seconds(10));

  void update(const Progress& progress);
  // Ends the bar's line (if one is drawn) so that other output starts on a fresh line.
  void break_line();
  // One line per finished epoch.
  void epoch(const EpochMetrics& metrics);

 private:
  std::FILE* out_;
  bool terminal_;
  std::chrono::milliseconds interval_;
  std::chrono::steady_clock::time_point last_;
  bool drawn_ = false;  // a bar is on the current line
  bool started_ = false;
};

}  // namespace dgc::train
