// Fused CPU kernels for the training step of lealla_tf.LeallaEncoder.
//
// TensorFlow runs a transformer layer's elementwise work one op at a time: on
// lealla_small's step (64 pairs x 32 tokens, 24 layers, 2 cores) layer norm,
// GELU, residual adds, dropout, softmax, transposes and their gradients were
// more time than the matmuls in bfloat16 (a retired benchmark's profile:
// docs/benchmarks.md, "Settings chosen by retired benchmarks";
// benchmarks/training_step.py --profile profiles today's step). Each op
// here does one of those blocks in one pass over its rows, computing in float32
// whatever the input type (float32 or bfloat16):
//
//   LeallaAttention        qkv rows (+ bias) -> per-head softmax(q k^T + key
//                          mask) with dropout, times v, written in the [rows,
//                          heads * head_size] layout the output projection reads
//   LeallaBiasGelu         gelu(x + bias), tanh-approximate or exact
//   LeallaBiasDropoutAddNorm
//                          layer_norm(dropout(x + bias) + residual)
//
// and a *Grad op for each, which recomputes what it needs (the attention
// probabilities, the dropout mask) instead of keeping it. Dropout is the keep
// mask of lealla_tf/models/layers/hash_dropout.py bit for bit (the same counter hash
// over the same flat index), so the fused layer and the op-by-op layer draw the
// same masks from the same seeds. lealla_tf/models/kernels/__init__.py compiles this
// file for the machine it runs on and registers the gradients.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "Eigen/Core"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"
#include "unsupported/Eigen/SpecialFunctions"

namespace lealla {
namespace {

using tensorflow::bfloat16;
using tensorflow::DEVICE_CPU;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;
using Array = Eigen::Array<float, Eigen::Dynamic, 1>;
using Map = Eigen::Map<Array>;

// === float32 <-> the tensors' type ===

inline float FromBf16Bits(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

// A float's bits (uint32_t, or 16 of them) rounded to bfloat16's, in the low
// half: to nearest even, as TensorFlow's Cast does; NaN stays NaN.
template <typename U>
inline U RoundToBf16(U word) {
  const U rounded = (word + 0x7FFFu + ((word >> 16) & 1u)) >> 16;
  const U nan = (word >> 16) | 0x40u;
  return (word & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded;
}

inline uint16_t ToBf16Bits(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  return static_cast<uint16_t>(RoundToBf16(word));
}

template <typename T>
struct Io;

template <>
struct Io<float> {
  static void Load(const float* source, float* out, int64_t n) {
    std::memcpy(out, source, n * sizeof(float));
  }
  static void Store(const float* values, float* out, int64_t n) {
    std::memcpy(out, values, n * sizeof(float));
  }
};

template <>
struct Io<bfloat16> {
  static void Load(const bfloat16* source, float* out, int64_t n) {
    const uint16_t* bits = reinterpret_cast<const uint16_t*>(source);
    for (int64_t i = 0; i < n; ++i) out[i] = FromBf16Bits(bits[i]);
  }
  static void Store(const float* values, bfloat16* out, int64_t n) {
    uint16_t* bits = reinterpret_cast<uint16_t*>(out);
    for (int64_t i = 0; i < n; ++i) bits[i] = ToBf16Bits(values[i]);
  }
};

// === 16-float vectors ===
//
// GCC/Clang vector extensions: one AVX-512 register here, two AVX2 ones
// elsewhere. Sums over a row go through them because the compiler may not
// reorder a float sum on its own (no -ffast-math).

typedef float V16 __attribute__((vector_size(64)));
typedef int32_t V16i __attribute__((vector_size(64)));
typedef uint32_t V16u __attribute__((vector_size(64)));

inline V16 Load16(const float* p) {
  V16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store16(float* p, V16 v) { std::memcpy(p, &v, sizeof(v)); }
inline V16 Splat(float x) { return V16{} + x; }
inline float Sum(V16 v) {
  float total = 0.0f;
  for (int i = 0; i < 16; ++i) total += v[i];
  return total;
}
inline int64_t RoundUp16(int64_t n) { return (n + 15) / 16 * 16; }

// 16 values of a tensor's type as floats, and back (bfloat16: Io's conversions,
// a vector at a time).
typedef uint16_t V16h __attribute__((vector_size(32)));

inline V16 LoadAs16(const float* p) { return Load16(p); }
inline V16 LoadAs16(const bfloat16* p) {
  V16h bits;
  std::memcpy(&bits, p, sizeof(bits));
  const V16u words = __builtin_convertvector(bits, V16u) << 16;
  V16 v;
  std::memcpy(&v, &words, sizeof(v));
  return v;
}
inline void StoreAs16(float* p, V16 v) { Store16(p, v); }
inline void StoreAs16(bfloat16* p, V16 v) {
  V16u word;
  std::memcpy(&word, &v, sizeof(word));
  const V16h bits = __builtin_convertvector(RoundToBf16(word), V16h);
  std::memcpy(p, &bits, sizeof(bits));
}

// Sum of x[0..n) (vectors of 16, then the rest).
inline float RowSum(const float* x, int64_t n) {
  V16 sums = Splat(0.0f);
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) sums += Load16(x + c);
  float total = Sum(sums);
  for (; c < n; ++c) total += x[c];
  return total;
}

// Sum of x[c] * y[c].
inline float RowDot(const float* x, const float* y, int64_t n) {
  V16 sums = Splat(0.0f);
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) sums += Load16(x + c) * Load16(y + c);
  float total = Sum(sums);
  for (; c < n; ++c) total += x[c] * y[c];
  return total;
}

// out[0..n) = in[0..n), inlined for the short rows of a head.
inline void CopyFloats(float* out, const float* in, int64_t n) {
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) Store16(out + c, Load16(in + c));
  for (; c < n; ++c) out[c] = in[c];
}

// out[c, i] = in[i, c] for the first `rows` rows and `columns` columns of
// in (leading dimension ldi) into out (leading dimension ldo). Row by row of
// out: its stores are contiguous, the strided accesses loads.
inline void Transpose(const float* in, int64_t rows, int64_t columns, int64_t ldi, float* out,
                      int64_t ldo) {
  for (int64_t c = 0; c < columns; ++c) {
    float* row = out + c * ldo;
    for (int64_t i = 0; i < rows; ++i) row[i] = in[i * ldi + c];
  }
}

// exp(x) of a softmax's shifted scores, 16 at a time, for x <= 0 only (above
// about 89 the exponent bits would spill into the sign): x = n ln 2 + r,
// n the nearest integer (adding 1.5 * 2^23 rounds x / ln 2 into the low bits
// of the sum) and ln 2 in two parts, e^r by a degree-6 polynomial (Cephes'
// expf coefficients, ~1 ulp), 2^n into the exponent bits. Below -87.3 (e^x
// under float's normal range) it is 0, as TensorFlow's exp of a masked score
// (-1e9) is.
inline V16 Exp16(V16 x) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  const V16i underflow = x < -87.33654f;  // there the result below is any value
  const V16 y = x * 1.44269504088896341f + kRound;
  const V16 nf = y - kRound;
  V16 r = x - nf * 0.693359375f;
  r = r - nf * -2.12194440e-4f;
  V16 poly = Splat(1.9875691500e-4f);
  poly = poly * r + 1.3981999507e-3f;
  poly = poly * r + 8.3334519073e-3f;
  poly = poly * r + 4.1665795894e-2f;
  poly = poly * r + 1.6666665459e-1f;
  poly = poly * r + 5.0000001201e-1f;
  poly = poly * r * r + r + 1.0f;
  // y's bits are kRound's plus n; kRound's own bits shift out of the word.
  V16u bits;
  std::memcpy(&bits, &y, sizeof(bits));
  bits = (bits + 127) << 23;
  V16 scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  const V16 result = poly * scale;
  return underflow ? Splat(0.0f) : result;
}

// C[m, n] = op(A)[m, k] B[k, n], row-major with leading dimensions lda, ldb,
// ldc; n a multiple of 16. op(A) is A [m, k], or with kTransposeA, A^T of A
// [k, m]. Eight rows of C at a time, each a chain of vector FMAs.
template <bool kTransposeA>
void Gemm(int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B,
          int64_t ldb, float* C, int64_t ldc) {
  auto a = [&](int64_t i, int64_t p) { return kTransposeA ? A[p * lda + i] : A[i * lda + p]; };
  for (int64_t j = 0; j < n; j += 16) {
    int64_t i = 0;
    for (; i + 8 <= m; i += 8) {
      V16 c[8];
      for (int r = 0; r < 8; ++r) c[r] = Splat(0.0f);
      for (int64_t p = 0; p < k; ++p) {
        const V16 b = Load16(B + p * ldb + j);
        for (int r = 0; r < 8; ++r) c[r] += a(i + r, p) * b;
      }
      for (int r = 0; r < 8; ++r) Store16(C + (i + r) * ldc + j, c[r]);
    }
    for (; i < m; ++i) {
      V16 c = Splat(0.0f);
      for (int64_t p = 0; p < k; ++p) c += a(i, p) * Load16(B + p * ldb + j);
      Store16(C + i * ldc + j, c);
    }
  }
}

// === The dropout mask of hash_dropout.py ===

template <typename U>  // uint32_t, or 16 of them
inline U Fmix32(U h) {  // murmur3's finaliser
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}

struct Dropout {
  bool active = false;
  uint32_t key0 = 0, key1 = 0, threshold = 0;
  float scale = 1.0f;

