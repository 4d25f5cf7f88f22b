// dgc plot's input and charts (plot_charts.h): the JSON lines read by their fields, grouped
// into series, and each chart's gnuplot commands with the data inline.
#include "dgc/cli/plot_charts.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dgc/core/error.h"

namespace dgc::cli::plot {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct MetricsRun {
  std::string file;
  std::string label;
  std::vector<json> epochs;
};

struct ExchangePoint {
  int workers = 0;
  double dgc_seconds = 0.0;
  double dense_seconds = 0.0;  // 0: not measured
};

// One kind of benchmark result (exchange or replayed step): its fields and its charts.
struct Benchmark {
  std::string kind;           // the "benchmark" field, and the charts' middle name
  std::string dgc_field;      // seconds of DGC
  std::string dense_field;    // seconds of dense, optional
  std::string series_field;   // the series' name after "profile" (the link's name)
  std::string detail_fields;  // added to the series name when present: "exchange|algorithm"
  std::string time_title;
  std::string dense_name;  // legend: "<dense_name>, <series>"
  std::string speedup_title;
  std::map<std::string, std::map<int, ExchangePoint>> series;  // series -> workers -> point
};
double number(const json& object, const std::string& field, const std::string& where) {
  const auto it = object.find(field);
  if (it == object.end() || !it->is_number()) {
    throw DataError(where + ": field '" + field + "' is missing or not a number");
  }
  return it->get<double>();
}

// An epoch's message bytes: "message_bytes", or in files written before that name, "bytes_sent".
std::optional<double> message_bytes(const json& epoch) {
  for (const char* field : {"message_bytes", "bytes_sent"}) {
    const auto it = epoch.find(field);
    if (it != epoch.end() && it->is_number()) return it->get<double>();
  }
  return std::nullopt;
}

// Metrics stored as fractions and drawn in %.
bool percent(const std::string& metric) {
  return metric == "test_accuracy" || metric.find("error_rate") != std::string::npos;
}

// Factor from a metric's stored value to the value drawn.
double drawn_scale(const std::string& metric) { return percent(metric) ? 100.0 : 1.0; }

std::string readable(const std::string& metric) {
  std::string out = metric;
  std::replace(out.begin(), out.end(), '_', ' ');
  if (percent(metric)) out += " (%)";
  return out;
}

class Plotter {
 public:
  explicit Plotter(const PlotCommand& cmd) : cmd_(cmd) {}

  void read() {
    if (!cmd_.labels.empty() && cmd_.labels.size() != cmd_.files.size()) {
      throw InvalidArgument(detail::concat("--label given ", cmd_.labels.size(), " times for ",
                                           cmd_.files.size(),
                                           " files; give one label per file, in order, or none"));
    }
    for (size_t f = 0; f < cmd_.files.size(); ++f) read_file(f);
    if (runs_.empty() && exchange_.series.empty() && step_.series.empty()) {
      throw DataError("no training metrics or benchmark results in the input");
    }
  }

  std::vector<Chart> charts() const {
    std::vector<Chart> out;
    if (!runs_.empty()) add_metrics_charts(out);
    for (const Benchmark* b : {&exchange_, &step_}) {
      if (!b->series.empty()) add_benchmark_charts(*b, out);
    }
    return out;
  }

 private:
  void read_file(size_t f) {
    const std::string& path = cmd_.files[f];
    std::ifstream in(path);
    if (!in) throw DataError("cannot open '" + path + "': check the path");
    MetricsRun run;
    run.file = path;
    std::string line;
    int line_number = 0;
    while (std::getline(in, line)) {
      ++line_number;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = detail::concat(path, ":", line_number);
      json object = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (object.is_discarded() || !object.is_object()) {
        throw DataError(where +
                        ": not a JSON object; dgc plot reads JSON lines as written by "
                        "`dgc train --metrics` or `dgc bench exchange --json`");
      }
      const std::string benchmark = object.value("benchmark", "");
      if (benchmark == exchange_.kind || benchmark == step_.kind) {
        add_point(benchmark == exchange_.kind ? exchange_ : step_, object, where);
      } else if (object.contains("epoch") && object.contains("seconds")) {
        number(object, "epoch", where);
        number(object, "seconds", where);
        run.epochs.push_back(std::move(object));
      } else {
        throw DataError(where +
                        ": neither training metrics (\"epoch\", \"seconds\") nor a "
                        "benchmark result (\"benchmark\": \"exchange\" or \"step\")");
      }
    }
    if (line_number == 0) throw DataError("'" + path + "' is empty");
    if (!run.epochs.empty()) {
      run.label = cmd_.labels.empty() ? "" : cmd_.labels[f];
      runs_.push_back(std::move(run));
    }
  }

