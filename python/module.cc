// dgc._C: the Python bindings of the C++ core. Tensors and process groups cross the boundary
// through libtorch's own pybind11 casters (torch/extension.h): a Python torch.Tensor becomes an
// at::Tensor, and a torch.distributed.ProcessGroup a c10::intrusive_ptr<c10d::ProcessGroup>,
// without copies, because this module links the libtorch and libtorch_python the Python process
// has loaded and is built with the same pybind11 ABI (see python/CMakeLists.txt).
//
// What is bound:
//   Options            dgc::train::OptimizerOptions, from keyword arguments;
//   Step               dgc::train::BucketedStep over a ProcessGroup communicator: the engine
//                      of the DDP hook (dgc/torch.py), one message or buckets started as DDP
//                      hands them over during the backward pass;
//   DGCError ...       the dgc::Error family as Python exceptions, messages unchanged;
//   _choose_exchange   the exchange dgc plan's cost model predicts fastest for a stated link;
//   _distributed_optimizer_steps  runs the C++ DistributedOptimizer over a process group (the
//                      reference the tests compare the hook with).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "dgc/comm/process_group.h"
#include "dgc/core/auth.h"
#include "dgc/core/clip.h"
#include "dgc/core/error.h"
#include "dgc/train/buckets.h"
#include "dgc/train/exchange_choice.h"
#include "dgc/train/optimizer.h"
#include "dgc/train/step.h"
#include "python/device_compressor.h"
#include "python/device_step.h"

namespace py = pybind11;

namespace dgc::python {
namespace {

using train::OptimizerOptions;

// The keyword arguments of dgc.torch.DGCState, one to one onto OptimizerOptions (the names are
// those of `dgc train`'s flags).
OptimizerOptions make_options(const std::string& compression, double density, double warmup_epochs,
                              int warmup_stages, int64_t iterations_per_epoch, double momentum,
                              bool nesterov, bool masking, double weight_decay, double clip_norm,
                              const std::string& selection, double sample_ratio,
                              const std::string& value_type, int64_t min_compress_numel,
                              bool compress_1d, const std::string& exchange, uint64_t seed,
                              double timeout_seconds, const std::string& dense_path,
                              double dense_path_density, const std::string& selection_scope,
                              const std::string& clip_scaling, const std::string& on_nonfinite,
                              int64_t max_consecutive_skips, double bucket_cap_mb,
                              double last_bucket_cap_mb) {
  DGC_CHECK(iterations_per_epoch >= 1, "iterations_per_epoch must be at least 1, got ",
            iterations_per_epoch, " (pass the length of the training data loader)");
  DGC_CHECK(warmup_stages >= 0, "warmup_stages must be >= 0, got ", warmup_stages);
  DGC_CHECK(warmup_epochs >= 0, "warmup_epochs must be >= 0, got ", warmup_epochs);
  DGC_CHECK(timeout_seconds > 0, "timeout must be positive, got ", timeout_seconds, " s");
  OptimizerOptions o;
  o.compression = train::parse_compression(compression);
  o.density.after_warmup = density;
  o.density.warmup_epochs = warmup_epochs;
  if (warmup_stages > 0 && warmup_epochs > 0) {
    // The paper's stages fitted into the warm-up epochs, as `dgc train --warmup-stages` does.
    const double warmup_iterations = warmup_epochs * static_cast<double>(iterations_per_epoch);
    o.density.iterations_per_stage =
        std::max<int64_t>(1, static_cast<int64_t>(std::ceil(warmup_iterations / warmup_stages)));
  }
  o.iterations_per_epoch = iterations_per_epoch;
  o.compressor.momentum = {.factor = momentum, .nesterov = nesterov, .masking = masking};
  o.compressor.selection.method = parse_name(kSelectionMethodNames, selection, "selection");
  o.compressor.selection.sample_ratio = sample_ratio;
  o.compressor.value_type = parse_value_type(value_type);
  o.compressor.seed = seed;
  o.policy = {.min_numel = min_compress_numel, .compress_1d = compress_1d};
  o.exchange = parse_exchange_algorithm(exchange);
  o.weight_decay = weight_decay;
  o.clip_norm = clip_norm;
  o.clip_scaling = parse_clip_scaling(clip_scaling);
  o.dense_path = train::parse_dense_path(dense_path);
  o.dense_path_density = dense_path_density;
  o.selection_scope = train::parse_selection_scope(selection_scope);
  o.on_nonfinite = train::parse_nonfinite_policy(on_nonfinite);
  DGC_CHECK(max_consecutive_skips >= 1, "max_consecutive_skips must be at least 1, got ",
            max_consecutive_skips);
  o.max_consecutive_skips = max_consecutive_skips;
  DGC_CHECK(bucket_cap_mb >= 0, "bucket_cap_mb must be >= 0 (0: one message), got ", bucket_cap_mb);
  o.bucket_cap_mb = bucket_cap_mb;
  DGC_CHECK(last_bucket_cap_mb >= 0,
            "last_bucket_cap_mb must be >= 0 (0: as the cap gives it), got ", last_bucket_cap_mb);
  o.last_bucket_cap_mb = last_bucket_cap_mb;
  // The learning rate belongs to the user's optimizer; the C++ reference runs use it constant.
  o.lr.warmup_epochs = 0;
  o.lr.decay = LearningRateSchedule::Decay::kConstant;
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000.0));
  // The job secret, as `dgc train` reads it (never a keyword argument: it would end up in
  // scripts): with DGC_JOB_SECRET set the hook's exchange messages carry HMAC-SHA256 tags.
  if (auto secret = load_job_secret("", std::getenv(kJobSecretEnv))) {
    o.message_key = derive_job_keys(*secret).exchange;
    wipe(*secret);
  }
  return o;
}

