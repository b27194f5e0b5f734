// Entry symbol of the "quant" plugin. Compiled into quant-objects with the components
// (one unit with them): the entry is weak there, so the tests that link several plugins' objects
// link; see trainrun_add_plugin_objects in the top-level CMakeLists.txt.
#include "quant.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("quant", "0.1.0",
                trainrun::v1::component<trainrun::v1::Precision, trainrun::quant::Nf4Precision>(
                    "quant-nf4", "frozen 4-bit NormalFloat base weights (QLoRA), blockwise absmax, "
                    "optional double quantization; fp32 elsewhere"),
                trainrun::v1::component<trainrun::v1::Precision, trainrun::quant::Int8Precision>(
                    "quant-int8", "frozen row-wise int8 base weights with LLM.int8() outlier "
                    "columns; fp32 elsewhere"))