  static void add_point(Benchmark& b, const json& object, const std::string& where) {
    ExchangePoint p;
    p.workers = static_cast<int>(number(object, "workers", where));
    p.dgc_seconds = number(object, b.dgc_field, where);
    const auto dense = object.find(b.dense_field);
    if (dense != object.end() && dense->is_number()) p.dense_seconds = dense->get<double>();
    std::string series = "loopback";
    for (const std::string& field : {std::string("profile"), b.series_field}) {
      if (object.contains(field) && object[field].is_string()) {
        series = object[field].get<std::string>();
        break;
      }
    }
    std::istringstream details(b.detail_fields);
    for (std::string field; std::getline(details, field, '|');) {
      if (object.contains(field) && object[field].is_string()) {
        series += ", " + object[field].get<std::string>();
        break;
      }
    }
    b.series[series][p.workers] = p;
  }

  // Default labels: the runs' "compression" values when they tell the runs apart, else the
  // file names without extension.
  std::vector<std::string> labels() const {
    std::vector<std::string> out;
    std::set<std::string> seen;
    bool distinct = true;
    for (const auto& run : runs_) {
      std::string label = run.label;
      if (label.empty()) {
        const std::string compression = run.epochs.front().value("compression", "");
        label = compression == "none" ? "dense" : compression == "dgc" ? "DGC" : compression;
      }
      if (label.empty() || !seen.insert(label).second) distinct = false;
      out.push_back(label);
    }
    if (!distinct) {
      for (size_t i = 0; i < runs_.size(); ++i) {
        if (runs_[i].label.empty()) out[i] = fs::path(runs_[i].file).stem().string();
      }
    }
    return out;
  }

  std::string metric() const {
    if (!cmd_.metric.empty()) {
      for (const auto& run : runs_) {
        for (size_t e = 0; e < run.epochs.size(); ++e) {
          number(run.epochs[e], cmd_.metric, detail::concat(run.file, ", epoch record ", e + 1));
        }
      }
      return cmd_.metric;
    }
    for (const char* candidate :
         {"test_accuracy", "test_perplexity", "validation_perplexity", "test_token_error_rate"}) {
      const bool everywhere = std::all_of(runs_.begin(), runs_.end(), [&](const MetricsRun& run) {
        return std::all_of(run.epochs.begin(), run.epochs.end(), [&](const json& e) {
          return e.contains(candidate) && e[candidate].is_number();
        });
      });
      if (everywhere) return candidate;
    }
    throw DataError(
        "the training metrics have no test_accuracy, test_perplexity, validation_perplexity or "
        "test_token_error_rate in every epoch of every file; name the field to draw with --metric");
  }

  std::string title(const std::string& text) const {
    return cmd_.title.empty() ? text : cmd_.title + ": " + text;
  }

  // A datablock per run: epoch, wall minutes, metric, message megabytes.
  std::string metrics_data(const std::string& field) const {
    std::ostringstream out;
    const double scale = drawn_scale(field);
    for (size_t r = 0; r < runs_.size(); ++r) {
      out << "$run" << r << " << EOD\n";
      double minutes = 0.0;
      for (const auto& e : runs_[r].epochs) {
        minutes += e["seconds"].get<double>() / 60.0;
        const double bytes = message_bytes(e).value_or(0.0);
        out << e["epoch"].get<double>() << " " << minutes << " " << scale * e[field].get<double>()
            << " " << bytes / 1e6 << "\n";
      }
      out << "EOD\n";
    }
    return out.str();
  }

  // `target`: the level (already scaled like the data) of a dashed reference line, if any.
  std::string metrics_plot(int x_column, int y_column,
                           std::optional<double> target = std::nullopt) const {
    const auto names = labels();
    std::string plot = "plot ";
    for (size_t r = 0; r < runs_.size(); ++r) {
      plot += detail::concat(r ? ", " : "", "$run", r, " using ", x_column, ":", y_column,
                             " with linespoints lw 2 pt 7 ps 0.8 title ", quote(names[r]));
    }
    if (target) {
      plot += detail::concat(", ", *target, " with lines dt 2 lw 2 lc rgb 'gray40' title ",
                             quote(cmd_.target_label));
    }
    return plot + "\n";
  }

