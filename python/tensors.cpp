// Tensors across the boundary: regen.Tensor exposes a CPU tensor's memory through the buffer
// protocol (np.asarray(t) is a view that keeps the tensor alive); .numpy() copies, from any
// device. Arrays coming in are copied into new CPU tensors. safetensors files load and save as
// dicts of arrays. f16 tensors are NumPy's float16 both ways; NumPy has no bfloat16, so a bf16
// tensor comes out of .numpy() as float32 (exactly: every bf16 value is an f32 one) and shares no
// memory.
#include <algorithm>
#include <cstring>

#include "python/bindings.h"
#include "regen/autograd/ops.h"
#include "regen/core/safetensors.h"
#include "regen/core/tensor.h"

namespace regen::py {
namespace {

pb::dtype numpy_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return pb::dtype::of<float>();
    case DType::f64:
      return pb::dtype::of<double>();
    case DType::i32:
      return pb::dtype::of<int32_t>();
    case DType::i64:
      return pb::dtype::of<int64_t>();
    case DType::f16:
      return pb::dtype("float16");
    case DType::bf16:
      return pb::dtype::of<float>();  // tensor_to_numpy widens it
  }
  REGEN_FAIL("unknown dtype");
}

std::string format_of(DType t) {
  switch (t) {
    case DType::f32:
      return pb::format_descriptor<float>::format();
    case DType::f64:
      return pb::format_descriptor<double>::format();
    case DType::i32:
      return pb::format_descriptor<int32_t>::format();
    case DType::i64:
      return pb::format_descriptor<int64_t>::format();
    case DType::f16:
      return "e";  // the buffer protocol's half float
    case DType::bf16:
      break;
  }
  REGEN_FAIL("a bf16 tensor shares no memory with NumPy, which has no bfloat16: .numpy() copies ",
             "it as float32");
}

const char* dtype_text(DType t) {
  switch (t) {
    case DType::f32:
      return "float32";
    case DType::f64:
      return "float64";
    case DType::i32:
      return "int32";
    case DType::i64:
      return "int64";
    case DType::f16:
      return "float16";
    case DType::bf16:
      return "bfloat16";
  }
  return "?";
}

std::vector<pb::ssize_t> contiguous_strides(const Shape& shape, size_t item) {
  std::vector<pb::ssize_t> strides(shape.size());
  pb::ssize_t s = static_cast<pb::ssize_t>(item);
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= static_cast<pb::ssize_t>(shape[i]);
  }
  return strides;
}

template <class T>
bool copy_if(const pb::array& a, DType dt, Tensor& out) {
  if (!pb::isinstance<pb::array_t<T>>(a)) return false;
  // Same dtype: forcecast changes only the layout (to C order).
  auto c = pb::array_t<T, pb::array::c_style | pb::array::forcecast>::ensure(a);
  // ensure() answers null (the Python error cleared) when numpy cannot make the copy: a view that
  // broadcasts a few values over a huge shape needs all of its bytes.
  REGEN_CHECK(c, "cannot copy the ", pb::str(pb::tuple(a.attr("shape"))).cast<std::string>(),
              " array to C order: numpy could not allocate its ",
              format_bytes(static_cast<int64_t>(
                  std::min<double>(static_cast<double>(a.size()) * sizeof(T), 9.2e18))));
  Shape shape(static_cast<size_t>(c.ndim()));
  for (size_t i = 0; i < shape.size(); ++i)
    shape[i] = static_cast<int64_t>(c.shape(static_cast<pb::ssize_t>(i)));
  out = empty(shape, dt, Device::cpu());
  if (out.nbytes() > 0) std::memcpy(out.raw_data(), c.data(), out.nbytes());
  return true;
}

}  // namespace

pb::array tensor_to_numpy(const Tensor& t) {
  REGEN_CHECK(t.defined(), "the tensor is undefined");
  REGEN_CHECK(t.has_storage(), "tensor ", t.name().empty() ? t.str() : "'" + t.name() + "'",
              " has no storage (evicted by a plan?)");
  if (t.dtype() == DType::bf16) return tensor_to_numpy(t.to(DType::f32));
  std::vector<pb::ssize_t> shape(t.shape().begin(), t.shape().end());
  pb::array out(numpy_dtype(t.dtype()), shape);
  if (t.nbytes() > 0)
    copy_bytes(out.mutable_data(), Device::cpu(), t.raw_data(), t.device(), t.nbytes());
  return out;
}

Tensor tensor_from_numpy(const pb::handle& obj, const std::string& what) {
  if (pb::isinstance<Tensor>(obj)) {
    const Tensor& t = obj.cast<const Tensor&>();
    return t.device().is_cpu() ? t : t.to(Device::cpu());
  }
  REGEN_CHECK(pb::isinstance<pb::array>(obj), what, " is a ",
              pb::str(pb::type::handle_of(obj).attr("__name__")).cast<std::string>(),
              ", not a numpy array or regen.Tensor");
  const pb::array a = pb::reinterpret_borrow<pb::array>(obj);
  Tensor out;
  if (copy_if<float>(a, DType::f32, out) || copy_if<double>(a, DType::f64, out) ||
      copy_if<int32_t>(a, DType::i32, out) || copy_if<int64_t>(a, DType::i64, out)) {
    return out;
  }
  if (a.dtype().is(pb::dtype("float16"))) {
    // No C++ type of pybind11's stands for float16: the bytes, in C order, are copied as they are.
    const pb::array c = pb::module_::import("numpy").attr("ascontiguousarray")(a);
    Shape shape(static_cast<size_t>(c.ndim()));
    for (size_t i = 0; i < shape.size(); ++i)
      shape[i] = static_cast<int64_t>(c.shape(static_cast<pb::ssize_t>(i)));
    out = empty(shape, DType::f16, Device::cpu());
    if (out.nbytes() > 0) std::memcpy(out.raw_data(), c.data(), out.nbytes());
    return out;
  }
  REGEN_FAIL(what, " has numpy dtype ", pb::str(a.dtype()).cast<std::string>(),
             "; regen tensors are float32, float64, float16, int32 or int64 (convert it with "
             ".astype)");
}

