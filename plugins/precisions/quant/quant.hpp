#pragma once
// Weight quantization kernels and the precision components `quant-nf4` and `quant-int8`.
//
// NF4 (Dettmers et al., "QLoRA", 2023, section 3 and appendix E; storage layout as
// bitsandbytes' quantize_4bit): the weight is flattened row-major and cut into blocks of
// `blocksize` elements; each block is divided by its absolute maximum (absmax, float32) and
// every value is replaced by the index of the nearest of the 16 NormalFloat code values
// (ties go to the lower code, as bitsandbytes' threshold comparisons do). Two codes share a
// byte: element 2i in the high nibble, 2i+1 in the low one; an odd count leaves the last low
// nibble at the code of 0.0 (7). Double quantization (section 3, "Double Quantization")
// quantizes the absmax constants again: their mean is subtracted and kept (float32), the rest
// is quantized blockwise (blocks of 256, float32 absmax per block) to bitsandbytes' signed
// 8-bit dynamic map (create_dynamic_map(signed=True)). Bits per parameter: 4 + 32/64 = 4.5
// without, 4 + 8/64 + 32/(64*256) = 4.127 with double quantization (blocksize 64).
//
// int8 (Dettmers et al., "LLM.int8()", 2022, section 3): vector-wise absmax quantization: each
// row of W [out, in] is scaled by 127 / max|row| and rounded to int8 (round half to even). In
// the forward the input rows are quantized the same way (vector-wise: the product is
// dequantized by the outer product of row and column scales), except the input feature columns
// holding a value of magnitude >= threshold (outliers, section 3.2): those columns are taken
// out of the int8 product and multiplied in the compute dtype (the "mixed-precision
// decomposition"; as in bitsandbytes, the matching weight columns come from the int8 storage).
#include <trainrun/precision/weight_storage.hpp>
#include <trainrun/interfaces.hpp>
#include <trainrun/model/linear.hpp>

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

namespace trainrun::quant {

/// The 16 NF4 code values (QLoRA appendix E, bitsandbytes' NF4 table), ascending; the index is
/// the 4-bit code. kNf4Code[7] == 0.0f.
extern const float kNf4Code[16];
/// Largest distance from any value in [-1, 1] to its nearest NF4 code (half the widest gap,
/// between -1 and -0.6962): the per-element error bound is absmax x this.
double nf4_max_normalized_error();

/// bitsandbytes' signed 8-bit dynamic quantization map (create_dynamic_map(signed=True,
/// max_exponent_bits=7, total_bits=8)): 256 ascending float32 values in [-0.993, 1].
const at::Tensor& dynamic_map();

/// Blockwise absmax quantization of a 1-D float32 tensor to the indices of the nearest values
/// of `code` (ascending float32 [256]). Returns {uint8 [n] indices, float32 [ceil(n/blocksize)]
/// absmax}. All-zero blocks get absmax 0 and the index of 0.0.
std::pair<at::Tensor, at::Tensor> quantize_blockwise(const at::Tensor& x, const at::Tensor& code,
                                                     int64_t blocksize);
/// Inverse of quantize_blockwise: float32 [n].
at::Tensor dequantize_blockwise(const at::Tensor& idx, const at::Tensor& absmax,
                                const at::Tensor& code, int64_t blocksize);

struct Nf4Options {
  int64_t blocksize = 64;     ///< elements per absmax block; even, >= 2
  bool double_quant = false;  ///< quantize the absmax constants (8-bit, blocks of dq_blocksize)
  int64_t dq_blocksize = 256;
};

/// An NF4-quantized tensor. Either `absmax` (no double quantization) or `absmax_q`,
/// `absmax2` and `absmax_offset` are defined.
struct Nf4Tensor {
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t blocksize = 64;
  int64_t dq_blocksize = 256;
  at::Tensor packed;         ///< uint8 [ceil(numel / 2)]
  at::Tensor absmax;         ///< float32 [ceil(numel / blocksize)]
  at::Tensor absmax_q;       ///< uint8 [ceil(numel / blocksize)], dynamic-map indices
  at::Tensor absmax2;        ///< float32 [ceil(blocks / dq_blocksize)]
  at::Tensor absmax_offset;  ///< float32 [1], the mean subtracted before double quantization
  bool double_quant() const { return absmax_q.defined(); }
  /// Bytes of every tensor above (the code tables are constants and not counted).
  int64_t storage_bytes() const;
};

/// Quantizes `w` (any shape, floating; converted to float32). Throws Error naming `name` when
/// `w` holds NaN or Inf, or when the options are invalid.
Nf4Tensor nf4_quantize(const at::Tensor& w, const Nf4Options& options, const std::string& name);
/// The per-block absmax, float32 [blocks] (dequantized when double-quantized).
at::Tensor nf4_absmax(const Nf4Tensor& q);
/// The dequantized tensor, float32 of q.shape: on CPU one fused pass over the packed bytes.
at::Tensor nf4_dequantize(const Nf4Tensor& q);
/// The same values as torch ops (table lookup, block view, multiply): the reference the fused
/// pass is tested against, and the path on other devices.
at::Tensor nf4_dequantize_reference(const Nf4Tensor& q);

/// A row-wise int8-quantized matrix.
struct Int8Tensor {
  at::Tensor q;      ///< int8 [out, in], in [-127, 127]
  at::Tensor scale;  ///< float32 [out], max |row| (0 for an all-zero row)
  int64_t storage_bytes() const { return q.nbytes() + scale.nbytes(); }
};
/// Quantizes a 2-D `w`. Throws Error naming `name` on NaN/Inf or a non-2-D tensor.
Int8Tensor int8_quantize(const at::Tensor& w, const std::string& name);
/// float32 [out, in].
at::Tensor int8_dequantize(const Int8Tensor& q);
/// x [..., in] -> [..., out] in x's dtype: LLM.int8()'s vector-wise product with the outlier
/// decomposition (threshold <= 0: no outlier columns), computed in `compute_dtype`. Gradients
/// flow to x as if the activation quantization were the identity (straight-through, as
/// bitsandbytes' backward uses the dequantized weight), and to bias.
at::Tensor int8_linear(const at::Tensor& x, const Int8Tensor& w, const at::Tensor& bias,
                       double threshold, at::ScalarType compute_dtype);

/// Frozen NF4 base of a trainrun Linear: dequantize to compute_dtype, then matmul; the
/// backward dequantizes again rather than keeping the dense weight (bitsandbytes' MatMul4Bit).
class Nf4Base final : public v1::LinearBase {
 public:
  Nf4Base(Nf4Tensor q, at::ScalarType compute_dtype) : q_(std::move(q)), dtype_(compute_dtype) {}
  at::Tensor forward(const at::Tensor& x, const at::Tensor& bias) override;
  at::Tensor dequantized_weight() override { return nf4_dequantize(q_); }
  std::string format() const override { return q_.double_quant() ? "nf4+dq" : "nf4"; }
  int64_t storage_bytes() const override { return q_.storage_bytes(); }
  /// The frozen tensors to register on the layer (LinearImpl::set_base; names "weight_nf4",
  /// "weight_absmax" or "weight_absmax_q", "weight_absmax2", "weight_absmax_offset").
  std::vector<std::pair<std::string, at::Tensor>> buffers() const;
  const Nf4Tensor& tensor() const { return q_; }

