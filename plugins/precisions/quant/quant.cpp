#include "quant.hpp"

#include <trainrun/plugin.hpp>
#include <trainrun/precision/finite_check.hpp>

#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <sstream>
#include <trainrun/log.hpp>

namespace trainrun::quant {

using namespace trainrun::v1;

const float kNf4Code[16] = {-1.0f,
                            -0.6961928009986877f,
                            -0.5250730514526367f,
                            -0.39491748809814453f,
                            -0.28444138169288635f,
                            -0.18477343022823334f,
                            -0.09105003625154495f,
                            0.0f,
                            0.07958029955625534f,
                            0.16093020141124725f,
                            0.24611230194568634f,
                            0.33791524171829224f,
                            0.44070982933044434f,
                            0.5626170039176941f,
                            0.7229568362236023f,
                            1.0f};

namespace {

at::Tensor nf4_table() {
  static const at::Tensor t = at::from_blob(const_cast<float*>(kNf4Code), {16}, at::kFloat).clone();
  return t;
}

// Decision boundaries between adjacent codes: a value above boundary k (strictly) gets a code
// above k, so a value exactly on a boundary takes the lower code (bitsandbytes compares with >).
at::Tensor midpoints(const at::Tensor& code) {
  return (code.slice(0, 0, code.numel() - 1) + code.slice(0, 1)) * 0.5;
}

// Every byte's two values, [256, 2]: byte b holds codes b >> 4 (element 2i) and b & 15 (2i+1).
at::Tensor nf4_byte_table() {
  static const at::Tensor t = [] {
    at::Tensor b = at::arange(256, at::kLong);
    at::Tensor table = nf4_table();
    return at::stack({table.index_select(0, b.div(16, "floor")), table.index_select(0, b.remainder(16))}, 1)
        .contiguous();
  }();
  return t;
}

void check_finite(const at::Tensor& w, const std::string& name) {
  if (at::isfinite(w).all().item<bool>()) return;
  const int64_t nan = at::isnan(w).sum().item<int64_t>();
  const int64_t inf = at::isinf(w).sum().item<int64_t>();
  TR_FAIL("layer '", name, "': the weight holds ", nan, " NaN and ", inf,
          " Inf values and cannot be quantized (was the checkpoint loaded correctly?)");
}

// x [n] padded with zeros to [blocks, blocksize].
at::Tensor as_blocks(const at::Tensor& x, int64_t blocksize) {
  const int64_t n = x.numel();
  const int64_t blocks = (n + blocksize - 1) / blocksize;
  at::Tensor padded = x;
  if (blocks * blocksize != n) padded = at::constant_pad_nd(x, {0, blocks * blocksize - n}, 0.0);
  return padded.view({blocks, blocksize});
}

// Divides each block by its absmax; an all-zero block stays zero (absmax 0 is kept as is).
at::Tensor normalize(const at::Tensor& blocks, const at::Tensor& absmax) {
  at::Tensor safe = at::where(absmax > 0, absmax, at::ones_like(absmax));
  return (blocks / safe.unsqueeze(1)).clamp(-1.0, 1.0);
}

}  // namespace

double nf4_max_normalized_error() {
  double gap = 0;
  for (int i = 0; i + 1 < 16; ++i) gap = std::max(gap, double(kNf4Code[i + 1]) - double(kNf4Code[i]));
  return gap / 2;
}

const at::Tensor& dynamic_map() {
  // create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for exponent i in 0..6,
  // 2^i fractions (the means of 2^i + 1 points evenly spaced in [0.1, 1]) scaled by 10^(i-6),
  // with both signs; then 0 and 1: 2 x 127 + 2 = 256 values, sorted.
  static const at::Tensor map = [] {
    std::vector<double> data;
    const int max_exponent_bits = 7, non_sign_bits = 7;
    for (int i = 0; i < max_exponent_bits; ++i) {
      const int fraction_items = (1 << (i + non_sign_bits - max_exponent_bits)) + 1;
      std::vector<double> b(fraction_items);
      // torch.linspace(0.1, 1, n) in float32, as bitsandbytes computes it.
      at::Tensor lin = at::linspace(0.1, 1.0, fraction_items, at::kFloat);
      for (int k = 0; k < fraction_items; ++k) b[k] = lin[k].item<float>();
      for (int k = 0; k + 1 < fraction_items; ++k) {
        const float mean = static_cast<float>((b[k] + b[k + 1]) / 2.0);
        const double scale = std::pow(10.0, -(max_exponent_bits - 1) + i);
        data.push_back(scale * mean);
        data.push_back(-scale * mean);
      }
    }
    data.push_back(0.0);
    data.push_back(1.0);
    TR_CHECK(data.size() == 256, "dynamic_map: ", data.size(), " values, expected 256");
    std::sort(data.begin(), data.end());
    return at::tensor(data, at::kDouble).to(at::kFloat);
  }();
  return map;
}

std::pair<at::Tensor, at::Tensor> quantize_blockwise(const at::Tensor& x, const at::Tensor& code,
                                                     int64_t blocksize) {
  TR_CHECK(blocksize >= 1, "quantize_blockwise: blocksize must be >= 1, got ", blocksize);
  const at::Tensor flat = x.detach().to(at::kFloat).reshape({-1});
  const int64_t n = flat.numel();
  at::Tensor blocks = as_blocks(flat, blocksize);
  at::Tensor absmax = blocks.abs().amax(1);
  at::Tensor idx = at::searchsorted(midpoints(code), normalize(blocks, absmax));
  return {idx.reshape({-1}).slice(0, 0, n).to(at::kByte), absmax};
}

at::Tensor dequantize_blockwise(const at::Tensor& idx, const at::Tensor& absmax,
                                const at::Tensor& code, int64_t blocksize) {
  const int64_t n = idx.numel();
  at::Tensor values = code.index_select(0, idx.reshape({-1}).to(at::kLong));
  return (as_blocks(values, blocksize) * absmax.unsqueeze(1)).reshape({-1}).slice(0, 0, n);
}

int64_t Nf4Tensor::storage_bytes() const {
  int64_t b = packed.nbytes();
  for (const auto* t : {&absmax, &absmax_q, &absmax2, &absmax_offset})
    if (t->defined()) b += t->nbytes();
  return b;
}

Nf4Tensor nf4_quantize(const at::Tensor& w, const Nf4Options& o, const std::string& name) {
  TR_CHECK(o.blocksize >= 2 && o.blocksize % 2 == 0, "layer '", name,
           "': NF4 blocksize must be even and >= 2, got ", o.blocksize);
  TR_CHECK(o.dq_blocksize >= 1, "layer '", name, "': double-quantization blocksize must be >= 1");
  c10::NoGradGuard no_grad;
  const at::Tensor flat = w.detach().to(at::kFloat).contiguous().reshape({-1});
  TR_CHECK(flat.numel() > 0, "layer '", name, "': the weight is empty");
  check_finite(flat, name);
  Nf4Tensor q;
  q.shape = w.sizes().vec();
  q.numel = flat.numel();
  q.blocksize = o.blocksize;
  q.dq_blocksize = o.dq_blocksize;
  at::Tensor blocks = as_blocks(flat, o.blocksize);  // zero padding: code 7, absmax unchanged
  at::Tensor absmax = blocks.abs().amax(1);
  at::Tensor codes = at::searchsorted(midpoints(nf4_table()), normalize(blocks, absmax)).reshape({-1});
  // Pairs of codes, element 2i high: an odd count's last low nibble is the padding's code 7.
  const int64_t bytes = (q.numel + 1) / 2;
  codes = codes.slice(0, 0, 2 * bytes).view({bytes, 2});
  q.packed = (codes.select(1, 0) * 16 + codes.select(1, 1)).to(at::kByte).contiguous();
  if (!o.double_quant) {
    q.absmax = absmax.contiguous();
    return q;
  }
  at::Tensor offset = absmax.mean();
  auto [idx, absmax2] = quantize_blockwise(absmax - offset, dynamic_map(), o.dq_blocksize);
  q.absmax_q = idx.contiguous();
  q.absmax2 = absmax2.contiguous();
  q.absmax_offset = offset.reshape({1}).contiguous();
  return q;
}

at::Tensor nf4_absmax(const Nf4Tensor& q) {
  if (!q.double_quant()) return q.absmax;
  return dequantize_blockwise(q.absmax_q, q.absmax2, dynamic_map(), q.dq_blocksize) + q.absmax_offset;
}

at::Tensor nf4_dequantize_reference(const Nf4Tensor& q) {
  c10::NoGradGuard no_grad;
  // One lookup per byte into a [256, 2] table gives both of its values.
  at::Tensor values = nf4_byte_table().index_select(0, q.packed.to(at::kLong)).reshape({-1});
  values = values.slice(0, 0, q.numel);
  at::Tensor absmax = nf4_absmax(q);
  return (as_blocks(values, q.blocksize) * absmax.unsqueeze(1)).reshape({-1}).slice(0, 0, q.numel).view(q.shape);
}

at::Tensor nf4_dequantize(const Nf4Tensor& q) {
  if (!q.packed.device().is_cpu()) return nf4_dequantize_reference(q);
  c10::NoGradGuard no_grad;
  // One pass over the packed bytes, block by block (blocksize is even, so a byte never straddles
  // two blocks): each output element is code * absmax, the same float32 product as the
  // reference's, without its int64 index copy, [n, 2] gather and padded block view.
  const at::Tensor absmax = nf4_absmax(q).contiguous();
  const at::Tensor packed = q.packed.contiguous();
  at::Tensor out = at::empty({q.numel}, absmax.options());
  const uint8_t* p = packed.data_ptr<uint8_t>();
  const float* a = absmax.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const int64_t n = q.numel, bs = q.blocksize, blocks = (n + bs - 1) / bs;
  at::parallel_for(0, blocks, std::max<int64_t>(1, 16384 / bs), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const float m = a[b];
      const int64_t e0 = b * bs, e1 = std::min(n, e0 + bs);
      int64_t e = e0;
      for (; e + 1 < e1; e += 2) {
        const uint8_t v = p[e / 2];
        o[e] = kNf4Code[v >> 4] * m;
        o[e + 1] = kNf4Code[v & 15] * m;
      }
      if (e < e1) o[e] = kNf4Code[p[e / 2] >> 4] * m;
    }
  });
  return out.view(q.shape);
}