  // out[j] = the factor (0 or 1 / (1 - rate)) of flat entry start + j.
  void Factors(uint32_t start, int64_t n, float* out) const {
    const V16u lanes = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
      const V16u index = lanes + (start + static_cast<uint32_t>(j));
      const V16u h = Fmix32(Fmix32(index * 0x9E3779B9u + key0) ^ key1);
      Store16(out + j, h >= threshold ? Splat(scale) : Splat(0.0f));
    }
    for (; j < n; ++j) {
      const uint32_t h =
          Fmix32(Fmix32((start + static_cast<uint32_t>(j)) * 0x9E3779B9u + key0) ^ key1);
      out[j] = h >= threshold ? scale : 0.0f;
    }
  }

  // The factors of the 16 entries start, start + stride, ..., start + 15 stride.
  V16 Factors16(uint32_t start, uint32_t stride) const {
    const V16u lanes = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const V16u index = lanes * stride + start;
    const V16u h = Fmix32(Fmix32(index * 0x9E3779B9u + key0) ^ key1);
    return h >= threshold ? Splat(scale) : Splat(0.0f);
  }
};

// `threshold` is round(rate * 2^32) (0: no dropout), `scale` 1 / (1 - rate) in
// float32, both computed by the Python side exactly as hash_dropout.py does.
Dropout MakeDropout(const Tensor& seed, int64_t threshold, float scale) {
  Dropout dropout;
  if (threshold <= 0) return dropout;
  const auto words = seed.flat<int64_t>();
  dropout.active = true;
  dropout.key0 = Fmix32(static_cast<uint32_t>(words(0) & 0xFFFFFFFF));
  dropout.key1 = Fmix32(static_cast<uint32_t>(words(1) & 0xFFFFFFFF) + 0x632BE5ABu);
  dropout.threshold = static_cast<uint32_t>(threshold);
  dropout.scale = scale;
  return dropout;
}

// === Work on TensorFlow's CPU pool ===

// fn(block, begin, end) for `blocks` contiguous blocks of [0, n).
template <typename Fn>
void ForBlocks(OpKernelContext* context, int64_t n, int64_t blocks, int64_t cost_per_block,
               const Fn& fn) {
  const auto* threads = context->device()->tensorflow_cpu_worker_threads();
  tensorflow::Shard(threads->num_threads, threads->workers, blocks, cost_per_block,
                    [&](int64_t first, int64_t last) {
                      for (int64_t block = first; block < last; ++block) {
                        fn(block, n * block / blocks, n * (block + 1) / blocks);
                      }
                    });
}

// Row blocks for a pass over `rows` rows of `width` floats: a few per thread,
// none smaller than 16 KB of work.
int64_t RowBlocks(OpKernelContext* context, int64_t rows, int64_t width) {
  const int64_t threads = context->device()->tensorflow_cpu_worker_threads()->num_threads;
  const int64_t by_size = std::max<int64_t>(1, rows * width / 4096);
  return std::max<int64_t>(1, std::min({rows, 4 * threads, by_size}));
}

// Sums `partials` [blocks, width] into `out` [width].
void SumPartials(const std::vector<float>& partials, int64_t blocks, int64_t width, float* out) {
  std::fill(out, out + width, 0.0f);
  for (int64_t block = 0; block < blocks; ++block) {
    const float* row = partials.data() + block * width;
    for (int64_t c = 0; c < width; ++c) out[c] += row[c];
  }
}

