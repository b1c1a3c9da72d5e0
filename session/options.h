// A training session's options as library API. SessionOptions is what a person chooses (the regen
// command line's flags, regen.Model's keywords, or a program's own code): a registered model with
// its own options (models/model.h ModelInput), the optimizer, data, device and threads. validate()
// holds every range check once, for the command line and the Python module alike. Tests:
// tests/test_cli.cpp (through the tool and directly), tests/python/test_errors.py.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "regen/models/data.h"
#include "regen/models/evaluate.h"
#include "regen/models/optim.h"
#include "regen/models/train.h"
#include "regen/remat/plan/planner.h"

namespace regen {

struct SessionOptions {
  std::string model = "resnet-tiny";  // a registered model (model_preset_names())
  int64_t batch = 4;
  std::string device = "auto";  // auto, cpu, cuda, cuda:N
  // The model's own options that were given, by key ("image_size": 64): those of its
  // ModelInput::options; the others keep the preset's values.
  std::map<std::string, double> model_options;
  // The model's configuration given whole instead of its registered preset: a program's variant of
  // a registered model with sizes no option sets (other block counts, widths). Its name must be
  // `model`, whose build function and input serve it; model_options and the seed still apply.
  std::optional<ModelConfig> config;
  std::string optimizer = "sgd";  // sgd or adamw
  double lr = 0.1;
  double momentum = 0.9;  // SGD's
  double weight_decay = 0.0;
  uint64_t seed = 0;            // parameters, data and dropout
  int64_t threads = 0;          // CPU threads, at most kMaxThreads; 0: OpenMP's default
  std::string data;             // "": the model's first data kind (synthetic); else NAME[:ARG]
  std::string conv = "native";  // CUDA convolution: native or cudnn
  // CUDA math mode: fp32 or tf32; "" when not given (math_mode gives the default). `tf32` is the
  // same as math "tf32" (--tf32, regen.Model(tf32=True)).
  std::string math;
  bool tf32 = false;
  // The precision the run trains in (autograd/precision.h): fp32, tf32, bf16 or fp16; "" when not
  // given (resolve_precision gives the default: the math mode's fp32 or tf32). --precision,
  // precision=. fp32 and tf32 say what --math says (its synonyms, kept); bf16 and fp16 train under
  // autocast with f32 master weights, and fp16 scales the loss (models/train.h LossScale).
  // docs/precision.md.
  std::string precision;
  // ---- The training loop (models/train.h, models/schedule.h, models/evaluate.h) ----------------
  // Micro-batches per optimizer step (--accumulate): `batch` is the micro-batch, and each step's
  // gradients are those of the mean loss over batch * accumulate examples.
  int64_t accumulate = 1;
  // The learning-rate schedule (LrSchedule): constant, step or cosine, after `warmup_steps` of
  // linear warm-up; cosine decays to lr_min over schedule_steps steps (0: not set; the command line
  // sets it to --steps), step multiplies by lr_gamma every lr_step_size steps.
  std::string lr_schedule = "constant";
  int64_t warmup_steps = 0;
  int64_t schedule_steps = 0;
  int64_t lr_step_size = 0;
  double lr_gamma = 0.1;
  double lr_min = 0;
  double clip_grad_norm = 0;  // the global gradient norm clipped to this (0: no clipping)
  bool grad_norm = false;     // compute the gradient norm each step even without clipping (logs)
  // Evaluation on the held-out split: every eval_every optimizer steps (0: not during training),
  // at most eval_batches batches (0: the whole split) of eval_batch examples (0: batch *
  // accumulate). eval_split: the fraction of a text file held out at its end (0: 0.1 when
  // eval_every > 0, else none: the file trains whole).
  int64_t eval_every = 0;
  int64_t eval_batches = 0;
  int64_t eval_batch = 0;
  double eval_split = 0;
  // Data parallelism, when the process is one of several ranks under mpirun (dist/world.h): what
  // each rank keeps of the optimizer state and the gradients ("none"; "optimizer", ZeRO-1;
  // "gradients", ZeRO-2) and the size of a gradient bucket in bytes (DDP's 25 MiB by default).
  // A process alone ignores both. docs/distributed.md.
  std::string shard = "none";
  int64_t bucket_size = int64_t{25} << 20;
  // Packed saves (autograd/tape.h PackedSaves; docs/ops.md): an op whose backward needs only a few
  // bits of what it would save keeps those, packed, where nothing else saves the full tensor (relu
  // a 1-bit mask, max_pool2d its argmax in 4 bits for 3x3 windows). Training is bitwise the same
  // either way. --masks on|off, masks=True|False.
  bool masks = true;
  // Lossy compression of saved activations (remat/plan/compress.h): none, or bf16 or fp16, where
  // every plan holds the activations it retains narrow between their last forward use and backward
  // (training is then no longer bitwise that of none). Applies to steps run under a plan (a run
  // with --compress profiles and plans, policy none at least). --compress, compress=.
  std::string compress = "none";
  // CUDA graphs (remat/execute/cuda_graph.h; docs/memory.md, "One CUDA graph per step"): off,
  // on or auto. on: every step under a plan with a planned layout after the first is one replayed
  // graph, and a run whose steps cannot be captured is refused before its first step, naming why;
  // auto: captured where they can be, else uncaptured with the reason said once. --cuda-graph,
  // cuda_graph=.
  std::string cuda_graph = "off";
  // How messages name the options: --image-size (the command line) or image_size= (Python).
  OptionStyle style = OptionStyle::flag;

