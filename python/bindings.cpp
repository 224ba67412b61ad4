// pybind11 glue over the C ABI: raw-pointer entry points, DLPack capsule reading, and the planner
// (pure host code, exposed so that its choices are tested on machines without a GPU).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cctype>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "../src/plan.hpp"
#include "softlight/softlight.h"

namespace py = pybind11;

namespace {

// DLPack ABI (https://dmlc.github.io/dlpack/latest/), the parts a consumer reads.
struct DLDevice { int32_t device_type; int32_t device_id; };
struct DLDataType { uint8_t code; uint8_t bits; uint16_t lanes; };
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
struct DLPackVersion { uint32_t major; uint32_t minor; };
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned*);
  uint64_t flags;
  DLTensor dl_tensor;
};
constexpr uint64_t kDLPackReadOnly = 1;

// Reads a DLPack capsule without consuming it: the capsule's own destructor releases the tensor,
// and the caller keeps the producing array alive for as long as the pointer is used.
py::dict dlpack_view(py::capsule cap) {
  const char* name = cap.name();
  const DLTensor* t = nullptr;
  bool readonly = false;
  if (name && std::string(name) == "dltensor_versioned") {
    auto* m = static_cast<DLManagedTensorVersioned*>(cap.get_pointer());
    if (m->version.major != 1)
      throw py::value_error("unsupported DLPack major version " + std::to_string(m->version.major));
    t = &m->dl_tensor;
    readonly = (m->flags & kDLPackReadOnly) != 0;
  } else if (name && std::string(name) == "dltensor") {
    t = &static_cast<DLManagedTensor*>(cap.get_pointer())->dl_tensor;
  } else {
    throw py::type_error("not an unconsumed DLPack capsule (name: " + std::string(name ? name : "none") + ")");
  }
  py::tuple shape(t->ndim), strides(t->ndim);
  int64_t expected = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    shape[i] = t->shape[i];
    strides[i] = t->strides ? t->strides[i] : expected;  // no strides: C-contiguous
    expected *= t->shape[i];
  }
  py::dict d;
  d["ptr"] = reinterpret_cast<uintptr_t>(t->data) + t->byte_offset;
  d["shape"] = shape;
  d["strides"] = strides;
  d["dtype_code"] = int(t->dtype.code);
  d["dtype_bits"] = int(t->dtype.bits);
  d["dtype_lanes"] = int(t->dtype.lanes);
  d["device_type"] = int(t->device.device_type);
  d["device_id"] = int(t->device.device_id);
  d["readonly"] = readonly;
  return d;
}

softlight::DeviceInfo device(int cc_major, int cc_minor, int sm_count, int64_t smem_optin, int max_cluster) {
  softlight::DeviceInfo d;
  d.cc_major = cc_major;
  d.cc_minor = cc_minor;
  d.sm_count = sm_count;
  d.smem_per_block_optin = smem_optin;
  d.max_cluster = max_cluster;
  return d;
}

py::dict plan_dict(const softlight::Plan& r) {
  py::dict out;
  out["family"] = softlight::family_name(r.family);
  out["vec"] = r.vec;
  out["threads"] = r.threads;
  out["grid"] = r.grid;
  out["group"] = r.group;
  out["iters"] = r.iters;
  out["bounded"] = r.bounded;
  out["flat_rows"] = r.flat_rows;
  out["flat_spread"] = r.flat_spread;
  out["rows_per_lane"] = r.rows_per_lane;
  out["resident"] = r.resident;
  out["peel"] = r.peel;
  out["double_buffered"] = r.double_buffered;
  out["smem_bytes"] = r.smem_bytes;
  out["cluster"] = r.cluster;
  out["grid_exchange"] = r.grid_exchange;
  out["claim_rows"] = r.claim_rows;
  out["striped"] = r.striped;
  out["chunk_bytes"] = r.chunk_bytes;
  out["aux_slots"] = r.aux_slots;
  out["ring_slots"] = r.ring_slots;
  out["chunks_per_row"] = r.chunks_per_row;
  out["chunks_per_cta"] = r.chunks_per_cta;
  out["spill_chunks"] = r.spill_chunks;
  out["wait_last"] = r.wait_last;
  out["hints"] = r.hints;
  out["lanes"] = r.lanes;
  out["tiles"] = r.tiles;
  out["segment"] = r.segment;
  return out;
}

