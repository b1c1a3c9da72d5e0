// The op table: every op of the op list (autograd/op_list.h REGEN_OPS) described once, as rows of
// one op at one shape: its inputs (shapes and how to fill them), the call, its tolerances and its
// reference. The reference is an f64 formula (the unary list's, tests/op_reference.h; dropout's,
// below) or PyTorch's values, stored in tests/data/op_reference.safetensors under the row's name
// by tools/make_op_reference.py together with the inputs and the cotangent they were computed on.
// The same rows drive
//   - tests/test_op_table.cpp: every op kind has a row and a reference; the f64 gradcheck of every
//     row; the CPU's f64 and f32 outputs and gradients against the reference;
//   - tests/cuda/test_cuda_op_table.cpp: CUDA's f32 outputs and gradients against the reference.
// A formula wrong the same way in an op's forward and backward passes the gradcheck but not the
// reference. docs/ops.md says what a new op needs here.
#pragma once

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "regen/autograd/op_list.h"
#include "regen/autograd/ops.h"
#include "regen/autograd/ops_unary.h"
#include "regen/autograd/sharded_parameters.h"
#include "regen/core/philox.h"
#include "regen/core/safetensors.h"
#include "tests/dry_paths.h"
#include "tests/gradcheck.h"
#include "tests/op_reference.h"

namespace regen::testing {

struct OpInput {
  enum class Kind { real, index, mask };
  Shape shape;
  Kind kind = Kind::real;
  double lo = -1, hi = 1;  // real: uniform in [lo, hi)
  double gap = 0;          // real: then pushed at least this far from 0 (an op with a kink there)
  int64_t range = 0;       // index: i64 in [0, range); mask: i32 0/1 (last column always 0)
  bool grad = true;        // real: checked by the gradcheck and compared as a gradient
};
inline OpInput real(Shape s, double lo = -1, double hi = 1, double gap = 0) {
  return {std::move(s), OpInput::Kind::real, lo, hi, gap, 0, true};
}
inline OpInput fixed(Shape s, double lo = -1, double hi = 1) {
  return {std::move(s), OpInput::Kind::real, lo, hi, 0, 0, false};
}
inline OpInput index(Shape s, int64_t range) {
  return {std::move(s), OpInput::Kind::index, 0, 0, 0, range, false};
}
inline OpInput mask(Shape s) {
  return {std::move(s), OpInput::Kind::mask, 0, 0, 0, 2, false};
}

// An f64 formula for a row's output, from its f64 inputs on the CPU.
using ReferenceFn = std::function<std::vector<double>(const std::vector<Tensor>&)>;

struct OpCase {
  std::string name;  // "conv2d 3x3 stride 2 pad 1"; the key of its stored reference
  OpKind kind;       // the op it exercises
  std::vector<OpInput> inputs;
  TensorFn fn;  // one output (ops with several outputs are summed or concatenated)
  GradcheckOptions tol = linear_op_tol();
  bool differentiable = true;  // false: values only (no gradcheck)
  double f32_rtol = 1e-4;      // f32 (CPU or CUDA) against the reference: |a - b| <= rtol (|b| + 1)
  double f64_rtol = 1e-10;     // f64 against the reference: only the summation order may differ
  // The reference: this formula for the output (the gradients are then checked against the f64
  // run, which the gradcheck ties to the f64 output), or, when it is empty, PyTorch's stored
  // output and gradients (tests/data/op_reference.safetensors, "<name>/...").
  ReferenceFn formula = nullptr;
};

// PyTorch's values for the rows without a formula (tools/make_op_reference.py).
inline const SafetensorsFile& stored_references() {
  static const SafetensorsFile f =
      load_safetensors(std::string(REGEN_TEST_DATA) + "/op_reference.safetensors");
  return f;
}
// The stored tensor "<row>/<what>", which must exist.
inline const Tensor& stored(const std::string& row, const std::string& what) {
  const Tensor* t = stored_references().find(row + "/" + what);
  REQUIRE_MESSAGE(t != nullptr, "tests/data/op_reference.safetensors has no '", row, "/", what,
                  "': add the row to tools/make_op_reference.py and rerun it");
  return *t;
}

// The inputs of a row in `dtype` (floating inputs) on `device`: the same values for every dtype
// and device (drawn in f64 and converted).
// A row with a stored reference takes the inputs stored with it (checked against the row's shapes).
inline std::vector<Tensor> op_inputs(const OpCase& c, DType dtype, Device device,
                                     uint64_t seed = 11) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const OpInput& in = c.inputs[i];
    if (!c.formula) {
      const Tensor& t = stored(c.name, "in" + std::to_string(i));
      REQUIRE_MESSAGE(t.shape() == in.shape, c.name, ": stored input ", i, " is ", sh(t.shape()),
                      ", the row says ", sh(in.shape), ": rerun tools/make_op_reference.py");
      if (in.kind == OpInput::Kind::real && dtype == DType::f32) {
        const std::vector<double> v = t.to_vector<double>();
        out.push_back(from_vector<float>(std::vector<float>(v.begin(), v.end()), in.shape, device));
      } else {
        out.push_back(t.to(device));  // f64, i64 or i32 as stored
      }
      continue;
    }
    Generator g(seed + 17 * i);
    Tensor t;
    if (in.kind == OpInput::Kind::real) {
      std::vector<double> v = uniform(in.shape, in.lo, in.hi, g, DType::f64).to_vector<double>();
      for (double& e : v) e += e >= 0 ? in.gap : -in.gap;
      if (dtype == DType::f64) {
        t = from_vector<double>(v, in.shape, device);
      } else {
        t = from_vector<float>(std::vector<float>(v.begin(), v.end()), in.shape, device);
      }
    } else if (in.kind == OpInput::Kind::index) {
      t = randint(in.shape, in.range, g, DType::i64).to(device);
    } else {
      std::vector<int32_t> m = randint(in.shape, 2, g, DType::i32).to_vector<int32_t>();
      const int64_t cols = in.shape.back();
      for (size_t j = 0; j < m.size(); ++j) {
        if (static_cast<int64_t>(j) % cols == 0) m[j] = 0;  // every row keeps a key
      }
      t = from_vector<int32_t>(m, in.shape, device);
    }
    out.push_back(std::move(t));
  }
  return out;
}