namespace {
// y = x W^T + b with W dequantized from NF4. at::linear would keep the dense W alive from forward
// to backward, one per layer: the memory QLoRA exists to save. As bitsandbytes' MatMul4Bit does,
// the backward dequantizes W again (the packed storage is gathered again for the backward under
// a sharding strategy) and gives gradients to x and bias only.
struct Nf4LinearFunction : torch::autograd::Function<Nf4LinearFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& bias, const Nf4Tensor* q, at::ScalarType dtype) {
    ctx->saved_data["q"] = reinterpret_cast<int64_t>(q);
    ctx->saved_data["dtype"] = static_cast<int64_t>(dtype);
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    const bool has_bias = bias.numel() > 0;  // an empty stand-in means none (see Nf4Base::forward)
    ctx->saved_data["has_bias"] = has_bias;
    at::Tensor w = nf4_dequantize(*q).to(dtype);
    at::Tensor b = has_bias ? bias.to(dtype) : at::Tensor();
    return at::linear(x.to(dtype), w, b).to(x.scalar_type());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto* q = reinterpret_cast<const Nf4Tensor*>(ctx->saved_data["q"].toInt());
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    const auto x_dtype = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const at::Tensor gy = grads[0].to(dtype);
    at::Tensor gx, gb;
    if (ctx->needs_input_grad(0)) gx = at::matmul(gy, nf4_dequantize(*q).to(dtype)).to(x_dtype);
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(1)) {
      at::Tensor flat = grads[0].reshape({-1, grads[0].size(-1)});
      gb = flat.sum(0);
    }
    return {gx, gb, at::Tensor(), at::Tensor()};
  }
};
}  // namespace

