// tightfit.Model, tightfit.plan: gradients and log-probs of a Hugging Face checkpoint under a
// StreamBP schedule, and the memory planner. Every call into nn/ and stream/ (and loss/) is in
// this file, through the entry points `tightfit grad`, `logprobs` and `plan` use
// (tools/tightfit/cmd_*.cpp), with the tool's batch reader and checks, so that the module's
// results are the tool's.
// Invariants: every array and option is checked before the work (ValueError naming it); the GIL
// is released while computing and taken back between layers only, to run Python's signal
// handlers (Ctrl-C raises KeyboardInterrupt there and ends the call); gradients do not
// accumulate across calls.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "batch_file.hpp"  // tools/tightfit: the tool's batch reader
#include "bindings.hpp"
#include "checks.hpp"  // tools/tightfit: the tool's checks
#include "tightfit/backend/eigen.hpp"
#include "tightfit/io/safetensors.hpp"
#include "tightfit/loss/dpo.hpp"
#include "tightfit/loss/grpo.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/architectures.hpp"
#include "tightfit/nn/hf_model.hpp"
#include "tightfit/nn/presets.hpp"
#include "tightfit/stream/backward.hpp"
#include "tightfit/stream/forward.hpp"
#include "tightfit/stream/planner.hpp"

namespace tightfit::python {

namespace {

using cli::loaded_batch;

/// The largest count an option takes (chunk, head chunk rows, completion length), as the tool.
constexpr index_t max_count = index_t{1} << 40;

/// A batch given as arrays, read through the members batch_file.hpp's readers use (those of
/// safetensors_file): tensors by the batch file's names, converted with the GIL held.
class array_batch {
 public:
  void add_ints(const std::string& key, const array_view& v) {
    entry& e = add(key, v);
    e.ints = to_int64(v, key);
  }
  void add_floats(const std::string& key, const array_view& v) {
    entry& e = add(key, v);
    e.floats = to_double(v, key);
  }
  std::string source() const { return "batch"; }
  bool contains(const std::string& key) const { return tensors_.count(key) != 0; }
  const tensor_info& info(const std::string& key) const { return tensors_.at(key).info; }
  std::vector<std::int64_t> read_ints(const std::string& key) const {
    const entry& e = tensors_.at(key);
    check(e.floats.empty() || e.info.numel() == 0, key, " holds floats, expected integers");
    return e.ints;
  }
  template <class V>
  std::vector<V> read(const std::string& key) const {
    const entry& e = tensors_.at(key);
    if (!e.ints.empty()) return std::vector<V>(e.ints.begin(), e.ints.end());
    return std::vector<V>(e.floats.begin(), e.floats.end());
  }