// A float32 CPU contiguous tensor with this data, or a copy that is (CUDA or other dtypes).
torch::Tensor host_float(const torch::Tensor& t, const std::string& what) {
  DGC_CHECK(t.defined(), what, " is undefined");
  DGC_CHECK(t.is_floating_point(), what, " must be a floating-point tensor, got ",
            c10::toString(t.scalar_type()));
  if (t.is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous()) return t;
  return t.to(torch::kCPU, torch::kFloat32).contiguous();
}

std::span<float> span_of(const torch::Tensor& t) {
  return {t.data_ptr<float>(), static_cast<size_t>(t.numel())};
}

py::dict bytes_dict(const ExchangeBytes& b) {
  py::dict d;
  d["message"] = b.message;
  d["dense_gradient"] = b.dense_gradient;
  d["wire_sent"] = b.wire_sent;
  d["wire_received"] = b.wire_received;
  d["dense_wire_sent"] = b.dense_wire_sent;
  return d;
}

ExchangeBytes bytes_from(const py::dict& d) {
  ExchangeBytes b;
  b.message = d["message"].cast<uint64_t>();
  b.dense_gradient = d["dense_gradient"].cast<uint64_t>();
  b.wire_sent = d["wire_sent"].cast<uint64_t>();
  b.wire_received = d["wire_received"].cast<uint64_t>();
  b.dense_wire_sent = d["dense_wire_sent"].cast<uint64_t>();
  return b;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> named_shapes(
    const std::vector<std::string>& names, const std::vector<std::vector<int64_t>>& shapes) {
  DGC_CHECK_EQ(names.size(), shapes.size(), "names and shapes");
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (size_t i = 0; i < names.size(); ++i) out.emplace_back(names[i], shapes[i]);
  return out;
}

comm::ProcessGroupOptions group_options(const OptimizerOptions& options,
                                        const std::string& device) {
  return {.timeout = options.timeout, .device = c10::Device(device)};
}

// A BucketedStep (dgc/train/buckets.h) with the communicator it runs over: one message (run), or
// buckets whose steps start on its communication thread as the DDP hook hands their gradients
// over during the backward pass (gradients_ready ... finish).
class Step {
 public:
  Step(c10::intrusive_ptr<c10d::ProcessGroup> group, const std::vector<std::string>& names,
       const std::vector<std::vector<int64_t>>& shapes, const OptimizerOptions& options,
       const std::string& run_settings, const std::string& device)
      : comm_(comm::connect_process_group(std::move(group), group_options(options, device))),
        step_(*comm_, named_shapes(names, shapes), options, run_settings) {}
  ~Step() { step_.stop(); }

  // grads[i], weights[i]: tensor i of the layout. The directions are written into grads (zeros
  // when every rank skipped the step: then returns false).
  bool run(const std::vector<torch::Tensor>& grads, const std::vector<torch::Tensor>& weights) {
    const auto& layout = step_.layout();
    DGC_CHECK_EQ(grads.size(), layout.size(), "gradient tensors (one per parameter)");
    DGC_CHECK_EQ(weights.size(), layout.size(), "weight tensors (one per parameter)");
    std::vector<std::span<float>> grad_spans;
    std::vector<std::span<const float>> weight_spans;
    for (size_t i = 0; i < layout.size(); ++i) {
      hold(i, grads[i], weights[i]);
      grad_spans.push_back(span_of(held_.back().host_grad));
      weight_spans.push_back(span_of(held_.back().host_weight));
    }
    bool taken = false;
    {
      py::gil_scoped_release release;
      taken = step_.run(grad_spans, weight_spans, grad_spans);
    }
    give_back();
    return taken;
  }

  // The gradients of layout tensors `indices` are final (one DDP bucket's): each of our buckets
  // starts once all its tensors are given. The tensors must stay alive until finish(), which
  // writes the directions into `grads`.
  void gradients_ready(const std::vector<int64_t>& indices, const std::vector<torch::Tensor>& grads,
                       const std::vector<torch::Tensor>& weights) {
    DGC_CHECK_EQ(grads.size(), indices.size(), "gradient tensors (one per index)");
    DGC_CHECK_EQ(weights.size(), indices.size(), "weight tensors (one per index)");
    for (size_t k = 0; k < indices.size(); ++k) {
      DGC_CHECK(indices[k] >= 0 && static_cast<size_t>(indices[k]) < step_.layout().size(),
                "tensor index ", indices[k], " outside the layout's ", step_.layout().size());
      const auto t = static_cast<size_t>(indices[k]);
      hold(t, grads[k], weights[k]);
      Held& h = held_.back();
      step_.gradient_ready(t, span_of(h.host_grad), span_of(h.host_weight), span_of(h.host_grad));
    }
  }

  // Waits for every bucket of the step (every tensor must have been given), writes the
  // directions into the gradients given and returns as run() does.
  bool finish() {
    bool taken = false;
    try {
      py::gil_scoped_release release;
      taken = step_.finish();
    } catch (...) {
      held_.clear();
      throw;
    }
    give_back();
    return taken;
  }

  // A step in flight is abandoned (after an error on this rank's side of the hook); the state is
  // then unusable for further steps.
  void abandon() {
    {
      py::gil_scoped_release release;
      step_.stop();
    }
    held_.clear();
  }

  train::BucketedStep& step() { return step_; }
  comm::Communicator& comm() { return *comm_; }

 private:
  // A tensor given to the step: the caller's gradient and the float32 host tensors the step works
  // on (the same tensors where the caller's already are).
  struct Held {
    torch::Tensor grad, host_grad, host_weight;
  };
  void hold(size_t t, const torch::Tensor& grad, const torch::Tensor& weight) {
    const auto& spec = step_.layout()[t];
    DGC_CHECK_EQ(grad.numel(), spec.numel(), "elements of the gradient of '", spec.name, "'");
    DGC_CHECK_EQ(weight.numel(), spec.numel(), "elements of parameter '", spec.name, "'");
    held_.push_back({grad, host_float(grad, "the gradient of '" + spec.name + "'"),
                     host_float(weight.detach(), "parameter '" + spec.name + "'")});
  }
  // The directions back into the caller's gradients where the step worked on copies.
  void give_back() {
    for (Held& h : held_) {
      if (!h.host_grad.is_same(h.grad)) h.grad.copy_(h.host_grad.view_as(h.grad));
    }
    held_.clear();
  }

  std::unique_ptr<comm::Communicator> comm_;
  train::BucketedStep step_;
  std::vector<Held> held_;
};

// A DeviceStep (device_step.h) with the communicator it runs over: the hook's step when the
// gradients stay on their device. `exchange_device`: where the process group's collectives take
// their tensors (cuda:<n> for NCCL, cpu otherwise); `device`: where the gradients and the state
// are.
class DeviceStepHolder {
 public:
  DeviceStepHolder(c10::intrusive_ptr<c10d::ProcessGroup> group,
                   const std::vector<std::string>& names,
                   const std::vector<std::vector<int64_t>>& shapes, const OptimizerOptions& options,
                   const std::string& run_settings, const std::string& exchange_device,
                   const std::string& device)
      : comm_(
            comm::connect_process_group(std::move(group), group_options(options, exchange_device))),
        step_(*comm_, named_shapes(names, shapes), options, run_settings, c10::Device(device)) {}

  bool run(const std::vector<torch::Tensor>& grads, const std::vector<torch::Tensor>& weights) {
    py::gil_scoped_release release;
    return step_.run(grads, weights);
  }

  DeviceStep& step() { return step_; }
  comm::Communicator& comm() { return *comm_; }

 private:
  std::unique_ptr<comm::Communicator> comm_;
  DeviceStep step_;
};

// One DeviceCompressor step next to the core Compressor's on copies of the same state, for the
// tests: returns (indices, values, u, v, threshold, rounds, hierarchical) of the device step and
// the same of the core's.
py::tuple compare_step(const torch::Tensor& grad, const torch::Tensor& momentum,
                       const torch::Tensor& velocity, const OptimizerOptions& options,
                       double density, uint64_t seed) {
  const int64_t n = grad.numel();
  CompressionOptions o = options.compressor;
  o.seed = seed;
  DeviceCompressor device({n}, o, grad.device());
  device.momentum(0).copy_(momentum.reshape({-1}));
  device.velocity(0).copy_(velocity.reshape({-1}));
  DeviceSelection selected;
  device.step(0, grad, density, selected);

  Compressor core({n}, o);
  const torch::Tensor host_grad = host_float(grad, "grad");
  const torch::Tensor host_u = host_float(momentum, "momentum");
  const torch::Tensor host_v = host_float(velocity, "velocity");
  std::copy_n(host_u.data_ptr<float>(), n, core.momentum(0).begin());
  std::copy_n(host_v.data_ptr<float>(), n, core.velocity(0).begin());
  Selection reference;
  core.step(0, span_of(host_grad), density, reference);
  const auto copy = [](std::span<const float> x) {
    return torch::from_blob(const_cast<float*>(x.data()), {static_cast<int64_t>(x.size())},
                            torch::kFloat32)
        .clone();
  };
  std::vector<int64_t> indices(reference.indices.begin(), reference.indices.end());
  const torch::Tensor core_indices =
      torch::from_blob(indices.data(), {static_cast<int64_t>(indices.size())}, torch::kInt64)
          .clone();
  return py::make_tuple(py::make_tuple(selected.indices.cpu(), selected.values.cpu(),
                                       device.momentum(0).cpu(), device.velocity(0).cpu(),
                                       selected.threshold, selected.rounds, selected.hierarchical),
                        py::make_tuple(core_indices, copy(reference.values), copy(core.momentum(0)),
                                       copy(core.velocity(0)), reference.threshold,
                                       reference.rounds, reference.hierarchical));
}

// DGCState(exchange="auto", link=...): the exchange the cost model predicts fastest for these
// shapes, workers, density and link (as `dgc train --exchange auto --link`); returns its name and
// the line that says so.
py::tuple choose_exchange(const std::vector<std::string>& names,
                          const std::vector<std::vector<int64_t>>& shapes, int workers,
                          double density, const std::string& link) {
  const train::ExchangeChoice choice = train::choose_exchange_for_link(
      named_shapes(names, shapes), workers, density, train::parse_link(link));
  return py::make_tuple(std::string(to_string(choice.algorithm)), choice.text);
}

// A module holding given tensors as its parameters, for the C++ optimizer reference.
struct TensorModule : torch::nn::Module {
  TensorModule(const std::vector<std::string>& names, const std::vector<torch::Tensor>& weights) {
    for (size_t i = 0; i < names.size(); ++i) {
      std::string name = names[i];
      for (char& c : name) {
        if (c == '.') c = '_';
      }
      register_parameter(name, weights[i].detach().to(torch::kFloat32).contiguous().clone());
    }
  }
};

// Runs the C++ DistributedOptimizer for grads.size() steps at a constant learning rate: step s
// sets every parameter's .grad to grads[s][i]. Returns the final weights.
std::vector<torch::Tensor> distributed_optimizer_steps(
    c10::intrusive_ptr<c10d::ProcessGroup> group, const std::vector<std::string>& names,
    const std::vector<torch::Tensor>& weights, const std::vector<std::vector<torch::Tensor>>& grads,
    OptimizerOptions options, double lr, double bucket_cap_mb) {
  options.lr.base = lr;
  options.bucket_cap_mb = bucket_cap_mb;
  auto comm = comm::connect_process_group(std::move(group), group_options(options, "cpu"));
  TensorModule model(names, weights);
  {
    py::gil_scoped_release release;
    train::DistributedOptimizer optimizer(*comm, model, options);
    const auto params = model.parameters();
    for (const auto& step_grads : grads) {
      DGC_CHECK_EQ(step_grads.size(), params.size(), "gradients per step");
      for (size_t i = 0; i < params.size(); ++i) {
        params[i].mutable_grad() = step_grads[i].detach().to(torch::kFloat32).contiguous().clone();
      }
      optimizer.step();
    }
  }
  std::vector<torch::Tensor> out;
  for (const auto& p : model.parameters()) out.push_back(p.detach().clone());
  return out;
}

}  // namespace
}  // namespace dgc::python