// The row of an op of the unary list (kernels/unary_ops.h): its inputs and tolerance from its
// reference (tests/op_reference.h). An op without a reference gets a row with none, which the
// table's coverage test reports.
inline OpCase unary_row(OpKind kind, const std::string& name, TensorFn fn) {
  const std::vector<UnaryReference>& refs = unary_references();
  const auto it =
      std::find_if(refs.begin(), refs.end(), [&](const UnaryReference& r) { return name == r.op; });
  const UnaryReference r = it != refs.end() ? *it : UnaryReference{nullptr, nullptr};
  OpCase c{name,
           kind,
           {real({4, 7}, r.lo, r.hi, r.gap)},
           std::move(fn),
           r.smooth ? smooth_op_tol() : linear_op_tol()};
  if (r.value != nullptr) {
    c.formula = [value = r.value](const std::vector<Tensor>& x) {
      std::vector<double> y = x[0].to_vector<double>();
      for (double& e : y) e = value(e);
      return y;
    };
  }
  return c;
}

// The rows. Shapes are small (the gradcheck runs two forward passes per input element) and odd
// where that finds more bugs (edges, remainders).
inline std::vector<OpCase> op_table() {
  std::vector<OpCase> t;
  const GradcheckOptions lin = linear_op_tol(), smooth = smooth_op_tol();
  auto at = [](const std::vector<Tensor>& x, size_t i) { return x[i]; };
  // ---- Dense
  t.push_back({"linear with bias",
               OpKind::linear,
               {real({3, 5}), real({4, 5}), real({4})},
               [=](const std::vector<Tensor>& x) { return linear(at(x, 0), at(x, 1), at(x, 2)); },
               lin});
  t.push_back({"matmul",
               OpKind::matmul,
               {real({3, 4}), real({4, 5})},
               [=](const std::vector<Tensor>& x) { return matmul(at(x, 0), at(x, 1)); },
               lin});
  t.push_back({"bmm transposed b",
               OpKind::bmm,
               {real({2, 3, 4}), real({2, 5, 4})},
               [=](const std::vector<Tensor>& x) { return bmm(at(x, 0), at(x, 1), false, true); },
               lin});
  // ---- Convolutions, normalization, pooling
  t.push_back(
      {"conv2d 3x3 stride 2 pad 1 bias",
       OpKind::conv2d,
       {real({2, 3, 7, 6}), real({4, 3, 3, 3}), real({4})},
       [=](const std::vector<Tensor>& x) { return conv2d(at(x, 0), at(x, 1), at(x, 2), 2, 1); },
       lin});
  t.push_back({"conv_transpose2d 2x2 stride 2 bias",
               OpKind::conv_transpose2d,
               {real({2, 4, 3, 3}), real({4, 3, 2, 2}), real({3})},
               [=](const std::vector<Tensor>& x) {
                 return conv_transpose2d(at(x, 0), at(x, 1), at(x, 2), 2, 0, 0);
               },
               lin});
  t.push_back({"conv_transpose2d 3x3 stride 2 pad 1 output_padding 1",
               OpKind::conv_transpose2d,
               {real({1, 2, 4, 3}), real({2, 3, 3, 3})},
               [=](const std::vector<Tensor>& x) {
                 return conv_transpose2d(at(x, 0), at(x, 1), Tensor(), 2, 1, 1);
               },
               lin});
  t.push_back(
      {"batchnorm2d training",
       OpKind::batchnorm2d,
       {real({3, 2, 3, 4}), real({2}, 0.5, 1.5), real({2}), fixed({2}), fixed({2}, 0.5, 1.5)},
       [=](const std::vector<Tensor>& x) {
         // Fresh running statistics per call: the gradcheck calls it many times.
         Tensor rm = zeros({2}, x[0].dtype(), x[0].device()),
                rv = ones({2}, x[0].dtype(), x[0].device());
         return batchnorm2d(at(x, 0), at(x, 1), at(x, 2), rm, rv, true);
       },
       smooth});
  t.push_back({"max_pool2d 3x3 stride 2 pad 1",
               OpKind::max_pool2d,
               {real({2, 2, 7, 6})},
               // a small step: random neighbours may lie closer than linear_op_tol's 1e-2
               [=](const std::vector<Tensor>& x) { return max_pool2d(at(x, 0), 3, 2, 1); },
               GradcheckOptions()});
  t.push_back({"avg_pool2d 2x2 stride 2",
               OpKind::avg_pool2d,
               {real({2, 3, 6, 5})},
               [=](const std::vector<Tensor>& x) { return avg_pool2d(at(x, 0), 2, 2); },
               lin});
  t.push_back({"global_avg_pool",
               OpKind::global_avg_pool,
               {real({2, 3, 5, 4})},
               [=](const std::vector<Tensor>& x) { return global_avg_pool(at(x, 0)); },
               lin});
  t.push_back(
      {"upsample2x nearest",
       OpKind::upsample2x,
       {real({2, 3, 3, 4})},
       [=](const std::vector<Tensor>& x) { return upsample2x(at(x, 0), UpsampleMode::nearest); },
       lin});
  t.push_back(
      {"upsample2x bilinear",
       OpKind::upsample2x,
       {real({1, 2, 4, 3})},
       [=](const std::vector<Tensor>& x) { return upsample2x(at(x, 0), UpsampleMode::bilinear); },
       lin});
  // ---- Elementwise: the unary list's rows, then the others
#define REGEN_UNARY_ROW(name) \
  t.push_back(                \
      unary_row(OpKind::name, #name, [](const std::vector<Tensor>& x) { return name(x[0]); }));
  REGEN_UNARY_OPS(REGEN_UNARY_ROW)
#undef REGEN_UNARY_ROW
  t.push_back({"add broadcast over leading dims",
               OpKind::add,
               {real({3, 4, 5}), real({4, 5})},
               [=](const std::vector<Tensor>& x) { return add(at(x, 0), at(x, 1)); },
               lin});
  t.push_back({"mul",
               OpKind::mul,
               {real({3, 5}), real({3, 5})},
               [=](const std::vector<Tensor>& x) { return mul(at(x, 0), at(x, 1)); },
               lin});
  t.push_back({"scale",
               OpKind::scale,
               {real({6, 5})},
               [=](const std::vector<Tensor>& x) { return scale(at(x, 0), -2.5); },
               lin});
  t.push_back({"dropout p 0.3 (fixed seed)",
               OpKind::dropout,
               {real({5, 8})},
               [=](const std::vector<Tensor>& x) {
                 manual_seed(5);  // the same mask every call: seed 5, stream 1
                 return dropout(at(x, 0), 0.3f, true);
               },
               lin});
  // Element i is kept when its Philox word (seed 5, stream 1) is at least p 2^32, then scaled.
  t.back().formula = [](const std::vector<Tensor>& x) {
    const double p = 0.3f;
    std::vector<double> y = x[0].to_vector<double>();
    for (size_t i = 0; i < y.size(); ++i) {
      y[i] = philox_word(5, 1, i) >= static_cast<uint64_t>(p * 4294967296.0) ? y[i] / (1 - p) : 0;
    }
    return y;
  };
  // ---- Shapes
  t.push_back({"reshape",
               OpKind::reshape,
               {real({2, 6})},
               [=](const std::vector<Tensor>& x) {
                 return scale(reshape(at(x, 0), {3, 4}), 1.0);
               },
               lin});
  t.push_back({"transpose",
               OpKind::transpose,
               {real({2, 3, 4})},
               [=](const std::vector<Tensor>& x) { return transpose(at(x, 0), 0, 2); },
               lin});
  t.push_back({"permute",
               OpKind::permute,
               {real({2, 3, 4})},
               [=](const std::vector<Tensor>& x) {
                 return permute(at(x, 0), {1, 2, 0});
               },
               lin});
  t.push_back({"concat along dim 1 of three",
               OpKind::concat,
               {real({2, 3, 2}), real({2, 1, 2}), real({2, 4, 2})},
               [=](const std::vector<Tensor>& x) {
                 return concat({at(x, 0), at(x, 1), at(x, 2)}, 1);
               },
               lin});
  t.push_back({"split along the last dim (pieces concatenated back, one scaled)",
               OpKind::split,
               {real({3, 7})},
               [=](const std::vector<Tensor>& x) {
                 const std::vector<Tensor> p = split(at(x, 0), {2, 0, 5}, -1);
                 return concat({scale(p[2], 3.0), p[0]}, 1);
               },
               lin});
  t.push_back({"narrow along dim 0",
               OpKind::narrow,
               {real({5, 3})},
               [=](const std::vector<Tensor>& x) { return narrow(at(x, 0), 0, 1, 3); },
               lin});
  // ---- Sequence ops
  t.push_back({"embedding",
               OpKind::embedding,
               {index({3, 4}, 7), real({7, 5})},
               [=](const std::vector<Tensor>& x) { return embedding(at(x, 0), at(x, 1)); },
               lin});
  t.push_back(
      {"layernorm",
       OpKind::layernorm,
       {real({3, 6}), real({6}, 0.5, 1.5), real({6})},
       [=](const std::vector<Tensor>& x) { return layernorm(at(x, 0), at(x, 1), at(x, 2)); },
       smooth});
  // rmsnorm's reference: each row times 1/sqrt(mean of its squares + eps), times weight, in f64.
  // Rows of 40 (a warp per row on CUDA, a partial block of rows) and of 1100 (a block per row).
  auto rmsnorm_reference = [](const std::vector<Tensor>& x) {
    const std::vector<double> v = x[0].to_vector<double>(), w = x[1].to_vector<double>();
    std::vector<double> y(v.size());
    for (size_t r = 0; r < v.size() / w.size(); ++r) {
      double squares = 0;
      for (size_t j = 0; j < w.size(); ++j) squares += v[r * w.size() + j] * v[r * w.size() + j];
      const double rstd = 1 / std::sqrt(squares / static_cast<double>(w.size()) + 1e-6);
      for (size_t j = 0; j < w.size(); ++j) y[r * w.size() + j] = v[r * w.size() + j] * rstd * w[j];
    }
    return y;
  };
  for (int64_t cols : {40, 1100}) {
    const int64_t rows = cols == 40 ? 11 : 2;
    t.push_back({"rmsnorm " + std::to_string(rows) + "x" + std::to_string(cols),
                 OpKind::rmsnorm,
                 {real({rows, cols}), real({cols}, 0.5, 1.5)},
                 [=](const std::vector<Tensor>& x) { return rmsnorm(at(x, 0), at(x, 1), 1e-6); },
                 smooth});
    t.back().formula = rmsnorm_reference;
  }
  t.push_back({"softmax",
               OpKind::softmax,
               {real({3, 7}, -2, 2)},
               [=](const std::vector<Tensor>& x) { return softmax(at(x, 0)); },
               smooth});
  t.push_back({"attention causal, 2 heads",
               OpKind::attention,
               {real({2, 5, 12})},
               [=](const std::vector<Tensor>& x) { return attention(at(x, 0), 2, Tensor(), true); },
               smooth});
  t.push_back(
      {"attention with a key padding mask",
       OpKind::attention,
       {real({2, 4, 6}), mask({2, 4})},
       [=](const std::vector<Tensor>& x) { return attention(at(x, 0), 1, at(x, 1), false); },
       smooth});
  // The attention kernels take the score scale 1/sqrt(Dh) as a float (AttentionShape), in f64 too:
  // a relative error near 1e-8 in the scores, 3e-9 measured in the outputs and gradients.
  for (size_t r = t.size() - 2; r < t.size(); ++r) t[r].f64_rtol = 1e-8;
  t.push_back({"cross_entropy",
               OpKind::cross_entropy,
               {real({5, 6}, -2, 2), index({5}, 6)},
               [=](const std::vector<Tensor>& x) { return cross_entropy(at(x, 0), at(x, 1)); },
               smooth});
  t.push_back({"linear_cross_entropy in chunks of 2 rows",
               OpKind::linear_cross_entropy,
               {real({5, 4}), real({6, 4}), real({6}), index({5}, 6)},
               [=](const std::vector<Tensor>& x) {
                 return linear_cross_entropy(at(x, 0), at(x, 1), at(x, 2), at(x, 3), -100, 2);
               },
               smooth});
  t.push_back({"sum",
               OpKind::sum,
               {real({3, 4})},
               [=](const std::vector<Tensor>& x) { return sum(at(x, 0)); },
               lin});
  t.push_back({"mean",
               OpKind::mean,
               {real({3, 4})},
               [=](const std::vector<Tensor>& x) { return mean(at(x, 0)); },
               lin});
  // cast there and back through the other of f32 and f64 (f64 -> f32 -> f64 rounds each value to
  // f32 once; f32 -> f64 -> f32 is exact): two cast nodes whose gradients pass through unchanged.
  // The f64 gradcheck's steps (1e-2) move the f32 rounding by at most 2^-24 relative: a numerical
  // derivative within about 6e-6 of 1.
  {
    GradcheckOptions cast_tol = lin;
    cast_tol.atol = 1e-5;
    cast_tol.rtol = 1e-5;
    t.push_back({"cast to the other of f32 and f64 and back",
                 OpKind::cast,
                 {real({4, 5})},
                 [=](const std::vector<Tensor>& x) {
                   const DType d = at(x, 0).dtype();
                   return cast(cast(at(x, 0), d == DType::f64 ? DType::f32 : DType::f64), d);
                 },
                 cast_tol});
    t.back().f32_rtol = 0;
    t.back().f64_rtol = 0;
    t.back().formula = [](const std::vector<Tensor>& x) {
      std::vector<double> y = x[0].to_vector<double>();
      for (double& v : y) v = static_cast<double>(static_cast<float>(v));
      return y;
    };
  }
  // gather_shards over one rank (ZeRO-3's gather, autograd/sharded_parameters.h): a shard of 256
  // elements holds the whole (4, 60) parameter and 16 elements of padding; forward is the first 240
  // elements, backward their gradient with zeros in the padding. Two ranks: tests/test_mpi.cpp.
  {
    struct OneRank final : ShardCollectives {
      int rank() const override { return 0; }
      int ranks() const override { return 1; }
      int64_t scratch_elements(int64_t) const override { return 0; }
      void all_gather(DType, void*, int64_t) override {}
      void reduce_scatter_mean(DType dtype, void* data, void* out, int64_t chunk, void*) override {
        std::memmove(out, data, static_cast<size_t>(chunk) * dtype_size(dtype));
      }
    };
    static OneRank one_rank;
    t.push_back({"gather_shards of one rank",
                 OpKind::gather_shards,
                 {real({256})},
                 [=](const std::vector<Tensor>& x) {
                   return gather_shards(at(x, 0), {4, 60}, &one_rank);
                 },
                 lin});
    // A copy: bitwise in f64; in f32 the f64 inputs rounded once (f32's unit roundoff, 2^-24).
    t.back().f32_rtol = 0x1p-24;
    t.back().f64_rtol = 0;
    t.back().formula = [](const std::vector<Tensor>& x) {
      std::vector<double> y = x[0].to_vector<double>();
      y.resize(240);
      return y;
    };
  }
  return t;
}

// One row run forward and backward in `dtype` on `device`: its output and the gradients of its
// inputs marked `grad`, as doubles on the host, against a fixed cotangent (the same values for
// every dtype and device).
inline std::vector<double> as_doubles(const Tensor& t) {
  if (t.dtype() == DType::f64) return t.to_vector<double>();
  const std::vector<float> v = t.to_vector<float>();
  return std::vector<double>(v.begin(), v.end());
}
struct OpRun {
  std::vector<double> out;
  std::vector<std::vector<double>> grads;
};
inline OpRun run_op(const OpCase& c, DType dtype, Device device) {
  std::vector<Tensor> in = op_inputs(c, dtype, device);
  for (size_t i = 0; i < in.size(); ++i) {
    if (c.inputs[i].kind == OpInput::Kind::real && c.inputs[i].grad) in[i].set_requires_grad(true);
  }
  Tensor out = c.fn(in);
  OpRun r;
  r.out = as_doubles(out);
  if (c.differentiable) {
    Generator g(3);
    const std::vector<double> rv =
        c.formula ? uniform(out.shape(), -1.0, 1.0, g, DType::f64).to_vector<double>()
                  : stored(c.name, "cot").to_vector<double>();
    const Tensor R =
        dtype == DType::f64
            ? from_vector<double>(rv, out.shape(), device)
            : from_vector<float>(std::vector<float>(rv.begin(), rv.end()), out.shape(), device);
    Tape::current().backward(out, R);
    for (size_t i = 0; i < in.size(); ++i) {
      if (c.inputs[i].kind == OpInput::Kind::real && c.inputs[i].grad)
        r.grads.push_back(as_doubles(in[i].grad()));
    }
  }
  return r;
}

// a (f32, any device) against b (the CPU's f64): |a - b| <= rtol * (|b| + 1) everywhere.
inline void check_close(const std::string& what, const std::vector<double>& a,
                        const std::vector<double>& b, double rtol) {
  REQUIRE_MESSAGE(a.size() == b.size(), what, ": ", a.size(), " values against ", b.size());
  int64_t bad = 0, first = -1, worst = -1;
  double worst_ratio = 0;  // |a - b| / (|b| + 1), the error in units of rtol's scale
  for (size_t i = 0; i < a.size(); ++i) {
    const double ratio = std::fabs(a[i] - b[i]) / (std::fabs(b[i]) + 1);
    if (!(ratio <= rtol)) {  // NaN counts as a failure
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
    if (!(ratio <= worst_ratio)) {
      worst_ratio = ratio;
      worst = static_cast<int64_t>(i);
    }
  }
  auto at = [&](int64_t i) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%.17g against %.17g", a[static_cast<size_t>(i)],
                  b[static_cast<size_t>(i)]);
    return std::string(buf);
  };
  CHECK_MESSAGE(
      bad == 0, what, ": ", bad, " of ", a.size(), " values out of tolerance (rtol ", rtol,
      "), first at ", first, first >= 0 ? " (" + at(first) + ")" : std::string(),
      ", worst |a - b| / (|b| + 1) = ", worst_ratio,
      worst >= 0 ? " at " + std::to_string(worst) + " (" + at(worst) + ")" : std::string());
}

// Compares a row run in `dtype` on `device` with its reference: the output, and every gradient
// (against PyTorch's when stored; against the CPU's f64 run, when the reference is a formula and
// the run is not that f64 run itself).
inline void check_against_reference(const OpCase& c, DType dtype, Device device) {
  const std::string what = c.name + " (" + device.str() + " " + dtype_name(dtype) + ")";
  const double rtol = dtype == DType::f64 ? c.f64_rtol : c.f32_rtol;
  const OpRun got = run_op(c, dtype, device);
  if (c.formula) {
    check_close(what + ": output against its formula", got.out,
                c.formula(op_inputs(c, DType::f64, Device::cpu())), rtol);
    if (dtype == DType::f64 && device.is_cpu()) return;
    const OpRun ref = run_op(c, DType::f64, Device::cpu());
    REQUIRE(got.grads.size() == ref.grads.size());
    for (size_t i = 0; i < got.grads.size(); ++i) {
      check_close(what + ": gradient " + std::to_string(i) + " against the CPU's f64", got.grads[i],
                  ref.grads[i], rtol);
    }
    return;
  }
  check_close(what + ": output against PyTorch", got.out, as_doubles(stored(c.name, "out")), rtol);
  size_t k = 0;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (c.inputs[i].kind != OpInput::Kind::real || !c.inputs[i].grad || !c.differentiable) continue;
    REQUIRE(k < got.grads.size());
    check_close(what + ": gradient of input " + std::to_string(i) + " against PyTorch",
                got.grads[k++], as_doubles(stored(c.name, "grad" + std::to_string(i))), rtol);
  }
  CHECK(k == got.grads.size());
}

