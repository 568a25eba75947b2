// collective-guard's kernel for the checked c10d:: ops, in C++ (see harness/guard/rank.py).
//
// Why: a Python kernel costs every call, sampled or not, the dispatcher boxing its arguments
// into Python objects and the GIL (measured: x1.55 on a DDP step at 1 in 100 sampling). Here
// an unsampled call costs a counter step under a mutex and the redispatch, and never enters
// Python. A sampled call (one in N per op family and group, the same call on every rank) of
// dense CPU tensors is digested here too (digest.cpp: fused loops, no torch ops): its inputs
// before it is issued, its outputs in a callback on its Work's future (on the backend's
// thread, without the GIL, so the callback never waits for the training thread), and a
// received buffer when its Work is waited. The only Python such a call runs is the walk of
// the stack for its call site (kept as a code object and a line: the site's text, the call's
// case JSON are made only for a call found wrong). The digested records queue here until the
// guard's checker thread takes them (guard_take), in batches.
//
// Other sampled calls (CUDA tensors, non-contiguous or complex ones, a Python Work) go to
// the guard's Python (`before`, `after`), which digests them with torch ops as before.
// Built into the recorder's extension (one build, one cache); its state is its own.
#include "common.h"
#include "digest.h"

#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/library.h>

#include <time.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

using collective_native::Arg;
using collective_native::Digest;
using Clock = std::chrono::steady_clock;

enum Kind { REDUCE, BROADCAST, GATHER_BASE, GATHER_LIST, SCATTER_BASE, SCATTER_LIST, SEND, RECV };

struct OpInfo {
  std::string name;    // the dispatcher op's name without its namespace
  std::string family;  // the counter's op family
  Kind kind = REDUCE;
  bool p2p = false;    // counted per peer too
  size_t group_at = 0;  // the ProcessGroup argument's index
};

// One sampled call digested here: what the checker needs to decide it, and (for a call found
// wrong) what its finding needs, kept as plain values and references.
struct Record {
  const c10::FunctionSchema* schema = nullptr;
  const OpInfo* op = nullptr;
  int64_t seq = 0, ordinal = 0, step = 0;
  std::string group;
  std::vector<int64_t> ranks;  // the group's global ranks
  int64_t me = 0;              // this rank's position in the group
  c10::ScalarType dtype = c10::ScalarType::Float;
  int64_t chunk = 0;           // elements per digested chunk
  int64_t reduce = -1, root = -1, peer = -1, tag = 0;
  bool linear = false;         // whether the reduction's linear digests are taken
  std::vector<Arg> args;
  collective_native::Site site;
  std::vector<Digest> in, out;
  std::vector<at::Tensor> later;  // digested once the call completed; released then
  std::vector<at::Tensor> kept;   // copies of the inputs (--keep-inputs)
  Clock::time_point ready_at;
};
using RecordPtr = std::shared_ptr<Record>;

// Never destroyed, as in hook.cpp: a static destructor would run after Python is gone.
std::mutex& mu = *new std::mutex();  // ops, counters, groups
auto& ops = *new std::unordered_map<std::string, OpInfo>();  // by qualified op name
auto& counters = *new std::unordered_map<std::string, int64_t>();
auto& groups = *new std::unordered_map<std::string, std::vector<int64_t>>();
auto& sites = *new collective_native::Sites();
std::atomic<int64_t> every{100};
std::atomic<int64_t> chunk_setting{65536};
std::atomic<int64_t> keep_limit{0};  // elements of a call's input kept; 0: none
std::atomic<int64_t> total{0};
std::atomic<int64_t> steps{0};
std::atomic<int64_t> digest_ns{0};  // CPU time spent digesting, all threads (for the stats)
std::atomic<bool> off{false};
std::atomic<bool> raise_pending{false};
thread_local int depth = 0;  // inside a sampled call: its own c10d calls are not the user's
py::object& before_cb = *new py::object();
py::object& after_cb = *new py::object();
py::object& raise_cb = *new py::object();
py::object& group_cb = *new py::object();
auto& libs = *new std::vector<std::unique_ptr<torch::Library>>();

