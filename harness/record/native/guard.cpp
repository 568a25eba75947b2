// collective-guard's kernel for the checked c10d:: ops, in C++ (see harness/guard/rank.py).
//
// Why: a Python kernel costs every call, sampled or not, the dispatcher boxing its arguments
// into Python objects and the GIL (measured: x1.55 on a DDP step at 1 in 100 sampling). Here
// an unsampled call costs a counter step under a mutex and the redispatch, and never enters
// Python; only a sampled call (one in N per op family and group, the same call on every rank)
// takes the GIL and hands its arguments to the guard's Python (`before`, which digests the
// inputs and says whether the call is checked), is issued, and hands its outputs to `after`
// (which arranges the output digests from the Work's completion). Built into the recorder's
// extension (one build, one cache); its state is its own, apart from the recorder's.
#include <Python.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

struct OpInfo {
  std::string name;    // the dispatcher op's name without its namespace
  std::string family;  // the counter's op family
  bool p2p = false;    // counted per peer too
  size_t group_at = 0;  // the ProcessGroup argument's index
};

// Never destroyed, as in hook.cpp: a static destructor would run after Python is gone.
std::mutex& mu = *new std::mutex();  // ops, counters
auto& ops = *new std::unordered_map<std::string, OpInfo>();  // by qualified op name
auto& counters = *new std::unordered_map<std::string, int64_t>();
std::atomic<int64_t> every{100};
std::atomic<int64_t> total{0};
std::atomic<bool> off{false};
std::atomic<bool> raise_pending{false};
thread_local int depth = 0;  // inside a sampled call: its own c10d calls are not the user's
py::object& before_cb = *new py::object();
py::object& after_cb = *new py::object();
py::object& raise_cb = *new py::object();
auto& libs = *new std::vector<std::unique_ptr<torch::Library>>();

// The call's counter key: family and group name (and the peer for p2p), "" when unreadable.
std::string key_of(const OpInfo& info, const torch::jit::Stack& stack, size_t base) {
  const auto& pg = stack[base + info.group_at];
  if (!pg.isCustomClass()) return "";
  std::string key = info.family;
  key += '\0';
  key += pg.toCustomClass<c10d::ProcessGroup>()->getGroupName();
  if (info.p2p) {
    key += '\0';
    key += info.name;
    key += '\0';
    key += std::to_string(stack[base + 2].toInt());
  }
  return key;
}

// A sampled CPU call's Work as its caller sees it: complete once the guard's completion callback
// digested the output (`done` is the future that callback returns), so that no one (DDP's Reducer
// waits on its future) sees the output before that; its wait() raises the op's error as the
// backend's Work does (torch's future-made Work would swallow it).
class Digested : public c10d::Work {
 public:
  Digested(c10::intrusive_ptr<c10d::Work> work, c10::intrusive_ptr<c10::ivalue::Future> done)
      : c10d::Work(-1, work->retrieveOpType()), work_(std::move(work)), done_(std::move(done)) {}
  bool isCompleted() override { return done_->completed(); }
  bool isSuccess() const override { return done_->completed() && !done_->hasError(); }
  std::exception_ptr exception() const override {
    return done_->hasError() ? done_->exception_ptr() : nullptr;
  }
  int sourceRank() const override { return work_->sourceRank(); }
  std::vector<at::Tensor> result() override { return work_->result(); }
  bool wait(std::chrono::milliseconds timeout) override {
    done_->waitAndThrow();
    return true;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return done_; }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  c10::intrusive_ptr<c10::ivalue::Future> done_;
};

py::tuple to_py(const torch::jit::Stack& stack, size_t from) {
  py::tuple out(stack.size() - from);
  for (size_t i = from; i < stack.size(); ++i) out[i - from] = torch::jit::toPyObject(stack[i]);
  return out;
}

void kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const auto below = ks & c10::after_autograd_keyset;
  if (depth > 0 || off.load(std::memory_order_relaxed)) {
    op.redispatchBoxed(below, stack);
    return;
  }
  if (raise_pending.exchange(false)) {  // --on-mismatch raise: a finding was decided
    py::gil_scoped_acquire gil;
    raise_cb();  // raises GuardMismatch; error_already_set carries it to the caller
  }
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  const size_t base = stack->size() - n;
  int64_t seq = -1;
  std::string name;
  {
    std::lock_guard<std::mutex> g(mu);
    auto it = ops.find(schema.name());
    if (it != ops.end()) {
      std::string key;
      try {
        key = key_of(it->second, *stack, base);
      } catch (const std::exception&) {  // a form this kernel cannot read: unchecked
      }
      if (!key.empty()) {
        seq = counters[key]++;
        name = it->second.name;
      }
    }
  }
  total++;
  if (seq < 0 || seq % every.load(std::memory_order_relaxed) != 0) {
    op.redispatchBoxed(below, stack);
    return;
  }
  py::gil_scoped_acquire gil;
  py::object state = before_cb(name, seq, to_py(*stack, base));
  {
    py::gil_scoped_release nogil;
    if (!state.is_none()) ++depth;
    try {
      op.redispatchBoxed(below, stack);
    } catch (...) {
      if (!state.is_none()) --depth;
      throw;
    }
    if (!state.is_none()) --depth;
  }
  if (state.is_none()) return;
  const auto& returns = schema.returns();
  const size_t first = stack->size() - returns.size();
  py::object done = after_cb(state, to_py(*stack, first));
  if (done.is_none()) return;
  auto future = torch::jit::toIValue(done, c10::FutureType::create(c10::AnyType::get())).toFuture();
  for (size_t i = 0; i < returns.size(); ++i) {
    auto& v = (*stack)[first + i];
    if (v.isCustomClass() && returns[i].type()->str().find("Work") != std::string::npos) {
      v = c10::IValue(c10::intrusive_ptr<c10d::Work>(
          c10::make_intrusive<Digested>(v.toCustomClass<c10d::Work>(), future)));
    }
  }
}

}  // namespace

// Register the kernel for `names` (with their families and ProcessGroup argument index) at
// `keys`; sampled calls go to `before(name, seq, args)` and `after(state, outputs)`.
void guard_attach(const std::vector<std::string>& names, const std::vector<std::string>& families,
                  const std::vector<int64_t>& group_at, const std::vector<std::string>& keys,
                  int64_t n, py::object before, py::object after, py::object raise) {
  {
    std::lock_guard<std::mutex> g(mu);
    for (size_t i = 0; i < names.size(); ++i) {
      OpInfo info;
      info.name = names[i];
      info.family = families[i];
      info.p2p = families[i] == "p2p";
      info.group_at = static_cast<size_t>(group_at[i]);
      ops["c10d::" + names[i]] = info;
    }
  }
  every = n;
  before_cb = std::move(before);
  after_cb = std::move(after);
  raise_cb = std::move(raise);
  for (const auto& key : keys) {
    auto lib = std::make_unique<torch::Library>(
        torch::Library::IMPL, "c10d", c10::parseDispatchKey(key), __FILE__, __LINE__);
    for (const auto& name : names) {
      lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&kernel>());
    }
    libs.push_back(std::move(lib));
  }
}

void bind_guard(py::module& m) {
  m.def("guard_attach", &guard_attach);
  // Unregister the kernel (collectives then go through the dispatcher as without the guard)
  // and register it again: ci/bench/bench_guard.py alternates blocks of steps in one process.
  m.def("guard_detach", [] { libs.clear(); });
  m.def("guard_reattach", [](const std::vector<std::string>& keys) {
    std::vector<std::string> names;
    {
      std::lock_guard<std::mutex> g(mu);
      for (const auto& [qual, info] : ops) names.push_back(info.name);
    }
    for (const auto& key : keys) {
      auto lib = std::make_unique<torch::Library>(
          torch::Library::IMPL, "c10d", c10::parseDispatchKey(key), __FILE__, __LINE__);
      for (const auto& name : names) {
        lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&kernel>());
      }
      libs.push_back(std::move(lib));
    }
  });
  m.def("guard_off", [] { off = true; });
  m.def("guard_raise", [] { raise_pending = true; });
  m.def("guard_calls", [] { return total.load(); });
  m.def("guard_depth", [] { return depth; });
}
