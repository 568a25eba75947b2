// The guard's digests in C++: fused loops over the buffer, no temporaries, no Python, so that
// a sampled call's digests cost the rank's thread (inputs) and the backend's completion
// thread (outputs) microseconds per MiB instead of torch ops' milliseconds (guard.cpp).
// Definitions: harness/guard/digest.py, the reference; the two agree bit for bit.
#include "digest.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e4m3fnuz.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Float8_e5m2fnuz.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace collective_native {

namespace generic {
#include "digest_loops.h"
}  // namespace generic

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2")
namespace avx2 {
#include "digest_loops.h"
template void exact_row<uint8_t>(const uint8_t*, int64_t, uint64_t*);
template void exact_row<uint16_t>(const uint16_t*, int64_t, uint64_t*);
template void exact_row<uint32_t>(const uint32_t*, int64_t, uint64_t*);
template void linear_row_vec<double>(const double*, int64_t, double*);
template void linear_row_vec<float>(const float*, int64_t, double*);
template void linear_row_vec<c10::BFloat16>(const c10::BFloat16*, int64_t, double*);
template void both_row_vec<double, uint32_t>(const double*, int64_t, double*, uint64_t*);
template void both_row_vec<float, uint32_t>(const float*, int64_t, double*, uint64_t*);
template void both_row_vec<c10::BFloat16, uint16_t>(const c10::BFloat16*, int64_t, double*,
                                                    uint64_t*);
}  // namespace avx2
#pragma GCC pop_options
// __builtin_cpu_init first: this initializer may run before libgcc's own.
const bool use_avx2 = (__builtin_cpu_init(), __builtin_cpu_supports("avx2"));
#define COLLECTIVE_DISPATCH(fn, ...) \
  (use_avx2 ? avx2::fn(__VA_ARGS__) : generic::fn(__VA_ARGS__))
#else
#define COLLECTIVE_DISPATCH(fn, ...) generic::fn(__VA_ARGS__)
#endif

namespace {

constexpr int64_t MAX_CHUNKS = 1024;  // digest.py's MAX_CHUNKS

template <typename W>
Digest exact_words(const W* w, int64_t total, int64_t n) {
  Digest d;
  d.cols = 3;
  for (int64_t at = 0; at < total; at += n) {
    uint64_t row[3];
    COLLECTIVE_DISPATCH(exact_row<W>, w + at, std::min(n, total - at), row);
    for (uint64_t v : row) d.ints.push_back(static_cast<int64_t>(v));
  }
  return d;
}

// The lane sums of elements the vector loop does not read (fp16 without a vector conversion
// here, float8): the same order, one element at a time.
template <typename T>
void linear_row_scalar(const T* x, int64_t k, double out[2]) {
  constexpr int L = 16;
  double s[L] = {}, a[L] = {};
  for (int64_t j = 0; j < k; ++j) {
    const double v = static_cast<double>(static_cast<float>(x[j]));
    s[j % L] += v;
    a[j % L] += std::fabs(v);
  }
  double ss = 0, aa = 0;
  for (int l = 0; l < L; ++l) {
    ss += static_cast<double>(l + 1) * s[l];
    aa += static_cast<double>(l + 1) * a[l];
  }
  out[0] = ss;
  out[1] = aa;
}

template <typename T, bool Vec>
Digest linear_floats(const T* x, int64_t numel, int64_t n) {
  Digest d;
  d.floating = true;
  d.cols = 2;
  for (int64_t at = 0; at < numel; at += n) {
    double row[2];
    const int64_t k = std::min(n, numel - at);
    if constexpr (Vec) {
      COLLECTIVE_DISPATCH(linear_row_vec<T>, x + at, k, row);
    } else {
      linear_row_scalar<T>(x + at, k, row);
    }
    d.reals.push_back(row[0]);
    d.reals.push_back(row[1]);
  }
  return d;
}

// Both digests of a float64, float32 or bfloat16 tensor in one pass (both_row_vec per chunk).
template <typename T, typename W>
void both_floats(const T* x, int64_t numel, int64_t n, Digest& lin, Digest& ex) {
  lin.floating = true;
  lin.cols = 2;
  ex.cols = 3;
  for (int64_t at = 0; at < numel; at += n) {
    double l[2];
    uint64_t e[3];
    const int64_t k = std::min(n, numel - at);
#if defined(__x86_64__) && defined(__GNUC__)
    if (use_avx2) {
      avx2::both_row_vec<T, W>(x + at, k, l, e);
    } else {
      generic::both_row_vec<T, W>(x + at, k, l, e);
    }
#else
    generic::both_row_vec<T, W>(x + at, k, l, e);
#endif
    lin.reals.push_back(l[0]);
    lin.reals.push_back(l[1]);
    for (uint64_t v : e) ex.ints.push_back(static_cast<int64_t>(v));
  }
}

// Integers: sum_j w_j x_j modulo 2^64, x_j sign- or zero-extended as its dtype says (the
// reference's conversion to int64), and 0 beside it.
template <typename T>
Digest linear_ints(const T* x, int64_t numel, int64_t n) {
  Digest d;
  d.cols = 2;
  for (int64_t at = 0; at < numel; at += n) {
    const int64_t k = std::min(n, numel - at);
    uint64_t s = 0;
    for (int64_t j = 0; j < k; ++j) {
      s += static_cast<uint64_t>(1 + j % 16) *
           static_cast<uint64_t>(static_cast<int64_t>(x[at + j]));
    }
    d.ints.push_back(static_cast<int64_t>(s));
    d.ints.push_back(0);
  }
  return d;
}

}  // namespace