// The digested records, until the checker takes them.
std::mutex& qmu = *new std::mutex();
std::condition_variable& qcv = *new std::condition_variable();
auto& ready = *new std::deque<RecordPtr>();
int64_t pending = 0;      // records made and not yet taken nor dropped (qmu)
bool woken = false;       // the checker is asked to look now (qmu)
bool flushing = false;    // finishing: hand records over without lingering (qmu)
std::string& failure = *new std::string();  // why a digest failed, for the checker (qmu)

constexpr int64_t MAX_PENDING = 1 << 16;  // digested calls the checker has not taken

void made() {
  std::lock_guard<std::mutex> g(qmu);
  if (++pending > MAX_PENDING && failure.empty()) {  // it cannot keep up: memory would grow
    off = true;
    failure = "the checker fell behind (" + std::to_string(MAX_PENDING) +
              " sampled calls waiting; sample fewer, e.g. --sample 100)";
  }
}

int64_t batch_most = 1;  // the take() in progress hands over this many at once (qmu)

void enqueue(RecordPtr r) {
  r->ready_at = Clock::now();
  bool wake;
  {
    std::lock_guard<std::mutex> g(qmu);
    ready.push_back(std::move(r));
    // Only what ends a wait of take()'s: the first record, or a full batch. A wake per record
    // while the checker lingers cost it a context switch per call.
    const auto n = static_cast<int64_t>(ready.size());
    wake = n == 1 || n >= batch_most;
  }
  if (wake) qcv.notify_all();
}

void drop(const std::string& why) {
  {
    std::lock_guard<std::mutex> g(qmu);
    --pending;
    if (!why.empty() && failure.empty()) failure = why;
  }
  qcv.notify_all();
}

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

void digest_outputs(Record& r);

// A receive's Work (or a collective's whose Work has no future): the buffer is digested when
// the caller's wait() returns, not before (waiting in the kernel could deadlock a program
// whose peer sends after its own receive). A Work never waited leaves its call unchecked.
class DigestedOnWait : public c10d::Work {
 public:
  DigestedOnWait(c10::intrusive_ptr<c10d::Work> work, RecordPtr record)
      : c10d::Work(-1, work->retrieveOpType()), work_(std::move(work)),
        record_(std::move(record)) {}
  bool isCompleted() override { return work_->isCompleted(); }
  bool isSuccess() const override { return work_->isSuccess(); }
  std::exception_ptr exception() const override { return work_->exception(); }
  int sourceRank() const override { return work_->sourceRank(); }
  std::vector<at::Tensor> result() override { return work_->result(); }
  bool wait(std::chrono::milliseconds timeout) override {
    const bool got = work_->wait(timeout);
    RecordPtr r;
    {
      std::lock_guard<std::mutex> g(mu_);
      r = std::move(record_);  // digested once, by the first wait that returns
    }
    if (r && !off.load()) {
      made();
      try {
        digest_outputs(*r);
        enqueue(std::move(r));
      } catch (const std::exception& e) {
        drop(std::string("cannot digest ") + r->op->name + ": " + e.what());
      }
    }
    return got;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return work_->getFuture(); }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::mutex mu_;
  RecordPtr record_;
};

py::tuple to_py(const torch::jit::Stack& stack, size_t from) {
  py::tuple out(stack.size() - from);
  for (size_t i = from; i < stack.size(); ++i) out[i - from] = torch::jit::toPyObject(stack[i]);
  return out;
}

std::vector<at::Tensor> tensors_of(const c10::IValue& v) {
  if (v.isTensor()) return {v.toTensor()};
  if (v.isTensorList()) return v.toTensorList().vec();
  return {};
}

// The flat tensor cut into `parts` equal blocks (digest.py's blocks).
std::vector<at::Tensor> blocks(const at::Tensor& t, int64_t parts) {
  auto flat = t.reshape(-1);
  const int64_t n = flat.numel() / std::max<int64_t>(parts, 1);
  std::vector<at::Tensor> out;
  for (int64_t i = 0; i < parts; ++i) out.push_back(flat.narrow(0, i * n, n));
  return out;
}

