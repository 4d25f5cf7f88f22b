#include "dgc/train/progress.h"

#include <cmath>

namespace dgc::train {

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int unit = 0;
  while (bytes >= 1000.0 && unit < 4) {
    bytes /= 1000.0;
    ++unit;
  }
  char text[32];
  if (unit == 0) {
    std::snprintf(text, sizeof(text), "%.0f B", bytes);
  } else {
    std::snprintf(text, sizeof(text), "%.2f %s", bytes, units[unit]);
  }
  return text;
}

std::string format_duration(double seconds) {
  const auto s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  char text[32];
  if (s < 60) {
    std::snprintf(text, sizeof(text), "%llds", static_cast<long long>(s));
  } else if (s < 3600) {
    std::snprintf(text, sizeof(text), "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  } else {
    std::snprintf(text, sizeof(text), "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>((s % 3600) / 60));
  }
  return text;
}

ProgressPrinter::ProgressPrinter(std::FILE* out, bool terminal,
                                 std::chrono::milliseconds plain_interval)
    : out_(out), terminal_(terminal), interval_(plain_interval) {}

void ProgressPrinter::update(const Progress& p) {
  const auto now = std::chrono::steady_clock::now();
  if (!started_) {
    started_ = true;
    last_ = now;
  }
  const bool end_of_epoch = p.iteration == p.iterations_per_epoch;
  if (terminal_) {
    if (drawn_ && !end_of_epoch && now - last_ < std::chrono::milliseconds(100)) return;
  } else if (end_of_epoch || now - last_ < interval_) {
    return;  // plain output: one line per interval; the epoch line follows at the end
  }
  last_ = now;
  const double fraction = static_cast<double>(p.iteration) /
                          static_cast<double>(std::max<int64_t>(1, p.iterations_per_epoch));
  const std::string stats = "loss " + std::to_string(p.loss).substr(0, 6) + "  " +
                            std::to_string(static_cast<int64_t>(p.items_per_second)) + " " +
                            p.item_unit + "/s  sent " +
                            format_bytes(static_cast<double>(p.message_bytes)) + "  left " +
                            format_duration(p.seconds_left);
  if (terminal_) {
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(fraction * kWidth);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.append(static_cast<size_t>(kWidth - filled), '.');
    std::fprintf(out_, "\r\033[Kepoch %d/%d [%s] %3.0f%%  %s", p.epoch + 1, p.epochs, bar.c_str(),
                 100.0 * fraction, stats.c_str());
    drawn_ = true;
  } else {
    std::fprintf(out_, "epoch %d/%d  %5.1f%%  %s\n", p.epoch + 1, p.epochs, 100.0 * fraction,
                 stats.c_str());
  }
  std::fflush(out_);
}

void ProgressPrinter::break_line() {
  if (terminal_ && drawn_) {
    std::fprintf(out_, "\r\033[K");
    std::fflush(out_);
  }
  drawn_ = false;
}

void ProgressPrinter::epoch(const EpochMetrics& m) {
  break_line();
  std::string evaluation;
  for (const auto& metric : m.evaluation) evaluation += metric.text + "  ";
  const std::string resumed =
      m.resumed_at > 0 ? "  (resumed after iteration " + std::to_string(m.resumed_at) + ")" : "";
  std::fprintf(out_,
               "epoch %d  train loss %.4f  %slr %.4g  "
               "density %.4g  sent %s (dense %s, ratio %.1fx)  %s%s\n",
               m.epoch, m.train_loss, evaluation.c_str(), m.lr, m.density,
               format_bytes(static_cast<double>(m.bytes.message)).c_str(),
               format_bytes(static_cast<double>(m.bytes.dense_gradient)).c_str(),
               m.compression_ratio, format_duration(m.seconds).c_str(), resumed.c_str());
  std::fflush(out_);
}

}  // namespace dgc::train
