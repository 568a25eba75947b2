// The digest loops, included twice by digest.cpp: once as they compile for the build's target,
// once for AVX2 (chosen at run time where the CPU has it). No include guard on purpose.
//
// Both compilations compute the same bits: the exact digest is integer arithmetic modulo
// 2^64, and the linear digest adds each of its 16 lanes in element order and combines the
// lanes in a fixed order (no reassociation, no fused multiply-add: -ffp-contract=off), which
// is the order digest.py's reference takes.

// Per word j of a chunk (zero-extended to 64 bits): the plain sum, the sum weighted by j + 1,
// and the sum weighted by the odd 32-bit hash of j, (j * 2654435761 + 0x9E3779B1) | 1 mod 2^32;
// all modulo 2^64. Lane l takes words j = l (mod 16); its weights step by 16 positions.
template <typename W>
void exact_row(const W* w, int64_t k, uint64_t out[3]) {
  constexpr int L = 16;
  constexpr uint32_t HASH = 2654435761u;
  uint64_t a0[L] = {}, a1[L] = {}, a2[L] = {};
  uint32_t pos[L], hash[L];
  for (int l = 0; l < L; ++l) {
    pos[l] = static_cast<uint32_t>(l) + 1u;
    hash[l] = static_cast<uint32_t>(l) * HASH + 0x9E3779B1u;
  }
  int64_t j = 0;
  for (; j + L <= k; j += L) {
    for (int l = 0; l < L; ++l) {
      const uint64_t x = w[j + l];
      a0[l] += x;
      a1[l] += x * static_cast<uint64_t>(pos[l]);
      a2[l] += x * static_cast<uint64_t>(hash[l] | 1u);
      pos[l] += L;
      hash[l] += L * HASH;
    }
  }
  uint64_t s0 = 0, s1 = 0, s2 = 0;
  for (int l = 0; j < k; ++j, ++l) {
    const uint64_t x = w[j];
    s0 += x;
    s1 += x * static_cast<uint64_t>(pos[l]);
    s2 += x * static_cast<uint64_t>(hash[l] | 1u);
  }
  for (int l = 0; l < L; ++l) {
    s0 += a0[l];
    s1 += a1[l];
    s2 += a2[l];
  }
  out[0] = s0;
  out[1] = s1;
  out[2] = s2;
}

typedef double v4d __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
typedef uint32_t v4u __attribute__((vector_size(16)));
typedef uint16_t v4h __attribute__((vector_size(8)));
typedef int64_t v4l __attribute__((vector_size(32)));

// Four elements as float64, for the vector loop.
inline v4d load4(const double* x) {
  v4d v;
  std::memcpy(&v, x, sizeof v);
  return v;
}
inline v4d load4(const float* x) {
  v4f v;
  std::memcpy(&v, x, sizeof v);
  return __builtin_convertvector(v, v4d);
}
inline v4d load4(const c10::BFloat16* x) {  // bfloat16: the high half of a float32
  v4h h;
  std::memcpy(&h, x, sizeof h);
  v4u u = __builtin_convertvector(h, v4u) << 16;
  v4f f;
  std::memcpy(&f, &u, sizeof f);
  return __builtin_convertvector(f, v4d);
}

// Per chunk: sum_j w_j x_j and sum_j w_j |x_j| in float64, w_j = 1 + j mod 16, as
// sum_l (l + 1) * S_l with S_l the lane's sum in element order (digest.py's definition).
template <typename T>
void linear_row_vec(const T* x, int64_t k, double out[2]) {
  constexpr int L = 16;
  v4d s[4] = {}, a[4] = {};
  const v4l mask = {INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX};
  int64_t j = 0;
  for (; j + L <= k; j += L) {
    for (int q = 0; q < 4; ++q) {
      const v4d v = load4(x + j + 4 * q);
      s[q] += v;
      a[q] += (v4d)((v4l)v & mask);
    }
  }
  double sl[L], al[L];
  std::memcpy(sl, s, sizeof sl);
  std::memcpy(al, a, sizeof al);
  for (int l = 0; j < k; ++j, ++l) {
    const double v = static_cast<double>(x[j]);
    sl[l] += v;
    al[l] += std::fabs(v);
  }
  double ss = 0, aa = 0;
  for (int l = 0; l < L; ++l) {
    ss += static_cast<double>(l + 1) * sl[l];
    aa += static_cast<double>(l + 1) * al[l];
  }
  out[0] = ss;
  out[1] = aa;
}