bool all_readable(const std::vector<at::Tensor>& ts) {
  for (const auto& t : ts) {
    if (!collective_native::readable(t)) return false;
  }
  return true;
}

bool linear_kind(c10::ScalarType dtype, int64_t reduce) {  // plan.py's dtype_facts
  return dtype != c10::ScalarType::Bool && (reduce == 0 || reduce == 1 || reduce == 3 ||
                                            reduce == 4);
}

enum Plan { SKIP, NATIVE, PYTHON };

// plan.py's plan_for, for the forms this file digests: which tensors, which digests. SKIP:
// a form the guard does not check (the same answer plan_for gives); PYTHON: checked, but by
// the reference in Python (CUDA, non-contiguous, complex, ...). `r` gets the inputs to digest
// now (r.later: the outputs) on NATIVE.
Plan plan(const OpInfo& op, const torch::jit::Stack& s, size_t base, int64_t w, Record& r,
          std::vector<at::Tensor>& before) {
  const int64_t chunk = chunk_setting.load();
  switch (op.kind) {
    case REDUCE: {
      auto ts = tensors_of(s[base]);
      if (ts.size() != 1 || !s[base + 3].isNone() || ts[0].numel() == 0) return SKIP;
      const auto& t = ts[0];
      if (!all_readable(ts)) return PYTHON;
      r.reduce = static_cast<int64_t>(s[base + 2].toCustomClass<c10d::ReduceOp>()->op_);
      r.linear = linear_kind(t.scalar_type(), r.reduce);
      if (r.linear && !collective_native::linear_readable(t.scalar_type())) return PYTHON;
      r.dtype = t.scalar_type();
      r.chunk = collective_native::chunk_len(t.numel(), chunk);
      if (r.linear) before.push_back(t);
      r.later = {t};
      return NATIVE;
    }
    case BROADCAST: {
      auto ts = tensors_of(s[base]);
      if (ts.empty()) return SKIP;
      if (!all_readable(ts)) return PYTHON;
      r.dtype = ts[0].scalar_type();
      r.root = s[base + 2].toInt();
      r.chunk = 1;
      for (const auto& t : ts) {
        r.chunk = std::max(r.chunk, collective_native::chunk_len(t.numel(), chunk));
      }
      r.later = ts;
      return NATIVE;
    }
    case GATHER_BASE: case GATHER_LIST: {
      std::vector<at::Tensor> outs;
      at::Tensor inp;
      if (op.kind == GATHER_LIST) {
        auto ins = tensors_of(s[base + 1]);
        auto lists = s[base].toListRef();
        if (ins.size() != 1 || lists.empty()) return SKIP;
        inp = ins[0];
        outs = tensors_of(lists[0]);
        if (!all_readable(outs) || !all_readable({inp})) return PYTHON;
      } else {
        inp = s[base + 1].toTensor();
        const auto out = s[base].toTensor();
        if (!all_readable({out, inp})) return PYTHON;
        outs = blocks(out, w);
      }
      if (static_cast<int64_t>(outs.size()) != w) return SKIP;
      for (const auto& o : outs) {
        if (o.numel() != inp.numel()) return SKIP;
      }
      r.dtype = inp.scalar_type();
      r.chunk = collective_native::chunk_len(inp.numel(), chunk);
      before.push_back(inp);
      r.later = outs;
      return NATIVE;
    }
    case SCATTER_BASE: case SCATTER_LIST: {
      at::Tensor out;
      std::vector<at::Tensor> ins;
      if (op.kind == SCATTER_LIST) {
        auto outs = tensors_of(s[base]);
        auto lists = s[base + 1].toListRef();
        if (outs.size() != 1 || lists.empty()) return SKIP;
        out = outs[0];
        ins = tensors_of(lists[0]);
        if (!all_readable(ins) || !all_readable({out})) return PYTHON;
      } else {
        out = s[base].toTensor();
        const auto inp = s[base + 1].toTensor();
        if (!all_readable({out, inp})) return PYTHON;
        ins = blocks(inp, w);
      }
      r.reduce = static_cast<int64_t>(s[base + 3].toCustomClass<c10d::ReduceOp>()->op_);
      if (static_cast<int64_t>(ins.size()) != w) return SKIP;
      for (const auto& i : ins) {
        if (i.numel() != out.numel()) return SKIP;
      }
      if (!linear_kind(out.scalar_type(), r.reduce)) return SKIP;
      if (!collective_native::linear_readable(out.scalar_type())) return PYTHON;
      r.linear = true;
      r.dtype = out.scalar_type();
      r.chunk = collective_native::chunk_len(out.numel(), chunk);
      before = ins;
      r.later = {out};
      return NATIVE;
    }
    case SEND: case RECV: {
      auto ts = tensors_of(s[base]);
      if (ts.size() != 1 || (op.kind == RECV && s[base + 2].toInt() < 0)) return SKIP;
      if (!all_readable(ts)) return PYTHON;
      r.dtype = ts[0].scalar_type();
      r.chunk = collective_native::chunk_len(ts[0].numel(), chunk);
      r.peer = s[base + 2].toInt();
      r.tag = s[base + 3].toInt();
      if (op.kind == SEND) {
        before = ts;
      } else {
        r.later = ts;
      }
      return NATIVE;
    }
  }
  return SKIP;
}