// Column sums of a [rows, width] tensor of type T, in float32.
template <typename T>
void ColumnSums(OpKernelContext* context, const T* data, int64_t rows, int64_t width,
                float* out) {
  const int64_t blocks = RowBlocks(context, rows, width);
  std::vector<float> partials(blocks * width, 0.0f);
  ForBlocks(context, rows, blocks, rows * width / blocks * 2,
            [&](int64_t block, int64_t begin, int64_t end) {
              std::vector<float> row(width);
              float* sums = partials.data() + block * width;
              for (int64_t r = begin; r < end; ++r) {
                Io<T>::Load(data + r * width, row.data(), width);
                for (int64_t c = 0; c < width; ++c) sums[c] += row[c];
              }
            });
  SumPartials(partials, blocks, width, out);
}

Status CheckVector(const Tensor& tensor, int64_t size, const char* name) {
  if (tensor.dims() != 1 || tensor.dim_size(0) != size) {
    return tensorflow::errors::InvalidArgument(name, " must be a vector of ", size,
                                               " values, got shape ",
                                               tensor.shape().DebugString());
  }
  return Status();
}

Status CheckSeed(const Tensor& seed) { return CheckVector(seed, 2, "seed"); }

// === Attention ===
//
// qkv [b * t, 3 * heads * size]: each row the query, key and value of one
// token, head-major within each (the packed projection of LeallaEncoder.forward,
// the query already scaled by 1 / sqrt(size)); bias [3 * heads * size] float32;
// mask [b, t] (0 at padded keys, which get -1e9 added to their scores as Keras'
// masked softmax does). context [b * t, heads * size].

struct AttentionShape {
  int64_t batch, length, heads, size, inner, width;
};

Status GetAttentionShape(const Tensor& qkv, const Tensor& bias, const Tensor& mask,
                         int64_t heads, AttentionShape* shape) {
  if (qkv.dims() != 2 || mask.dims() != 2) {
    return tensorflow::errors::InvalidArgument(
        "qkv must be [rows, 3 * heads * size] and mask [batch, length], got ",
        qkv.shape().DebugString(), " and ", mask.shape().DebugString());
  }
  shape->batch = mask.dim_size(0);
  shape->length = mask.dim_size(1);
  shape->heads = heads;
  shape->width = qkv.dim_size(1);
  if (qkv.dim_size(0) != shape->batch * shape->length || shape->width % (3 * heads) != 0) {
    return tensorflow::errors::InvalidArgument(
        "qkv ", qkv.shape().DebugString(), " does not hold 3 x ", heads,
        " heads for each token of mask ", mask.shape().DebugString());
  }
  shape->size = shape->width / (3 * heads);
  shape->inner = heads * shape->size;
  return CheckVector(bias, shape->width, "bias");
}

// One sequence's attention in float32 scratch. With dropout (training) its
// rows of q, k, v (bias added) are loaded once, contiguous, then each head
// works from them; without it (Inference) each head reads its own rows from
// the tensor and writes its context rows back.
//
// Within a head, scores are kept transposed, keys down and queries across
// (s^T [t, tq], queries padded to tq, a multiple of 16): the softmax over the
// keys of each query is then a sum down the rows, lane by lane, with no sum
// across a vector. Head dimensions are padded to sp (a multiple of 16) with
// zeros, so every product below works on whole 16-float vectors.
// What a Sequence's scratch is for: Inference (no dropout), Probabilities and
// Context (dropout), or those and Backward.
enum class Pass { kInference, kForward, kBackward };

struct Sequence {
  const AttentionShape& s;
  const int64_t t, tq, sp;
  // rows [t, width] (qkv + bias); results [t, width] (context or dqkv);
  // gradients [t, inner] (dcontext); per head: q, k, v, context, dc, dq, dk,
  // dv [t, sp]; qt, dct [sp, tq]; p, pd, factor, dp [t (keys), tq (queries)].
  std::vector<float> rows, results, gradients, key_bias, q, k, v, context, qt, p, pd, factor,
      dc, dct, dq, dk, dv, dp;
  // LoadMask's reading of the key mask for Inference: the keys to score, and
  // whether they need the mask's -1e9 (false when the mask pads a suffix).
  int64_t keys = 0;
  bool masked_keys = true;

  Sequence(const AttentionShape& shape, Pass pass)
      : s(shape), t(shape.length), tq(RoundUp16(shape.length)), sp(RoundUp16(shape.size)),
        key_bias(t), q(t * sp, 0.0f), k(q.size(), 0.0f), v(q.size(), 0.0f),
        context(q.size()), qt(sp * tq, 0.0f), p(t * tq), pd(p.size()) {
    if (pass == Pass::kInference) return;  // no rows, results or dropout factors
    rows.resize(t * s.width);
    results.resize(t * s.width);
    factor.resize(p.size());
    if (pass == Pass::kBackward) {
      gradients.resize(t * s.inner);
      dc.assign(q.size(), 0.0f);
      dct.assign(qt.size(), 0.0f);
      dq.resize(q.size());
      dk.resize(q.size());
      dv.resize(q.size());
      dp.resize(p.size());
    }
  }

  // Sequence b's rows with their bias, and its key mask.
  template <typename T>
  void Load(const T* qkv, const float* bias, const int32_t* mask, int64_t b) {
    Io<T>::Load(qkv + b * t * s.width, rows.data(), t * s.width);
    for (int64_t i = 0; i < t; ++i) {
      float* row = &rows[i * s.width];
      for (int64_t c = 0; c < s.width; ++c) row[c] += bias[c];
    }
    LoadMask(mask, b);
  }

  // Sequence b's key mask: key_bias, and the keys Inference scores.
  void LoadMask(const int32_t* mask, int64_t b) {
    for (int64_t i = 0; i < t; ++i) key_bias[i] = mask[b * t + i] != 0 ? 0.0f : -1e9f;
    int64_t unpadded = 0;
    while (unpadded < t && mask[b * t + unpadded] != 0) ++unpadded;
    bool prefix = unpadded > 0;
    for (int64_t i = unpadded; i < t; ++i) prefix = prefix && mask[b * t + i] == 0;
    keys = prefix ? unpadded : t;
    masked_keys = !prefix;
  }