py::dict plan(int64_t rows, int64_t cols, int elem_bytes, bool aligned16, int cc_major,
              int cc_minor, int sm_count, int64_t smem_optin, int max_cluster, int cluster,
              int chunk_bytes, int threads, int hints, bool peelable, bool aligned8, int exchange, int claim, int iters,
              int64_t register_rows_bytes, bool flat16, int flat, int rows_per_lane, int peel_clusters,
              int register_cluster, int grid_rows, int item_chunks, int64_t spill_chunks, int stripe,
              bool rows128) {
  softlight::Problem p;
  p.rows = rows;
  p.cols = cols;
  p.elem_bytes = elem_bytes;
  p.aligned16 = aligned16;
  p.peelable = peelable;
  p.flat16 = flat16;
  p.aligned8 = aligned8 || aligned16;
  p.rows128 = rows128;
  const auto d = device(cc_major, cc_minor, sm_count, smem_optin, max_cluster);
  softlight::Overrides over{cluster, chunk_bytes, threads, hints};
  over.exchange = exchange;
  over.claim = claim;
  over.iters = iters;
  over.register_rows_bytes = register_rows_bytes;
  over.flat = flat;
  over.rows_per_lane = rows_per_lane;
  over.peel_clusters = peel_clusters;
  over.register_cluster = register_cluster;
  over.grid_rows = grid_rows;
  over.item_chunks = item_chunks;
  over.spill_chunks = spill_chunks;
  over.stripe = stripe;
  return plan_dict(softlight::plan_rows(p, d, over));
}

py::dict plan_axis(int64_t outer, int64_t dim, int64_t inner, int elem_bytes, bool rows, bool aligned16,
                   bool backward, int cc_major, int sm_count, int64_t smem_optin, int max_cluster,
                   bool tiles_aligned, int cluster, int exchange, int rows_per_lane) {
  softlight::AxisProblem p;
  p.outer = outer;
  p.dim = dim;
  p.inner = inner;
  p.elem_bytes = elem_bytes;
  p.rows = rows;
  p.aligned16 = aligned16;
  p.backward = backward;
  p.tiles_aligned = tiles_aligned;
  softlight::Overrides over;
  over.cluster = cluster;
  over.exchange = exchange;
  over.rows_per_lane = rows_per_lane;
  return plan_dict(softlight::plan_axis(p, device(cc_major, 0, sm_count, smem_optin, max_cluster),
                                        softlight::SplitOverrides{}, over));
}

// The tuning knobs the library reads from the environment at each call (SOFTLIGHT_<NAME>), by name
// in lower case.
py::dict env_knobs() {
  py::dict out;
  for (auto& [name, value] : softlight::knob_values(softlight::knobs_from_env())) {
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    out[py::str(name)] = value;
  }
  return out;
}

softlight_dtype as_dtype(int code) { return static_cast<softlight_dtype>(code); }