// The digests plan.py takes after the call: a reduction's linear (if any) and exact digest
// of its buffer, a reduce_scatter's output's linear digest, else the exact digest of each.
// Adds the calling thread's CPU time from its making to its end to digest_ns.
struct Timed {
  static int64_t now() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  }
  int64_t start = now();
  ~Timed() { digest_ns += now() - start; }
};

void digest_outputs(Record& r) {
  Timed timed;
  if (r.op->kind == SCATTER_BASE || r.op->kind == SCATTER_LIST) {
    r.out.push_back(collective_native::linear(r.later[0], r.chunk));
  } else if (r.op->kind == REDUCE) {
    if (r.linear) {
      r.out.resize(2);
      collective_native::linear_and_exact(r.later[0], r.chunk, r.out[0], r.out[1]);
    } else {
      r.out.push_back(collective_native::exact(r.later[0], r.chunk));
    }
  } else {
    for (const auto& t : r.later) r.out.push_back(collective_native::exact(t, r.chunk));
  }
  r.later.clear();  // the user's buffers are not held past the digest
}

void digest_inputs(Record& r, const std::vector<at::Tensor>& before) {
  Timed timed;
  const bool linear = r.op->kind == REDUCE || r.op->kind == SCATTER_BASE ||
                      r.op->kind == SCATTER_LIST;
  for (const auto& t : before) {
    r.in.push_back(linear ? collective_native::linear(t, r.chunk)
                          : collective_native::exact(t, r.chunk));
  }
  const int64_t limit = keep_limit.load();
  if (limit <= 0) return;
  // What a finding's case needs as this rank's input: the buffer as the call received it.
  std::vector<at::Tensor> input = before;
  if (r.op->kind == REDUCE || r.op->kind == BROADCAST) input = {r.later[0]};
  int64_t n = 0;
  for (const auto& t : input) n += t.numel();
  if (n > limit) return;
  for (const auto& t : input) r.kept.push_back(t.clone());
}

// The group's global ranks, asked of Python once per group name (the GIL is held).
std::vector<int64_t> group_ranks(const std::string& name) {
  {
    std::lock_guard<std::mutex> g(mu);
    auto it = groups.find(name);
    if (it != groups.end()) return it->second;
  }
  auto got = group_cb(name).cast<std::vector<int64_t>>();
  std::lock_guard<std::mutex> g(mu);
  groups[name] = got;
  return got;
}

