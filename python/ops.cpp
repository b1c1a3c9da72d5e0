// regen.ops: the differentiable ops a model is built from (autograd/ops.h), on regen.Tensors, with
// the scopes that name their nodes (regen.scope) and mark the planners' blocks (regen.block), and
// regen.tensor() to make a tensor from an array. An op records a node on the tape when one of its
// inputs requires grad (a parameter, or regen.tensor(..., requires_grad=True)), exactly as the same
// op called from C++ does: every byte backward reads is a SavedTensor the planners see.
// The unary element-wise ops are bound from their list (REGEN_UNARY_OPS, kernels/unary_ops.h), so
// an op added to the list is in regen.ops with no edit here; regen.ops.unary_names() lists them.
// So is every op its own file registers (REGEN_REGISTER_FUNCTION, autograd/functions.h);
// regen.ops.function_names() lists those.
// Tests: tests/python/test_models.py, tests/python/test_unary_ops.py.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "python/bindings.h"
#include "regen/autograd/functions.h"
#include "regen/autograd/ops.h"
#include "regen/autograd/ops_unary.h"

namespace regen::py {
namespace {

Tensor optional_tensor(const pb::object& t) {
  return t.is_none() ? Tensor() : t.cast<Tensor>();
}

UpsampleMode upsample_mode(const std::string& mode) {
  if (mode == "nearest") return UpsampleMode::nearest;
  REGEN_CHECK(mode == "bilinear", "upsample2x: mode must be 'nearest' or 'bilinear', got '", mode,
              "'");
  return UpsampleMode::bilinear;
}

// A `with` block around an RAII scope of regen's: entered at __enter__, left at __exit__.
template <class Scope>
class WithScope {
 public:
  explicit WithScope(std::function<std::unique_ptr<Scope>()> make) : make_(std::move(make)) {}
  void enter() {
    REGEN_CHECK(!scope_, "a scope can be entered once at a time");
    scope_ = make_();
  }
  void exit() { scope_.reset(); }

 private:
  std::function<std::unique_ptr<Scope>()> make_;
  std::unique_ptr<Scope> scope_;
};

template <class Scope>
void bind_scope(pb::module_& m, const char* cls, const char* doc) {
  pb::class_<WithScope<Scope>>(m, cls, doc)
      .def("__enter__",
           [](WithScope<Scope>& s) -> WithScope<Scope>& {
             s.enter();
             return s;
           })
      .def("__exit__", [](WithScope<Scope>& s, const pb::object&, const pb::object&,
                          const pb::object&) { s.exit(); });
}

// The docstring of unary op F, from its name in the list and what its node saves.
template <class F>
std::string unary_doc() {
  const std::string name = unary::name_of<F>::value;
  const char* saved = F::reads == unary::Reads::output ? "output" : "input";
  return "The element-wise op '" + name +
         "' of regen's unary op list (kernels/unary_ops.h), on float32 or float64 x; its node "
         "saves its " +
         saved + (unary::has_mask<F>::value ? ", or a 1-bit mask of it where packed" : "");
}

// Binds a registered function: its tensors, then its numbers, positionally or by name; a number
// left out takes its default.
void bind_function(pb::module_& ops, const OpFunction& f) {
  ops.def(
      f.name,
      [f](const pb::args& args, const pb::kwargs& kwargs) {
        const size_t nt = f.tensors.size(), nn = f.numbers.size();
        REGEN_CHECK(args.size() <= nt + nn, f.name, ": takes ", nt + nn, " arguments, got ",
                    args.size());
        std::vector<pb::object> given(nt + nn);
        for (size_t i = 0; i < args.size(); ++i) given[i] = args[i];
        for (const auto& kv : kwargs) {
          const std::string key = kv.first.cast<std::string>();
          size_t i = 0;
          while (i < nt + nn && key != (i < nt ? f.tensors[i] : f.numbers[i - nt].first)) ++i;
          REGEN_CHECK(i < nt + nn, f.name, ": no argument named '", key, "'");
          REGEN_CHECK(!given[i], f.name, ": argument '", key, "' given twice");
          given[i] = pb::reinterpret_borrow<pb::object>(kv.second);
        }
        std::vector<Tensor> tensors;
        for (size_t i = 0; i < nt; ++i) {
          REGEN_CHECK(given[i], f.name, ": missing argument '", f.tensors[i], "'");
          tensors.push_back(given[i].cast<Tensor>());
        }
        std::vector<double> numbers;
        for (size_t i = 0; i < nn; ++i) {
          numbers.push_back(given[nt + i] ? given[nt + i].cast<double>() : f.numbers[i].second);
        }
        return f.call(tensors, numbers);
      },
      f.doc);
}

}  // namespace

void bind_ops(pb::module_& m) {
  bind_scope<ModuleScope>(m, "_ModuleScope", "A module scope (regen.scope)");
  bind_scope<BlockScope>(m, "_BlockScope", "A block scope (regen.block)");
  bind_scope<NoGradScope>(m, "_NoGradScope", "Grad mode off (regen.no_grad)");
  m.def(
      "scope",
      [](const std::string& name) {
        return WithScope<ModuleScope>([name] { return std::make_unique<ModuleScope>(name); });
      },
      pb::arg("name"),
      "``with regen.scope('down0'):``: the nodes recorded inside are named under 'down0' "
      "(profiles, "
      "plans and memory reports show the path)");
  m.def(
      "block",
      [](const std::string& name) {
        return WithScope<BlockScope>([name] { return std::make_unique<BlockScope>(name); });
      },
      pb::arg("name") = "",
      "``with regen.block():``: the ops inside form one block, the unit of the blocks and sqrt "
      "planners and of dp's chain (a residual block, an encoder layer)");
  m.def(
      "no_grad",
      [] { return WithScope<NoGradScope>([] { return std::make_unique<NoGradScope>(); }); },
      "``with regen.no_grad():``: ops record nothing and no gradient flows");
  m.def(
      "tensor",
      [](const pb::object& array, bool requires_grad, const std::string& device) {
        Tensor t = tensor_from_numpy(array, "tensor");
        const Device d = Device::parse(device);
        if (!d.is_cpu()) t = t.to(d);
        if (requires_grad) {
          REGEN_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64,
                      "tensor: only float32 and float64 tensors can require grad, not ", t.dtype());
          t.set_requires_grad(true);
        }
        return t;
      },
      pb::arg("array"), pb::kw_only(), pb::arg("requires_grad") = false, pb::arg("device") = "cpu",
      "A new tensor with the values of a numpy array (float32, float64, int32 or int64), on "
      "``device``; with ``requires_grad``, ops on it record nodes and ``backward`` fills its "
      "``grad``");

