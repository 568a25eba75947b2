// What the recorder's and the guard's C++ kernels share (hook.cpp, guard.cpp): a call's
// arguments read from the dispatcher's stack as plain C++ values (the same tags and tuples as
// harness/record/capture.py), and the walk of the Python stack for the user's call site.
//
// Both kernels keep a call's facts in C++ and turn them into Python objects later, off the
// calling thread (the recorder's flusher; the guard only for a call found wrong).
#pragma once

#include <Python.h>
#include <frameobject.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/extension.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace collective_native {

namespace py = pybind11;

// Argument tags: the same numbers as harness/record/capture.py's.
enum Tag : int { TENSOR = 0, TENSORS = 1, NESTED = 2, GROUP = 3, REDUCE = 4, INTS = 5,
                 NONE = 6, BOOL = 7, INT = 8, FLOAT = 9, STR = 10 };

struct Meta {
  std::vector<int64_t> shape, stride;
  bool strided = true, contiguous = true;
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::Device device{c10::DeviceType::CPU};
  c10::Layout layout = c10::Layout::Strided;
};

struct Arg {
  int tag = NONE;
  std::vector<Meta> metas;            // TENSOR (one), TENSORS
  std::vector<std::vector<Meta>> nested;
  std::vector<int64_t> ints;          // INTS
  int64_t i = 0;                      // INT, BOOL, REDUCE
  double f = 0;                       // FLOAT
  std::string s;                      // STR, GROUP (its name)
};

inline Meta meta_of(const at::Tensor& t) {
  Meta m;
  m.shape = t.sizes().vec();
  m.layout = t.layout();
  m.strided = m.layout == c10::Layout::Strided;
  if (m.strided) m.stride = t.strides().vec();
  try {  // some sparse layouts raise on is_contiguous(): never fail the user's call for it
    m.contiguous = t.is_contiguous();
  } catch (const std::exception&) {
    m.contiguous = false;
  }
  m.dtype = t.scalar_type();
  m.device = t.device();
  return m;
}

inline Arg capture(const c10::Argument& a, const c10::IValue& v) {
  Arg out;
  if (v.isTensor()) {
    out.tag = TENSOR;
    out.metas.push_back(meta_of(v.toTensor()));
  } else if (v.isTensorList()) {
    out.tag = TENSORS;
    for (const at::Tensor& t : v.toTensorList().vec()) out.metas.push_back(meta_of(t));
  } else if (v.isList()) {
    auto list = v.toListRef();
    if (!list.empty() && list[0].isTensorList()) {
      out.tag = NESTED;
      for (const auto& inner : list) {
        std::vector<Meta> ms;
        for (const at::Tensor& t : inner.toTensorList().vec()) ms.push_back(meta_of(t));
        out.nested.push_back(std::move(ms));
      }
    } else if (!list.empty() && list[0].isTensor()) {
      out.tag = TENSORS;
      for (const auto& t : list) out.metas.push_back(meta_of(t.toTensor()));
    } else {
      out.tag = INTS;
      for (const auto& x : list) out.ints.push_back(x.isInt() ? x.toInt() : 0);
    }
  } else if (v.isIntList()) {
    out.tag = INTS;
    out.ints = v.toIntVector();
  } else if (v.isNone()) {
    out.tag = NONE;
  } else if (v.isBool()) {
    out.tag = BOOL;
    out.i = v.toBool();
  } else if (v.isInt()) {
    out.tag = INT;
    out.i = v.toInt();
  } else if (v.isDouble()) {
    out.tag = FLOAT;
    out.f = v.toDouble();
  } else if (v.isString()) {
    out.tag = STR;
    out.s = v.toStringRef();
  } else if (v.isCustomClass()) {
    const std::string type = a.type()->str();
    if (type.find("ProcessGroup") != std::string::npos) {
      out.tag = GROUP;
      out.s = v.toCustomClass<c10d::ProcessGroup>()->getGroupName();
    } else if (type.find("ReduceOp") != std::string::npos) {
      out.tag = REDUCE;
      out.i = static_cast<int64_t>(v.toCustomClass<c10d::ReduceOp>()->op_);
    } else {
      out.tag = STR;
      out.s = "<ScriptObject>";
    }
  } else {
    out.tag = STR;
    out.s = "<" + v.tagKind() + ">";
  }
  return out;
}

inline py::object meta_py(const Meta& m) {
  py::tuple shape(m.shape.size());
  for (size_t i = 0; i < m.shape.size(); ++i) shape[i] = m.shape[i];
  py::object stride = py::none();
  if (m.strided) {
    py::tuple st(m.stride.size());
    for (size_t i = 0; i < m.stride.size(); ++i) st[i] = m.stride[i];
    stride = st;
  }
  // The same objects the Python capture holds (torch.dtype, torch.device, torch.layout), so
  // that both kernels' records share one cache of JSON texts and are written alike.
  auto dtype = py::reinterpret_borrow<py::object>(
      reinterpret_cast<PyObject*>(torch::getTHPDtype(m.dtype)));
  auto layout = py::reinterpret_borrow<py::object>(
      reinterpret_cast<PyObject*>(torch::getTHPLayout(m.layout)));
  auto device = py::reinterpret_steal<py::object>(THPDevice_New(m.device));
  return py::make_tuple(shape, stride, m.contiguous, dtype, device, layout);
}

