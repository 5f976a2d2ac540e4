// The device-neutral side of the fused optimizer updates and GradScaler's kernels: list checks,
// grouping by device and dtype, flat views of channels-last parameters, contiguous working copies.
#include "tandem/core/optim.h"

#include <algorithm>

#include "tandem/core/backend.h"
#include "tandem/core/kernel_checks.h"
#include "tandem/core/copy.h"

namespace tandem::kernels {

namespace {
// The tensors of one fused optimizer update that share a device and a parameter dtype, each
// dense in one element order per parameter: row-major, or flat views of a channels-last
// parameter whose gradient and state share its layout. A tensor in any other layout is updated
// through a row-major copy written back after.
struct UpdateGroup {
  UpdateTensors tensors;
  std::vector<std::pair<Tensor, Tensor>> write_back;  // (tensor, its contiguous working copy)
};

// A dense tensor as the 1-D run of memory it occupies (element order = memory order).
Tensor flat(const Tensor& t) { return t.as_strided({t.numel()}, {1}, t.offset()); }

void check_scalar_f32(const char* op, const char* what, const Tensor& t, const Tensor& p) {
  TANDEM_CHECK_AS(TypeError, t.dtype() == DType::f32 && t.dim() == 0, op, ": ", what,
                  " must be a 0-dim f32 tensor, got ", t.dtype(), " of shape ", shape_str(t.shape()));
  check_same_device(op, p, t);
}

// Checks the lists of a fused optimizer update and splits them by device and dtype.
std::vector<UpdateGroup> group_update(const char* op, const UpdateTensors& t, size_t roles, bool with_steps) {
  const size_t n = t.params.size();
  TANDEM_CHECK_AS(ValueError, t.grads.size() == n, op, ": ", n, " parameters but ", t.grads.size(), " gradients");
  TANDEM_CHECK_AS(ValueError, t.states.size() == roles, op, ": expected ", roles, " state lists, got ",
                  t.states.size());
  for (const std::vector<Tensor>& role : t.states) {
    TANDEM_CHECK_AS(ValueError, role.size() == n, op, ": ", n, " parameters but ", role.size(),
                    " state tensors in one of the state lists");
  }
  TANDEM_CHECK_AS(ValueError, !with_steps || t.steps.size() == n, op, ": ", n, " parameters but ", t.steps.size(),
                  " step counts");
  TANDEM_CHECK_AS(ValueError, t.masters.empty() || t.masters.size() == n, op, ": ", n, " parameters but ",
                  t.masters.size(), " master weights (give none or one per parameter)");
  TANDEM_CHECK_AS(ValueError, t.found_inf.defined() || !t.inv_scale.defined(), op,
                  ": inv_scale given without found_inf");
  std::vector<UpdateGroup> groups;
  for (size_t i = 0; i < n; ++i) {
    const Tensor& p = t.params[i];
    const Tensor& g = t.grads[i];
    check_floating(op, p);
    check_same_device(op, p, g);
    check_same_dtype(op, p, g);
    TANDEM_CHECK_AS(ValueError, g.shape() == p.shape(), op, ": gradient ", i, " has shape ", shape_str(g.shape()),
                    " but its parameter has shape ", shape_str(p.shape()));
    const DType state_dtype = optimizer_state_dtype(p.dtype());
    for (const std::vector<Tensor>& role : t.states) {
      const Tensor& s = role[i];
      check_same_device(op, p, s);
      TANDEM_CHECK_AS(TypeError, s.dtype() == state_dtype, op, ": state tensor ", i, " is ", s.dtype(), " but a ",
                      p.dtype(), " parameter keeps its state in ", state_dtype);
      TANDEM_CHECK_AS(ValueError, s.shape() == p.shape(), op, ": state tensor ", i, " has shape ",
                      shape_str(s.shape()), " but its parameter has shape ", shape_str(p.shape()));
      TANDEM_CHECK_AS(ValueError, layout_is_dense(s.shape(), s.strides()), op, ": state tensor ", i,
                      " must be dense (row-major, or in its parameter's layout), got strides ", shape_str(s.strides()));
    }
    if (with_steps) check_scalar_f32(op, "a step count", t.steps[i], p);
    Tensor master = t.masters.empty() ? Tensor() : t.masters[i];
    if (master.defined()) {
      check_same_device(op, p, master);
      const bool full = master.dtype() == DType::f32 && is_half(p.dtype());
      const bool low_halves = master.dtype() == DType::bf16 && p.dtype() == DType::bf16;
      TANDEM_CHECK_AS(TypeError, full || low_halves, op, ": master weight ", i, " is ", master.dtype(), " for a ",
                      p.dtype(), " parameter; master weights are f32, for f16 and bf16 parameters, or the low "
                      "halves of f32 masters in a bf16 tensor, for bf16 parameters");
      TANDEM_CHECK_AS(ValueError, master.shape() == p.shape() && layout_is_dense(master.shape(), master.strides()), op,
                      ": master weight ", i, " must be dense and of its parameter's shape ", shape_str(p.shape()));
    }
    if (t.found_inf.defined()) check_scalar_f32(op, "found_inf", t.found_inf, p);
    if (t.inv_scale.defined()) check_scalar_f32(op, "inv_scale", t.inv_scale, p);
    if (p.numel() == 0) continue;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const UpdateGroup& u) {
      return u.tensors.params[0].device() == p.device() && u.tensors.params[0].dtype() == p.dtype();
    });
    if (it == groups.end()) {
      UpdateGroup fresh;
      fresh.tensors.states.resize(roles);
      fresh.tensors.found_inf = t.found_inf;
      fresh.tensors.inv_scale = t.inv_scale;
      if (t.lr_on_device.defined() && t.lr_on_device.device() == p.device()) fresh.tensors.lr_on_device = t.lr_on_device;
      groups.push_back(std::move(fresh));
      it = groups.end() - 1;
    }
    UpdateTensors& out = it->tensors;
    // A parameter laid out densely but not row-major (channels-last) whose gradient, state and
    // master share its strides is updated in place through flat views: no copies.
    bool flat_update = !p.is_contiguous() && layout_is_dense(p.shape(), p.strides()) && g.strides() == p.strides() &&
                       (!master.defined() || master.strides() == p.strides());
    for (size_t k = 0; k < roles; ++k) flat_update = flat_update && t.states[k][i].strides() == p.strides();
    auto work_on = [&](const Tensor& x) {  // x itself, or a row-major copy written back after
      if (flat_update) return flat(x);
      Tensor work = contiguous(x);
      if (!work.is_same(x)) it->write_back.emplace_back(x, work);
      return work;
    };
    out.params.push_back(work_on(p));
    out.grads.push_back(flat_update ? flat(g) : contiguous(g));
    for (size_t k = 0; k < roles; ++k) out.states[k].push_back(work_on(t.states[k][i]));
    if (with_steps) out.steps.push_back(t.steps[i]);
    out.masters.push_back(master.defined() ? work_on(master) : master);
  }
  for (UpdateGroup& g : groups) {
    const auto& m = g.tensors.masters;
    if (std::none_of(m.begin(), m.end(), [](const Tensor& x) { return x.defined(); })) g.tensors.masters.clear();
  }
  return groups;
}