// A sampled call digested here. Returns false where the call was not issued here (the
// guard's own failure before issuing it: then the caller issues it unguarded).
void native_call(const c10::OperatorHandle& op, c10::DispatchKeySet below,
                 torch::jit::Stack* stack, size_t base, RecordPtr r,
                 std::vector<at::Tensor> before) {
  const auto& schema = op.schema();
  try {
    digest_inputs(*r, before);
  } catch (const std::exception& e) {
    {
      std::lock_guard<std::mutex> g(qmu);
      if (failure.empty()) failure = std::string("cannot digest ") + r->op->name + ": " + e.what();
    }
    qcv.notify_all();
    op.redispatchBoxed(below, stack);
    return;
  }
  ++depth;
  try {
    op.redispatchBoxed(below, stack);
  } catch (...) {
    --depth;
    throw;
  }
  --depth;
  const auto& returns = schema.returns();
  const size_t first = stack->size() - returns.size();
  size_t at = stack->size();
  for (size_t i = 0; i < returns.size(); ++i) {
    const auto& v = (*stack)[first + i];
    if (v.isCustomClass() && returns[i].type()->str().find("Work") != std::string::npos) {
      at = first + i;
    }
  }
  if (r->op->kind == SEND) {  // what was sent is known now
    made();
    enqueue(std::move(r));
    return;
  }
  if (at == stack->size()) return;  // no Work: nothing to follow (not a form we know)
  auto work = (*stack)[at].toCustomClass<c10d::Work>();
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  if (r->op->kind != RECV) {
    try {
      fut = work->getFuture();
    } catch (const std::exception&) {  // a Work without a future: digested on wait()
    }
  }
  if (!fut) {
    (*stack)[at] = c10::IValue(c10::intrusive_ptr<c10d::Work>(
        c10::make_intrusive<DigestedOnWait>(work, std::move(r))));
    return;
  }
  made();
  auto done = fut->then(
      [r](c10::ivalue::Future& f) -> c10::IValue {
        if (f.hasError()) {  // the op failed: nothing to digest; its error goes to the caller
          r->later.clear();
          drop("");
          return f.value();  // throws the op's error into the future the caller gets
        }
        try {
          if (off.load()) {
            r->later.clear();
            drop("");
          } else {
            digest_outputs(*r);
            enqueue(r);
          }
        } catch (const std::exception& e) {  // never fail the user's call for the guard's sake
          r->later.clear();
          drop(std::string("cannot digest ") + r->op->name + ": " + e.what());
        }
        return f.value();
      },
      fut->elementType());
  (*stack)[at] = c10::IValue(c10::intrusive_ptr<c10d::Work>(
      c10::make_intrusive<Digested>(work, done)));
}

void python_call(const c10::OperatorHandle& op, c10::DispatchKeySet below,
                 torch::jit::Stack* stack, size_t base, const std::string& name, int64_t seq,
                 int64_t ordinal) {
  const auto& schema = op.schema();
  py::gil_scoped_acquire gil;
  py::object state = before_cb(name, seq, to_py(*stack, base), ordinal, steps.load());
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
  const OpInfo* info = nullptr;
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
        info = &it->second;
      }
    }
  }
  const int64_t ordinal = total++;
  if (seq < 0 || seq % every.load(std::memory_order_relaxed) != 0) {
    op.redispatchBoxed(below, stack);
    return;
  }
  auto r = std::make_shared<Record>();
  std::vector<at::Tensor> before;
  Plan how = PYTHON;
  try {
    auto pg = (*stack)[base + info->group_at].toCustomClass<c10d::ProcessGroup>();
    r->op = info;
    r->schema = &schema;
    r->seq = seq;
    r->ordinal = ordinal;
    r->step = steps.load();
    r->group = pg->getGroupName();
    r->me = pg->getRank();
    how = plan(*info, *stack, base, pg->getSize(), *r, before);
  } catch (const std::exception&) {  // a form plan() cannot read: the Python path decides
    how = PYTHON;
  }
  if (how == SKIP) {
    op.redispatchBoxed(below, stack);
    return;
  }
  if (how == PYTHON) {
    python_call(op, below, stack, base, info->name, seq, ordinal);
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    try {
      r->args.push_back(collective_native::capture(schema.arguments()[i], (*stack)[base + i]));
    } catch (const std::exception&) {
      Arg unreadable;
      unreadable.tag = collective_native::STR;
      unreadable.s = "<unreadable>";
      r->args.push_back(std::move(unreadable));
    }
  }
  {
    py::gil_scoped_acquire gil;
    try {
      r->site = sites.walk();
      r->ranks = group_ranks(r->group);
    } catch (py::error_already_set& e) {
      if (e.matches(PyExc_KeyboardInterrupt) || e.matches(PyExc_SystemExit)) throw;
      std::lock_guard<std::mutex> g(qmu);
      if (failure.empty()) failure = std::string("cannot read the call's group: ") + e.what();
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> g(qmu);
      if (failure.empty()) failure = std::string("cannot read the call's group: ") + e.what();
    }
  }
  if (r->ranks.empty()) {  // the group could not be read: the checker turns the guard off
    qcv.notify_all();
    op.redispatchBoxed(below, stack);
    return;
  }
  native_call(op, below, stack, base, std::move(r), std::move(before));
}