using Strides = std::array<int64_t, 3>;
const void* cptr(uintptr_t p) { return reinterpret_cast<const void*>(p); }
void* mptr(uintptr_t p) { return reinterpret_cast<void*>(p); }

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "softlight's C ABI, bound for Python (internal: use softlight.log_softmax)";
  m.def("version", &softlight_version);
  m.def("status_string", [](int s) { return std::string(softlight_status_string(static_cast<softlight_status>(s))); });
  m.def("dtype_size", [](int code) { return softlight_dtype_size(as_dtype(code)); });
  m.def(
      "forward",
      [](uintptr_t x, int64_t xs, uintptr_t y, int64_t ys, int64_t rows, int64_t cols, int dtype,
         uintptr_t stream, double temperature, uintptr_t lse) {
        const softlight_forward_options o{temperature, mptr(lse)};
        py::gil_scoped_release nogil;
        return static_cast<int>(softlight_log_softmax_forward_ex(cptr(x), xs, mptr(y), ys, rows, cols,
                                                                 as_dtype(dtype), &o, mptr(stream)));
      },
      py::arg("x"), py::arg("x_stride"), py::arg("y"), py::arg("y_stride"), py::arg("rows"),
      py::arg("cols"), py::arg("dtype"), py::arg("stream"), py::arg("temperature") = 1.0,
      py::arg("lse") = 0);
  m.def(
      "forward_cpu",
      [](uintptr_t x, int64_t xs, uintptr_t y, int64_t ys, int64_t rows, int64_t cols, int dtype,
         int threads, double temperature, uintptr_t lse) {
        const softlight_forward_options o{temperature, mptr(lse)};
        py::gil_scoped_release nogil;
        return static_cast<int>(softlight_log_softmax_forward_cpu_ex(cptr(x), xs, mptr(y), ys, rows, cols,
                                                                     as_dtype(dtype), &o, threads));
      },
      py::arg("x"), py::arg("x_stride"), py::arg("y"), py::arg("y_stride"), py::arg("rows"),
      py::arg("cols"), py::arg("dtype"), py::arg("threads") = 0, py::arg("temperature") = 1.0,
      py::arg("lse") = 0);
  // Any axis: extents (outer, dim, inner), strides per array as 3-tuples.
  m.def(
      "forward_3d",
      [](uintptr_t x, Strides xs, uintptr_t y, Strides ys, int64_t outer, int64_t dim, int64_t inner,
         int dtype, uintptr_t stream, double temperature, uintptr_t lse) {
        const softlight_forward_options o{temperature, mptr(lse)};
        py::gil_scoped_release nogil;
        return static_cast<int>(softlight_log_softmax_forward_3d(cptr(x), xs.data(), mptr(y), ys.data(), outer,
                                                                 dim, inner, as_dtype(dtype), &o, mptr(stream)));
      },
      py::arg("x"), py::arg("x_strides"), py::arg("y"), py::arg("y_strides"), py::arg("outer"),
      py::arg("dim"), py::arg("inner"), py::arg("dtype"), py::arg("stream"), py::arg("temperature") = 1.0,
      py::arg("lse") = 0);
  m.def(
      "forward_3d_cpu",
      [](uintptr_t x, Strides xs, uintptr_t y, Strides ys, int64_t outer, int64_t dim, int64_t inner,
         int dtype, int threads, double temperature, uintptr_t lse) {
        const softlight_forward_options o{temperature, mptr(lse)};
        py::gil_scoped_release nogil;
        return static_cast<int>(softlight_log_softmax_forward_3d_cpu(cptr(x), xs.data(), mptr(y), ys.data(), outer,
                                                                     dim, inner, as_dtype(dtype), &o, threads));
      },
      py::arg("x"), py::arg("x_strides"), py::arg("y"), py::arg("y_strides"), py::arg("outer"),
      py::arg("dim"), py::arg("inner"), py::arg("dtype"), py::arg("threads") = 0, py::arg("temperature") = 1.0,
      py::arg("lse") = 0);
  m.def(
      "backward_3d",
      [](uintptr_t dy, Strides dys, uintptr_t y, Strides ys, uintptr_t dx, Strides dxs, int64_t outer,
         int64_t dim, int64_t inner, int dtype, uintptr_t stream) {
        py::gil_scoped_release nogil;
        return static_cast<int>(softlight_log_softmax_backward_3d(cptr(dy), dys.data(), cptr(y), ys.data(), mptr(dx),
                                                                  dxs.data(), outer, dim, inner, as_dtype(dtype),
                                                                  mptr(stream)));
      },
      py::arg("dy"), py::arg("dy_strides"), py::arg("y"), py::arg("y_strides"), py::arg("dx"),
      py::arg("dx_strides"), py::arg("outer"), py::arg("dim"), py::arg("inner"), py::arg("dtype"),
      py::arg("stream"));
  m.def(
      "backward_3d_cpu",
      [](uintptr_t dy, Strides dys, uintptr_t y, Strides ys, uintptr_t dx, Strides dxs, int64_t outer,
         int64_t dim, int64_t inner, int dtype, int threads) {
        py::gil_scoped_release nogil;
        return static_cast<int>(softlight_log_softmax_backward_3d_cpu(cptr(dy), dys.data(), cptr(y), ys.data(),
                                                                      mptr(dx), dxs.data(), outer, dim, inner,
                                                                      as_dtype(dtype), threads));
      },
      py::arg("dy"), py::arg("dy_strides"), py::arg("y"), py::arg("y_strides"), py::arg("dx"),
      py::arg("dx_strides"), py::arg("outer"), py::arg("dim"), py::arg("inner"), py::arg("dtype"),
      py::arg("threads") = 0);
  m.def(
      "backward",
      [](uintptr_t dy, int64_t dys, uintptr_t y, int64_t ys, uintptr_t dx, int64_t dxs, int64_t rows,
         int64_t cols, int dtype, uintptr_t stream) {
        py::gil_scoped_release nogil;
        return static_cast<int>(softlight_log_softmax_backward(cptr(dy), dys, cptr(y), ys, mptr(dx), dxs, rows,
                                                               cols, as_dtype(dtype), mptr(stream)));
      },
      py::arg("dy"), py::arg("dy_stride"), py::arg("y"), py::arg("y_stride"), py::arg("dx"),
      py::arg("dx_stride"), py::arg("rows"), py::arg("cols"), py::arg("dtype"), py::arg("stream"));
  m.def(
      "backward_cpu",
      [](uintptr_t dy, int64_t dys, uintptr_t y, int64_t ys, uintptr_t dx, int64_t dxs, int64_t rows,
         int64_t cols, int dtype, int threads) {
        py::gil_scoped_release nogil;
        return static_cast<int>(softlight_log_softmax_backward_cpu(cptr(dy), dys, cptr(y), ys, mptr(dx), dxs,
                                                                   rows, cols, as_dtype(dtype), threads));
      },
      py::arg("dy"), py::arg("dy_stride"), py::arg("y"), py::arg("y_stride"), py::arg("dx"),
      py::arg("dx_stride"), py::arg("rows"), py::arg("cols"), py::arg("dtype"), py::arg("threads") = 0);
  m.def("dlpack_view", &dlpack_view, py::arg("capsule"));
  m.def("env_knobs", &env_knobs);
  m.def("plan_axis", &plan_axis, py::arg("outer"), py::arg("dim"), py::arg("inner"), py::arg("elem_bytes"),
        py::arg("rows"), py::arg("aligned16"), py::arg("backward"), py::arg("cc_major"), py::arg("sm_count"),
        py::arg("smem_optin"), py::arg("max_cluster"), py::arg("tiles_aligned") = false, py::arg("cluster") = 0,
        py::arg("exchange") = -1, py::arg("rows_per_lane") = -1);
  m.def("plan", &plan, py::arg("rows"), py::arg("cols"), py::arg("elem_bytes"), py::arg("aligned16"),
        py::arg("cc_major"), py::arg("cc_minor"), py::arg("sm_count"), py::arg("smem_optin"),
        py::arg("max_cluster"), py::arg("cluster") = 0, py::arg("chunk_bytes") = 0,
        py::arg("threads") = 0, py::arg("hints") = -1, py::arg("peelable") = false, py::arg("aligned8") = false,
        py::arg("exchange") = -1, py::arg("claim") = -1, py::arg("iters") = 0,
        py::arg("register_rows_bytes") = 0, py::arg("flat16") = false, py::arg("flat") = -1,
        py::arg("rows_per_lane") = -1, py::arg("peel_clusters") = -1,
        py::arg("register_cluster") = -1, py::arg("grid_rows") = -1, py::arg("item_chunks") = 0,
        py::arg("spill_chunks") = -1, py::arg("stripe") = -1, py::arg("rows128") = false);
}