at::Tensor Nf4Base::forward(const at::Tensor& x, const at::Tensor& bias) {
  // LibTorch 1.13's Function::apply records every tensor input's device and throws "tensor does
  // not have a device" for an undefined one: a layer without bias (every Llama projection)
  // passes an empty stand-in.
  if (!bias.defined()) return Nf4LinearFunction::apply(x, at::empty({0}, x.options()), &q_, dtype_);
  return Nf4LinearFunction::apply(x, bias, &q_, dtype_);
}

std::vector<std::pair<std::string, at::Tensor>> Nf4Base::buffers() const {
  if (!q_.double_quant()) return {{"weight_nf4", q_.packed}, {"weight_absmax", q_.absmax}};
  return {{"weight_nf4", q_.packed},
          {"weight_absmax_q", q_.absmax_q},
          {"weight_absmax2", q_.absmax2},
          {"weight_absmax_offset", q_.absmax_offset}};
}

Int8Tensor int8_quantize(const at::Tensor& w, const std::string& name) {
  TR_CHECK(w.dim() == 2, "layer '", name, "': int8 quantization needs a 2-D weight, got shape ",
           w.sizes());
  c10::NoGradGuard no_grad;
  const at::Tensor f = w.detach().to(at::kFloat).contiguous();
  check_finite(f, name);
  Int8Tensor q;
  q.scale = f.abs().amax(1).contiguous();
  at::Tensor safe = at::where(q.scale > 0, q.scale, at::ones_like(q.scale)).unsqueeze(1);
  q.q = (f * (127.0 / safe)).round().clamp(-127, 127).to(at::kChar).contiguous();
  return q;
}