void finish_update(const UpdateGroup& group) {
  for (const auto& [param, work] : group.write_back) copy_(param, work);
}
}  // namespace

void sgd_step(const UpdateTensors& t, const SgdHyper& h) {
  const bool momentum = h.momentum != 0.0;
  TANDEM_CHECK_AS(ValueError, momentum || t.states.empty(), "sgd_step: momentum buffers given but the momentum is 0");
  TANDEM_CHECK_AS(ValueError, !h.nesterov || (h.momentum > 0.0 && h.dampening == 0.0),
                  "sgd_step: Nesterov momentum requires a momentum > 0 and zero dampening, got momentum ",
                  h.momentum, " and dampening ", h.dampening);
  for (const UpdateGroup& g : group_update("sgd_step", t, momentum ? 1 : 0, false)) {
    TANDEM_ROUTE(g.tensors.params[0].device(), sgd_step, g.tensors, h);
    finish_update(g);
  }
}

void adamw_step(const UpdateTensors& t, const AdamWHyper& h) {
  for (const UpdateGroup& g : group_update("adamw_step", t, 2, true)) {
    TANDEM_ROUTE(g.tensors.params[0].device(), adamw_step, g.tensors, h);
    finish_update(g);
  }
}

namespace {
void check_master_halves(const char* op, const Tensor& param, const Tensor& low_halves) {
  check_same_device(op, param, low_halves);
  TANDEM_CHECK_AS(TypeError, param.dtype() == DType::bf16 && low_halves.dtype() == DType::bf16, op,
                  ": the parameter and its master's low halves must both be bf16, got ", param.dtype(), " and ",
                  low_halves.dtype());
  TANDEM_CHECK_AS(ValueError, low_halves.shape() == param.shape(), op, ": the low halves have shape ",
                  shape_str(low_halves.shape()), " but the parameter has shape ", shape_str(param.shape()));
}
}  // namespace