int64_t chunk_len(int64_t numel, int64_t chunk) {
  return std::max<int64_t>({chunk, (numel + MAX_CHUNKS - 1) / MAX_CHUNKS, 1});
}

bool readable(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != c10::DeviceType::CPU ||
      t.layout() != c10::Layout::Strided || !t.is_contiguous() || t.is_conj() || t.is_neg() ||
      t.is_complex() || t.is_quantized()) {
    return false;
  }
  const auto size = t.element_size();
  return size == 1 || size == 2 || size % 4 == 0;
}

bool linear_readable(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Double: case c10::ScalarType::Float: case c10::ScalarType::BFloat16:
    case c10::ScalarType::Half: case c10::ScalarType::Float8_e5m2:
    case c10::ScalarType::Float8_e4m3fn: case c10::ScalarType::Float8_e5m2fnuz:
    case c10::ScalarType::Float8_e4m3fnuz: case c10::ScalarType::Byte:
    case c10::ScalarType::Char: case c10::ScalarType::Short: case c10::ScalarType::Int:
    case c10::ScalarType::Long: case c10::ScalarType::UInt16: case c10::ScalarType::UInt32:
    case c10::ScalarType::UInt64:
      return true;
    default:
      return false;
  }
}

Digest exact(const at::Tensor& t, int64_t chunk) {
  const int64_t numel = t.numel();
  const int64_t size = t.element_size();
  const void* p = t.const_data_ptr();
  if (numel == 0) {
    Digest d;
    d.cols = 3;
    return d;
  }
  const int64_t n = chunk_len(numel, chunk);
  if (size == 1) return exact_words(static_cast<const uint8_t*>(p), numel, n);
  if (size == 2) return exact_words(static_cast<const uint16_t*>(p), numel, n);
  const int64_t per = size / 4;
  return exact_words(static_cast<const uint32_t*>(p), numel * per, n * per);
}

Digest linear(const at::Tensor& t, int64_t chunk) {
  const int64_t numel = t.numel();
  const int64_t n = chunk_len(numel, chunk);
  const void* p = t.const_data_ptr();
  switch (t.scalar_type()) {
    case c10::ScalarType::Double:
      return linear_floats<double, true>(static_cast<const double*>(p), numel, n);
    case c10::ScalarType::Float:
      return linear_floats<float, true>(static_cast<const float*>(p), numel, n);
    case c10::ScalarType::BFloat16:
      return linear_floats<c10::BFloat16, true>(static_cast<const c10::BFloat16*>(p), numel, n);
    case c10::ScalarType::Half:
      return linear_floats<c10::Half, false>(static_cast<const c10::Half*>(p), numel, n);
    case c10::ScalarType::Float8_e5m2:
      return linear_floats<c10::Float8_e5m2, false>(
          static_cast<const c10::Float8_e5m2*>(p), numel, n);
    case c10::ScalarType::Float8_e4m3fn:
      return linear_floats<c10::Float8_e4m3fn, false>(
          static_cast<const c10::Float8_e4m3fn*>(p), numel, n);
    case c10::ScalarType::Float8_e5m2fnuz:
      return linear_floats<c10::Float8_e5m2fnuz, false>(
          static_cast<const c10::Float8_e5m2fnuz*>(p), numel, n);
    case c10::ScalarType::Float8_e4m3fnuz:
      return linear_floats<c10::Float8_e4m3fnuz, false>(
          static_cast<const c10::Float8_e4m3fnuz*>(p), numel, n);
    case c10::ScalarType::Byte: return linear_ints(static_cast<const uint8_t*>(p), numel, n);
    case c10::ScalarType::Char: return linear_ints(static_cast<const int8_t*>(p), numel, n);
    case c10::ScalarType::Short: return linear_ints(static_cast<const int16_t*>(p), numel, n);
    case c10::ScalarType::Int: return linear_ints(static_cast<const int32_t*>(p), numel, n);
    case c10::ScalarType::Long: return linear_ints(static_cast<const int64_t*>(p), numel, n);
    case c10::ScalarType::UInt16: return linear_ints(static_cast<const uint16_t*>(p), numel, n);
    case c10::ScalarType::UInt32: return linear_ints(static_cast<const uint32_t*>(p), numel, n);
    case c10::ScalarType::UInt64: return linear_ints(static_cast<const uint64_t*>(p), numel, n);
    default:
      TORCH_CHECK(false, "collective-guard: no C++ linear digest for ", t.scalar_type());
  }
}

void linear_and_exact(const at::Tensor& t, int64_t chunk, Digest& lin, Digest& ex) {
  const int64_t numel = t.numel();
  const void* p = t.const_data_ptr();
  const int64_t n = chunk_len(numel, chunk);
  if (numel > 0) {
    switch (t.scalar_type()) {
      case c10::ScalarType::Double:
        return both_floats<double, uint32_t>(static_cast<const double*>(p), numel, n, lin, ex);
      case c10::ScalarType::Float:
        return both_floats<float, uint32_t>(static_cast<const float*>(p), numel, n, lin, ex);
      case c10::ScalarType::BFloat16:
        return both_floats<c10::BFloat16, uint16_t>(static_cast<const c10::BFloat16*>(p), numel,
                                                    n, lin, ex);
      default:
        break;
    }
  }
  // The other dtypes (no vector loop for their linear digest here): two passes.
  lin = linear(t, chunk);
  ex = exact(t, chunk);
}

}  // namespace collective_native