// The workspace requests of a row's f32 forward and backward on `device`, run for real or dry
// (tests/dry_paths.h): what a dry run of a step that uses the op counts as its scratch. The inputs
// come first; the cotangent, made after the forward, is no workspace.
inline ScratchEvents op_scratch_events(const OpCase& c, Device device, bool dry) {
  return scratch_events(device, dry, [&](const auto& begin) {
    std::vector<Tensor> in = op_inputs(c, DType::f32, device);
    for (size_t i = 0; i < in.size(); ++i) {
      if (c.inputs[i].kind == OpInput::Kind::real && c.inputs[i].grad)
        in[i].set_requires_grad(true);
    }
    begin();
    Tensor out = c.fn(in);
    if (c.differentiable) {
      Tape::current().backward(out, ones(out.shape(), DType::f32, device));
    } else {
      Tape::current().clear();  // nothing recorded outlives a dry run's allocator
    }
  });
}

// Every row of the op table, run dry on `device`, requests the scratch its real run requests;
// returns how many rows request any.
inline int check_op_table_dry_runs(Device device) {
  int with_scratch = 0;
  for (const OpCase& c : op_table()) {
    CAPTURE(c.name);
    const ScratchEvents real = op_scratch_events(c, device, false);
    const ScratchEvents dry = op_scratch_events(c, device, true);
    CHECK(dry.size() == real.size());
    CHECK(dry == real);
    if (!real.empty()) ++with_scratch;
  }
  return with_scratch;
}

}  // namespace regen::testing