 private:
  struct entry {
    tensor_info info;
    std::vector<std::int64_t> ints;
    std::vector<double> floats;
  };
  entry& add(const std::string& key, const array_view& v) {
    entry& e = tensors_[key];
    e.info.name = key;
    e.info.shape.assign(v.shape.begin(), v.shape.end());
    return e;
  }
  std::map<std::string, entry> tensors_;
};

/// The batch's arrays: ids, masks and positions as integers, log-probs and advantages as
/// floats; a 1-D per-token array is one row (1, T).
array_batch make_batch(const py::dict& arrays) {
  static const char* per_sequence[] = {"advantages", "lengths", "ref_chosen_logps",
                                       "ref_rejected_logps"};
  static const char* floats[] = {"advantages", "old_logprobs", "ref_logprobs", "ref_chosen_logps",
                                 "ref_rejected_logps"};
  array_batch batch;
  for (const auto& [k, value] : arrays) {
    const std::string key = py::str(k);
    array_view v = view_array(value, key);
    bool token_shaped = true;
    for (const char* s : per_sequence) token_shaped &= key != s;
    if (token_shaped && v.shape.size() == 1) {
      v.shape.insert(v.shape.begin(), 1);
      v.strides.insert(v.strides.begin(), 0);
    }
    bool is_float = false;
    for (const char* s : floats) is_float |= key == s;
    if (is_float)
      batch.add_floats(key, v);
    else
      batch.add_ints(key, v);
  }
  return batch;
}

/// A bound for messages: 1e-06, 1000000, 0.5 (not 9.9999999999999995e-07).
std::string shown(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.10g", x);
  return text;
}

/// Scalar options by name, each read once; what is left unread is an error naming it.
class option_reader {
 public:
  explicit option_reader(const py::dict& d) {
    for (const auto& [k, v] : d) values_[py::str(k)] = py::reinterpret_borrow<py::object>(v);
  }
  bool has(const std::string& k) const { return values_.count(k) != 0; }
  double real(const std::string& k, double fallback, double lo, double hi) {
    if (!take(k)) return fallback;
    const py::object& v = values_[k];
    check(!py::isinstance<py::bool_>(v) &&
              (py::isinstance<py::float_>(v) || py::isinstance<py::int_>(v)),
          k, " is ", std::string(py::repr(v)), ", expected a number");
    const double x = v.cast<double>();
    check(std::isfinite(x) && x >= lo && x <= hi, k, " is ", shown(x), ", outside [", shown(lo),
          ", ", shown(hi), "]");
    return x;
  }
  index_t integer(const std::string& k, index_t fallback, index_t lo, index_t hi) {
    if (!take(k)) return fallback;
    const py::object& v = values_[k];
    check(!py::isinstance<py::bool_>(v) && py::isinstance<py::int_>(v), k, " is ",
          std::string(py::repr(v)), ", expected an integer");
    const auto x = v.cast<long long>();
    check(x >= lo && x <= hi, k, " is ", x, ", outside [", lo, ", ", hi, "]");
    return static_cast<index_t>(x);
  }
  std::string text(const std::string& k, const std::string& fallback) {
    if (!take(k)) return fallback;
    check(py::isinstance<py::str>(values_[k]), k, " is ", std::string(py::repr(values_[k])),
          ", expected a string");
    return py::str(values_[k]);
  }
  bool flag(const std::string& k) {
    if (!take(k)) return false;
    check(py::isinstance<py::bool_>(values_[k]), k, " is ", std::string(py::repr(values_[k])),
          ", expected True or False");
    return values_[k].cast<bool>();
  }
  std::vector<token_id> ids(const std::string& k) {
    if (!take(k)) return {};
    const py::object& v = values_[k];
    if (py::isinstance<py::int_>(v) && !py::isinstance<py::bool_>(v)) return {v.cast<token_id>()};
    const auto out = to_int64(view_array(v, k), k);
    return {out.begin(), out.end()};
  }
  py::object raw(const std::string& k) { return take(k) ? values_[k] : py::none(); }
  /// Every option was read (one nobody read is a mistake: a typo, another objective's option).
  void finish(const std::string& what) const {
    for (const auto& [k, v] : values_) check(read_.count(k) != 0, k, " is not an option of ", what);
  }

 private:
  bool take(const std::string& k) {
    if (!has(k) || values_[k].is_none()) return false;
    read_[k] = true;
    return true;
  }
  std::map<std::string, py::object> values_;
  std::map<std::string, bool> read_;
};

/// Between layers: with the GIL, Python's signal handlers run (Ctrl-C raises KeyboardInterrupt);
/// the exception they raise ends the library's call and reaches Python.
void check_signals() {
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
}

/// One parameter's gradient, copied out of the model.
struct named_grad {
  std::string name;
  std::vector<index_t> shape;
  std::vector<double> f64;
  std::vector<float> f32;
};

struct grad_request {
  std::string objective;
  array_batch batch;
  backward_options opt;
  bool auto_chunk = false;
  std::size_t budget = 0;
  grpo_options grpo;
  dpo_options dpo;
  std::vector<token_id> stop_ids;  ///< grpo: mask_truncated_completions' EOS ids (or none)
};

struct logprob_request {
  array_batch batch;
  forward_options opt;
  bool sums = false;
};

/// The model behind tightfit.Model, for its value type and layer.
class model_base {
 public:
  virtual ~model_base() = default;
  virtual const model_config& config() const = 0;
  virtual const char* dtype() const = 0;
  virtual std::pair<double, std::vector<named_grad>> gradients(grad_request& r) = 0;
  virtual std::pair<std::vector<double>, loaded_batch> logprobs(const logprob_request& r) = 0;
  virtual std::vector<named_grad> weights() = 0;
};

template <class T, template <class> class Layer>
class model_impl final : public model_base {
 public:
  using backend = eigen_backend<T>;