  // Head h of sequence b without dropout (inference), from its qkv rows `in`
  // [t, width] (of type T) into its context rows `out` [t, inner], after
  // LoadMask: Probabilities and Context in one pass over local pointers, each
  // head reading and writing the tensors itself. When the mask pads a suffix,
  // only the `keys` unpadded keys are scored: with finite scores and values a
  // padded key's score leaves the maximum as it is and its e^(-1e9 - max) is
  // 0 exactly, so no sum changes. The softmax's division moves after
  // p v, one multiply per context value instead of one per probability (a
  // different rounding, not a different result).
  template <typename T>
  void Inference(const T* in, const float* bias, int64_t h, T* out) {
    const int64_t size = s.size, n = keys, head = h * size;
    float* qb = q.data();
    float* kb = k.data();
    float* vb = v.data();
    float* qtb = qt.data();
    float* pb = p.data();
    float* cb = context.data();
    float* inverse = pd.data();  // [tq]: 1 / each query's sum of exponentials
    const float* kbias = key_bias.data();
    for (int64_t i = 0; i < t; ++i) {
      const T* row = in + i * s.width + head;
      AddBias(row, bias + head, size, qb + i * sp);
      if (i < n) {
        AddBias(row + s.inner, bias + s.inner + head, size, kb + i * sp);
        AddBias(row + 2 * s.inner, bias + 2 * s.inner + head, size, vb + i * sp);
      }
    }
    Transpose(qb, t, size, sp, qtb, tq);
    Gemm<false>(n, tq, sp, kb, sp, qtb, tq, pb, tq);  // s^T = k q^T, unpadded keys
    for (int64_t i = 0; i < tq; i += 16) {
      V16 top = Splat(-INFINITY);
      for (int64_t j = 0; j < n; ++j) {
        V16 x = Load16(pb + j * tq + i);
        if (masked_keys) {
          x += kbias[j];
          Store16(pb + j * tq + i, x);
        }
        top = x > top ? x : top;
      }
      V16 sums = Splat(0.0f);
      for (int64_t j = 0; j < n; ++j) {
        const V16 e = Exp16(Load16(pb + j * tq + i) - top);
        Store16(pb + j * tq + i, e);
        sums += e;
      }
      Store16(inverse + i, 1.0f / sums);
    }
    Gemm<true>(t, sp, n, pb, tq, vb, sp, cb, sp);  // e v over the unpadded keys
    for (int64_t i = 0; i < t; ++i) {
      StoreScaled(cb + i * sp, inverse[i], size, out + i * s.inner + head);
    }
  }

  // dst[0..n) = src[0..n) (of type T) + bias, in float32.
  template <typename T>
  static void AddBias(const T* src, const float* bias, int64_t n, float* dst) {
    int64_t c = 0;
    for (; c + 16 <= n; c += 16) Store16(dst + c, LoadAs16(src + c) + Load16(bias + c));
    if (c == n) return;
    Io<T>::Load(src + c, dst + c, n - c);
    for (; c < n; ++c) dst[c] += bias[c];
  }

  // dst[0..n) (of type T) = src[0..n) * scale.
  template <typename T>
  static void StoreScaled(const float* src, float scale, int64_t n, T* dst) {
    int64_t c = 0;
    for (; c + 16 <= n; c += 16) StoreAs16(dst + c, Load16(src + c) * scale);
    if (c == n) return;
    float tail[16];
    for (int64_t i = 0; c + i < n; ++i) tail[i] = src[c + i] * scale;
    Io<T>::Store(tail, dst + c, n - c);
  }

  // Head h of sequence b: the probabilities p^T after the masked softmax,
  // their dropout factors and pd = p * factor.
  void Probabilities(const Dropout& dropout, int64_t b, int64_t h) {
    const int64_t size = s.size;
    for (int64_t i = 0; i < t; ++i) {
      const float* row = &rows[i * s.width + h * size];
      CopyFloats(&q[i * sp], row, size);
      CopyFloats(&k[i * sp], row + s.inner, size);
      CopyFloats(&v[i * sp], row + 2 * s.inner, size);
    }
    Transpose(q.data(), t, size, sp, qt.data(), tq);
    Gemm<false>(t, tq, sp, k.data(), sp, qt.data(), tq, p.data(), tq);  // s^T = k q^T
    for (int64_t i = 0; i < tq; i += 16) {
      V16 top = Splat(-INFINITY);
      for (int64_t j = 0; j < t; ++j) {
        float* score = &p[j * tq + i];
        const V16 x = Load16(score) + key_bias[j];
        Store16(score, x);
        top = x > top ? x : top;
      }
      V16 sums = Splat(0.0f);
      for (int64_t j = 0; j < t; ++j) {
        float* score = &p[j * tq + i];
        const V16 e = Exp16(Load16(score) - top);
        Store16(score, e);
        sums += e;
      }
      const V16 inverse = 1.0f / sums;
      for (int64_t j = 0; j < t; ++j) {
        float* score = &p[j * tq + i];
        const V16 probability = Load16(score) * inverse;
        Store16(score, probability);
        V16 keep = Splat(1.0f);
        if (dropout.active) {
          // Entry (query i + lane, key j) of [b, heads, t, t].
          keep = dropout.Factors16(static_cast<uint32_t>(((b * s.heads + h) * t + i) * t + j),
                                   static_cast<uint32_t>(t));
        }
        Store16(&factor[j * tq + i], keep);
        Store16(&pd[j * tq + i], probability * keep);
      }
    }
  }

  // Head h's context = pd v into results [t, inner].
  void Context(int64_t h) {
    Gemm<true>(t, sp, t, pd.data(), tq, v.data(), sp, context.data(), sp);
    for (int64_t i = 0; i < t; ++i) {
      CopyFloats(&results[i * s.inner + h * s.size], &context[i * sp], s.size);
    }
  }

  // Head h's dq, dk, dv from its dcontext (in gradients) into results [t, width].
  void Backward(int64_t h) {
    for (int64_t i = 0; i < t; ++i) {
      CopyFloats(&dc[i * sp], &gradients[i * s.inner + h * s.size], s.size);
    }
    Transpose(dc.data(), t, s.size, sp, dct.data(), tq);
    Gemm<false>(t, sp, t, pd.data(), tq, dc.data(), sp, dv.data(), sp);   // dv = pd^T dc
    Gemm<false>(t, tq, sp, v.data(), sp, dct.data(), tq, dp.data(), tq);  // d(pd)^T = v dc^T
    // The softmax's gradient, through the dropout: ds = p (dp - sum_keys(p dp)).
    for (int64_t i = 0; i < tq; i += 16) {
      V16 dots = Splat(0.0f);
      for (int64_t j = 0; j < t; ++j) {
        float* g = &dp[j * tq + i];
        const V16 through = Load16(g) * Load16(&factor[j * tq + i]);
        Store16(g, through);
        dots += through * Load16(&p[j * tq + i]);
      }
      for (int64_t j = 0; j < t; ++j) {
        float* g = &dp[j * tq + i];
        Store16(g, Load16(&p[j * tq + i]) * (Load16(g) - dots));
      }
    }
    Gemm<true>(t, sp, t, dp.data(), tq, k.data(), sp, dq.data(), sp);   // dq = ds k
    Gemm<false>(t, sp, t, dp.data(), tq, q.data(), sp, dk.data(), sp);  // dk = ds^T q
    for (int64_t i = 0; i < t; ++i) {
      float* row = &results[i * s.width + h * s.size];
      CopyFloats(row, &dq[i * sp], s.size);
      CopyFloats(row + s.inner, &dk[i * sp], s.size);
      CopyFloats(row + 2 * s.inner, &dv[i * sp], s.size);
    }
  }
};