void bind_tensors(pb::module_& m) {
  pb::class_<Tensor>(m, "Tensor", pb::buffer_protocol(), R"doc(
A regen tensor (a parameter, a gradient, a buffer). On the CPU it exposes its memory through the
buffer protocol: ``np.asarray(t)`` is a view of the tensor (writes go to the tensor) that keeps it
alive. ``t.numpy()`` returns a copy, from any device.)doc")
      .def_buffer([](const Tensor& t) -> pb::buffer_info {
        REGEN_CHECK(t.device().is_cpu(), "tensor ", t.str(), " is on ", t.device().str(),
                    ": only CPU tensors share their memory; copy it with .numpy()");
        REGEN_CHECK(t.has_storage(), "tensor ", t.str(), " has no storage (evicted by a plan?)");
        const size_t item = dtype_size(t.dtype());
        std::vector<pb::ssize_t> shape(t.shape().begin(), t.shape().end());
        return pb::buffer_info(t.raw_data(), static_cast<pb::ssize_t>(item), format_of(t.dtype()),
                               static_cast<pb::ssize_t>(shape.size()), shape,
                               contiguous_strides(t.shape(), item));
      })
      .def_property_readonly("shape",
                             [](const Tensor& t) {
                               pb::tuple out(t.shape().size());
                               for (size_t i = 0; i < t.shape().size(); ++i) out[i] = t.shape()[i];
                               return out;
                             })
      .def_property_readonly(
          "dtype", [](const Tensor& t) { return dtype_text(t.dtype()); },
          "'float32', 'float64', 'int32', 'int64', 'float16' or 'bfloat16'")
      .def_property_readonly("device", [](const Tensor& t) { return t.device().str(); })
      .def_property_readonly("name", [](const Tensor& t) { return t.name(); })
      .def_property_readonly("numel", &Tensor::numel)
      .def_property_readonly("nbytes", &Tensor::nbytes)
      .def_property_readonly("requires_grad", &Tensor::requires_grad)
      .def_property_readonly(
          "grad",
          [](const Tensor& t) -> pb::object {
            const Tensor g = t.grad();
            return g.defined() ? pb::cast(g) : pb::none();
          },
          "The gradient (a Tensor) or None")
      .def(
          "__add__", [](const Tensor& a, const Tensor& b) { return add(a, b); }, pb::is_operator(),
          "regen.ops.add")
      .def(
          "__mul__", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, pb::is_operator(),
          "regen.ops.mul")
      .def(
          "__matmul__", [](const Tensor& a, const Tensor& b) { return matmul(a, b); },
          pb::is_operator(), "regen.ops.matmul")
      .def(
          "backward", [](const Tensor& loss) { backward(loss); },
          "Backward from this scalar: fills the grad of every tensor that requires grad and that "
          "it depends on (parameters accumulate), then clears the tape")
      .def("numpy", &tensor_to_numpy,
           "A copy as a new numpy array (CUDA tensors are copied to the host)")
      .def("__repr__", [](const Tensor& t) {
        return "regen.Tensor(" + (t.name().empty() ? std::string() : "'" + t.name() + "', ") +
               t.str() + ")";
      });

  m.def(
      "save_safetensors",
      [](const std::string& path, const pb::dict& tensors, const pb::object& metadata) {
        std::vector<std::pair<std::string, Tensor>> list;
        for (const auto& [k, v] : tensors) {
          REGEN_CHECK(pb::isinstance<pb::str>(k), "save_safetensors: the keys must be names (str)");
          const std::string name = k.cast<std::string>();
          list.emplace_back(name, tensor_from_numpy(v, "save_safetensors: tensor '" + name + "'"));
        }
        std::map<std::string, std::string> meta;
        if (!metadata.is_none()) {
          for (const auto& [k, v] : metadata.cast<pb::dict>()) {
            REGEN_CHECK(pb::isinstance<pb::str>(k) && pb::isinstance<pb::str>(v),
                        "save_safetensors: metadata maps str to str");
            meta[k.cast<std::string>()] = v.cast<std::string>();
          }
        }
        check_write("save_safetensors(" + path_text(path) + ")", path);
        save_safetensors(path, list, meta);
      },
      pb::arg("path"), pb::arg("tensors"), pb::arg("metadata") = pb::none(),
      "Writes a dict of arrays (or Tensors) to a safetensors file, atomically. The names must be "
      "unique and not empty; metadata maps str to str.");
  m.def(
      "load_safetensors",
      [](const std::string& path) {
        SafetensorsFile f = load_safetensors(path);
        pb::dict tensors;
        for (const auto& [name, t] : f.tensors) tensors[pb::str(name)] = tensor_to_numpy(t);
        return pb::make_tuple(tensors, f.metadata);
      },
      pb::arg("path"),
      "Reads a safetensors file, fully validated: (dict name -> numpy array, metadata dict).");
}

}  // namespace regen::py