  model_impl(const model_config& cfg, const std::filesystem::path& dir, int threads)
      : be_(backend_options(threads)), model_(be_, cfg) {
    load_hf_weights(dir, model_.parameters());
    cli::check_finite_weights(model_.parameters(), dir.string());
  }
  const model_config& config() const override { return model_.config(); }
  const char* dtype() const override { return sizeof(T) == 8 ? "float64" : "float32"; }

  // cmd_grad.cpp's run_grad_with in one process
  std::pair<double, std::vector<named_grad>> gradients(grad_request& r) override {
    const model_config& cfg = model_.config();
    loaded_batch lb = cli::read_batch(r.batch, r.objective);
    const index_t b = lb.b, t = lb.t;
    if (!r.stop_ids.empty())
      mask_truncated_completions(lb.targets, lb.ids, b, t, lb.lengths, r.stop_ids, lb.positions);
    const token_batch batch = lb.view();
    if (r.auto_chunk) {
      const auto plan = plan_memory<T>(cfg, b, t, r.budget, sft_loss{}, 0, t);
      check(plan.chunk >= 1, "chunk='auto': even chunk 1 needs more than the budget of ", r.budget,
            " bytes at T = ", t);
      r.opt.chunk = plan.chunk;
      if (r.opt.sched != backward_schedule::full) r.opt.keep_every = plan.keep_every;
    }
    cli::check_activations_fit<T>("batch", false, cfg, b, t, r.opt,
                                  cli::batch_host_bytes_per_token);
    r.opt.between_layers = check_signals;
    auto& params = model_.parameters();
    params.zero_grads();

    backward_result result;
    if (r.objective == "sft") {
      sft_loss loss;
      result = compute_gradients(model_, batch, loss, r.opt);
    } else if (r.objective == "grpo") {
      const auto adv = cli::read_floats(r.batch, "advantages", lb.documents());
      std::vector<double> old, refp;
      if (r.batch.contains("old_logprobs"))
        old = cli::shift_values(cli::read_floats(r.batch, "old_logprobs", b * t), b, t);
      if (r.batch.contains("ref_logprobs"))
        refp = cli::shift_values(cli::read_floats(r.batch, "ref_logprobs", b * t), b, t);
      grpo_loss loss(adv, old, refp, r.grpo);
      result = compute_gradients(model_, batch, loss, r.opt);
    } else {
      const index_t p = lb.pairs();
      std::vector<double> ref_w, ref_l;
      if (needs_reference(r.dpo.loss) || r.batch.contains("ref_chosen_logps") ||
          r.batch.contains("ref_rejected_logps")) {
        ref_w = cli::read_floats(r.batch, "ref_chosen_logps", p);
        ref_l = cli::read_floats(r.batch, "ref_rejected_logps", p);
      }
      dpo_loss loss(lb.chosen, lb.rejected, ref_w, ref_l, r.dpo);
      result = compute_gradients(model_, batch, loss, r.opt);
    }
    check(std::isfinite(result.loss), "the loss is ", result.loss, " (not finite)");
    cli::check_finite_gradients(params, "gradients");
    std::vector<named_grad> out;
    for (std::size_t i = 0; i < params.size(); ++i)
      if (params.has_grad(i)) out.push_back(copy(params, i, params.grad(i)));
    return {result.loss, std::move(out)};
  }

  // cmd_logprobs.cpp's run_logprobs; sums: forward.hpp's sequence_logprob_sums
  std::pair<std::vector<double>, loaded_batch> logprobs(const logprob_request& r) override {
    loaded_batch lb = cli::read_batch(r.batch, "sft");
    backward_options bo;  // the backward's bound is an upper bound of the forward's
    bo.sched = backward_schedule::stream;
    bo.chunk = r.opt.chunk;
    cli::check_activations_fit<T>("batch", false, model_.config(), lb.b, lb.t, bo,
                                  cli::batch_host_bytes_per_token);
    forward_options fo = r.opt;
    fo.between_layers = check_signals;
    std::vector<double> lp = r.sums ? sequence_logprob_sums(model_, lb.view(), fo)
                                    : model_logprobs(model_, lb.view(), fo);
    for (std::size_t i = 0; i < lp.size(); ++i)
      check(std::isfinite(lp[i]), "log-prob ", i, " is ", lp[i], " (not finite)");
    return {std::move(lp), std::move(lb)};
  }