inline py::object arg_py(const Arg& a) {
  switch (a.tag) {
    case TENSOR: return py::make_tuple(a.tag, meta_py(a.metas[0]));
    case TENSORS: {
      py::tuple t(a.metas.size());
      for (size_t i = 0; i < a.metas.size(); ++i) t[i] = meta_py(a.metas[i]);
      return py::make_tuple(a.tag, t);
    }
    case NESTED: {
      py::tuple t(a.nested.size());
      for (size_t i = 0; i < a.nested.size(); ++i) {
        py::tuple in(a.nested[i].size());
        for (size_t j = 0; j < a.nested[i].size(); ++j) in[j] = meta_py(a.nested[i][j]);
        t[i] = in;
      }
      return py::make_tuple(a.tag, t);
    }
    case INTS: {
      py::tuple t(a.ints.size());
      for (size_t i = 0; i < a.ints.size(); ++i) t[i] = a.ints[i];
      return py::make_tuple(a.tag, t);
    }
    case NONE: return py::make_tuple(a.tag, py::none());
    case BOOL: return py::make_tuple(a.tag, py::bool_(a.i != 0));
    case INT: case REDUCE: return py::make_tuple(a.tag, a.i);
    case FLOAT: return py::make_tuple(a.tag, a.f);
    default: return py::make_tuple(a.tag, a.s);  // STR, GROUP (name: resolved in Python)
  }
}

// A call site: the user's innermost frame (code object and line) and the torch.distributed
// function the user called (null: none, e.g. a call issued from C++ by DDP's Reducer).
struct Site {
  PyObject* code = nullptr;  // borrowed: the Sites cache that found it owns a reference
  int line = 0;
  const std::string* api = nullptr;
};

// A Python callback that classifies a code object, (user code, torch.distributed function
// name or None, public API file), asked once per code object and cached here. Never
// destroyed (see the kernels: no static destructors after Python is gone).
class Sites {
 public:
  void set_classify(py::object cb) { classify_ = std::move(cb); }

  // One walk of the calling thread's Python stack (the GIL is held; no lock of the caller's
  // is, as the callback may run Python that issues collectives): the innermost user frame,
  // and the outermost torch.distributed function of the public API files (else the outermost
  // torch.distributed function).
  Site walk() {
    Site site;
    PyThreadState* ts = PyThreadState_Get();
    // Owned handles: a callback that raises must not leak the frames (and the user's locals).
    auto f = py::reinterpret_steal<py::object>(
        reinterpret_cast<PyObject*>(PyThreadState_GetFrame(ts)));  // null when no frame
    const std::string* api = nullptr;
    const std::string* outer = nullptr;
    bool have_site = false;
    while (f) {
      auto* frame = reinterpret_cast<PyFrameObject*>(f.ptr());
      auto code_ref = py::reinterpret_steal<py::object>(
          reinterpret_cast<PyObject*>(PyFrame_GetCode(frame)));
      auto* code = code_ref.ptr();
      Info info = lookup(code);
      if (info.user) {
        if (!have_site) {
          site.code = code;
          site.line = PyFrame_GetLineNumber(frame);
          have_site = true;
        }
      } else if (info.dist_fn != nullptr) {
        outer = info.dist_fn;
        if (info.api_file) api = info.dist_fn;
      }
      f = py::reinterpret_steal<py::object>(
          reinterpret_cast<PyObject*>(PyFrame_GetBack(frame)));  // null at the outermost
    }
    site.api = api != nullptr ? api : outer;
    return site;
  }

  const std::string* intern(const std::string& s) {
    std::lock_guard<std::mutex> g(mu_);
    return intern_locked(s);
  }

 private:
  struct Info {
    bool user = false;
    const std::string* dist_fn = nullptr;
    bool api_file = false;
  };

  Info lookup(PyObject* code) {
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = codes_.find(code);
      if (it != codes_.end()) return it->second;
    }
    py::tuple got = classify_(py::handle(code));
    Info info;
    info.user = got[0].cast<bool>();
    info.api_file = got[2].cast<bool>();
    std::lock_guard<std::mutex> g(mu_);
    info.dist_fn = got[1].is_none() ? nullptr : intern_locked(got[1].cast<std::string>());
    if (codes_.emplace(code, info).second) Py_INCREF(code);  // owned: Site borrows it
    return info;
  }

  const std::string* intern_locked(const std::string& s) {
    auto it = strings_.find(s);
    if (it != strings_.end()) return it->second.get();
    auto p = std::make_unique<std::string>(s);
    auto* raw = p.get();
    strings_.emplace(s, std::move(p));
    return raw;
  }

  std::mutex mu_;
  std::unordered_map<PyObject*, Info> codes_;
  std::unordered_map<std::string, std::unique_ptr<std::string>> strings_;
  py::object classify_;
};

}  // namespace collective_native