PYBIND11_MODULE(_C, m) {
  namespace dp = dgc::python;
  m.doc() = "Deep Gradient Compression: the C++ core (see the dgc package)";
  // Compared with torch._C's by dgc/__init__.py: types cross only within one pybind11 ABI.
  m.attr("_PYBIND11_BUILD_ABI") = PYBIND11_BUILD_ABI;
  m.attr("_PYBIND11_COMPILER_TYPE") = PYBIND11_COMPILER_TYPE;
  m.attr("_PYBIND11_STDLIB") = PYBIND11_STDLIB;
  // The torch (major.minor) this module was compiled against, compared at import.
  m.attr("_TORCH_VERSION") = DGC_TORCH_VERSION;

  // Exceptions: the dgc::Error family, most derived registered last (tried first).
  static py::exception<dgc::Error> error(m, "DGCError", PyExc_RuntimeError);
  static py::exception<dgc::InvalidArgument> invalid(m, "InvalidArgument", error.ptr());
  static py::exception<dgc::CommError> comm_error(m, "CommError", error.ptr());
  static py::exception<dgc::TimeoutError> timeout(m, "TimeoutError", comm_error.ptr());
  static py::exception<dgc::MismatchError> mismatch(m, "MismatchError", error.ptr());
  static py::exception<dgc::DataError> data(m, "DataError", error.ptr());
  static py::exception<dgc::DecodeError> decode(m, "DecodeError", error.ptr());
  static py::exception<dgc::NumericError> numeric(m, "NumericError", error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const dgc::TimeoutError& e) {
      timeout(e.what());
    } catch (const dgc::CommError& e) {
      comm_error(e.what());
    } catch (const dgc::InvalidArgument& e) {
      invalid(e.what());
    } catch (const dgc::MismatchError& e) {
      mismatch(e.what());
    } catch (const dgc::DataError& e) {
      data(e.what());
    } catch (const dgc::DecodeError& e) {
      decode(e.what());
    } catch (const dgc::NumericError& e) {
      numeric(e.what());
    } catch (const dgc::Error& e) {
      error(e.what());
    }
  });

  py::class_<dgc::train::OptimizerOptions>(m, "Options")
      .def(py::init(&dp::make_options), py::kw_only(), py::arg("compression") = "dgc",
           py::arg("density") = 0.001, py::arg("warmup_epochs") = 1.0, py::arg("warmup_stages") = 4,
           py::arg("iterations_per_epoch") = 1, py::arg("momentum") = 0.9,
           py::arg("nesterov") = false, py::arg("masking") = true, py::arg("weight_decay") = 1e-4,
           py::arg("clip_norm") = 0.0, py::arg("selection") = "sampled",
           py::arg("sample_ratio") = 0.01, py::arg("value_type") = "fp32",
           py::arg("min_compress_numel") = 1024, py::arg("compress_1d") = false,
           py::arg("exchange") = "allgather", py::arg("seed") = 0, py::arg("timeout") = 60.0,
           py::arg("dense_path") = "grouped", py::arg("dense_path_density") = 0.1,
           py::arg("selection_scope") = "tensor", py::arg("clip_scaling") = "paper",
           py::arg("on_nonfinite") = "stop", py::arg("max_consecutive_skips") = 10,
           py::arg("bucket_cap_mb") = 0.0, py::arg("last_bucket_cap_mb") = 0.0)
      .def("describe", [](const dgc::train::OptimizerOptions& o) { return describe(o); })
      .def("__repr__", [](const dgc::train::OptimizerOptions& o) {
        return "dgc.Options(\n" + describe(o) + ")";
      });

  py::class_<dp::Step>(m, "Step")
      .def(py::init<c10::intrusive_ptr<c10d::ProcessGroup>, const std::vector<std::string>&,
                    const std::vector<std::vector<int64_t>>&, const dgc::train::OptimizerOptions&,
                    const std::string&, const std::string&>(),
           py::arg("process_group"), py::arg("names"), py::arg("shapes"), py::arg("options"),
           py::arg("run_settings") = "", py::arg("device") = "cpu",
           py::call_guard<py::gil_scoped_release>())
      .def("run", &dp::Step::run, py::arg("grads"), py::arg("weights"))
      .def("gradients_ready", &dp::Step::gradients_ready, py::arg("indices"), py::arg("grads"),
           py::arg("weights"))
      .def("finish", &dp::Step::finish)
      .def("abandon", &dp::Step::abandon)
      .def_property_readonly("bucket_count", [](dp::Step& s) { return s.step().bucket_count(); })
      .def_property_readonly("buckets", [](dp::Step& s) { return s.step().plan().buckets; })
      .def_property_readonly("one_message_reason",
                             [](dp::Step& s) { return s.step().plan().one_message_reason; })
      .def_property_readonly("last_wait_seconds",
                             [](dp::Step& s) { return s.step().last_wait_seconds(); })
      .def_property(
          "iteration", [](dp::Step& s) { return s.step().iteration(); },
          [](dp::Step& s, int64_t i) { s.step().set_iteration(i); })
      .def_property_readonly("density", [](dp::Step& s) { return s.step().density(); })
      .def_property_readonly("last_bad_ranks",
                             [](dp::Step& s) { return s.step().last_bad_ranks(); })
      .def_property_readonly("consecutive_skips",
                             [](dp::Step& s) { return s.step().consecutive_skips(); })
      .def(
          "set_skipped_steps",
          [](dp::Step& s, int64_t total, int64_t consecutive) {
            s.step().set_skipped_steps(total, consecutive);
          },
          py::arg("total"), py::arg("consecutive"))
      .def_property_readonly("skipped_steps", [](dp::Step& s) { return s.step().skipped_steps(); })
      .def_property_readonly("warmup_iterations",
                             [](dp::Step& s) { return s.step().warmup_iterations(); })
      .def_property_readonly("settings", [](dp::Step& s) { return s.step().settings(); })
      .def_property_readonly("rank", [](dp::Step& s) { return s.comm().rank(); })
      .def_property_readonly("world_size", [](dp::Step& s) { return s.comm().size(); })
      .def_property_readonly(
          "layout",
          [](dp::Step& s) {
            py::list out;
            for (const auto& spec : s.step().layout()) {
              out.append(py::make_tuple(
                  spec.name, spec.path == dgc::TensorPath::kCompressed ? "compressed" : "dense"));
            }
            return out;
          })
      .def_property_readonly("last_bytes",
                             [](dp::Step& s) { return dp::bytes_dict(s.step().last_bytes()); })
      .def_property_readonly("total_bytes",
                             [](dp::Step& s) { return dp::bytes_dict(s.step().total_bytes()); })
      .def_property_readonly(
          "post_warmup_bytes",
          [](dp::Step& s) { return dp::bytes_dict(s.step().post_warmup_bytes()); })
      .def("set_bytes",
           [](dp::Step& s, const py::dict& total, const py::dict& post_warmup) {
             s.step().set_bytes(dp::bytes_from(total), dp::bytes_from(post_warmup));
           })
      .def_property_readonly("last_timings",
                             [](dp::Step& s) {
                               const auto& t = s.step().last_timings();
                               py::dict d;
                               d["compress"] = t.compress;
                               d["exchange"] = t.exchange;
                               d["update"] = t.update;
                               return d;
                             })
      .def(
          "state_buffers",
          [](dp::Step& s) {
            py::dict out;
            for (const auto& b : s.step().state_buffers()) {
              out[py::str(b.name)] =
                  torch::from_blob(b.values.data(), {static_cast<int64_t>(b.values.size())},
                                   torch::kFloat32)
                      .clone();
            }
            return out;
          },
          "Copies of every float buffer of the state, by name.")
      .def("load_state_buffer",
           [](dp::Step& s, const std::string& name, const torch::Tensor& values) {
             for (const auto& b : s.step().state_buffers()) {
               if (b.name != name) continue;
               const torch::Tensor v = dp::host_float(values, "state buffer '" + name + "'");
               if (static_cast<size_t>(v.numel()) != b.values.size()) {
                 throw dgc::DataError(dgc::detail::concat(
                     "state buffer '", name, "' has ", v.numel(), " elements, expected ",
                     b.values.size(), ": the state dict was written for another model"));
               }
               std::copy_n(v.data_ptr<float>(), b.values.size(), b.values.begin());
               return;
             }
             throw dgc::DataError("the state dict has a buffer '" + name +
                                  "' this model does not have: it was written for another model "
                                  "or other settings");
           })
      .def_property(
          "rng_state", [](dp::Step& s) { return s.step().rng_state(); },
          [](dp::Step& s, const std::string& t) { s.step().set_rng_state(t); });

  py::class_<dp::DeviceStepHolder>(m, "DeviceStep")
      .def(py::init<c10::intrusive_ptr<c10d::ProcessGroup>, const std::vector<std::string>&,
                    const std::vector<std::vector<int64_t>>&, const dgc::train::OptimizerOptions&,
                    const std::string&, const std::string&, const std::string&>(),
           py::arg("process_group"), py::arg("names"), py::arg("shapes"), py::arg("options"),
           py::arg("run_settings"), py::arg("exchange_device"), py::arg("device"),
           py::call_guard<py::gil_scoped_release>())
      .def("run", &dp::DeviceStepHolder::run, py::arg("grads"), py::arg("weights"))
      .def_property(
          "iteration", [](dp::DeviceStepHolder& s) { return s.step().iteration(); },
          [](dp::DeviceStepHolder& s, int64_t i) { s.step().set_iteration(i); })
      .def_property_readonly("density", [](dp::DeviceStepHolder& s) { return s.step().density(); })
      .def_property_readonly("last_bad_ranks",
                             [](dp::DeviceStepHolder& s) { return s.step().last_bad_ranks(); })
      .def_property_readonly("consecutive_skips",
                             [](dp::DeviceStepHolder& s) { return s.step().consecutive_skips(); })
      .def(
          "set_skipped_steps",
          [](dp::DeviceStepHolder& s, int64_t total, int64_t consecutive) {
            s.step().set_skipped_steps(total, consecutive);
          },
          py::arg("total"), py::arg("consecutive"))
      .def_property_readonly("skipped_steps",
                             [](dp::DeviceStepHolder& s) { return s.step().skipped_steps(); })
      .def_property_readonly("warmup_iterations",
                             [](dp::DeviceStepHolder& s) { return s.step().warmup_iterations(); })
      .def_property_readonly("settings",
                             [](dp::DeviceStepHolder& s) { return s.step().settings(); })
      .def_property_readonly("rank", [](dp::DeviceStepHolder& s) { return s.comm().rank(); })
      .def_property_readonly("world_size", [](dp::DeviceStepHolder& s) { return s.comm().size(); })
      .def_property_readonly("device",
                             [](dp::DeviceStepHolder& s) { return s.step().device().str(); })
      .def_property_readonly(
          "layout",
          [](dp::DeviceStepHolder& s) {
            py::list out;
            for (const auto& spec : s.step().layout()) {
              out.append(py::make_tuple(
                  spec.name, spec.path == dgc::TensorPath::kCompressed ? "compressed" : "dense"));
            }
            return out;
          })
      .def_property_readonly(
          "last_bytes",
          [](dp::DeviceStepHolder& s) { return dp::bytes_dict(s.step().last_bytes()); })
      .def_property_readonly(
          "total_bytes",
          [](dp::DeviceStepHolder& s) { return dp::bytes_dict(s.step().total_bytes()); })
      .def_property_readonly(
          "post_warmup_bytes",
          [](dp::DeviceStepHolder& s) { return dp::bytes_dict(s.step().post_warmup_bytes()); })
      .def("set_bytes",
           [](dp::DeviceStepHolder& s, const py::dict& total, const py::dict& post_warmup) {
             s.step().set_bytes(dp::bytes_from(total), dp::bytes_from(post_warmup));
           })
      .def_property_readonly("last_timings",
                             [](dp::DeviceStepHolder& s) {
                               const auto& t = s.step().last_timings();
                               py::dict d;
                               d["compress"] = t[0];
                               d["exchange"] = t[1];
                               d["update"] = t[2];
                               return d;
                             })
      .def(
          "state_buffers",
          [](dp::DeviceStepHolder& s) {
            py::dict out;
            for (const auto& [name, values] : s.step().state_buffers()) {
              out[py::str(name)] = values.detach().to(torch::kCPU).clone();
            }
            return out;
          },
          "Copies on the CPU of every float buffer of the state, by name (as Step's).")
      .def("load_state_buffer",
           [](dp::DeviceStepHolder& s, const std::string& name, const torch::Tensor& values) {
             for (auto& [buffer_name, buffer] : s.step().state_buffers()) {
               if (buffer_name != name) continue;
               if (values.numel() != buffer.numel()) {
                 throw dgc::DataError(dgc::detail::concat(
                     "state buffer '", name, "' has ", values.numel(), " elements, expected ",
                     buffer.numel(), ": the state dict was written for another model"));
               }
               torch::NoGradGuard no_grad;
               buffer.copy_(values.reshape({-1}));
               return;
             }
             throw dgc::DataError("the state dict has a buffer '" + name +
                                  "' this model does not have: it was written for another model "
                                  "or other settings");
           })
      .def_property(
          "rng_state", [](dp::DeviceStepHolder& s) { return s.step().rng_state(); },
          [](dp::DeviceStepHolder& s, const std::string& t) { s.step().set_rng_state(t); });

  // The device compressor alone, for benchmarks (bench/device_step.py).
  py::class_<dp::DeviceCompressor>(m, "_DeviceCompressor")
      .def(py::init([](const std::vector<int64_t>& numels, const dgc::train::OptimizerOptions& o,
                       double density, const std::string& device) {
             dgc::CompressionOptions c = o.compressor;
             return std::make_unique<dp::DeviceCompressor>(numels, c, c10::Device(device));
           }),
           py::arg("numels"), py::arg("options"), py::arg("density"), py::arg("device"))
      .def(
          "step",
          [](dp::DeviceCompressor& c, size_t t, const torch::Tensor& grad, double density) {
            dp::DeviceSelection out;
            {
              py::gil_scoped_release release;
              c.step(t, grad, density, out);
            }
            return py::make_tuple(out.indices, out.values);
          },
          py::arg("tensor"), py::arg("grad"), py::arg("density"),
          "One step (momentum correction, selection, masking) of tensor `tensor`: the sorted "
          "indices and the values to send, on the device.")
      .def("velocity", [](dp::DeviceCompressor& c, size_t t) { return c.velocity(t); });

  m.def("_compare_device_step", &dp::compare_step, py::arg("grad"), py::arg("momentum"),
        py::arg("velocity"), py::arg("options"), py::arg("density"), py::arg("seed"),
        "One step of the device compressor and of the core's on the same state (for tests).");

  m.def("_choose_exchange", &dp::choose_exchange, py::arg("names"), py::arg("shapes"),
        py::arg("workers"), py::arg("density"), py::arg("link"),
        "The exchange dgc plan's cost model predicts fastest: (name, the line that says so).");
  m.def("_distributed_optimizer_steps", &dp::distributed_optimizer_steps, py::arg("process_group"),
        py::arg("names"), py::arg("weights"), py::arg("grads"), py::arg("options"), py::arg("lr"),
        py::arg("bucket_cap_mb") = 0.0,
        "Runs the C++ DistributedOptimizer over the process group (a reference for tests; one "
        "message unless bucket_cap_mb is given, whatever the options say).");
}