 private:
  Nf4Tensor q_;
  at::ScalarType dtype_;
};

/// Frozen int8 base of a trainrun Linear (frozen tensors "weight_int8", "weight_scale").
class Int8Base final : public v1::LinearBase {
 public:
  Int8Base(Int8Tensor q, double threshold, at::ScalarType compute_dtype)
      : q_(std::move(q)), threshold_(threshold), dtype_(compute_dtype) {}
  at::Tensor forward(const at::Tensor& x, const at::Tensor& bias) override {
    return int8_linear(x, q_, bias, threshold_, dtype_);
  }
  at::Tensor dequantized_weight() override { return int8_dequantize(q_); }
  std::string format() const override { return "int8"; }
  int64_t storage_bytes() const override { return q_.storage_bytes(); }
  std::vector<std::pair<std::string, at::Tensor>> buffers() const {
    return {{"weight_int8", q_.q}, {"weight_scale", q_.scale}};
  }

 private:
  Int8Tensor q_;
  double threshold_;
  at::ScalarType dtype_;
};

/// What convert() did, for the banner line and tests.
struct QuantReport {
  std::vector<std::string> layers;
  int64_t parameters = 0;     ///< weights quantized
  int64_t storage_bytes = 0;  ///< their packed storage and state
  double bits_per_parameter() const {
    return parameters ? 8.0 * static_cast<double>(storage_bytes) / static_cast<double>(parameters) : 0;
  }
};

/// Precision `quant-nf4` / `quant-int8`: converts the selected trainrun Linear layers' weights
/// to a frozen quantized base (Precision::convert); otherwise as fp32 (no autocast, no loss
/// scaling, the finite-gradient check agreed by all ranks).
class QuantPrecision : public v1::Precision, public v1::WeightStoragePlan {
 public:
  enum class Format { Nf4, Int8 };
  static void declare_common(v1::OptionSchema& s);
  QuantPrecision(Format format, const v1::Options& o, const v1::RunContext& ctx);
  void convert(v1::Model& model) override;
  /// The layers convert() quantizes and their storage_bytes() (Nf4Tensor, Int8Tensor), from
  /// shapes only.
  std::vector<v1::PlannedWeight> plan_weight_storage(v1::Model& model) const override;
  bool unscale_and_check(const std::vector<at::Tensor>& grads, v1::Communicator& comm) override;
  const QuantReport& report() const { return report_; }

 private:
  Format format_;
  std::string who_;
  std::vector<std::string> targets_, skips_;
  at::ScalarType dtype_;
  Nf4Options nf4_;
  double threshold_ = 6.0;
  int rank_ = 0;
  QuantReport report_;
};

class Nf4Precision final : public QuantPrecision {
 public:
  static void declare_options(v1::OptionSchema& s);
  Nf4Precision(const v1::Options& o, const v1::RunContext& ctx)
      : QuantPrecision(Format::Nf4, o, ctx) {}
};

class Int8Precision final : public QuantPrecision {
 public:
  static void declare_options(v1::OptionSchema& s);
  Int8Precision(const v1::Options& o, const v1::RunContext& ctx)
      : QuantPrecision(Format::Int8, o, ctx) {}
};

}  // namespace trainrun::quant
