// The guard's per-chunk digests in C++ (digest.cpp), bit for bit those of
// harness/guard/digest.py, the reference (tests/test_guard_digest.py compares them).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace collective_native {

// A digest: `rows` chunks of `cols` numbers, int64 or float64, as the reference's tensor.
struct Digest {
  bool floating = false;
  int cols = 0;
  std::vector<int64_t> ints;
  std::vector<double> reals;
};

// The chunk length used for `numel` elements (digest.py's chunk_len).
int64_t chunk_len(int64_t numel, int64_t chunk);
// Whether this code reads `t` (a dense contiguous CPU tensor; for the linear digest, of a real
// dtype): otherwise the reference, in Python, takes the digest.
bool readable(const at::Tensor& t);
bool linear_readable(c10::ScalarType dtype);
// digest.py's exact(t, chunk) and linear(t, chunk).
Digest exact(const at::Tensor& t, int64_t chunk);
Digest linear(const at::Tensor& t, int64_t chunk);
// Both, in one pass over the buffer where the dtype allows (float64, float32, bfloat16): a
// reduction's output. The same bits as linear() and exact().
void linear_and_exact(const at::Tensor& t, int64_t chunk, Digest& lin, Digest& ex);

}  // namespace collective_native