  void add_metrics_charts(std::vector<Chart>& out) const {
    const std::string field = metric();
    const std::string data = metrics_data(field);
    const std::string ylabel = readable(field);
    const bool lower_is_better =
        field.find("perplexity") != std::string::npos || field.find("loss") != std::string::npos;
    const std::string key = lower_is_better ? "set key top right\n" : "set key bottom right\n";
    const std::string base = cmd_.name + "-" + field;
    std::optional<double> target;
    if (cmd_.target) target = *cmd_.target * drawn_scale(field);
    double last_epoch = 0;
    for (const auto& run : runs_)
      last_epoch = std::max(last_epoch, run.epochs.back()["epoch"].get<double>());
    const std::string epoch_tics = last_epoch <= 20 ? "set xtics 1\n" : "";
    out.push_back({base + "-epoch", data + "set title " + quote(title(ylabel + " by epoch")) +
                                        "\nset xlabel 'epoch'\nset ylabel " + quote(ylabel) + "\n" +
                                        key + epoch_tics + metrics_plot(1, 3, target)});
    out.push_back({base + "-time", data + "set title " + quote(title(ylabel + " by wall time")) +
                                       "\nset xlabel 'wall time (minutes)'\nset ylabel " +
                                       quote(ylabel) + "\n" + key + metrics_plot(2, 3, target)});
    const bool have_bytes = std::any_of(runs_.begin(), runs_.end(), [](const MetricsRun& run) {
      return std::all_of(run.epochs.begin(), run.epochs.end(),
                         [](const json& e) { return message_bytes(e).value_or(0.0) > 0; });
    });
    if (have_bytes) {
      out.push_back({cmd_.name + "-bytes",
                     data + "set title " + quote(title("message bytes per worker per epoch")) +
                         "\nset xlabel 'epoch'\nset ylabel 'message bytes per worker (MB)'\n"
                         "set logscale y\nset key top right\n" +
                         epoch_tics + metrics_plot(1, 4)});
    }
  }

  void add_benchmark_charts(const Benchmark& b, std::vector<Chart>& out) const {
    // Worker counts are usually powers of two: a log2 axis keeps 2, 4, 8, ... 256 apart.
    int max_workers = 0;
    for (const auto& [series, points] : b.series)
      max_workers = std::max(max_workers, points.rbegin()->first);
    const std::string worker_axis = max_workers <= 16 ? "set xtics 1\n" : "set logscale x 2\n";
    std::ostringstream data;
    int index = 0;
    std::string time_plot = "plot ";
    std::string speedup_plot = "plot ";
    bool any_speedup = false;
    const std::string block = "$" + b.kind;
    for (const auto& [series, points] : b.series) {
      data << block << index << " << EOD\n";
      for (const auto& [workers, p] : points) {
        const double speedup =
            p.dgc_seconds > 0 && p.dense_seconds > 0 ? p.dense_seconds / p.dgc_seconds : 0.0;
        data << workers << " " << 1e3 * p.dgc_seconds << " " << 1e3 * p.dense_seconds << " "
             << speedup << "\n";
        any_speedup = any_speedup || speedup > 0;
      }
      data << "EOD\n";
      const std::string sep = index ? ", " : "";
      time_plot +=
          detail::concat(sep, block, index, " using 1:2 with linespoints lw 2 pt 7 lc ", index + 1,
                         " title ", quote("DGC, " + series), ", ", block, index,
                         " using 1:($3 > 0 ? $3 : NaN) with linespoints lw 2 dt 2 pt 5 lc ",
                         index + 1, " title ", quote(b.dense_name + ", " + series));
      speedup_plot += detail::concat(sep, block, index,
                                     " using 1:($4 > 0 ? $4 : NaN) with linespoints lw 2 pt 7 lc ",
                                     index + 1, " title ", quote(series));
      ++index;
    }
    out.push_back({cmd_.name + "-" + b.kind + "-time",
                   data.str() + "set title " + quote(title(b.time_title)) +
                       "\nset xlabel 'workers'\nset ylabel 'time (ms)'\nset logscale y\n"
                       "set format y '%.0f'\nset key below\n" +
                       worker_axis + time_plot + "\n"});
    if (any_speedup) {
      out.push_back({cmd_.name + "-" + b.kind + "-speedup",
                     data.str() + "set title " + quote(title(b.speedup_title)) +
                         "\nset xlabel 'workers'\nset ylabel 'dense time / DGC time'\n"
                         "set yrange [0:*]\nset key below\n" +
                         worker_axis + speedup_plot + "\n"});
    }
  }

  const PlotCommand& cmd_;
  std::vector<MetricsRun> runs_;
  Benchmark exchange_{.kind = "exchange",
                      .dgc_field = "dgc_seconds",
                      .dense_field = "dense_seconds",
                      .series_field = "rate",
                      .detail_fields = "exchange|algorithm",
                      .time_title = "exchange time per iteration",
                      .dense_name = "dense allreduce",
                      .speedup_title = "speedup of the DGC exchange over a dense allreduce",
                      .series = {}};
  Benchmark step_{.kind = "step",
                  .dgc_field = "step_seconds_dgc",
                  .dense_field = "step_seconds_dense",
                  .series_field = "link",
                  .detail_fields = "model",
                  .time_title = "time per training step (replayed: compute + optimizer step)",
                  .dense_name = "dense",
                  .speedup_title = "speedup of DGC training steps over dense",
                  .series = {}};
};

}  // namespace

std::vector<Chart> read_charts(const PlotCommand& cmd) {
  Plotter plotter(cmd);
  plotter.read();
  return plotter.charts();
}

}  // namespace dgc::cli::plot
