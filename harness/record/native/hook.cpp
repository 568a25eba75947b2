// collective-record's kernel for c10d:: ops, in C++ (see harness/record/native/__init__.py).
//
// The Python kernel (harness/record/hook.py) costs the rank's thread tens of microseconds per
// call: the dispatcher boxes every argument into a Python object, and the capture runs as
// Python. This kernel reads the same facts from the IValues on the stack and keeps them in a
// C++ queue; the only Python it runs per call is the stack walk for the call site (C API,
// under the GIL), and a Python callback only the first time it meets a code object, a thread
// or a group. The flusher thread drains the queue into the same tuples the Python kernel
// makes, so the trace is the same.
//
// The argument capture and the stack walk are in common.h (shared with collective-guard's
// kernel, guard.cpp); the kernel, its queue and the drain are here.
#include "common.h"

#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <pthread.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

using collective_native::Arg;
using collective_native::arg_py;
using collective_native::capture;
using collective_native::GROUP;
using collective_native::STR;

struct Call {
  // the op's (registered for the process' life); null in a record that carries only a Work
  const c10::FunctionSchema* schema = nullptr;
  std::vector<Arg> args;
  std::vector<size_t> names;  // each captured argument's index in the schema
  PyObject* code = nullptr;  // the site's code object: borrowed, the Sites cache owns it
  int line = 0;
  const std::string* api = nullptr;
  const std::string* thread = nullptr;
  int64_t seq = 0;
  c10::IValue work;  // the Work the call returned, for wait() matching; None if none
};

// Everything below lives until the process ends and is never destroyed: a static destructor
// would run after Python and the dispatcher are gone (decrefs without an interpreter, Works
// and registrations torn down in the wrong order), and the process is ending anyway.
std::mutex& mu = *new std::mutex();  // the queue, the caches
std::vector<Call>& queue = *new std::vector<Call>();
std::atomic<int64_t> seq_counter{0};
std::atomic<int64_t> calls{0};
thread_local int depth = 0;
auto& sites = *new collective_native::Sites();  // the call sites' classify cache
auto& strings = *new std::unordered_map<std::string, std::unique_ptr<std::string>>();
auto& groups_seen = *new std::unordered_map<std::string, bool>();
// Python callbacks, set by install()
py::object& thread_cb = *new py::object();
py::object& group_cb = *new py::object();
py::object& start_cb = *new py::object();
std::atomic<bool> started{false};  // start_cb runs at the first recorded call
auto& libs = *new std::vector<std::unique_ptr<torch::Library>>();

const std::string* intern(const std::string& s) {  // mu held
  auto it = strings.find(s);
  if (it != strings.end()) return it->second.get();
  auto p = std::make_unique<std::string>(s);
  auto* raw = p.get();
  strings.emplace(s, std::move(p));
  return raw;
}

// Asked once per thread (a thread_local, not a map by thread id: ids are reused).
thread_local const std::string* my_thread_name = nullptr;

const std::string* thread_name() {  // the GIL is held
  if (my_thread_name == nullptr) {
    std::string name = thread_cb().cast<std::string>();
    std::lock_guard<std::mutex> g(mu);
    my_thread_name = intern(name);
  }
  return my_thread_name;
}

void kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const auto below = ks & c10::after_autograd_keyset;
  if (depth > 0) {
    op.redispatchBoxed(below, stack);
    return;
  }
  const auto& schema = op.schema();
  const auto& arguments = schema.arguments();
  const size_t n = arguments.size();
  const size_t base = stack->size() - n;
  // Arguments equal to their schema default are left out, trailing positional ones and
  // keyword-only ones, as the dispatcher leaves them out when it calls a Python kernel: the
  // trace is then the same whichever kernel recorded it.
  const auto is_default = [&](size_t i) {
    const auto& d = arguments[i].default_value();
    return d.has_value() && *d == (*stack)[base + i];
  };
  size_t kw_start = n;
  while (kw_start > 0 && arguments[kw_start - 1].kwarg_only()) --kw_start;
  size_t pos_end = kw_start;
  while (pos_end > 0 && is_default(pos_end - 1)) --pos_end;
  Call c;
  c.args.reserve(n);
  c.names.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if ((i >= pos_end && i < kw_start) || (i >= kw_start && is_default(i))) continue;
    try {
      c.args.push_back(capture(arguments[i], (*stack)[base + i]));
    } catch (const std::exception&) {  // never fail the user's call for the recording's sake
      Arg unreadable;
      unreadable.tag = STR;
      unreadable.s = "<unreadable>";
      c.args.push_back(std::move(unreadable));
    }
    c.names.push_back(i);
  }
  {
    py::gil_scoped_acquire gil;
    // A failure of the recorder's own Python must never fail the user's call: the call is
    // then recorded with what was read (site "?" at worst).
    try {
      if (!started.load()) {  // the header: rank and world, taken now (idempotent in Python)
        start_cb();
        started = true;
      }
      const auto site = sites.walk();
      c.code = site.code;
      c.line = site.line;
      c.api = site.api;
      c.thread = thread_name();
      for (const Arg& a : c.args) {
        if (a.tag != GROUP) continue;
        bool seen;
        {
          std::lock_guard<std::mutex> g(mu);
          seen = groups_seen.count(a.s) > 0;
        }
        if (!seen) {  // the ranks are read now: the group may be gone when the batch is written
          group_cb(a.s);
          std::lock_guard<std::mutex> g(mu);
          groups_seen[a.s] = true;
        }
      }
    } catch (py::error_already_set& e) {
      if (e.matches(PyExc_KeyboardInterrupt) || e.matches(PyExc_SystemExit)) throw;
    } catch (const std::exception&) {
    }
    if (c.thread == nullptr) {
      std::lock_guard<std::mutex> g(mu);
      c.thread = intern("?");
    }
  }
  const int64_t seq = c.seq = seq_counter++;
  calls++;
  c.schema = &schema;
  {
    std::lock_guard<std::mutex> g(mu);
    queue.push_back(std::move(c));
  }
  ++depth;
  try {
    op.redispatchBoxed(below, stack);
  } catch (...) {
    --depth;
    throw;
  }
  --depth;
  // The outputs: a Work alone, or (outputs, Work).
  c10::IValue work;
  const size_t outs = schema.returns().size();
  for (size_t i = stack->size() - outs; i < stack->size(); ++i) {
    const auto& v = (*stack)[i];
    if (v.isCustomClass() && schema.returns()[i - (stack->size() - outs)].type()->str().find(
            "Work") != std::string::npos) {
      work = v;
    }
  }
  if (!work.isNone()) {
    std::lock_guard<std::mutex> g(mu);
    // The call is still queued unless the flusher drained it meanwhile: then the Work goes
    // in a record of its own (seq only), which drain() hands over the same way.
    for (auto it = queue.rbegin(); it != queue.rend(); ++it) {
      if (it->seq == seq) {
        it->work = work;
        return;
      }
    }
    Call late;
    late.seq = seq;
    late.work = work;
    queue.push_back(std::move(late));
  }
}

}  // namespace