// Runs `fn(Sequence&, b)` over the sequences, one Sequence's scratch per block.
template <typename Fn>
void ForSequences(OpKernelContext* context, const AttentionShape& s, Pass pass,
                  int64_t cost, const Fn& fn) {
  const int64_t threads = context->device()->tensorflow_cpu_worker_threads()->num_threads;
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(s.batch, 4 * threads));
  ForBlocks(context, s.batch, blocks, cost * s.batch / blocks,
            [&](int64_t, int64_t begin, int64_t end) {
              Sequence sequence(s, pass);
              for (int64_t b = begin; b < end; ++b) fn(sequence, b);
            });
}

// The dropout attributes of an op (threshold 0: no dropout).
class DropoutKernel : public OpKernel {
 public:
  explicit DropoutKernel(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("dropout_threshold", &threshold_));
    OP_REQUIRES_OK(context, context->GetAttr("dropout_scale", &scale_));
  }

 protected:
  Dropout MakeDropoutFrom(const Tensor& seed) const {
    return MakeDropout(seed, threshold_, scale_);
  }

 private:
  int64_t threshold_;
  float scale_;
};

// What the attention op and its gradient share: qkv, bias, mask and seed at
// inputs first..first + 3, checked, and the head count.
class AttentionKernel : public DropoutKernel {
 public:
  explicit AttentionKernel(OpKernelConstruction* context) : DropoutKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("num_heads", &heads_));
  }

 protected:
  Status Prepare(OpKernelContext* context, int first, AttentionShape* shape,
                 Dropout* dropout) const {
    const Tensor& seed = context->input(first + 3);
    TF_RETURN_IF_ERROR(GetAttentionShape(context->input(first), context->input(first + 1),
                                         context->input(first + 2), heads_, shape));
    TF_RETURN_IF_ERROR(CheckSeed(seed));
    *dropout = MakeDropoutFrom(seed);
    return Status();
  }

 private:
  int64_t heads_;
};

template <typename T>
class AttentionOp : public AttentionKernel {
 public:
  explicit AttentionOp(OpKernelConstruction* context) : AttentionKernel(context) {}

  void Compute(OpKernelContext* context) override {
    AttentionShape s;
    Dropout dropout;
    OP_REQUIRES_OK(context, Prepare(context, 0, &s, &dropout));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, TensorShape({s.batch * s.length, s.inner}), &output));
    const T* in = context->input(0).flat<T>().data();
    const float* b = context->input(1).flat<float>().data();
    const int32_t* m = context->input(2).flat<int32_t>().data();
    T* out = output->flat<T>().data();
    const int64_t t = s.length;
    ForSequences(context, s, dropout.active ? Pass::kForward : Pass::kInference,
                 s.heads * t * (8 * t * s.size + 30 * t),
                 [&](Sequence& sequence, int64_t bi) {
                   if (!dropout.active) {
                     sequence.LoadMask(m, bi);
                     for (int64_t h = 0; h < s.heads; ++h) {
                       sequence.Inference(in + bi * t * s.width, b, h, out + bi * t * s.inner);
                     }
                     return;
                   }
                   sequence.Load(in, b, m, bi);
                   for (int64_t h = 0; h < s.heads; ++h) {
                     sequence.Probabilities(dropout, bi, h);
                     sequence.Context(h);
                   }
                   Io<T>::Store(sequence.results.data(), out + bi * t * s.inner, t * s.inner);
                 });
  }
};

// Inputs: dcontext, then the forward op's qkv, bias, mask, seed.
template <typename T>
class AttentionGradOp : public AttentionKernel {
 public:
  explicit AttentionGradOp(OpKernelConstruction* context) : AttentionKernel(context) {}

  void Compute(OpKernelContext* context) override {
    AttentionShape s;
    Dropout dropout;
    OP_REQUIRES_OK(context, Prepare(context, 1, &s, &dropout));
    const Tensor& dcontext = context->input(0);
    const Tensor& qkv = context->input(1);
    OP_REQUIRES(context,
                dcontext.dims() == 2 && dcontext.dim_size(0) == qkv.dim_size(0) &&
                    dcontext.dim_size(1) == s.inner,
                tensorflow::errors::InvalidArgument("dcontext must be [rows, heads * size], got ",
                                                    dcontext.shape().DebugString()));
    Tensor* dqkv = nullptr;
    Tensor* dbias = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, qkv.shape(), &dqkv));
    OP_REQUIRES_OK(context, context->allocate_output(1, TensorShape({s.width}), &dbias));
    const T* in = qkv.flat<T>().data();
    const T* grad = dcontext.flat<T>().data();
    const float* b = context->input(2).flat<float>().data();
    const int32_t* m = context->input(3).flat<int32_t>().data();
    T* out = dqkv->flat<T>().data();
    const int64_t t = s.length;
    ForSequences(context, s, Pass::kBackward, s.heads * t * (20 * t * s.size + 50 * t),
                 [&](Sequence& sequence, int64_t bi) {
                   sequence.Load(in, b, m, bi);
                   Io<T>::Load(grad + bi * t * s.inner, sequence.gradients.data(), t * s.inner);
                   for (int64_t h = 0; h < s.heads; ++h) {
                     sequence.Probabilities(dropout, bi, h);
                     sequence.Backward(h);
                   }
                   Io<T>::Store(sequence.results.data(), out + bi * t * s.width, t * s.width);
                 });
    ColumnSums(context, out, s.batch * t, s.width, dbias->flat<float>().data());
  }
};

// === Bias + GELU ===

constexpr float kSqrtTwoOverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;
constexpr float kInvSqrtTwo = 0.7071067811865476f;
constexpr float kInvSqrtTwoPi = 0.3989422804014327f;

Status GetRowsShape(const Tensor& x, const Tensor& bias, int64_t* rows, int64_t* width) {
  if (x.dims() != 2) {
    return tensorflow::errors::InvalidArgument("x must be [rows, width], got ",
                                               x.shape().DebugString());
  }
  *rows = x.dim_size(0);
  *width = x.dim_size(1);
  return CheckVector(bias, *width, "bias");
}