at::Tensor int8_dequantize(const Int8Tensor& q) {
  c10::NoGradGuard no_grad;
  return q.q.to(at::kFloat) * (q.scale / 127.0).unsqueeze(1);
}

at::Tensor int8_linear(const at::Tensor& x, const Int8Tensor& w, const at::Tensor& bias,
                       double threshold, at::ScalarType compute_dtype) {
  const int64_t in = w.q.size(1);
  TR_CHECK(x.size(-1) == in, "int8 Linear: input has ", x.size(-1), " features, the layer ", in);
  at::Tensor x2 = x.reshape({-1, in}).to(compute_dtype);
  at::Tensor xq;
  {
    c10::NoGradGuard no_grad;
    at::Tensor xf = x2.to(at::kFloat);
    at::Tensor outliers;  // bool [in]: feature columns kept out of the int8 product
    at::Tensor rest = xf;
    if (threshold > 0) {
      outliers = (xf.abs() >= threshold).any(0);
      rest = xf.masked_fill(outliers.unsqueeze(0), 0.0);
    }
    at::Tensor sx = rest.abs().amax(1, /*keepdim=*/true);
    at::Tensor safe = at::where(sx > 0, sx, at::ones_like(sx));
    // (Xq * sx / 127) (Wq * sw / 127)^T equals the int32 product Xq Wq^T dequantized by the
    // outer product sx sw^T / 127^2: the vector-wise product, computed here in float.
    xq = (rest * (127.0 / safe)).round().clamp(-127, 127) * (safe / 127.0);
    if (threshold > 0) xq = at::where(outliers.unsqueeze(0), xf, xq);
    xq = xq.to(compute_dtype);
  }
  // Straight-through: the forward uses xq, the gradient reaches x unchanged.
  at::Tensor xhat = x2 + (xq - x2).detach();
  at::Tensor wd = int8_dequantize(w).to(compute_dtype);
  at::Tensor b = bias.defined() ? bias.to(compute_dtype) : bias;
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = w.q.size(0);
  return at::linear(xhat, wd, b).view(shape).to(x.scalar_type());
}

// --- the precision components -----------------------------------------------------------------

void QuantPrecision::declare_common(OptionSchema& s) {
  s.string_list("target_modules", {"all-linear"},
                "trainrun Linear layers to quantize: names (\"c_attn\", \"attn.c_proj\") or globs "
                "(\"blocks.*.mlp.*\"); \"all-linear\" = every one but an output layer lm_head");
  s.string_list("skip_modules", {}, "layers to leave in float32 (names or globs)");
  s.choice("compute_dtype", "fp32", {"fp32", "bf16"},
           "dtype the dequantized weight is multiplied in (the output is cast back)");
}

void Nf4Precision::declare_options(OptionSchema& s) {
  declare_common(s);
  s.integer("blocksize", 64, "weights per absmax block (even)", 2, 1 << 20);
  s.boolean("double_quant", false,
            "quantize the absmax constants to 8 bits (blocks of 256): 4.127 instead of 4.5 "
            "bits per parameter at blocksize 64");
}