py::object digest_py(const Digest& d) {
  const size_t rows = d.cols ? (d.floating ? d.reals.size() : d.ints.size()) / d.cols : 0;
  py::list out(rows);
  for (size_t i = 0; i < rows; ++i) {
    py::list row(d.cols);
    for (int c = 0; c < d.cols; ++c) {
      const size_t at = i * d.cols + c;
      row[c] = d.floating ? py::object(py::float_(d.reals[at])) : py::object(py::int_(d.ints[at]));
    }
    out[i] = row;
  }
  return out;
}

// A digest as the side channel carries it (channel.py's raw form): its kind ("d": float64,
// "q": int64), its columns and its numbers' little-endian bytes, so that the checker passes
// them on (and compares them) without a Python number per value.
py::tuple digest_raw(const Digest& d) {
  const size_t n = d.floating ? d.reals.size() : d.ints.size();
  std::string bytes(n * 8, '\0');
  const void* src = d.floating ? static_cast<const void*>(d.reals.data())
                               : static_cast<const void*>(d.ints.data());
  std::memcpy(bytes.data(), src, bytes.size());
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  for (size_t i = 0; i < n; ++i) {
    uint64_t v;
    std::memcpy(&v, bytes.data() + 8 * i, 8);
    v = __builtin_bswap64(v);
    std::memcpy(bytes.data() + 8 * i, &v, 8);
  }
#endif
  return py::make_tuple(d.floating ? "d" : "q", d.cols, py::bytes(bytes));
}

py::list digests_raw(const std::vector<Digest>& ds) {
  py::list out(ds.size());
  for (size_t i = 0; i < ds.size(); ++i) out[i] = digest_raw(ds[i]);
  return out;
}

