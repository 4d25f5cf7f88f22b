// dgc plot's model of its input and its charts (plot.cc has the command and its description of
// the inputs): reading the JSON lines, grouping them into series, and the gnuplot commands of each
// chart.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace dgc::cli::plot {

struct PlotCommand {
  std::vector<std::string> files;
  std::vector<std::string> labels;
  std::string out = "plots";
  std::string name = "dgc";
  std::string metric;            // empty: automatic
  std::string title;             // prefix of every chart title
  std::optional<double> target;  // a reference level of the metric, drawn as a line
  std::string target_label = "target";
  int width = 800;
  int height = 500;
};

// One chart: its gnuplot commands after the terminal and output are set.
struct Chart {
  std::string file;      // without extension
  std::string commands;  // title, axes, plot
};

// Reads every file of cmd (throws dgc::DataError on an input it cannot read or recognise, and
// dgc::InvalidArgument on a --label count that does not match) and returns the charts to draw.
std::vector<Chart> read_charts(const PlotCommand& cmd);

// gnuplot single-quoted string: only ' needs escaping (doubled).
inline std::string quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

}  // namespace dgc::cli::plot