void Int8Precision::declare_options(OptionSchema& s) {
  declare_common(s);
  s.real("threshold", 6.0,
         "input feature columns with a value of magnitude >= threshold are multiplied in the "
         "compute dtype instead of int8 (LLM.int8() outliers); 0 = none", 0.0);
}

QuantPrecision::QuantPrecision(Format format, const Options& o, const RunContext& ctx)
    : format_(format),
      who_(format == Format::Nf4 ? "precision 'quant-nf4'" : "precision 'quant-int8'"),
      targets_(o.get_string_list("target_modules")),
      skips_(o.get_string_list("skip_modules")),
      dtype_(o.get_string("compute_dtype") == "bf16" ? at::kBFloat16 : at::kFloat),
      rank_(ctx.rank) {
  TR_CHECK_TYPED(ConfigError, !targets_.empty(), o.context(), ": target_modules is empty");
  if (format == Format::Nf4) {
    nf4_.blocksize = o.get_int("blocksize");
    nf4_.double_quant = o.get_bool("double_quant");
    TR_CHECK_TYPED(ConfigError, nf4_.blocksize % 2 == 0, o.context(),
                   ": blocksize must be even (two 4-bit codes per byte), got ", nf4_.blocksize);
  } else {
    threshold_ = o.get_double("threshold");
  }
}

void QuantPrecision::convert(Model& model) {
  c10::NoGradGuard no_grad;
  const auto layers = find_linear_layers(model, targets_, skips_, who_);
  report_ = {};
  int64_t bf16_bytes = 0;
  for (const auto& [name, layer] : layers) {
    TR_CHECK(!layer->base(), who_, ": layer '", name, "' is already quantized (",
             layer->base()->format(), ")");
    const at::Tensor w = layer->weight;
    if (format_ == Format::Nf4) {
      auto base = std::make_shared<Nf4Base>(nf4_quantize(w, nf4_, name), dtype_);
      layer->set_base(base, base->buffers());
      report_.storage_bytes += base->storage_bytes();
    } else {
      auto base = std::make_shared<Int8Base>(int8_quantize(w, name), threshold_, dtype_);
      layer->set_base(base, base->buffers());
      report_.storage_bytes += base->storage_bytes();
    }
    report_.layers.push_back(name);
    report_.parameters += w.numel();
    bf16_bytes += 2 * w.numel();
  }
  if (rank_ == 0) {
    std::ostringstream os;
    os.precision(4);
    os << report_.layers.size() << " Linear layer(s) quantized (" << report_.layers.front()
       << (report_.layers.size() > 1 ? ", ..." : "") << "): " << report_.parameters
       << " weights in " << report_.storage_bytes << " bytes = " << report_.bits_per_parameter()
       << " bits/parameter (bf16: " << bf16_bytes << " bytes)";
    v1::Logger(who_.substr(11, who_.size() - 12), rank_).info(os.str());
  }
}

std::vector<v1::PlannedWeight> QuantPrecision::plan_weight_storage(Model& model) const {
  std::vector<v1::PlannedWeight> out;
  for (const auto& [name, layer] : find_linear_layers(model, targets_, skips_, who_)) {
    v1::PlannedWeight w;
    w.module = name;
    w.numel = layer->options.in_features() * layer->options.out_features();
    if (format_ == Format::Nf4) {
      // As nf4_quantize lays it out: two codes a byte, one absmax per block, double-quantized
      // to one byte each plus a float per dq block and the float offset.
      const int64_t blocks = (w.numel + nf4_.blocksize - 1) / nf4_.blocksize;
      w.bytes = (w.numel + 1) / 2 +
                (nf4_.double_quant
                     ? blocks + 4 * ((blocks + nf4_.dq_blocksize - 1) / nf4_.dq_blocksize) + 4
                     : 4 * blocks);
      w.format = nf4_.double_quant ? "nf4+dq" : "nf4";
    } else {
      w.bytes = w.numel + 4 * layer->options.out_features();  // int8 codes, a float scale a row
      w.format = "int8";
    }
    out.push_back(std::move(w));
  }
  return out;
}

bool QuantPrecision::unscale_and_check(const std::vector<at::Tensor>& grads, Communicator& comm) {
  // As fp32: no loss scale, the finite check agreed by all ranks.
  return all_finite_agreed(grads, comm);
}

}  // namespace trainrun::quant
