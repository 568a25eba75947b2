// The digest loops, included twice by digest.cpp: once as they compile for the build's target,
// once for AVX2 (chosen at run time where the CPU has it). No include guard on purpose.
//
// Both compilations compute the same bits: the exact digest is integer arithmetic modulo
// 2^64, and the linear digest adds each of its 16 lanes in element order and combines the
// lanes in a fixed order (no reassociation, no fused multiply-add: -ffp-contract=off), which
// is the order digest.py's reference takes.

// Per word j of a chunk (zero-extended to 64 bits): the plain sum, the sum weighted by j + 1,
// and the sum weighted by the odd 32-bit hash of j, (j * 2654435761 + 0x9E3779B1) | 1 mod 2^32;
// all modulo 2^64. Integer sums modulo 2^64 are exact in any order, so the loop's shape is
// free: lane l takes words j = l (mod 16); the position-weighted sum is taken without a
// multiply (Fletcher's running sums: per block b, P += x, Q += P, so that after B blocks
// sum_b b x_b = B P - Q), leaving one multiply per word, for the hashed weights.
constexpr int EXACT_LANES = 16;
constexpr uint32_t EXACT_HASH = 2654435761u;

struct ExactLanes {
  uint64_t p[EXACT_LANES] = {}, q[EXACT_LANES] = {}, h[EXACT_LANES] = {};
  uint32_t hash[EXACT_LANES];
  uint64_t blocks = 0;
  ExactLanes() {
    for (int l = 0; l < EXACT_LANES; ++l) {
      hash[l] = static_cast<uint32_t>(l) * EXACT_HASH + 0x9E3779B1u;
    }
  }
};

// One block of EXACT_LANES words. Inlined into the callers' loops, whose lanes are locals.
template <typename W>
inline __attribute__((always_inline)) void exact_block(const W* __restrict w,
                                                       uint64_t* __restrict p,
                                                       uint64_t* __restrict q,
                                                       uint64_t* __restrict h,
                                                       uint32_t* __restrict hash) {
  for (int l = 0; l < EXACT_LANES; ++l) {
    const uint64_t x = w[l];
    p[l] += x;
    q[l] += p[l];
    h[l] += x * static_cast<uint64_t>(hash[l] | 1u);
    hash[l] += EXACT_LANES * EXACT_HASH;
  }
}

// The row from the lanes after `blocks` full blocks, and the `n` < EXACT_LANES words after them.
template <typename W>
void exact_finish(const ExactLanes& e, const W* w, int64_t n, uint64_t out[3]) {
  uint64_t s0 = 0, s1 = 0, s2 = 0;
  for (int l = 0; l < EXACT_LANES; ++l) {
    s0 += e.p[l];
    s1 += EXACT_LANES * (e.blocks * e.p[l] - e.q[l]) + static_cast<uint64_t>(l + 1) * e.p[l];
    s2 += e.h[l];
  }
  const uint64_t base = e.blocks * EXACT_LANES;
  for (int64_t l = 0; l < n; ++l) {
    const uint64_t x = w[l];
    s0 += x;
    s1 += x * (base + static_cast<uint64_t>(l) + 1);
    s2 += x * static_cast<uint64_t>(e.hash[l] | 1u);
  }
  out[0] = s0;
  out[1] = s1;
  out[2] = s2;
}

template <typename W>
void exact_row(const W* w, int64_t k, uint64_t out[3]) {
  ExactLanes e;
  int64_t j = 0;
  for (; j + EXACT_LANES <= k; j += EXACT_LANES) {
    exact_block(w + j, e.p, e.q, e.h, e.hash);
  }
  e.blocks = static_cast<uint64_t>(j / EXACT_LANES);
  exact_finish(e, w + j, k - j, out);
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
constexpr int LINEAR_LANES = 16;

// Four lanes' worth of the vector loop: s[q], a[q] hold lanes 4q..4q+3.
template <typename T>
inline __attribute__((always_inline)) void linear_block(const T* x, v4d s[4], v4d a[4]) {
  const v4l mask = {INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX};
  for (int q = 0; q < 4; ++q) {
    const v4d v = load4(x + 4 * q);
    s[q] += v;
    a[q] += (v4d)((v4l)v & mask);
  }
}

// The row from the lanes, after the `n` < 16 elements past the last full block.
template <typename T>
void linear_finish(const v4d s[4], const v4d a[4], const T* x, int64_t n, double out[2]) {
  double sl[LINEAR_LANES], al[LINEAR_LANES];
  std::memcpy(sl, s, sizeof sl);
  std::memcpy(al, a, sizeof al);
  for (int64_t l = 0; l < n; ++l) {
    const double v = static_cast<double>(x[l]);
    sl[l] += v;
    al[l] += std::fabs(v);
  }
  double ss = 0, aa = 0;
  for (int l = 0; l < LINEAR_LANES; ++l) {
    ss += static_cast<double>(l + 1) * sl[l];
    aa += static_cast<double>(l + 1) * al[l];
  }
  out[0] = ss;
  out[1] = aa;
}

template <typename T>
void linear_row_vec(const T* x, int64_t k, double out[2]) {
  v4d s[4] = {}, a[4] = {};
  int64_t j = 0;
  for (; j + LINEAR_LANES <= k; j += LINEAR_LANES) linear_block(x + j, s, a);
  linear_finish(s, a, x + j, k - j, out);
}

// Both digests of one chunk in one loop over it (a reduction's output: linear and exact), for
// the dtypes the vector loop reads; W is the exact digest's word, sizeof(T) / sizeof(W) of
// them to an element. The same bits as linear_row_vec and exact_row: each lane adds in the
// same order. (The chunk is read as T and as W; nothing here writes it.)
template <typename T, typename W>
void both_row_vec(const T* x, int64_t k, double lin[2], uint64_t ex[3]) {
  constexpr int64_t per = sizeof(T) / sizeof(W);
  static_assert(per >= 1 && LINEAR_LANES == EXACT_LANES);
  const W* w = reinterpret_cast<const W*>(x);
  v4d s[4] = {}, a[4] = {};
  ExactLanes e;
  int64_t j = 0;
  for (; j + LINEAR_LANES <= k; j += LINEAR_LANES) {
    linear_block(x + j, s, a);
    for (int64_t r = 0; r < per; ++r) {
      exact_block(w + j * per + r * EXACT_LANES, e.p, e.q, e.h, e.hash);
    }
  }
  linear_finish(s, a, x + j, k - j, lin);
  int64_t i = j * per;  // the exact digest's words left: whole blocks, then fewer
  const int64_t words = k * per;
  for (; i + EXACT_LANES <= words; i += EXACT_LANES) exact_block(w + i, e.p, e.q, e.h, e.hash);
  e.blocks = static_cast<uint64_t>(i / EXACT_LANES);
  exact_finish(e, w + i, words - i, ex);
}
