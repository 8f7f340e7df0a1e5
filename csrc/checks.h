// Host-side argument checks and output allocation shared by the CPU and CUDA op bodies.
// megatron_gamma.ops validates the same conditions in Python with a message naming the fix;
// these checks guard direct calls of torch.ops.megatron_gamma.*.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <vector>

namespace megatron_gamma {

inline bool supported_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf || t == at::kDouble;
}

// fp64 inputs accumulate in fp64, everything else in fp32.
inline at::ScalarType acc_dtype(at::ScalarType t) {
  return t == at::kDouble ? at::kDouble : at::kFloat;
}

inline void check_same_device(const at::Tensor& a, const at::Tensor& b, const char* what) {
  TORCH_CHECK(a.device() == b.device(), what, ": tensors on different devices (", a.device(),
              " and ", b.device(), ")");
}

inline void check_rms_norm_inputs(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) >= 1, "rms_norm: x of shape ", x.sizes(),
              " has no hidden dimension to normalize");
  TORCH_CHECK(supported_dtype(x.scalar_type()), "rms_norm: unsupported dtype ", x.scalar_type(),
              " (supported: float32, bfloat16, float16, float64)");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), "rms_norm: weight of shape ",
              weight.sizes(), " does not match hidden size ", x.size(-1));
  TORCH_CHECK(supported_dtype(weight.scalar_type()), "rms_norm: unsupported weight dtype ",
              weight.scalar_type());
  TORCH_CHECK(std::isfinite(eps) && eps > 0, "rms_norm: eps must be finite and > 0, got ", eps);
  check_same_device(x, weight, "rms_norm");
}

inline void check_rms_norm_grad_inputs(const at::Tensor& dy, const at::Tensor& x,
                                       const at::Tensor& weight, const at::Tensor& rstd) {
  check_rms_norm_inputs(x, weight, 1.0);
  TORCH_CHECK(dy.sizes() == x.sizes(), "rms_norm backward: grad of shape ", dy.sizes(),
              " does not match x of shape ", x.sizes());
  TORCH_CHECK(dy.scalar_type() == x.scalar_type(), "rms_norm backward: grad dtype ",
              dy.scalar_type(), " differs from x dtype ", x.scalar_type());
  TORCH_CHECK(rstd.scalar_type() == acc_dtype(x.scalar_type()) &&
                  rstd.numel() * x.size(-1) == x.numel(),
              "rms_norm backward: rstd must hold one ", acc_dtype(x.scalar_type()),
              " per row, got ", rstd.sizes(), " ", rstd.scalar_type());
  check_same_device(dy, x, "rms_norm backward");
  check_same_device(rstd, x, "rms_norm backward");
}

// True for a headwise gate (g has o's shape without the last dimension), false for an
// elementwise gate (same shape); any other shape is an error.
inline bool check_gate_inputs(const at::Tensor& o, const at::Tensor& g) {
  TORCH_CHECK(o.dim() >= 1, "sigmoid_gate: o must have at least 1 dimension");
  TORCH_CHECK(supported_dtype(o.scalar_type()), "sigmoid_gate: unsupported dtype ",
              o.scalar_type(), " (supported: float32, bfloat16, float16, float64)");
  TORCH_CHECK(g.scalar_type() == o.scalar_type(), "sigmoid_gate: gate dtype ", g.scalar_type(),
              " differs from o dtype ", o.scalar_type());
  check_same_device(o, g, "sigmoid_gate");
  if (g.sizes() == o.sizes()) {
    return false;
  }
  TORCH_CHECK(g.sizes() == o.sizes().slice(0, o.dim() - 1), "sigmoid_gate: gate shape ",
              g.sizes(), " fits neither o ", o.sizes(), " (elementwise) nor o without its last "
              "dimension (headwise)");
  return true;
}

// Shape of the per-row statistics: x's shape without the hidden dimension.
inline std::vector<int64_t> row_shape(const at::Tensor& x) {
  return std::vector<int64_t>(x.sizes().begin(), x.sizes().end() - 1);
}

}  // namespace megatron_gamma
