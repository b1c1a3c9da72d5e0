// Learning-rate schedules and gradient clipping of the training loop (Trainer, models/train.h),
// defined as PyTorch's schedulers define them, so that a run here and a run of torch.optim with the
// same weights and settings take the same learning rate at every step:
//   warm-up (W > 0 steps): lr(t) = base * (t + 1) / W for t < W, i.e. torch's
//     LinearLR(start_factor=1/W, end_factor=1, total_iters=W-1), reaching base at step W-1 (llm.c
//     warms up the same way); the schedule below then starts at step W, at its own step t - W
//     (torch's SequentialLR with milestones=[W]);
//   constant: base;
//   step: base * gamma^floor((t - W) / step_size) (torch's StepLR);
//   cosine: min + (base - min) * (1 + cos(pi * (t - W) / (T - W))) / 2 over a horizon of T steps
//     (torch's CosineAnnealingLR with T_max = T - W and eta_min = min, in its closed form), min
//     from step T on.
// Clipping scales every gradient by min(1, max_norm / (norm + 1e-6)), norm being the global L2
// norm of all gradients together (torch.nn.utils.clip_grad_norm_).
// Tests: tests/test_training.cpp (against torch 1.13's schedulers and clip_grad_norm_, from
// tools/make_training_reference.py's tests/data/training_reference.safetensors).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "regen/core/tensor.h"

namespace regen {

struct LrSchedule {
  enum class Kind { constant, step, cosine };
  Kind kind = Kind::constant;
  double base = 0.1;      // the optimizer's learning rate
  int64_t warmup = 0;     // W: steps of linear warm-up
  int64_t horizon = 0;    // T: cosine's total steps (warm-up included)
  int64_t step_size = 0;  // step: steps between decays (after the warm-up)
  double gamma = 0.1;     // step: factor per decay
  double min = 0;         // cosine: the final learning rate

  // The learning rate of optimizer step `t` (0-based). Throws regen::Error for a schedule whose
  // fields are out of range (check()).
  double at(int64_t t) const;
  // "" when the fields are usable, else what is wrong ("cosine needs a horizon of more steps than
  // its warm-up (T 10, W 10)").
  std::string problem() const;
};

const char* schedule_kind_name(LrSchedule::Kind k);
// "constant", "step" or "cosine"; throws regen::Error naming the text otherwise.
LrSchedule::Kind parse_schedule_kind(const std::string& text);

// The global L2 norm of the gradients of `params` (those that have one), computed on their device
// with per-tensor sums of squares in double (kernels' sum_squares) taken from the allocator in one
// block (category workspace, tag "grad_norm"). 0 when no parameter has a gradient.
double gradient_norm(const std::vector<Tensor>& params);
// The sum of the squares of the gradients' values (gradient_norm's square, before the root), and
// every gradient scaled by `coef`: the two halves of clipping, for a caller that reduces the sum
// across ranks in between (Trainer under ZeRO).
double gradient_sum_squares(const std::vector<Tensor>& params);
void scale_gradients(const std::vector<Tensor>& params, double coef);
// torch.nn.utils.clip_grad_norm_(params, max_norm): scales every gradient by
// max_norm / (norm + 1e-6) when that is below 1; returns the norm before clipping.
double clip_gradient_norm(const std::vector<Tensor>& params, double max_norm);

}  // namespace regen
