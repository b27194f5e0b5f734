// Entry symbol of the "precision" plugin. Compiled into precision-objects with the components
// (one unit with them): the entry is weak there, so the tests that link several plugins' objects
// link; see trainrun_add_plugin_objects in the top-level CMakeLists.txt.
#include "precision.hpp"
#include "mixed.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("precision", "0.2.0",
                trainrun::v1::component<trainrun::v1::Precision,
                                        trainrun::plugins::Fp32Precision>(
                    "fp32", "float32 weights and compute; skips steps with non-finite gradients"),
                trainrun::v1::component<trainrun::v1::Precision, trainrun::plugins::Bf16Mixed>(
                    "bf16-mixed", "autocast to bfloat16 for matmul-class ops; float32 weights, "
                    "gradients and optimizer state; no loss scaling"),
                trainrun::v1::component<trainrun::v1::Precision, trainrun::plugins::Bf16True>(
                    "bf16-true", "bfloat16 weights and gradients; the optimizer keeps float32 "
                    "master weights and state"),
                trainrun::v1::component<trainrun::v1::Precision, trainrun::plugins::Fp16Mixed>(
                    "fp16-mixed", "dynamic loss scaling (DeepSpeed semantics); float16 autocast "
                    "on CUDA; on CPU the compute stays float32 (no float16 kernels)"),
                trainrun::v1::component<trainrun::v1::Precision, trainrun::plugins::AutoPrecision>(
                    "auto", "bf16-mixed where the CPU computes bfloat16 natively, else fp32; "
                    "prints the choice"))
