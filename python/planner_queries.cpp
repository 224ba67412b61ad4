// softlight._planner, a module of tuning builds alone (SOFTLIGHT_TUNING): the planner's answers for
// problems and device profiles given as dicts, so that the CPU tests check every plan
// (tests/test_planner.py), and the forced values of the tuning interface (src/planner/knobs.h). It
// reaches past the C ABI into the planner, which tuning builds export for it; the default _C does not.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "planner/plan.hpp"
#include "planner/softlight_tuning.h"

namespace py = pybind11;

namespace {

template <class T> T get(const py::dict& d, const char* key, T fallback) {
  return d.contains(key) ? d[key].cast<T>() : fallback;
}

softlight::DeviceInfo device_of(const py::dict& d) {
  softlight::DeviceInfo dev;
  dev.cc_major = get<int>(d, "cc_major", 9);
  dev.cc_minor = get<int>(d, "cc_minor", 0);
  dev.sm_count = get<int>(d, "sm_count", 132);
  dev.smem_per_block_optin = get<int64_t>(d, "smem_optin", 232448);
  dev.max_cluster = get<int>(d, "max_cluster", dev.cc_major >= 9 ? 16 : 0);
  return dev;
}

// Forced values by knob name (src/planner/knobs.h), from a dict; an unknown name is an error.
softlight::Tuning tuning_of(const py::dict& d) {
  softlight::Tuning t;
  for (const auto& item : d) {
    const std::string key = py::str(item.first);
    bool found = false;
#define SOFTLIGHT_READ_KNOB(name, type, unset)  \
  if (key == #name) {                           \
    t.name = item.second.cast<type>();          \
    found = true;                               \
  }
    SOFTLIGHT_KNOBS(SOFTLIGHT_READ_KNOB)
#undef SOFTLIGHT_READ_KNOB
    if (!found) throw py::key_error("no forced value named " + key);
  }
  return t;
}

py::dict plan_dict(const softlight::Plan& r) {
  py::dict out;
  out["family"] = softlight::family_name(r.family);
  out["vec"] = r.vec;
  out["threads"] = r.threads;
  out["grid"] = r.grid;
  out["group"] = r.warp.group;
  out["iters"] = r.warp.iters;
  out["bounded"] = r.warp.bounded;
  out["flat_rows"] = r.warp.flat_rows;
  out["flat_spread"] = r.warp.flat_spread;
  out["rows_per_lane"] = r.warp.rows_per_lane;
  out["resident"] = r.resident;
  out["peel"] = r.peel;
  out["double_buffered"] = r.ring.double_buffered;
  out["smem_bytes"] = r.smem_bytes;
  out["cluster"] = r.cluster;
  out["grid_exchange"] = r.ring.grid_exchange;
  out["claim_rows"] = r.ring.claim_rows;
  out["striped"] = r.ring.striped;
  out["chunk_bytes"] = r.ring.chunk_bytes;
  out["aux_slots"] = r.ring.aux_slots;
  out["ring_slots"] = r.ring.ring_slots;
  out["chunks_per_row"] = r.ring.chunks_per_row;
  out["chunks_per_cta"] = r.ring.chunks_per_cta;
  out["spill_chunks"] = r.ring.spill_chunks;
  out["wait_last"] = r.ring.wait_last;
  out["hints"] = r.ring.hints;
  out["lanes"] = r.axis.lanes;
  out["tiles"] = r.axis.tiles;
  out["segment"] = r.segment;
  return out;
}

// A rows problem: rows, cols, elem_bytes and the layout flags of softlight::Problem (aligned16,
// aligned8, rows128, peelable, flat16; false where absent).
softlight::Problem rows_of(const py::dict& problem) {
  softlight::Problem p;
  p.rows = problem["rows"].cast<int64_t>();
  p.cols = problem["cols"].cast<int64_t>();
  p.elem_bytes = problem["elem_bytes"].cast<int>();
  p.aligned16 = get<bool>(problem, "aligned16", false);
  p.aligned8 = get<bool>(problem, "aligned8", false) || p.aligned16;
  p.rows128 = get<bool>(problem, "rows128", false);
  p.peelable = get<bool>(problem, "peelable", false);
  p.flat16 = get<bool>(problem, "flat16", false);
  return p;
}
// The plan of a forward over rows.
py::dict plan_rows(const py::dict& problem, const py::dict& device, const py::dict& forced) {
  return plan_dict(softlight::plan_rows(rows_of(problem), device_of(device), tuning_of(forced)));
}

// The plan of a consumer of the log-sum-exp: the rows problem of plan_rows (the log-softmax of x into
// the consumer's output) and cross_entropy, writes_grad, label_smoothing and asks_sum (false where
// absent).
py::dict plan_consumer(const py::dict& problem, const py::dict& device, const py::dict& forced) {
  softlight::ConsumerProblem p;
  p.rows = rows_of(problem);
  p.cross_entropy = get<bool>(problem, "cross_entropy", false);
  p.writes_grad = get<bool>(problem, "writes_grad", false);
  p.label_smoothing = get<bool>(problem, "label_smoothing", false);
  p.asks_sum = get<bool>(problem, "asks_sum", false);
  return plan_dict(softlight::plan_consumer(p, device_of(device), tuning_of(forced)));
}

// The plan of any other call: outer, dim, inner, elem_bytes and the flags of softlight::AxisProblem.
py::dict plan_axis(const py::dict& problem, const py::dict& device, const py::dict& forced) {
  softlight::AxisProblem p;
  p.outer = problem["outer"].cast<int64_t>();
  p.dim = problem["dim"].cast<int64_t>();
  p.inner = get<int64_t>(problem, "inner", 1);
  p.elem_bytes = problem["elem_bytes"].cast<int>();
  p.rows = get<bool>(problem, "rows", p.inner == 1);
  p.aligned16 = get<bool>(problem, "aligned16", false);
  p.backward = get<bool>(problem, "backward", false);
  p.tiles_aligned = get<bool>(problem, "tiles_aligned", false);
  return plan_dict(softlight::plan_axis(p, device_of(device), tuning_of(forced)));
}

// Forces values on this thread's later calls (an empty dict: none); SOFTLIGHT_ERROR_INVALID_ARGUMENT
// (11) where one is out of its range.
int force(const py::dict& forced) {
  if (forced.empty()) return softlight_tuning_force(nullptr);
  softlight_tuning t;
  std::vector<std::string> names;
#define SOFTLIGHT_FORCE_KNOB(name, type, unset) \
  t.name = get<int64_t>(forced, #name, -1);     \
  names.push_back(#name);
  SOFTLIGHT_KNOBS(SOFTLIGHT_FORCE_KNOB)
#undef SOFTLIGHT_FORCE_KNOB
  for (const auto& item : forced) {
    const std::string key = py::str(item.first);
    if (std::find(names.begin(), names.end(), key) == names.end()) throw py::key_error("no forced value named " + key);
  }
  return softlight_tuning_force(&t);
}

}  // namespace

PYBIND11_MODULE(_planner, m) {
  m.doc() = "softlight's planner queries and tuning interface (tuning builds only; for tests and tuning)";
  m.def("plan_rows", &plan_rows, py::arg("problem"), py::arg("device") = py::dict(), py::arg("forced") = py::dict());
  m.def("plan_consumer", &plan_consumer, py::arg("problem"), py::arg("device") = py::dict(),
        py::arg("forced") = py::dict());
  m.def("plan_axis", &plan_axis, py::arg("problem"), py::arg("device") = py::dict(), py::arg("forced") = py::dict());
  m.def("tuning_valid", [](const py::dict& forced) { return softlight::tuning_valid(tuning_of(forced)); });
  m.def("force", &force);
}