  std::vector<named_grad> weights() override {
    auto& params = model_.parameters();
    std::vector<named_grad> out;
    for (std::size_t i = 0; i < params.size(); ++i) out.push_back(copy(params, i, params.value(i)));
    return out;
  }

 private:
  static eigen_backend_options backend_options(int threads) {
    eigen_backend_options o;
    o.threads = threads;
    return o;
  }
  template <class P, class Span>
  static named_grad copy(P& params, std::size_t i, const Span& values) {
    named_grad g;
    g.name = params.name(i);
    const auto shape = params.shape(i);
    g.shape.assign(shape.begin(), shape.end());
    if constexpr (sizeof(T) == 8)
      g.f64.assign(values.begin(), values.end());
    else
      g.f32.assign(values.begin(), values.end());
    return g;
  }

  backend be_;
  decoder_model<backend, Layer<backend>> model_;
};

std::unique_ptr<model_base> load_model(const std::string& dir, const std::string& dtype,
                                       int threads) {
  check(dtype == "float32" || dtype == "float64", "dtype is '", dtype,
        "', expected 'float32' or 'float64'");
  check(threads >= 0, "threads is ", threads, ", expected >= 0 (0: one per core)");
  const std::filesystem::path path = dir;
  const model_config cfg = load_hf_config(path);
  const bool f64 = dtype == "float64";
  // sizes before allocation: config.json against the checkpoint, weights + gradients in memory
  cli::check_model_fits(cfg, f64 ? 8 : 4, 2, &path);
  // the layer the config's architecture names (nn/architectures.hpp), as the tool picks it
  return with_config_layer(cfg, [&](auto layer) -> std::unique_ptr<model_base> {
    using tag = decltype(layer);
    if (f64) return std::make_unique<model_impl<double, tag::template type>>(cfg, path, threads);
    return std::make_unique<model_impl<float, tag::template type>>(cfg, path, threads);
  });
}

/// The scalar options of a gradient call (the tool's names, with _ for -, and its ranges).
grad_request make_grad_request(const std::string& objective, const py::dict& arrays,
                               const py::dict& options) {
  check(objective == "sft" || objective == "grpo" || objective == "dpo", "objective is '",
        objective, "', expected 'sft', 'grpo' or 'dpo'");
  option_reader o(options);
  grad_request r;
  r.objective = objective;
  r.opt.sched = parse_backward_schedule(o.text("schedule", "stream"));
  r.opt.temperature = o.real("temperature", 1.0, 1e-6, 1e6);
  r.opt.head_chunk_rows = o.integer("head_chunk", 0, 0, max_count);
  const py::object chunk = o.raw("chunk"), budget = o.raw("budget");
  if (py::isinstance<py::str>(chunk)) {
    check(std::string(py::str(chunk)) == "auto", "chunk is ", std::string(py::repr(chunk)),
          ", expected an integer or 'auto'");
    r.auto_chunk = true;  // the largest chunk whose peak fits the budget (default 4G), as the tool
    r.budget = cli::parse_bytes("budget", budget.is_none() ? "4G" : std::string(py::str(budget)));
  } else {
    check(budget.is_none(), "budget applies to chunk='auto' only");
    py::dict c;
    c["chunk"] = chunk;
    r.opt.chunk = option_reader(c).integer("chunk", 512, 1, max_count);
  }
  if (objective == "grpo") {
    r.grpo.beta = o.real("beta", 0.0, 0, 1e6);
    r.grpo.epsilon_low = o.real("epsilon_low", 0.2, 0, 1e6);
    check(r.grpo.epsilon_low < 1, "epsilon_low is ", shown(r.grpo.epsilon_low),
          ", expected in [0, 1) (the ratio's lower clip is 1 - epsilon_low)");
    r.grpo.epsilon_high = o.real("epsilon_high", r.grpo.epsilon_low, 0, 1e6);
    r.grpo.aggregation = parse_grpo_aggregation(o.text("loss_type", "grpo"));
    r.grpo.max_completion_length = o.integer("max_completion_length", 0, 0, max_count);
    r.grpo.level = parse_importance_sampling_level(o.text("importance_sampling_level", "token"));
    r.grpo.delta = o.real("delta", 0.0, 0, 1e6);
    const bool mask = o.flag("mask_truncated_completions");
    r.stop_ids = o.ids("eos_token_id");
    check(mask == !r.stop_ids.empty(),
          "mask_truncated_completions=True and eos_token_id go together");
    for (token_id id : r.stop_ids)
      check(id >= 0 && id < (token_id{1} << 31), "eos_token_id ", id, " is outside [0, 2^31)");
  } else if (objective == "dpo") {
    r.dpo.beta = o.real("beta", 0.1, 0, 1e6);
    check(r.dpo.beta > 0, "beta is ", shown(r.dpo.beta), ", expected > 0 for objective='dpo'");
    r.dpo.label_smoothing = o.real("label_smoothing", 0.0, 0, 0.5);
    r.dpo.rpo_alpha = o.real("rpo_alpha", 0.0, 0, 1e6);
    r.dpo.simpo_gamma = o.real("simpo_gamma", 0.5, -1e6, 1e6);
    r.dpo.loss = parse_dpo_loss_type(o.text("loss_type", "sigmoid"));
  }
  o.finish("objective='" + objective + "'");
  r.batch = make_batch(arrays);
  return r;
}

/// A gradient (or weight) as a numpy array of the model's dtype and the parameter's shape.
py::array to_numpy(named_grad& g) {
  std::vector<py::ssize_t> shape(g.shape.begin(), g.shape.end());
  if (!g.f64.empty() || g.f32.empty()) {
    py::array_t<double> a(shape);
    std::copy(g.f64.begin(), g.f64.end(), a.mutable_data());
    return a;
  }
  py::array_t<float> a(shape);
  std::copy(g.f32.begin(), g.f32.end(), a.mutable_data());
  return a;
}

py::dict to_dict(std::vector<named_grad>& grads) {
  py::dict out;
  for (auto& g : grads) out[py::str(g.name)] = to_numpy(g);
  return out;
}

py::dict config_dict(const model_config& c) {
  py::dict d;
  d["architecture"] = c.architecture;
  d["vocab_size"] = c.vocab_size;
  d["hidden_size"] = c.hidden_size;
  d["intermediate_size"] = c.intermediate_size;
  d["num_hidden_layers"] = c.num_hidden_layers;
  d["num_attention_heads"] = c.num_attention_heads;
  d["num_key_value_heads"] = c.num_key_value_heads;
  d["head_dim"] = c.head_dim;
  d["rms_norm_eps"] = c.rms_norm_eps;
  d["rope_theta"] = c.rope_theta;
  d["tie_word_embeddings"] = c.tie_word_embeddings;
  return d;
}

/// cmd_plan.cpp's run_plan, as a dict.
template <class T>
py::dict plan_dict(const model_config& cfg, index_t batch, index_t seq, std::size_t budget,
                   index_t chunk, index_t max_seq) {
  plan_result p;
  {
    py::gil_scoped_release unlocked;
    p = plan_memory<T>(cfg, batch, seq, budget, sft_loss{}, chunk, max_seq);
  }
  py::dict d;
  d["budget_bytes"] = p.budget_bytes;
  d["chunk"] = p.chunk;
  d["chunk_peak_bytes"] = p.chunk_peak_bytes;
  d["keep_every"] = p.keep_every;
  d["recomputed_layers"] = p.recomputed_layers;
  d["max_seq_full"] = p.max_seq_full;
  d["max_seq_checkpoint"] = p.max_seq_checkpoint;
  d["max_seq_stream"] = p.max_seq_stream;
  d["stream_chunk"] = p.stream_chunk;
  d["max_seq_checkpoint_spaced"] = p.max_seq_checkpoint_spaced;
  d["checkpoint_keep_every"] = p.checkpoint_keep_every;
  d["max_seq_stream_spaced"] = p.max_seq_stream_spaced;
  d["stream_keep_every"] = p.stream_keep_every;
  d["max_seq_checkpoint_offload"] = p.max_seq_checkpoint_offload;
  d["max_seq_stream_offload"] = p.max_seq_stream_offload;
  d["checkpoint_offload_host_bytes"] = p.checkpoint_offload_host_bytes;
  d["stream_offload_host_bytes"] = p.stream_offload_host_bytes;
  return d;
}

py::dict plan(py::object model, const std::string& preset, py::dict options) {
  option_reader o(options);
  constexpr index_t big = index_t{1} << 62;
  const index_t seq = o.integer("seq", 0, 1, big), batch = o.integer("batch", 1, 1, big);
  check(seq >= 1, "seq is required (the sequence length to plan for)");
  const index_t chunk = o.integer("chunk", 512, 1, big);
  const index_t max_seq = o.integer("max_seq", index_t{1} << 22, 1, big);
  const py::object budget = o.raw("budget");
  check(!budget.is_none(), "budget is required (bytes, or a string such as '60G')");
  const std::size_t bytes = cli::parse_bytes("budget", py::str(budget));
  const std::string dtype = o.text("dtype", "float32");
  check(dtype == "float32" || dtype == "float64", "dtype is '", dtype,
        "', expected 'float32' or 'float64'");
  o.finish("plan");
  // the planner prices B x T tokens by a closed form: the count must stay an index (2^62)
  for (const auto& [key, t] : {std::pair<const char*, index_t>{"seq", seq},
                               std::pair<const char*, index_t>{"max_seq", max_seq}}) {
    const auto tokens =
        checked_product({static_cast<std::uint64_t>(t), static_cast<std::uint64_t>(batch)});
    check(tokens && *tokens <= static_cast<std::uint64_t>(big), key, " ", t, " x batch ", batch,
          " is more than 2^62 tokens");
  }
  check(model.is_none() != preset.empty(), "give exactly one of model and preset");
  model_config cfg;
  if (!preset.empty())
    cfg = preset_config(preset);
  else if (py::isinstance<model_base>(model))
    cfg = model.cast<model_base&>().config();
  else
    cfg = load_hf_config(std::filesystem::path(std::string(py::str(model))));
  return dtype == "float64" ? plan_dict<double>(cfg, batch, seq, bytes, chunk, max_seq)
                            : plan_dict<float>(cfg, batch, seq, bytes, chunk, max_seq);
}

}  // namespace

void bind_model(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const cli::usage_error& e) {
      PyErr_SetString(PyExc_ValueError, e.message.c_str());
    }
  });

  py::class_<model_base>(m, "_Model")
      .def_property_readonly("config", [](const model_base& b) { return config_dict(b.config()); })
      .def_property_readonly("dtype", &model_base::dtype)
      .def("_state_dict",
           [](model_base& b) {
             std::vector<named_grad> w;
             {
               py::gil_scoped_release unlocked;
               w = b.weights();
             }
             return to_dict(w);
           })
      .def("_gradients",
           [](model_base& b, const std::string& objective, const py::dict& arrays,
              const py::dict& options) {
             grad_request r = make_grad_request(objective, arrays, options);
             std::pair<double, std::vector<named_grad>> out;
             {
               py::gil_scoped_release unlocked;
               out = b.gradients(r);
             }
             return py::make_tuple(out.first, to_dict(out.second));
           })
      .def("_logprobs", [](model_base& b, const py::dict& arrays, const py::dict& options) {
        option_reader o(options);
        logprob_request r;
        r.opt.chunk = o.integer("chunk", 512, 1, max_count);
        r.opt.head_chunk_rows = o.integer("head_chunk", 0, 0, max_count);
        r.opt.temperature = o.real("temperature", 1.0, 1e-6, 1e6);
        const std::string reduce = o.text("reduce", "none");
        check(reduce == "none" || reduce == "sum", "reduce is '", reduce,
              "', expected None or 'sum'");
        r.sums = reduce == "sum";
        o.finish("logprobs");
        r.batch = make_batch(arrays);
        std::pair<std::vector<double>, cli::loaded_batch> out;
        {
          py::gil_scoped_release unlocked;
          out = b.logprobs(r);
          // per token: label-aligned (B, T), entry t the log-prob of labels[t] (the tool's)
          if (!r.sums) out.first = cli::unshift_values(out.first, out.second.b, out.second.t);
        }
        if (r.sums)
          return py::array_t<double>(static_cast<py::ssize_t>(out.first.size()), out.first.data());
        return py::array_t<double>(
            {static_cast<py::ssize_t>(out.second.b), static_cast<py::ssize_t>(out.second.t)},
            out.first.data());
      });
  m.def(
      "_load_model",
      [](const std::string& dir, const std::string& dtype, int threads) {
        py::gil_scoped_release unlocked;
        return load_model(dir, dtype, threads);
      },
      py::arg("path"), py::arg("dtype"), py::arg("threads"));
  m.def("_plan", &plan, py::arg("model"), py::arg("preset"), py::arg("options"));
  m.def("_presets", &preset_names);
}

}  // namespace tightfit::python
