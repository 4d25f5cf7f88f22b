#include "dgc/train/resume.h"

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "dgc/core/error.h"
#include "dgc/core/key_value.h"
#include "dgc/train/trainer_internal.h"

namespace dgc::train {
namespace {

using trainer_detail::allgather_text;
using trainer_detail::contains;
using trainer_detail::parse_steps;
using trainer_detail::steps_text;

// The settings a different world size changes (options.cc, describe()).
bool depends_on_world_size(const std::string& key) {
  return key == "iterations_per_epoch" || key == "warmup_stage_iterations";
}

// Records of per-rank DGC state that are handed over (resume.h).
bool is_per_rank_state(const std::string& name) {
  return name.rfind("dgc/momentum/", 0) == 0 || name.rfind("dgc/velocity/", 0) == 0 ||
         name == "optimizer/dense_residual";
}

std::vector<float> floats_of(const CheckpointFile& file, const std::string& name) {
  const CheckpointRecord& record = file.get(name);
  std::vector<float> values(record.data.size() / sizeof(float));
  file.get_floats(name, values);
  return values;
}

// Rank 0's decision: "fresh", "same STEP", "new STEP WORLD" or "error MESSAGE".
std::string decide(const std::string& prefix, int world, const std::vector<std::string>& listed) {
  std::vector<std::vector<int64_t>> steps;
  bool any = false;
  for (const auto& text : listed) {
    steps.push_back(parse_steps(text));
    any = any || !steps.back().empty();
  }
  if (!any) return "fresh";
  const std::string pattern = prefix + ".step<S>.rank<r>";
  if (steps[0].empty()) {
    return "error no checkpoint of rank 0 (" + pattern +
           ") although other ranks have some: check --checkpoint, or remove the files and start "
           "a new run";
  }
  std::string passed;  // why newer steps of rank 0 were passed over
  for (auto it = steps[0].rbegin(); it != steps[0].rend(); ++it) {
    const int64_t step = *it;
    int stored_world = 0;
    try {
      const auto file = CheckpointFile::read(checkpoint_path(prefix, step, 0));
      stored_world = static_cast<int>(read_int(file, "optimizer/world_size"));
    } catch (const DataError& e) {
      passed += detail::concat("; step ", step, ": ", e.what());
      continue;
    }
    std::string missing;
    for (int r = 1; r < stored_world; ++r) {
      const bool present = r < world ? contains(steps[r], step)
                                     : std::filesystem::exists(checkpoint_path(prefix, step, r));
      if (!present) missing += detail::concat(missing.empty() ? "" : ", ", r);
    }
    if (missing.empty()) {
      return stored_world == world ? detail::concat("same ", step)
                                   : detail::concat("new ", step, " ", stored_world);
    }
    passed += detail::concat("; step ", step, " (", stored_world, " workers): no file of rank(s) ",
                             missing);
  }
  return "error no complete checkpoint set under " + pattern + passed +
         ": start a new run with another --checkpoint, or remove these files";
}

}  // namespace

AutoResume choose_auto_resume(comm::Communicator& comm, const std::string& prefix,
                              comm::Timeout timeout) {
  const auto listed =
      allgather_text(comm, steps_text(checkpoint_steps(prefix, comm.rank())), timeout);
  const std::string mine = comm.rank() == 0 ? decide(prefix, comm.size(), listed) : "";
  const std::string decision = allgather_text(comm, mine, timeout)[0];
  std::istringstream in(decision);
  std::string kind;
  in >> kind;
  AutoResume found;
  if (kind == "fresh") return found;
  if (kind == "error") throw DataError("--resume auto: " + decision.substr(6));
  in >> found.step;
  if (kind == "same") {
    found.kind = AutoResume::Kind::kSameWorld;
    found.stored_world = comm.size();
  } else {
    DGC_CHECK(kind == "new", "auto resume decision '", decision, "'");
    found.kind = AutoResume::Kind::kNewWorld;
    in >> found.stored_world;
  }
  DGC_CHECK(static_cast<bool>(in) && found.step >= 0 && found.stored_world >= 1,
            "auto resume decision '", decision, "'");
  return found;
}

std::vector<int> inherited_ranks(int rank, int world, int stored_world) {
  std::vector<int> ranks;
  for (int r = rank; r < stored_world; r += world) ranks.push_back(r);
  return ranks;
}

int64_t rescaled_iteration(int64_t iteration, int64_t epochs_done, int64_t old_iterations_per_epoch,
                           int stored_world, int world, int64_t new_iterations_per_epoch) {
  const int64_t in_epoch = iteration - epochs_done * old_iterations_per_epoch;
  DGC_CHECK(in_epoch >= 0 && in_epoch < std::max<int64_t>(old_iterations_per_epoch, 1),
            "iteration ", iteration, " after ", epochs_done, " epochs of ",
            old_iterations_per_epoch);
  const int64_t moved = std::min(new_iterations_per_epoch - 1, in_epoch * stored_world / world);
  return epochs_done * new_iterations_per_epoch + std::max<int64_t>(moved, 0);
}

CheckpointFile rescale_checkpoint(const std::vector<CheckpointFile>& inherited,
                                  const CheckpointFile& rank0, const CheckpointFile& fresh,
                                  int rank, int world, const std::string& settings,
                                  int64_t iterations_per_epoch, bool lr_follows_world_size) {
  const CheckpointFile& base = inherited.empty() ? rank0 : inherited.front();
  const std::string stored = base.text("optimizer/settings");
  const auto stored_map = parse_key_value_lines(stored);
  const auto current_map = parse_key_value_lines(settings);
  for (const auto& [key, value] : stored_map) {
    const auto it = current_map.find(key);
    // Under TrainOptions::lr_scaling the rate follows the global batch, so the new world size's.
    if (depends_on_world_size(key) || (lr_follows_world_size && key == "lr") ||
        (it != current_map.end() && it->second == value)) {
      continue;
    }
    std::string difference = describe_settings_difference(stored, settings);
    throw DataError("checkpoint " + base.path() + " was written by a run with other settings: " +
                    difference + ". Resume with the same flags, or start a new run");
  }
  for (const auto& [key, value] : current_map) {
    if (!stored_map.count(key)) {
      throw DataError("checkpoint " + base.path() + " was written by a run with other settings: " +
                      describe_settings_difference(stored, settings) +
                      ". Resume with the same flags, or start a new run");
    }
  }
  const auto old_iterations = stored_map.find("iterations_per_epoch");
  if (old_iterations == stored_map.end()) {
    throw DataError("checkpoint " + base.path() +
                    " does not record its iterations per epoch: it cannot be resumed at another "
                    "world size");
  }
  const int stored_world = static_cast<int>(read_int(base, "optimizer/world_size"));
  const int64_t iteration = read_int(base, "optimizer/iteration");
  const int64_t epochs_done = read_int(base, "train/epochs_done");
  const auto expected = inherited_ranks(rank, world, stored_world);
  DGC_CHECK_EQ(expected.size(), inherited.size(), "files inherited by rank ", rank);
  for (size_t i = 0; i < inherited.size(); ++i) {
    const CheckpointFile& file = inherited[i];
    if (read_int(file, "optimizer/rank") != expected[i] ||
        read_int(file, "optimizer/world_size") != stored_world ||
        read_int(file, "optimizer/iteration") != iteration) {
      throw DataError(detail::concat("checkpoint ", file.path(), " is not rank ", expected[i],
                                     " of ", stored_world, " at iteration ", iteration,
                                     " as the set's other files say"));
    }
  }

  CheckpointFile out = base;
  out.put_text("optimizer/settings", settings);
  out.put_text("optimizer/world_size", std::to_string(world));
  out.put_text("optimizer/rank", std::to_string(rank));
  out.put_text(
      "optimizer/iteration",
      std::to_string(rescaled_iteration(iteration, epochs_done, std::stoll(old_iterations->second),
                                        stored_world, world, iterations_per_epoch)));
  // Per-rank DGC state: the inherited ranks' sum, scaled so that sum / world stays what it was.
  const float scale = static_cast<float>(world) / static_cast<float>(stored_world);
  for (const auto& [name, record] : base.records()) {
    if (!is_per_rank_state(name)) continue;
    std::vector<float> sum(record.data.size() / sizeof(float), 0.0f);
    for (const auto& file : inherited) {
      const auto values = floats_of(file, name);
      DGC_CHECK_EQ(values.size(), sum.size(), "record ", name, " of ", file.path());
      for (size_t e = 0; e < sum.size(); ++e) sum[e] += values[e];
    }
    for (float& value : sum) value *= scale;
    out.put_floats(name, sum);
  }
  if (base.has("train/epoch_loss_sum")) {
    double loss = 0.0;
    for (const auto& file : inherited) loss += read_double(file, "train/epoch_loss_sum");
    out.put_text("train/epoch_loss_sum", double_text(loss));
  }
  if (inherited.empty()) {
    // A joining rank: its own counters (zero) and its own compressor RNG.
    out.put_text("optimizer/bytes_total", fresh.text("optimizer/bytes_total"));
    out.put_text("optimizer/bytes_post_warmup", fresh.text("optimizer/bytes_post_warmup"));
    if (out.has("train/epoch_bytes_start")) {
      out.put_text("train/epoch_bytes_start", fresh.text("optimizer/bytes_total"));
    }
    if (fresh.has("dgc/rng")) out.put_text("dgc/rng", fresh.text("dgc/rng"));
  }
  return out;
}

CheckpointFile read_rescaled_checkpoint(comm::Communicator& comm, const std::string& prefix,
                                        const AutoResume& found, const CheckpointFile& fresh,
                                        const std::string& settings, int64_t iterations_per_epoch,
                                        comm::Timeout timeout, bool lr_follows_world_size) {
  std::string error;
  CheckpointFile result;
  try {
    std::vector<CheckpointFile> inherited;
    for (const int r : inherited_ranks(comm.rank(), comm.size(), found.stored_world)) {
      inherited.push_back(CheckpointFile::read(checkpoint_path(prefix, found.step, r)));
    }
    const CheckpointFile rank0 = inherited.empty()
                                     ? CheckpointFile::read(checkpoint_path(prefix, found.step, 0))
                                     : CheckpointFile();
    result = rescale_checkpoint(inherited, rank0, fresh, comm.rank(), comm.size(), settings,
                                iterations_per_epoch, lr_follows_world_size);
  } catch (const DataError& e) {
    error = e.what();
  }
  const auto errors = allgather_text(comm, error, timeout);
  std::string failed;
  for (const auto& theirs : errors) {
    if (!theirs.empty()) failed += (failed.empty() ? "" : "; ") + theirs;
  }
  if (!failed.empty()) {
    throw DataError(detail::concat("--resume auto: cannot hand the checkpoint of step ", found.step,
                                   " (", found.stored_world, " workers) over to ", comm.size(),
                                   " workers: ", failed));
  }
  return result;
}

}  // namespace dgc::train