Tensor join_master_halves(const Tensor& param, const Tensor& low_halves) {
  check_master_halves("join_master_halves", param, low_halves);
  Tensor master = empty(param.shape(), TensorOptions(DType::f32, param.device()));
  if (master.numel() == 0) return master;
  TANDEM_ROUTE(param.device(), join_master_halves, contiguous(param), contiguous(low_halves), master);
  return master;
}

void split_master_(const Tensor& master, const Tensor& param, const Tensor& low_halves) {
  const char* op = "split_master_";
  check_master_halves(op, param, low_halves);
  check_same_device(op, param, master);
  TANDEM_CHECK_AS(TypeError, master.dtype() == DType::f32, op, ": the master must be f32, got ", master.dtype());
  TANDEM_CHECK_AS(ValueError, master.shape() == param.shape(), op, ": the master has shape ",
                  shape_str(master.shape()), " but the parameter has shape ", shape_str(param.shape()));
  if (param.numel() == 0) return;
  Tensor high = contiguous(param), low = contiguous(low_halves);
  TANDEM_ROUTE(param.device(), split_master, contiguous(master), high, low);
  if (!high.is_same(param)) copy_(param, high);
  if (!low.is_same(low_halves)) copy_(low_halves, low);
}

void non_finite_check_and_unscale_(const std::vector<Tensor>& grads, const Tensor& found_inf, const Tensor& inv_scale) {
  const char* op = "non_finite_check_and_unscale_";
  // Grouped by device and dtype; gradients in a layout that is not dense go through a contiguous copy.
  std::vector<std::vector<Tensor>> groups;
  std::vector<std::pair<Tensor, Tensor>> write_back;
  for (const Tensor& g : grads) {
    check_floating(op, g);
    check_scalar_f32(op, "found_inf", found_inf, g);
    if (inv_scale.defined()) check_scalar_f32(op, "inv_scale", inv_scale, g);
    if (g.numel() == 0) continue;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const std::vector<Tensor>& u) {
      return u[0].device() == g.device() && u[0].dtype() == g.dtype();
    });
    if (it == groups.end()) it = groups.insert(groups.end(), std::vector<Tensor>());
    // A dense gradient in another order (channels-last) is checked and scaled as its flat run.
    Tensor work = layout_is_dense(g.shape(), g.strides()) && !g.is_contiguous() ? flat(g) : contiguous(g);
    if (!work.storage().is_same(g.storage()) && inv_scale.defined()) write_back.emplace_back(g, work);
    it->push_back(work);
  }
  for (const std::vector<Tensor>& group : groups) {
    TANDEM_ROUTE(group[0].device(), non_finite_check_and_unscale_, group, found_inf, inv_scale);
  }
  for (const auto& [grad, work] : write_back) copy_(grad, work);
}

void update_scale_(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf, double growth,
                   double backoff, int64_t growth_interval) {
  const char* op = "update_scale_";
  check_scalar_f32(op, "scale", scale, scale);
  check_scalar_f32(op, "found_inf", found_inf, scale);
  TANDEM_CHECK_AS(TypeError, growth_tracker.dtype() == DType::i32 && growth_tracker.dim() == 0, op,
                  ": growth_tracker must be a 0-dim i32 tensor, got ", growth_tracker.dtype());
  check_same_device(op, scale, growth_tracker);
  TANDEM_CHECK_AS(ValueError, growth > 1.0 && backoff > 0.0 && backoff < 1.0 && growth_interval >= 1, op,
                  ": expected growth > 1, 0 < backoff < 1 and growth_interval >= 1, got ", growth, ", ", backoff,
                  " and ", growth_interval);
  TANDEM_ROUTE(scale.device(), update_scale_, scale, growth_tracker, found_inf, growth, backoff, growth_interval);
}

}  // namespace tandem::kernels
