// dgc-sim: the complete steps of `dgc bench step` (dense allreduce; DGC with each exchange
// algorithm) on a cluster simulated by SimGrid's SMPI, one rank per simulated host. Built with
// smpicxx (dgc/sim/CMakeLists.txt) and started by smpirun, e.g.
//   smpirun -np 16 -platform bench/platforms/ethernet-1g.xml -hostfile HOSTS
//     --cfg=smpi/host-speed:1Gf build/sim/dgc-sim --model resnet50
// (bench/sim_scaling.sh does it with the settings the results use). Rank 0 prints one JSON line
// per algorithm. See sim_step.h for what a step is and what runs for real.
#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

// smpicxx's helpers define exit() as a macro, which CLI11's App::exit member would expand.
#pragma push_macro("exit")
#undef exit
#include <CLI/CLI.hpp>
#pragma pop_macro("exit")
#include <nlohmann/json.hpp>

#include "dgc/comm/launch.h"
#include "dgc/core/error.h"
#include "dgc/sim/compute.h"
#include "dgc/sim/sim_step.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  dgc::sim::SimOptions o;
  std::vector<std::string> algorithms = {"dense", "allgather", "direct", "sparse-allreduce"};
  std::string platform = "unnamed";
  CLI::App app{"dgc-sim: DGC steps on a simulated cluster (run under smpirun)"};
  app.add_option("--model", o.model, "replay model (resnet50, alexnet, vgg16, lstm-ptb, cnn)");
  app.add_option("--compute-seconds", o.compute_seconds,
                 "forward + backward time per step (default: the model's, dgc/sim/compute.h)");
  app.add_option("--algorithms", algorithms, "dense and/or exchange algorithms")->delimiter(',');
  app.add_option("--density", o.density, "fraction of elements each rank sends");
  app.add_option("--overlap", o.overlap, "cross-rank overlap of the selected indices, [0, 1]");
  app.add_option("--sample-ranks", o.sample_ranks,
                 "ranks that compress and update for real (0: all)");
  app.add_option("--steps", o.steps, "timed steps");
  app.add_option("--warmup-steps", o.warmup_steps, "untimed steps first");
  app.add_flag("--private-buffers", o.private_buffers, "no SMPI shared allocations");
  app.add_flag("--check", o.check, "check every update against the reference");
  app.add_flag("--exchange-barrier", o.exchange_barrier,
               "a barrier before each exchange, outside its time (as dgc bench exchange)");
  app.add_option("--platform", platform, "platform label for the output");
  app.add_option("--seed", o.seed, "seed of the synthetic gradients");
  int rc = 0;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    rc = (app.exit)(e);  // parenthesised: not the exit macro
    MPI_Finalize();
    return rc;
  }
  try {
    auto comm = dgc::comm::connect_mpi(std::chrono::hours(24));
    const auto shapes = dgc::train::model_shapes(o.model);
    const double compute = o.compute_seconds >= 0 ? o.compute_seconds
                                                  : dgc::sim::default_compute_seconds().at(o.model);
    for (const std::string& algorithm : algorithms) {
      const auto r = dgc::sim::run_configuration(*comm, shapes, algorithm, o);
      if (r.check_mismatches > 0) rc = 1;
      if (comm->rank() != 0) continue;
      nlohmann::json j = {{"model", o.model},
                          {"parameters", dgc::train::parameter_count(shapes)},
                          {"nodes", comm->size()},
                          {"platform", platform},
                          {"algorithm", r.algorithm},
                          {"density", o.density},
                          {"overlap", o.overlap},
                          {"overlap_measured", r.overlap_measured},
                          {"sampled_ranks", r.sampled},
                          {"compute_seconds", compute},
                          {"step_s", r.step},
                          {"compute_s", r.compute},
                          {"compress_s", r.compress},
                          {"exchange_s", r.exchange},
                          {"exchange_sampled_s", r.exchange_sampled},
                          {"exchange_cpu_s", r.exchange_cpu},
                          {"update_s", r.update},
                          {"message_bytes", r.message_bytes},
                          {"wire_sent", r.wire_sent},
                          {"wire_received", r.wire_received},
                          {"steps", o.steps}};
      if (r.check_mismatches >= 0) j["check_mismatches"] = r.check_mismatches;
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dgc-sim: %s\n", e.what());
    rc = 2;
  }
  MPI_Finalize();
  return rc;
}