// The little-endian float64 numbers of a raw digest's bytes.
std::vector<double> reals_of(const std::string& bytes) {
  std::vector<double> out(bytes.size() / 8);
  std::memcpy(out.data(), bytes.data(), out.size() * 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  for (auto& v : out) {
    uint64_t u;
    std::memcpy(&u, &v, 8);
    u = __builtin_bswap64(u);
    std::memcpy(&v, &u, 8);
  }
#endif
  return out;
}

// check.py's float SUM/AVG test of a reduction's linear digests, for the honest call only:
// true where every chunk of every output is within half the bound check.py computes (its
// factors c_in, c_out, slack given), with room for this sum's own rounding; false where any
// is not, or anything is irregular (non-finite values, ragged sizes): check.py then decides,
// so a verdict is check.py's either way.
bool sum_ok(const std::vector<std::string>& ins, const std::vector<std::string>& outs,
            double c_in, double c_out, double slack, bool avg) {
  if (ins.empty() || outs.empty()) return false;
  std::vector<std::vector<double>> in;
  for (const auto& b : ins) {
    if (b.size() != ins[0].size() || b.size() % 16) return false;
    in.push_back(reals_of(b));
  }
  const size_t rows = ins[0].size() / 16;
  const double w = static_cast<double>(ins.size());
  for (const auto& b : outs) {
    if (b.size() != ins[0].size()) return false;
    const auto out = reals_of(b);
    for (size_t c = 0; c < rows; ++c) {
      double s = 0, a = 0, abs_s = 0;
      for (const auto& i : in) {
        s += i[2 * c];
        abs_s += std::fabs(i[2 * c]);
        a += i[2 * c + 1];
      }
      const double want = avg ? s / w : s;
      const double diff = std::fabs(out[2 * c] - want);
      const double bound = c_in * a + c_out * out[2 * c + 1] + slack;
      const double own = 4 * w * 0x1p-53 * abs_s;  // this sum's rounding, against fsum's
      if (!std::isfinite(diff) || !std::isfinite(bound) || !std::isfinite(own) ||
          !(diff + own <= 0.5 * bound)) {
        return false;
      }
    }
  }
  return true;
}

py::tuple ints_py(const std::vector<int64_t>& v) {
  py::tuple out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = v[i];
  return out;
}

// The records digested since the last take, as tuples (see rank.py's Native.take), after
// waiting up to `wait_s` for the first and then up to `linger_s` more for others (at most
// `most`): the checker publishes them in one message per peer.
py::list take(double wait_s, double linger_s, int64_t most) {
  std::vector<RecordPtr> got;
  {
    py::gil_scoped_release nogil;
    std::unique_lock<std::mutex> lk(qmu);
    batch_most = std::max<int64_t>(most, 1);
    const auto now = Clock::now();
    qcv.wait_until(lk, now + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(wait_s)),
                   [] { return !ready.empty() || woken || !failure.empty(); });
    if (!ready.empty() && !woken && !flushing) {
      const auto until = ready.front()->ready_at + std::chrono::duration_cast<Clock::duration>(
                                                       std::chrono::duration<double>(linger_s));
      qcv.wait_until(lk, until, [most] {
        return static_cast<int64_t>(ready.size()) >= most || woken || flushing ||
               !failure.empty();
      });
    }
    woken = false;
    got.assign(ready.begin(), ready.end());
    ready.clear();
    pending -= static_cast<int64_t>(got.size());
  }
  py::list out;
  for (auto& r : got) {
    auto* holder = new RecordPtr(r);
    py::capsule ref(holder, [](void* p) { delete static_cast<RecordPtr*>(p); });
    auto dtype = py::reinterpret_borrow<py::object>(
        reinterpret_cast<PyObject*>(torch::getTHPDtype(r->dtype)));
    out.append(py::make_tuple(
        r->op->name, r->seq, r->group, ints_py(r->ranks), r->me, dtype, r->chunk, r->reduce,
        r->root, r->peer, r->tag, r->ordinal, r->step, digests_raw(r->in), digests_raw(r->out),
        ref));
  }
  return out;
}

RecordPtr& record_of(py::capsule ref) { return *static_cast<RecordPtr*>(ref.get_pointer()); }

}  // namespace

