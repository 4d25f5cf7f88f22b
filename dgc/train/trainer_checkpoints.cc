// The trainer's checkpoints (trainer.h): writing them, and choosing and reading the one a run
// resumes from, which every rank must agree on.
#include <algorithm>
#include <sstream>

#include <torch/torch.h>

#include "dgc/core/error.h"
#include "dgc/train/checkpoint.h"
#include "dgc/train/optimizer.h"
#include "dgc/train/trainer_internal.h"

namespace dgc::train {
namespace trainer_detail {

// Every rank's `mine`, in rank order (collective).
std::vector<std::string> allgather_text(comm::Communicator& comm, const std::string& mine,
                                        comm::Timeout timeout) {
  const auto all = comm.allgatherv(
      std::span(reinterpret_cast<const uint8_t*>(mine.data()), mine.size()), timeout);
  std::vector<std::string> out;
  for (const auto& bytes : all) out.emplace_back(bytes.begin(), bytes.end());
  return out;
}

std::string steps_text(const std::vector<int64_t>& steps) {
  std::ostringstream text;
  for (size_t i = 0; i < steps.size(); ++i) text << (i == 0 ? "" : " ") << steps[i];
  return text.str();
}

std::vector<int64_t> parse_steps(const std::string& text) {
  std::istringstream in(text);
  std::vector<int64_t> steps;
  for (int64_t step = 0; in >> step;) steps.push_back(step);
  return steps;
}

bool contains(const std::vector<int64_t>& steps, int64_t step) {
  return std::find(steps.begin(), steps.end(), step) != steps.end();
}

// "rank 0: step 120, rank 1: step 100"
std::string per_rank_text(const std::vector<std::string>& values, const std::string& what) {
  std::string text;
  for (size_t r = 0; r < values.size(); ++r) {
    text += detail::concat(r == 0 ? "" : ", ", "rank ", r, ": ", what, values[r]);
  }
  return text;
}

}  // namespace trainer_detail

using namespace trainer_detail;

CheckpointFile Trainer::read_resume_checkpoint(int64_t* chosen) {
  const auto timeout = options_.optimizer.timeout;
  const int rank = comm_.rank();
  const int world = comm_.size();
  const std::string& prefix = options_.checkpoint;
  const std::string pattern = prefix + ".step<S>.rank<r>";

  // 1. Which steps every rank has files of.
  const auto listed = allgather_text(comm_, steps_text(checkpoint_steps(prefix, rank)), timeout);
  std::vector<std::vector<int64_t>> steps;
  for (const auto& text : listed) steps.push_back(parse_steps(text));
  std::vector<int64_t> common;
  for (const int64_t s : steps[0]) {
    bool everywhere = true;
    for (const auto& theirs : steps) everywhere = everywhere && contains(theirs, s);
    if (everywhere) common.push_back(s);
  }
  auto newest_common = [&](int64_t below) {
    for (auto it = common.rbegin(); it != common.rend(); ++it) {
      if (*it < below) {
        return detail::concat("the newest step every rank has is ", *it,
                              ": resume from it with --resume-step ", *it);
      }
    }
    return std::string(
        "no earlier step has a file of every rank: start a new run without "
        "--resume");
  };
  int64_t step = options_.resume_step;
  if (step >= 0) {
    std::string missing;
    for (int r = 0; r < world; ++r) {
      if (!contains(steps[r], step)) missing += detail::concat(missing.empty() ? "" : ", ", r);
    }
    if (!missing.empty()) {
      throw DataError(detail::concat("no checkpoint of step ", step, " for rank(s) ", missing, " (",
                                     pattern, "; steps found: ", per_rank_text(listed, ""), "); ",
                                     common.empty()
                                         ? std::string("no step has a file of every rank")
                                         : "steps every rank has: " + steps_text(common)));
    }
  } else {
    std::string missing;
    for (int r = 0; r < world; ++r) {
      if (steps[r].empty()) missing += detail::concat(missing.empty() ? "" : ", ", r);
    }
    if (!missing.empty()) {
      std::string present;
      for (int r = 0; r < world; ++r) {
        if (!steps[r].empty()) present += detail::concat(present.empty() ? "" : ", ", r);
      }
      throw DataError(
          "no checkpoint for rank(s) " + missing + " (files " + pattern + ")" +
          (present.empty()
               ? ": check --checkpoint, or start a new run without --resume"
               : "; rank(s) " + present +
                     " have one: was the run written by fewer workers? Resume with the same "
                     "number of workers"));
    }
    step = steps[0].back();
    bool same = true;
    for (const auto& theirs : steps) same = same && theirs.back() == step;
    if (!same) {
      std::vector<std::string> newest;
      for (const auto& theirs : steps) newest.push_back(std::to_string(theirs.back()));
      throw MismatchError("the ranks' newest checkpoints are from different steps (" +
                          per_rank_text(newest, "step ") +
                          "): the run stopped while writing them; " +
                          newest_common(std::numeric_limits<int64_t>::max()));
    }
  }

  // 2. This rank's file; every rank learns every rank's outcome, so that all refuse together.
  std::string error;
  std::unique_ptr<CheckpointFile> file;
  try {
    file =
        std::make_unique<CheckpointFile>(CheckpointFile::read(checkpoint_path(prefix, step, rank)));
  } catch (const DataError& e) {
    error = e.what();
  }
  const auto errors = allgather_text(comm_, error, timeout);
  std::string failed;
  for (int r = 0; r < world; ++r) {
    if (!errors[r].empty()) failed += detail::concat(failed.empty() ? "" : "; ", errors[r]);
  }
  if (failed.empty()) {
    *chosen = step;
    return std::move(*file);
  }

  // 3. The newest older step whose files every rank can read.
  std::vector<int64_t> readable;
  for (const int64_t s : common) {
    if (s >= step) continue;
    try {
      CheckpointFile::read(checkpoint_path(prefix, s, rank));
      readable.push_back(s);
    } catch (const DataError&) {
    }
  }
  const auto all_readable = allgather_text(comm_, steps_text(readable), timeout);
  int64_t previous = -1;
  for (const int64_t s : readable) {
    bool everywhere = true;
    for (const auto& theirs : all_readable)
      everywhere = everywhere && contains(parse_steps(theirs), s);
    if (everywhere) previous = std::max(previous, s);
  }
  std::string remedy;
  if (previous >= 0) {
    remedy =
        detail::concat("The newest older checkpoint every rank can read is step ", previous, " (",
                       checkpoint_path(prefix, previous, 0), " ..", world > 1 ? " .rank" : "",
                       world > 1 ? std::to_string(world - 1) : std::string(),
                       "): resume from it with "
                       "--resume-step ",
                       previous, " (its first checkpoint deletes the later steps' files)");
  } else {
    remedy = "No older checkpoint every rank can read: start a new run without --resume";
  }
  throw DataError(detail::concat("cannot resume from step ", step, ": ", failed, ". ", remedy));
}

void Trainer::save_checkpoint(int epochs_done, const EpochProgress* epoch_progress) {
  optimizer_->flush();  // a pipelined step's update belongs in the checkpoint
  CheckpointFile file;
  optimizer_->save(file);
  file.put_text("train/epochs_done", std::to_string(epochs_done));
  if (epoch_progress != nullptr) {
    file.put_text("train/epoch_loss_sum", double_text(epoch_progress->loss_sum));
    file.put_text("train/epoch_bytes_start", bytes_text(epoch_progress->bytes_before));
    file.put_text("train/epoch_train_seconds", double_text(epoch_progress->train_seconds));
    file.put_text("train/epoch_exchange_seconds", double_text(epoch_progress->exchange_seconds));
    file.put_text("train/epoch_skipped_steps", std::to_string(epoch_progress->skipped_steps));
    worker_->save_state(file);
  }
  const int64_t step = optimizer_->iteration();
  file.write(checkpoint_path(options_.checkpoint, step, comm_.rank()));
  // The barrier: every rank has written this step. An allgather of the step rather than
  // Communicator::barrier, because the ring collective's errors name the rank that stalled or died
  // (Gloo's barrier does not), and every rank checks that all wrote the same step.
  const std::string mine = std::to_string(step);
  const auto written = allgather_text(comm_, mine, options_.optimizer.timeout);
  for (const auto& theirs : written) {
    if (theirs != mine) {
      throw MismatchError("the ranks wrote checkpoints of different steps (" +
                          per_rank_text(written, "step ") + "): the ranks are out of step");
    }
  }
  // Every rank has written this step: older sets may go.
  remove_old_checkpoints(options_.checkpoint, comm_.rank(), step, options_.checkpoint_keep);
}

}  // namespace dgc::train