void bind_guard(py::module& m);  // guard.cpp: collective-guard's kernel, in the same module

// What was recorded since the last drain: a list of (qualname or None, args, api, code, line,
// thread, seq, work or None). args pairs each schema argument's name with (tag, payload).
py::list drain() {
  std::vector<Call> got;
  {
    std::lock_guard<std::mutex> g(mu);
    got.swap(queue);
  }
  py::list out;
  for (const Call& c : got) {
    py::object work = c.work.isNone() ? py::none() : torch::jit::toPyObject(c.work);
    if (c.schema == nullptr) {
      out.append(py::make_tuple(py::none(), py::none(), py::none(), py::none(), 0, py::none(),
                                c.seq, work));
      continue;
    }
    const auto& names = c.schema->arguments();
    py::tuple args(c.args.size());
    for (size_t i = 0; i < c.args.size(); ++i) {
      args[i] = py::make_tuple(names[c.names[i]].name(), arg_py(c.args[i]));
    }
    py::object code = c.code ? py::reinterpret_borrow<py::object>(c.code) : py::none();
    out.append(py::make_tuple(c.schema->name(), args, c.api ? py::object(py::str(*c.api)) : py::none(),
                              code, c.line, *c.thread, c.seq, work));
  }
  return out;
}

// The Works of queued calls, as (seq, Work), taken out of their records: what a wait() that
// finds no entry needs, without converting the rest of the queue on the waiting thread.
py::list take_works() {
  std::vector<std::pair<int64_t, c10::IValue>> got;
  {
    std::lock_guard<std::mutex> g(mu);
    for (Call& c : queue) {
      if (!c.work.isNone()) {
        got.emplace_back(c.seq, std::move(c.work));
        c.work = c10::IValue();
      }
    }
  }
  py::list out;
  for (const auto& [seq, work] : got) out.append(py::make_tuple(seq, torch::jit::toPyObject(work)));
  return out;
}

void install(py::object classify, py::object thread, py::object group, py::object start) {
  sites.set_classify(std::move(classify));
  thread_cb = std::move(thread);
  group_cb = std::move(group);
  start_cb = std::move(start);
}

// In a forked child: the parent's queued records are not the child's, and its header is new.
void restart() {
  std::lock_guard<std::mutex> g(mu);
  queue.clear();
  started = false;
}

void attach(const std::vector<std::string>& names, const std::vector<std::string>& keys) {
  for (const auto& key : keys) {
    auto lib = std::make_unique<torch::Library>(
        torch::Library::IMPL, "c10d", c10::parseDispatchKey(key), __FILE__, __LINE__);
    for (const auto& name : names) {
      lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&kernel>());
    }
    libs.push_back(std::move(lib));
  }
}

void detach() { libs.clear(); }

// After destroy_process_group: torch names groups by a counter it restarts, so a new group
// may reuse a name; its ranks must be read again.
void forget_groups() {
  std::lock_guard<std::mutex> g(mu);
  groups_seen.clear();
}
int64_t next_seq() { return seq_counter++; }
int64_t call_count() { return calls.load(); }
void count_call() { calls++; }
int64_t get_depth() { return depth; }
void enter() { ++depth; }
void leave() { --depth; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // A fork while another thread holds mu must not leave it held in the child: the forking
  // thread takes it first (whoever holds it never waits for the GIL, so this cannot block).
  pthread_atfork([] { mu.lock(); }, [] { mu.unlock(); }, [] { mu.unlock(); });
  m.def("forget_groups", &forget_groups);
  m.def("drain", &drain);
  m.def("take_works", &take_works);
  m.def("install", &install);
  m.def("restart", &restart);
  m.def("attach", &attach);
  m.def("detach", &detach);
  m.def("next_seq", &next_seq);
  m.def("call_count", &call_count);
  m.def("count_call", &count_call);
  m.def("depth", &get_depth);
  m.def("enter", &enter);
  m.def("leave", &leave);
  bind_guard(m);
}