  pb::module_ ops = m.def_submodule(
      "ops",
      "The differentiable ops a model is built from (regen's autograd/ops.h), on regen.Tensors. "
      "Shapes follow PyTorch's layouts: images (N, C, H, W), weights (out, in, ...).");
  ops.def(
      "linear",
      [](const Tensor& x, const Tensor& w, const pb::object& b) {
        return linear(x, w, optional_tensor(b));
      },
      pb::arg("x"), pb::arg("weight"), pb::arg("bias") = pb::none(),
      "x (..., in) @ weight (out, in)^T + bias (out)");
  ops.def("matmul", &matmul, pb::arg("a"), pb::arg("b"), "a (M, K) @ b (K, N)");
  ops.def("bmm", &bmm, pb::arg("a"), pb::arg("b"), pb::arg("trans_a") = false,
          pb::arg("trans_b") = false, "Batched matrix products (B, M, K) @ (B, K, N)");
  ops.def(
      "conv2d",
      [](const Tensor& x, const Tensor& w, const pb::object& b, int64_t stride, int64_t padding) {
        return conv2d(x, w, optional_tensor(b), stride, padding);
      },
      pb::arg("x"), pb::arg("weight"), pb::arg("bias") = pb::none(), pb::arg("stride") = 1,
      pb::arg("padding") = 0, "2-D convolution: x (N, C, H, W), weight (out, C, kh, kw)");
  ops.def(
      "conv_transpose2d",
      [](const Tensor& x, const Tensor& w, const pb::object& b, int64_t stride, int64_t padding,
         int64_t output_padding) {
        return conv_transpose2d(x, w, optional_tensor(b), stride, padding, output_padding);
      },
      pb::arg("x"), pb::arg("weight"), pb::arg("bias") = pb::none(), pb::arg("stride") = 1,
      pb::arg("padding") = 0, pb::arg("output_padding") = 0,
      "Transposed 2-D convolution: x (N, C, H, W), weight (C, out, kh, kw)");
  // Every unary op of the list, by the name the list gives it (relu, gelu, gelu_tanh, ...).
#define REGEN_BIND_UNARY(name)                                                         \
  ops.def(#name, static_cast<Tensor (*)(const Tensor&)>(&::regen::name), pb::arg("x"), \
          unary_doc<unary::name>().c_str());
  REGEN_UNARY_OPS(REGEN_BIND_UNARY)
#undef REGEN_BIND_UNARY
  ops.def(
      "unary_names",
      [] {
#define REGEN_UNARY_NAME(name) #name,
        return std::vector<std::string>{REGEN_UNARY_OPS(REGEN_UNARY_NAME)};
#undef REGEN_UNARY_NAME
      },
      "The names of the unary element-wise ops, in the order of regen's list "
      "(kernels/unary_ops.h); each is a function of regen.ops");
  ops.def("add", &add, pb::arg("a"), pb::arg("b"), "Element-wise a + b (the same shape)");
  ops.def("mul", &mul, pb::arg("a"), pb::arg("b"), "Element-wise a * b (the same shape)");
  ops.def("scale", &scale, pb::arg("x"), pb::arg("alpha"), "alpha * x");
  ops.def(
      "max_pool2d",
      [](const Tensor& x, int64_t kernel, const pb::object& stride, int64_t padding) {
        return max_pool2d(x, kernel, stride.is_none() ? kernel : stride.cast<int64_t>(), padding);
      },
      pb::arg("x"), pb::arg("kernel"), pb::arg("stride") = pb::none(), pb::arg("padding") = 0,
      "Max pooling (stride: the kernel's when None)");
  ops.def(
      "avg_pool2d",
      [](const Tensor& x, int64_t kernel, const pb::object& stride, int64_t padding) {
        return avg_pool2d(x, kernel, stride.is_none() ? kernel : stride.cast<int64_t>(), padding);
      },
      pb::arg("x"), pb::arg("kernel"), pb::arg("stride") = pb::none(), pb::arg("padding") = 0,
      "Average pooling (stride: the kernel's when None)");
  ops.def("global_avg_pool", &global_avg_pool, pb::arg("x"), "(N, C, H, W) -> (N, C, 1, 1)");
  ops.def("reshape", &reshape, pb::arg("x"), pb::arg("shape"),
          "A view with another shape (one dimension may be -1)");
  ops.def("flatten", &flatten, pb::arg("x"), pb::arg("start_dim") = 1,
          "Merges the dimensions from start_dim on");
  ops.def("transpose", &transpose, pb::arg("x"), pb::arg("dim0"), pb::arg("dim1"));
  ops.def("permute", &permute, pb::arg("x"), pb::arg("dims"),
          "The dimensions reordered (a copy): permute(x, [0, 2, 3, 1]) is NCHW -> NHWC");
  ops.def("concat", &concat, pb::arg("tensors"), pb::arg("dim"),
          "The tensors joined along dim (U-Net skips: concat([up, skip], 1))");
  ops.def("split", &split, pb::arg("x"), pb::arg("sizes"), pb::arg("dim"),
          "Pieces of the given sizes along dim");
  ops.def("narrow", &narrow, pb::arg("x"), pb::arg("dim"), pb::arg("start"), pb::arg("length"));
  ops.def(
      "upsample2x",
      [](const Tensor& x, const std::string& mode) { return upsample2x(x, upsample_mode(mode)); },
      pb::arg("x"), pb::arg("mode") = "nearest",
      "(N, C, H, W) -> (N, C, 2H, 2W), 'nearest' or 'bilinear' (align_corners=False)");
  ops.def("embedding", &embedding, pb::arg("ids"), pb::arg("weight"),
          "Rows of weight (num, dim) for integer ids");
  ops.def("layernorm", &layernorm, pb::arg("x"), pb::arg("gamma"), pb::arg("beta"),
          pb::arg("eps") = 1e-5, "Layer norm over the last dimension");
  ops.def("softmax", &softmax, pb::arg("x"), "Softmax over the last dimension");
  ops.def(
      "attention",
      [](const Tensor& qkv, int64_t heads, const pb::object& mask, bool causal, float dropout) {
        return attention(qkv, heads, optional_tensor(mask), causal, dropout);
      },
      pb::arg("qkv"), pb::arg("num_heads"), pb::arg("key_padding_mask") = pb::none(),
      pb::arg("causal") = false, pb::arg("dropout") = 0.0f,
      "Fused multi-head self-attention on packed (B, S, 3*D) projections -> (B, S, D)");
  ops.def("dropout", &dropout, pb::arg("x"), pb::arg("p"), pb::arg("training") = true,
          "Inverted dropout; its mask is replayed bit for bit when a plan recomputes it");
  ops.def("cross_entropy", &cross_entropy, pb::arg("logits"), pb::arg("targets"),
          pb::arg("ignore_index") = -100, "Mean cross-entropy of logits (N, C) against ids (N)");
  ops.def("sum", &sum, pb::arg("x"), "The sum of every element (a scalar)");
  ops.def("mean", &mean, pb::arg("x"), "The mean of every element (a scalar)");
  // Every op registered from its own file (autograd/functions.h).
  std::vector<std::string> names;
  for (const OpFunction& f : registered_functions()) {
    bind_function(ops, f);
    names.emplace_back(f.name);
  }
  ops.def(
      "function_names", [names] { return names; },
      "The ops bound from their own files' registration (REGEN_REGISTER_FUNCTION, regen's "
      "autograd/functions.h); each is a function of regen.ops");
}

}  // namespace regen::py