// The GELU ops' one attribute: the tanh approximation or the exact erf form.
class GeluKernel : public OpKernel {
 public:
  explicit GeluKernel(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("approximate", &approximate_));
  }

 protected:
  bool approximate_;
};

template <typename T>
class BiasGeluOp : public GeluKernel {
 public:
  explicit BiasGeluOp(OpKernelConstruction* context) : GeluKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& bias = context->input(1);
    int64_t rows, width;
    OP_REQUIRES_OK(context, GetRowsShape(x, bias, &rows, &width));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, x.shape(), &output));
    const T* in = x.flat<T>().data();
    const float* b = bias.flat<float>().data();
    T* out = output->flat<T>().data();
    const int64_t blocks = RowBlocks(context, rows, width);
    ForBlocks(context, rows, blocks, rows * width / blocks * 30,
              [&](int64_t, int64_t begin, int64_t end) {
                Array row(width), y(width);
                const Eigen::Map<const Array> bias_row(b, width);
                for (int64_t r = begin; r < end; ++r) {
                  Io<T>::Load(in + r * width, row.data(), width);
                  row += bias_row;
                  if (approximate_) {
                    y = 0.5f * row *
                        (1.0f + (kSqrtTwoOverPi * (row + kGeluCubic * row.cube())).tanh());
                  } else {
                    y = 0.5f * row * (1.0f + (row * kInvSqrtTwo).erf());
                  }
                  Io<T>::Store(y.data(), out + r * width, width);
                }
              });
  }
};

template <typename T>
class BiasGeluGradOp : public GeluKernel {
 public:
  explicit BiasGeluGradOp(OpKernelConstruction* context) : GeluKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& dy = context->input(0);
    const Tensor& x = context->input(1);
    const Tensor& bias = context->input(2);
    int64_t rows, width;
    OP_REQUIRES_OK(context, GetRowsShape(x, bias, &rows, &width));
    OP_REQUIRES(context, dy.shape() == x.shape(),
                tensorflow::errors::InvalidArgument("dy and x differ in shape"));
    Tensor* dx = nullptr;
    Tensor* dbias = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, x.shape(), &dx));
    OP_REQUIRES_OK(context, context->allocate_output(1, bias.shape(), &dbias));
    const T* in = x.flat<T>().data();
    const T* grad = dy.flat<T>().data();
    const float* b = bias.flat<float>().data();
    T* out = dx->flat<T>().data();
    const int64_t blocks = RowBlocks(context, rows, width);
    std::vector<float> partials(blocks * width, 0.0f);
    ForBlocks(context, rows, blocks, rows * width / blocks * 40,
              [&](int64_t block, int64_t begin, int64_t end) {
                Array row(width), g(width), derivative(width);
                const Eigen::Map<const Array> bias_row(b, width);
                Map sums(partials.data() + block * width, width);
                for (int64_t r = begin; r < end; ++r) {
                  Io<T>::Load(in + r * width, row.data(), width);
                  Io<T>::Load(grad + r * width, g.data(), width);
                  row += bias_row;
                  if (approximate_) {
                    const Array th =
                        (kSqrtTwoOverPi * (row + kGeluCubic * row.cube())).tanh();
                    derivative = 0.5f * (1.0f + th) +
                                 0.5f * row * (1.0f - th.square()) * kSqrtTwoOverPi *
                                     (1.0f + 3.0f * kGeluCubic * row.square());
                  } else {
                    derivative = 0.5f * (1.0f + (row * kInvSqrtTwo).erf()) +
                                 row * kInvSqrtTwoPi * (-0.5f * row.square()).exp();
                  }
                  g *= derivative;
                  sums += g;
                  Io<T>::Store(g.data(), out + r * width, width);
                }
              });
    SumPartials(partials, blocks, width, dbias->flat<float>().data());
  }
};

// === Bias + dropout + residual + layer norm ===
//
// z = dropout(x + bias) + residual; y = (z - mean) * rsqrt(var + epsilon) *
// gamma + beta over each row (statistics in float32), as LeallaEncoder's
// layers do after the attention output and the feed-forward output.

struct NormInputs {
  int64_t rows, width;
  const float *bias, *gamma;
  Dropout dropout;
};

// z of row r into `z` (float32), `factor` scratch.
template <typename T>
inline void PreNorm(const NormInputs& n, const T* x, const T* residual, int64_t r, float* z,
                    float* factor, float* scratch) {
  Io<T>::Load(x + r * n.width, z, n.width);
  Io<T>::Load(residual + r * n.width, scratch, n.width);
  if (n.dropout.active) {
    n.dropout.Factors(static_cast<uint32_t>(r * n.width), n.width, factor);
    for (int64_t c = 0; c < n.width; ++c) z[c] = (z[c] + n.bias[c]) * factor[c] + scratch[c];
  } else {
    for (int64_t c = 0; c < n.width; ++c) z[c] = z[c] + n.bias[c] + scratch[c];
  }
}

// The norm op's row r: PreNorm, the statistics and the output in three passes
// over z, each over the whole vectors, then the rest one value at a time (the
// sums in RowSum's and RowDot's order: lane by lane, across the lanes, the rest).
template <typename T>
inline void NormRow(const NormInputs& n, const T* x, const T* residual, const float* beta,
                    float epsilon, int64_t r, float* z, float* factor, T* out, float* means,
                    float* rstds) {
  const int64_t width = n.width, whole = width / 16 * 16;
  const T* xr = x + r * width;
  const T* rr = residual + r * width;
  T* yr = out + r * width;
  const bool drop = n.dropout.active;
  if (drop) n.dropout.Factors(static_cast<uint32_t>(r * width), width, factor);
  V16 sums = Splat(0.0f);
  for (int64_t c = 0; c < whole; c += 16) {
    V16 v = LoadAs16(xr + c) + Load16(n.bias + c);
    if (drop) v *= Load16(factor + c);
    v += LoadAs16(rr + c);
    Store16(z + c, v);
    sums += v;
  }
  float total = Sum(sums);
  for (int64_t c = whole; c < width; ++c) {
    float v, w;
    Io<T>::Load(xr + c, &v, 1);
    Io<T>::Load(rr + c, &w, 1);
    v += n.bias[c];
    if (drop) v *= factor[c];
    z[c] = v + w;
    total += z[c];
  }
  const float mu = total / width;
  V16 squares = Splat(0.0f);
  for (int64_t c = 0; c < whole; c += 16) {
    const V16 centred = Load16(z + c) - mu;
    Store16(z + c, centred);
    squares += centred * centred;
  }
  float square_total = Sum(squares);
  for (int64_t c = whole; c < width; ++c) {
    z[c] -= mu;
    square_total += z[c] * z[c];
  }
  const float inverse = 1.0f / std::sqrt(square_total / width + epsilon);
  for (int64_t c = 0; c < whole; c += 16) {
    StoreAs16(yr + c, Load16(z + c) * (inverse * Load16(n.gamma + c)) + Load16(beta + c));
  }
  for (int64_t c = whole; c < width; ++c) {
    const float y = z[c] * (inverse * n.gamma[c]) + beta[c];
    Io<T>::Store(&y, yr + c, 1);
  }
  means[r] = mu;
  rstds[r] = inverse;
}