  static constexpr int64_t kMaxThreads = 1024;  // libgomp fails far above the cores any CPU has
  // The largest batch (and micro-batch, evaluation batch, global batch): 2^24 examples, far above
  // what any device holds for the smallest model, and small enough that counts derived from it
  // (examples x accumulation, batch x sizes of a sample) stay far from int64's limit and loops over
  // a batch's divisors end at once.
  static constexpr int64_t kMaxBatch = int64_t{1} << 24;
  // The range of a session option with one ("batch", "threads", "lr", "momentum",
  // "weight_decay", "bucket_size"); the command line's validators take theirs from here.
  static OptionRange range(const std::string& key);

  // Every value in range and the combination valid, for the registered model, without building
  // or reading anything: the session's own options, the model's options (only the model's, each
  // in its range), the data kind, the model's own checks of its configuration and batch. Throws
  // regen::Error naming the option as `style` says: "--threads must be at most 1024, got
  // 300000", "threads=300000: must be at most 1024".
  void validate() const;
  // The registered model's preset (or `config`) with the given options and the seed applied
  // (validates first).
  ModelConfig model_config() const;
  // The files `data` reads (models/data.h data_input_files; validates first): outputs are checked
  // against them, so that no run writes over its own training data.
  std::vector<std::string> data_files() const;
  // The option `key` as `style` names it.
  std::string name(const std::string& key) const { return option_name(key, style); }
  // The schedule these options give (validates the schedule's fields; schedule_steps must be set
  // for cosine).
  LrSchedule schedule() const;
  // The fraction of a text file held out for evaluation (eval_split, or its default).
  double holdout() const;
  // The evaluation batch size (eval_batch, or batch * accumulate).
  int64_t evaluation_batch() const;
  // The options against a run of `steps` optimizer steps in all (a resumed run's included): a
  // warm-up longer than the run, which would never reach the learning rate, is refused naming both
  // options as `style` says.
  void check_steps(int64_t steps) const;
};

// "auto": cuda:0 when regen was built with CUDA and a GPU is visible, else cpu. A device that is
// not there (or a CUDA runtime that fails) is a regen::Error naming the option as `style` says.
Device resolve_device(const std::string& text, OptionStyle style = OptionStyle::flag);

// The math mode a run on `device` uses, "fp32" or "tf32": `math` when given, tf32 for `tf32`, else
// `default_math` on a CUDA device and fp32 on the CPU (every CPU kernel is FP32). Throws
// regen::Error naming both options for tf32 with math fp32, naming the option for a math mode
// other than fp32 or tf32, and for tf32 asked of the CPU.
std::string math_mode(const std::string& math, bool tf32, Device device,
                      const std::string& default_math = "fp32",
                      OptionStyle style = OptionStyle::flag);
// With `o.precision` given, the math mode it implies (tf32 for tf32, else fp32).
std::string math_mode(const SessionOptions& o, Device device,
                      const std::string& default_math = "fp32");

// The precision a run on `device` trains in: `o.precision` when given, else the math mode's (fp32
// or tf32, as math_mode gives it with `default_math`). Throws regen::Error naming the options for
// a precision that is not one of fp32, tf32, bf16, fp16, for --precision beside a --math or --tf32
// that says otherwise (or beside bf16 and fp16, which have no math mode), for tf32 asked of the
// CPU, and for bf16 or fp16 on a CUDA device that lacks them (check_precision_capability).
Precision resolve_precision(const SessionOptions& o, Device device,
                            const std::string& default_math = "fp32");
// The precision of an estimate of one CPU training step (regen estimate, regen.estimate): as
// resolve_precision on the CPU, and refused, naming the option, where the estimate could not
// count what was asked: a CUDA convolution (conv), compression (a plan's, which the estimate does
// not make), or a mixed precision's closed forms (they count an fp32 step; `exact`, the dry run's
// terms, counts any).
Precision estimate_precision(const SessionOptions& o, bool exact);
// Throws regen::Error naming `setting`, the device and its compute capability major.minor when a
// CUDA device of that capability cannot train in `p`: bf16 needs 8.0 (Ampere) or later, fp16 7.0
// (Volta) or later; fp32 and tf32 pass (tf32's tensor cores are cuBLAS's and cuDNN's choice).
void check_precision_capability(Precision p, const std::string& setting, Device device, int major,
                                int minor);

// A budget as a person writes it ("60%", "2GiB"); empty text is refused ("leave it out to plan
// without a budget"), naming the option `key` as `style` says.
Budget parse_budget_option(const std::string& text, const std::string& key = "budget",
                           OptionStyle style = OptionStyle::flag);

}  // namespace regen