// Register the kernel for `names` (with their families and ProcessGroup argument index) at
// `keys`; sampled calls this file cannot digest go to `before(name, seq, args, ordinal,
// step)` and `after(state, outputs)`; `group(name)` gives a group's global ranks.
void guard_attach(const std::vector<std::string>& names, const std::vector<std::string>& families,
                  const std::vector<int64_t>& group_at, const std::vector<std::string>& keys,
                  int64_t n, int64_t chunk, int64_t keep, py::object before, py::object after,
                  py::object raise, py::object group, py::object classify) {
  static const std::unordered_map<std::string, Kind> kinds = {
      {"allreduce_", REDUCE}, {"broadcast_", BROADCAST}, {"_allgather_base_", GATHER_BASE},
      {"allgather_", GATHER_LIST}, {"_reduce_scatter_base_", SCATTER_BASE},
      {"reduce_scatter_", SCATTER_LIST}, {"send", SEND}, {"recv_", RECV}};
  {
    std::lock_guard<std::mutex> g(mu);
    for (size_t i = 0; i < names.size(); ++i) {
      OpInfo info;
      info.name = names[i];
      info.family = families[i];
      info.kind = kinds.at(names[i]);
      info.p2p = families[i] == "p2p";
      info.group_at = static_cast<size_t>(group_at[i]);
      ops["c10d::" + names[i]] = info;
    }
  }
  every = n;
  chunk_setting = chunk;
  keep_limit = keep;
  before_cb = std::move(before);
  after_cb = std::move(after);
  raise_cb = std::move(raise);
  group_cb = std::move(group);
  sites.set_classify(std::move(classify));
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
  m.def("guard_off", [] {
    off = true;
    {
      std::lock_guard<std::mutex> g(qmu);
      woken = true;
    }
    qcv.notify_all();
  });
  m.def("guard_raise", [] { raise_pending = true; });
  m.def("guard_calls", [] { return total.load(); });
  m.def("guard_depth", [] { return depth; });
  m.def("guard_step", [] { steps++; });
  m.def("guard_steps", [] { return steps.load(); });
  m.def("guard_sum_ok", [](const std::vector<std::string>& ins,
                           const std::vector<std::string>& outs, double c_in, double c_out,
                           double slack, bool avg) {
    return sum_ok(ins, outs, c_in, c_out, slack, avg);
  });
  m.def("guard_digest_s", [] { return static_cast<double>(digest_ns.load()) * 1e-9; });
  m.def("guard_take", &take);
  // Wake the checker (a Python-path call is queued, or it must stop); with `flush`, from now
  // on records are handed over as they come (finishing: no batching delay).
  m.def("guard_wake", [](bool flush) {
    {
      std::lock_guard<std::mutex> g(qmu);
      woken = true;
      flushing = flushing || flush;
    }
    qcv.notify_all();
  });
  m.def("guard_pending", [] {
    std::lock_guard<std::mutex> g(qmu);
    return pending;
  });
  m.def("guard_failure", [] {  // why a digest failed ("" if none), once
    std::lock_guard<std::mutex> g(qmu);
    std::string why;
    why.swap(failure);
    return why;
  });
  m.def("guard_forget_groups", [] {  // after destroy_process_group: names may be reused
    std::lock_guard<std::mutex> g(mu);
    groups.clear();
  });
  // A record's call as the recorder captures it, for a finding's case: (op, ((argument name,
  // (tag, payload)), ...), api, code, line); made only for a call found wrong.
  m.def("guard_describe", [](py::capsule ref) {
    const auto& r = record_of(ref);
    const auto& names = r->schema->arguments();
    py::tuple args(r->args.size());
    for (size_t i = 0; i < r->args.size(); ++i) {
      args[i] = py::make_tuple(names[i].name(), collective_native::arg_py(r->args[i]));
    }
    py::object code = r->site.code ? py::reinterpret_borrow<py::object>(r->site.code)
                                   : py::none();
    py::object api = r->site.api ? py::object(py::str(*r->site.api)) : py::none();
    return py::make_tuple(r->schema->name(), args, api, code, r->site.line);
  });
  m.def("guard_kept", [](py::capsule ref) { return record_of(ref)->kept; });
  // The C++ digests of a tensor, as digest.py's functions return them (tests compare them).
  m.def("guard_exact", [](const at::Tensor& t, int64_t chunk) {
    TORCH_CHECK(collective_native::readable(t), "not a tensor the C++ digests read");
    return digest_py(collective_native::exact(t, chunk));
  });
  m.def("guard_linear", [](const at::Tensor& t, int64_t chunk) {
    TORCH_CHECK(collective_native::readable(t) &&
                collective_native::linear_readable(t.scalar_type()),
                "not a tensor the C++ linear digest reads");
    return digest_py(collective_native::linear(t, chunk));
  });
  m.def("guard_linear_and_exact", [](const at::Tensor& t, int64_t chunk) {
    TORCH_CHECK(collective_native::readable(t) &&
                collective_native::linear_readable(t.scalar_type()),
                "not a tensor the C++ linear digest reads");
    Digest lin, ex;
    collective_native::linear_and_exact(t, chunk, lin, ex);
    return py::make_tuple(digest_py(lin), digest_py(ex));
  });
}