// What the norm op and its gradient share: x, bias, residual, gamma, beta and
// seed at inputs first..first + 5, checked.
class NormKernel : public DropoutKernel {
 public:
  explicit NormKernel(OpKernelConstruction* context) : DropoutKernel(context) {}

 protected:
  Status GetInputs(OpKernelContext* context, int first, NormInputs* n) const {
    const Tensor& x = context->input(first);
    const Tensor& bias = context->input(first + 1);
    const Tensor& residual = context->input(first + 2);
    const Tensor& gamma = context->input(first + 3);
    const Tensor& seed = context->input(first + 5);
    TF_RETURN_IF_ERROR(GetRowsShape(x, bias, &n->rows, &n->width));
    if (residual.shape() != x.shape()) {
      return tensorflow::errors::InvalidArgument("residual and x differ in shape: ",
                                                 residual.shape().DebugString(), " and ",
                                                 x.shape().DebugString());
    }
    TF_RETURN_IF_ERROR(CheckVector(gamma, n->width, "gamma"));
    TF_RETURN_IF_ERROR(CheckVector(context->input(first + 4), n->width, "beta"));
    TF_RETURN_IF_ERROR(CheckSeed(seed));
    n->bias = bias.flat<float>().data();
    n->gamma = gamma.flat<float>().data();
    n->dropout = MakeDropoutFrom(seed);
    return Status();
  }
};

template <typename T>
class BiasDropoutAddNormOp : public NormKernel {
 public:
  explicit BiasDropoutAddNormOp(OpKernelConstruction* context) : NormKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("epsilon", &epsilon_));
  }

  void Compute(OpKernelContext* context) override {
    NormInputs n;
    OP_REQUIRES_OK(context, GetInputs(context, 0, &n));
    const Tensor& x = context->input(0);
    Tensor *y = nullptr, *mean = nullptr, *rstd = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, x.shape(), &y));
    OP_REQUIRES_OK(context, context->allocate_output(1, TensorShape({n.rows}), &mean));
    OP_REQUIRES_OK(context, context->allocate_output(2, TensorShape({n.rows}), &rstd));
    const T* in = x.flat<T>().data();
    const T* residual = context->input(2).flat<T>().data();
    const float* beta = context->input(4).flat<float>().data();
    T* out = y->flat<T>().data();
    float* means = mean->flat<float>().data();
    float* rstds = rstd->flat<float>().data();
    const int64_t width = n.width;
    const int64_t blocks = RowBlocks(context, n.rows, width);
    ForBlocks(context, n.rows, blocks, n.rows * width / blocks * 20,
              [&](int64_t, int64_t begin, int64_t end) {
                std::vector<float> z(width), factor(width);
                for (int64_t r = begin; r < end; ++r) {
                  NormRow(n, in, residual, beta, epsilon_, r, z.data(), factor.data(), out,
                          means, rstds);
                }
              });
  }

 private:
  float epsilon_;
};

template <typename T>
class BiasDropoutAddNormGradOp : public NormKernel {
 public:
  explicit BiasDropoutAddNormGradOp(OpKernelConstruction* context) : NormKernel(context) {}

  // Inputs: dy, x, bias, residual, gamma, beta, seed, mean, rstd.
  void Compute(OpKernelContext* context) override {
    NormInputs n;
    OP_REQUIRES_OK(context, GetInputs(context, 1, &n));
    const Tensor& dy = context->input(0);
    const Tensor& x = context->input(1);
    OP_REQUIRES(context, dy.shape() == x.shape(),
                tensorflow::errors::InvalidArgument("dy and x differ in shape"));
    OP_REQUIRES_OK(context, CheckVector(context->input(7), n.rows, "mean"));
    OP_REQUIRES_OK(context, CheckVector(context->input(8), n.rows, "rstd"));
    Tensor *dx = nullptr, *dbias = nullptr, *dresidual = nullptr, *dgamma = nullptr,
           *dbeta = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, x.shape(), &dx));
    OP_REQUIRES_OK(context, context->allocate_output(1, TensorShape({n.width}), &dbias));
    OP_REQUIRES_OK(context, context->allocate_output(2, x.shape(), &dresidual));
    OP_REQUIRES_OK(context, context->allocate_output(3, TensorShape({n.width}), &dgamma));
    OP_REQUIRES_OK(context, context->allocate_output(4, TensorShape({n.width}), &dbeta));
    const T* grad = dy.flat<T>().data();
    const T* in = x.flat<T>().data();
    const T* residual = context->input(3).flat<T>().data();
    const float* means = context->input(7).flat<float>().data();
    const float* rstds = context->input(8).flat<float>().data();
    T* out_x = dx->flat<T>().data();
    T* out_residual = dresidual->flat<T>().data();
    const int64_t width = n.width;
    const int64_t blocks = RowBlocks(context, n.rows, width);
    // Per block: d(bias), d(gamma), d(beta) partial sums.
    std::vector<float> partials(3 * blocks * width, 0.0f);
    ForBlocks(context, n.rows, blocks, n.rows * width / blocks * 30,
              [&](int64_t block, int64_t begin, int64_t end) {
                std::vector<float> z(width), factor(width), scratch(width), g(width);
                float* sum_bias = partials.data() + block * width;
                float* sum_gamma = sum_bias + blocks * width;
                float* sum_beta = sum_gamma + blocks * width;
                for (int64_t r = begin; r < end; ++r) {
                  PreNorm(n, in, residual, r, z.data(), factor.data(), scratch.data());
                  Io<T>::Load(grad + r * width, g.data(), width);
                  const float mu = means[r], inverse = rstds[r];
                  for (int64_t c = 0; c < width; ++c) {
                    const float normalized = (z[c] - mu) * inverse;
                    sum_gamma[c] += g[c] * normalized;
                    sum_beta[c] += g[c];
                    z[c] = normalized;
                    g[c] *= n.gamma[c];
                  }
                  const float mean_g = RowSum(g.data(), width) / width;
                  const float mean_gx = RowDot(g.data(), z.data(), width) / width;
                  for (int64_t c = 0; c < width; ++c) {
                    g[c] = inverse * (g[c] - mean_g - z[c] * mean_gx);  // dz
                  }
                  Io<T>::Store(g.data(), out_residual + r * width, width);
                  if (n.dropout.active) {
                    for (int64_t c = 0; c < width; ++c) g[c] *= factor[c];
                  }
                  for (int64_t c = 0; c < width; ++c) sum_bias[c] += g[c];
                  Io<T>::Store(g.data(), out_x + r * width, width);
                }
              });
    float* targets[3] = {dbias->flat<float>().data(), dgamma->flat<float>().data(),
                         dbeta->flat<float>().data()};
    for (int k = 0; k < 3; ++k) {
      std::vector<float> part(partials.begin() + k * blocks * width,
                              partials.begin() + (k + 1) * blocks * width);
      SumPartials(part, blocks, width, targets[k]);
    }
  }
};

// === Registration ===

Status SameAsInput(InferenceContext* c, int input) {
  c->set_output(0, c->input(input));
  return Status();
}

Status VectorLike(InferenceContext* c, int output, int input) {
  ShapeHandle shape;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(input), 1, &shape));
  c->set_output(output, shape);
  return Status();
}

// A gradient op's: its first output has input 1's shape, its second is a
// vector like input 2.
Status GradientShape(InferenceContext* c) {
  c->set_output(0, c->input(1));
  return VectorLike(c, 1, 2);
}

REGISTER_OP("LeallaAttention")
    .Input("qkv: T")
    .Input("bias: float")
    .Input("mask: int32")
    .Input("seed: int64")
    .Output("context: T")
    .Attr("T: {float, bfloat16}")
    .Attr("num_heads: int >= 1")
    .Attr("dropout_threshold: int = 0")
    .Attr("dropout_scale: float = 1.0")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle qkv;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &qkv));
      int64_t heads;
      TF_RETURN_IF_ERROR(c->GetAttr("num_heads", &heads));
      DimensionHandle inner;
      TF_RETURN_IF_ERROR(c->Divide(c->Dim(qkv, 1), 3, true, &inner));
      c->set_output(0, c->Matrix(c->Dim(qkv, 0), inner));
      return Status();
    });

REGISTER_OP("LeallaAttentionGrad")
    .Input("dcontext: T")
    .Input("qkv: T")
    .Input("bias: float")
    .Input("mask: int32")
    .Input("seed: int64")
    .Output("dqkv: T")
    .Output("dbias: float")
    .Attr("T: {float, bfloat16}")
    .Attr("num_heads: int >= 1")
    .Attr("dropout_threshold: int = 0")
    .Attr("dropout_scale: float = 1.0")
    .SetShapeFn(GradientShape);

REGISTER_OP("LeallaBiasGelu")
    .Input("x: T")
    .Input("bias: float")
    .Output("y: T")
    .Attr("T: {float, bfloat16}")
    .Attr("approximate: bool = true")
    .SetShapeFn([](InferenceContext* c) { return SameAsInput(c, 0); });

REGISTER_OP("LeallaBiasGeluGrad")
    .Input("dy: T")
    .Input("x: T")
    .Input("bias: float")
    .Output("dx: T")
    .Output("dbias: float")
    .Attr("T: {float, bfloat16}")
    .Attr("approximate: bool = true")
    .SetShapeFn(GradientShape);

REGISTER_OP("LeallaBiasDropoutAddNorm")
    .Input("x: T")
    .Input("bias: float")
    .Input("residual: T")
    .Input("gamma: float")
    .Input("beta: float")
    .Input("seed: int64")
    .Output("y: T")
    .Output("mean: float")
    .Output("rstd: float")
    .Attr("T: {float, bfloat16}")
    .Attr("epsilon: float")
    .Attr("dropout_threshold: int = 0")
    .Attr("dropout_scale: float = 1.0")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &x));
      c->set_output(0, x);
      c->set_output(1, c->Vector(c->Dim(x, 0)));
      c->set_output(2, c->Vector(c->Dim(x, 0)));
      return Status();
    });

REGISTER_OP("LeallaBiasDropoutAddNormGrad")
    .Input("dy: T")
    .Input("x: T")
    .Input("bias: float")
    .Input("residual: T")
    .Input("gamma: float")
    .Input("beta: float")
    .Input("seed: int64")
    .Input("mean: float")
    .Input("rstd: float")
    .Output("dx: T")
    .Output("dbias: float")
    .Output("dresidual: T")
    .Output("dgamma: float")
    .Output("dbeta: float")
    .Attr("T: {float, bfloat16}")
    .Attr("dropout_threshold: int = 0")
    .Attr("dropout_scale: float = 1.0")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(1));
      c->set_output(2, c->input(1));
      TF_RETURN_IF_ERROR(VectorLike(c, 1, 2));
      TF_RETURN_IF_ERROR(VectorLike(c, 3, 4));
      return VectorLike(c, 4, 5);
    });

#define LEALLA_REGISTER(T)                                                              \
  REGISTER_KERNEL_BUILDER(                                                              \
      Name("LeallaAttention").Device(DEVICE_CPU).TypeConstraint<T>("T"),                \
      AttentionOp<T>);                                                                  \
  REGISTER_KERNEL_BUILDER(                                                              \
      Name("LeallaAttentionGrad").Device(DEVICE_CPU).TypeConstraint<T>("T"),            \
      AttentionGradOp<T>);                                                              \
  REGISTER_KERNEL_BUILDER(Name("LeallaBiasGelu").Device(DEVICE_CPU).TypeConstraint<T>("T"), \
                          BiasGeluOp<T>);                                               \
  REGISTER_KERNEL_BUILDER(                                                              \
      Name("LeallaBiasGeluGrad").Device(DEVICE_CPU).TypeConstraint<T>("T"),             \
      BiasGeluGradOp<T>);                                                               \
  REGISTER_KERNEL_BUILDER(                                                              \
      Name("LeallaBiasDropoutAddNorm").Device(DEVICE_CPU).TypeConstraint<T>("T"),       \
      BiasDropoutAddNormOp<T>);                                                         \
  REGISTER_KERNEL_BUILDER(                                                              \
      Name("LeallaBiasDropoutAddNormGrad").Device(DEVICE_CPU).TypeConstraint<T>("T"),   \
      BiasDropoutAddNormGradOp<T>);

LEALLA_REGISTER(float)
LEALLA_REGISTER(bfloat16)

}  // namespace
}  // namespace lealla
