#pragma once
// The sharding engine shared by ZeRO (stages 1-3), FSDP and third-party sharded strategies.
// Reference: Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
// Models" (SC20), and PyTorch FSDP's FlatParameter (Zhao et al., "PyTorch FSDP", VLDB 2023).
//
// A flat parameter is a group of parameters (a unit, or a bucket of them) laid end to end in one
// contiguous buffer, padded with zeros to a multiple of world_size, so that rank r owns exactly
// the elements [r*S, (r+1)*S) with S = padded / world_size. Three buffers carry it:
//  - the shard  [S]: this rank's fp32 values, which the optimizer steps (its "master" weights);
//  - the full buffer [padded]: every rank's values after an all-gather; the model's parameters
//    are views into it (set_data), so a module computes with them unchanged. When released, its
//    storage is freed in place (resized to 0 bytes) rather than replaced: the views, and any
//    view autograd saved for backward, stay attached to the same storage, and a later gather
//    refills it. This is the trick PyTorch FSDP plays with `storage().resize_(0)`.
//  - the gradient shard [S]: this rank's part of the averaged gradient, accumulated over the
//    micro-batches of a step, which the optimizer reads.
// The optimizer sees one 1-D piece per parameter that intersects this rank's shard (a shard is
// contiguous, so at most one piece per parameter), named like the parameter; pieces alias the
// shard and their .grad aliases the gradient shard, so elementwise optimizers (SGD, Adam) give
// exactly the unsharded result and checkpoint state keeps the parameter's name.
//
// Mixed precision (PyTorch FSDP's MixedPrecision): with param_dtype bfloat16/float16 the shard
// stays float32 (the master weights the optimizer steps) while the full buffer, and so the
// parameters the model computes with, are param_dtype: a gather casts the shard and all-gathers
// the low-precision copy (half the bytes on the wire). Gradients arrive in param_dtype, are
// reduce-scattered in reduce_dtype and accumulated into the float32 gradient shard.
#include <ATen/ATen.h>
#include <c10/core/Allocator.h>
#include <c10/core/GradMode.h>
#include <c10/core/StorageImpl.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trainrun/error.hpp"
#include "trainrun/interfaces.hpp"

namespace trainrun::v1::sharding {

/// Where one parameter lives in a flat parameter: elements [offset, offset + numel) of the
/// unpadded flat buffer, viewed with `shape`.
struct ParamSpan {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t offset = 0;
};

/// The part of one parameter that lies in one rank's shard: elements [param_offset,
/// param_offset + length) of the flattened parameter are elements [shard_offset, shard_offset +
/// length) of the shard. `param` indexes FlatLayout::params().
struct Piece {
  size_t param = 0;
  int64_t param_offset = 0;
  int64_t shard_offset = 0;
  int64_t length = 0;
};

/// The arithmetic of a flat parameter over world_size ranks: offsets, padding, shards and the
/// pieces each rank owns. Pure (no tensors); unit-tested on sizes not divisible by world_size and
/// parameters smaller than world_size.
class FlatLayout {
 public:
  /// `params`: names and shapes in the order they are laid out (offsets are assigned here).
  /// Throws Error when world_size < 1, the group is empty or holds no element, or a dimension
  /// is negative.
  FlatLayout(std::vector<ParamSpan> params, int world_size) : params_(std::move(params)), world_size_(world_size) {
    TR_CHECK(world_size_ >= 1, "flat parameter: world_size must be >= 1, got ", world_size_);
    TR_CHECK(!params_.empty(), "flat parameter: no parameters to flatten");
    int64_t offset = 0;
    for (auto& p : params_) {
      int64_t n = 1;
      for (int64_t d : p.shape) {
        TR_CHECK(d >= 0, "flat parameter: parameter '", p.name, "' has a negative dimension");
        n *= d;
      }
      p.numel = n;
      p.offset = offset;
      offset += n;
    }
    numel_ = offset;
    TR_CHECK(numel_ > 0, "flat parameter: its ", params_.size(), " parameters hold no element");
    shard_numel_ = (numel_ + world_size_ - 1) / world_size_;
  }

  const std::vector<ParamSpan>& params() const { return params_; }
  int world_size() const { return world_size_; }
  /// Elements of all parameters (no padding).
  int64_t numel() const { return numel_; }
  /// numel() rounded up to a multiple of world_size (= world_size * shard_numel()).
  int64_t padded_numel() const { return shard_numel_ * world_size_; }
  /// Elements each rank owns, padding included.
  int64_t shard_numel() const { return shard_numel_; }
  /// Zero elements at the end of the last rank(s)' shards.
  int64_t padding() const { return padded_numel() - numel_; }

  /// The pieces of parameters inside `rank`'s shard, in layout order (none for a rank whose
  /// shard is all padding). Throws Error on a rank outside [0, world_size).
  std::vector<Piece> pieces(int rank) const {
    TR_CHECK(rank >= 0 && rank < world_size_, "flat parameter: rank ", rank,
             " outside [0, ", world_size_, ")");
    const int64_t lo = static_cast<int64_t>(rank) * shard_numel_;
    const int64_t hi = lo + shard_numel_;
    std::vector<Piece> out;
    for (size_t i = 0; i < params_.size(); ++i) {
      const ParamSpan& p = params_[i];
      const int64_t a = std::max(lo, p.offset);
      const int64_t b = std::min(hi, p.offset + p.numel);
      if (a < b) out.push_back({i, a - p.offset, a - lo, b - a});
    }
    return out;
  }

  /// The rank owning element `flat_offset` of the unpadded buffer.
  int owner(int64_t flat_offset) const {
    TR_CHECK(flat_offset >= 0 && flat_offset < numel_, "flat parameter: offset ", flat_offset,
             " outside [0, ", numel_, ")");
    return static_cast<int>(flat_offset / shard_numel_);
  }

 private:
  std::vector<ParamSpan> params_;
  int world_size_;
  int64_t numel_ = 0;
  int64_t shard_numel_ = 0;
};

/// Frees a tensor's storage in place (0 bytes), keeping the storage object, so views of it stay
/// attached; refill_storage() gives it memory again. The tensor must own its storage from
/// offset 0 and must not be read while freed.
inline void free_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (s->nbytes() == 0) return;
  s->set_data_ptr_noswap(at::DataPtr(nullptr, s->device()));
  s->set_nbytes(0);
}

/// Allocates `t.numel()` elements for a storage freed by free_storage() (contents undefined),
/// through the device's current allocator (so memory trackers see it). No-op when it has them.
inline void refill_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (s->nbytes() >= bytes) return;
  c10::Allocator* alloc = c10::GetAllocator(s->device().type());
  s->set_data_ptr_noswap(alloc->allocate(bytes));
  s->set_nbytes(bytes);
}

/// Waits for the collective in flight in `work`, if any, and drops it; false when none was. Every
/// asynchronous collective here is finished this way, so none is waited for twice.
inline bool finish_work(std::shared_ptr<Work>& work) {
  if (!work) return false;
  work->wait();
  work.reset();
  return true;
}

/// One flat parameter at run time: owns the shard, the gradient shard and the full buffer, and
/// runs the collectives on them. Not thread-safe: the owning strategy serialises calls (autograd
/// hooks included). Every collective must be issued in the same order on every rank.
class FlatParameter {
 public:
  struct Options {
    std::string name;          ///< for messages, e.g. "unit blocks.3" or "bucket 2"
    bool keep_full = true;     ///< parameters stay gathered (ZeRO-1/2, persistent parameters)
    bool full_grads = false;   ///< ZeRO-1: parameters' .grad are views of a persistent full
                               ///< gradient buffer, reduce-scattered only when a step ends
    /// dtype of the full buffer: what the model's parameters (and so its forward and backward)
    /// compute in, and what all-gathers send. float32, bfloat16 or float16.
    at::ScalarType param_dtype = at::kFloat;
    /// dtype gradients are reduce-scattered (and all-reduced across replicas) in.
    at::ScalarType reduce_dtype = at::kFloat;
    /// ABI 1.7, deferred loading (trainrun/deferred_weights.hpp): when set, the parameters hold
    /// no values yet and fill(param, offset, out) writes elements [offset, offset + out.numel())
    /// of the parameter's flattening into `out` (float32, 1-D, a view of this rank's buffers). The constructor then reads only this rank's shard (keep_full: every parameter
    /// whole), and the full buffer is never allocated for a sharded flat parameter.
    std::function<void(const NamedTensor& param, int64_t offset, const at::Tensor& out)> fill;
  };

  /// `params`: float32 leaves on `comm`'s device, each in one flat parameter only. Their current
  /// values become the flat parameter's (rank 0's values should already be on every rank, e.g.
  /// by replicate_from_rank0). Afterwards every parameter is a view of the full buffer; with
  /// keep_full = false the full buffer is released (call gather() before use).
  /// Throws Error on a non-float32 or non-leaf parameter, or a param_dtype/reduce_dtype that is
  /// not a floating type.
  FlatParameter(std::vector<NamedTensor> params, Communicator& comm, Options options)
      : params_(std::move(params)),
        comm_(&comm),
        opts_(std::move(options)),
        layout_(spans(params_), comm.world_size()) {
    c10::NoGradGuard no_grad;
    for (const auto& p : params_) {
      TR_CHECK(p.tensor.scalar_type() == at::kFloat, opts_.name, ": parameter '", p.name,
               "' is ", p.tensor.scalar_type(), "; the sharding engine flattens float32 only");
      TR_CHECK(p.tensor.is_leaf(), opts_.name, ": parameter '", p.name, "' is not a leaf");
    }
    TR_CHECK(at::isFloatingType(opts_.param_dtype) && at::isFloatingType(opts_.reduce_dtype),
             opts_.name, ": param_dtype ", opts_.param_dtype, " and reduce_dtype ",
             opts_.reduce_dtype, " must be floating types");
    const auto fopts = params_.front().tensor.options().requires_grad(false);
    const int64_t S = layout_.shard_numel();
    const int64_t lo = static_cast<int64_t>(comm.rank()) * S;
    at::Tensor values;
    if (opts_.fill && !opts_.keep_full) {
      // Deferred loading: only this rank's pieces are read. The full buffer is allocated but
      // never written (the parameters' views need its storage to exist when they are made);
      // release() below returns it untouched.
      shard_ = at::zeros({S}, fopts);
      for (const Piece& pc : layout_.pieces(comm.rank()))
        opts_.fill(params_[pc.param], pc.param_offset, shard_.narrow(0, pc.shard_offset, pc.length));
      full_ = at::empty({layout_.padded_numel()}, fopts.dtype(opts_.param_dtype));
    } else {
      values = at::zeros({layout_.padded_numel()}, fopts);
      for (size_t i = 0; i < params_.size(); ++i) {
        const ParamSpan& s = layout_.params()[i];
        if (opts_.fill)
          opts_.fill(params_[i], 0, values.narrow(0, s.offset, s.numel));
        else
          values.narrow(0, s.offset, s.numel).copy_(params_[i].tensor.reshape({-1}));
      }
    }
    // ZeRO-1/2 keep every parameter whole: the shard is a view of it (no second copy) unless the
    // parameters compute in another dtype. ZeRO-3 keeps only the shard between uses, in storage
    // of its own.
    if (values.defined() && low_precision()) {
      full_ = values.to(opts_.param_dtype);
      shard_ = values.narrow(0, lo, S).clone();
    } else if (values.defined()) {
      full_ = values;
      shard_ = opts_.keep_full ? full_.narrow(0, lo, S) : full_.narrow(0, lo, S).clone();
    }
    values = at::Tensor();
    if (opts_.full_grads) {
      full_grad_ = at::zeros({layout_.padded_numel()}, fopts.dtype(opts_.param_dtype));
      grad_shard_ = low_precision() ? at::zeros({S}, fopts) : full_grad_.narrow(0, lo, S);
    } else {
      grad_shard_ = at::zeros({S}, fopts);
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      const ParamSpan& s = layout_.params()[i];
      at::Tensor& p = params_[i].tensor;
      p.set_data(full_.narrow(0, s.offset, s.numel).view(s.shape));
      if (opts_.full_grads) p.mutable_grad() = full_grad_.narrow(0, s.offset, s.numel).view(s.shape);
    }
    for (const Piece& pc : layout_.pieces(comm.rank())) {
      at::Tensor piece = shard_.narrow(0, pc.shard_offset, pc.length).detach();
      piece.requires_grad_(true);
      piece.mutable_grad() = grad_shard_.narrow(0, pc.shard_offset, pc.length);
      pieces_.push_back({params_[pc.param].name, piece});
    }
    if (!opts_.keep_full) release();
  }

  const FlatLayout& layout() const { return layout_; }
  const Options& options() const { return opts_; }
  const std::vector<NamedTensor>& params() const { return params_; }
  /// This rank's values [S], float32.
  const at::Tensor& shard() const { return shard_; }
  /// Whether the parameters compute in a dtype other than the shard's float32.
  bool low_precision() const { return opts_.param_dtype != at::kFloat; }
  /// Bytes one gather of the full buffer moves per rank and element (param_dtype's size).
  int64_t param_element_bytes() const { return c10::elementSize(opts_.param_dtype); }
  /// reduce_dtype's size in bytes.
  int64_t reduce_element_bytes() const { return c10::elementSize(opts_.reduce_dtype); }
  /// This rank's averaged gradient [S], float32.
  const at::Tensor& grad_shard() const { return grad_shard_; }
  /// One 1-D leaf per parameter intersecting this rank's shard, named like the parameter,
  /// aliasing shard() with .grad aliasing grad_shard(): what the optimizer steps.
  const std::vector<NamedTensor>& optimizer_pieces() const { return pieces_; }

  // -- parameters ---------------------------------------------------------------------------

  /// Whether the full buffer holds memory (gathered, or a gather in flight).
  bool materialized() const { return full_.storage().nbytes() > 0; }
  /// Starts the all-gather of every rank's shard into the full buffer (allocating it when
  /// released); no-op when gathered or in flight. Collective.
  void gather_async() {
    if (gathered_ || gather_work_) return;
    c10::NoGradGuard no_grad;
    refill_storage(full_);
    // The input must not alias the output (MPI forbids it without MPI_IN_PLACE).
    if (low_precision())
      gather_input_ = shard_.to(opts_.param_dtype);
    else
      gather_input_ = opts_.keep_full ? shard_.clone() : shard_;
    gather_work_ = comm_->all_gather(gather_input_, full_);
  }
  /// Waits for (or runs) the gather: the parameters hold every rank's values afterwards.
  void gather() {
    gather_async();
    if (finish_work(gather_work_)) gather_input_ = at::Tensor();
    gathered_ = true;
  }
  bool gathered() const { return gathered_; }
  /// Frees the full buffer (keep_full = false only; no-op otherwise). Waits for a gather in
  /// flight first. Parameters must not be read until the next gather().
  void release() {
    if (opts_.keep_full) return;
    if (finish_work(gather_work_)) gather_input_ = at::Tensor();
    free_storage(full_);
    gathered_ = false;
  }
  /// After the optimizer stepped the shard: for keep_full, gathers the new values into the
  /// parameters (collective, started here, completed by gather()); otherwise nothing (the next
  /// use gathers). The caller calls gather() on every flat parameter it started.
  void after_step_async() {
    if (!opts_.keep_full) return;
    gathered_ = false;
    gather_async();
  }

  // -- gradients ----------------------------------------------------------------------------

  /// Starts averaging this micro-batch's parameter gradients over the ranks into a temporary
  /// shard (reduce-scatter, ReduceOp::Avg). full_grads: reads the persistent full gradient
  /// buffer. Otherwise copies each parameter's .grad (zeros for none) into a flat buffer and
  /// drops the .grad, so the next micro-batch starts fresh and the memory is freed now.
  /// Collective. Complete with finish_reduce().
  void reduce_async() {
    TR_CHECK(!reduce_work_, opts_.name, ": reduce_async() twice without finish_reduce()");
    c10::NoGradGuard no_grad;
    const auto ropts = grad_shard_.options().dtype(opts_.reduce_dtype);
    if (opts_.full_grads) {
      reduce_input_ = full_grad_.scalar_type() == opts_.reduce_dtype ? full_grad_
                                                                     : full_grad_.to(opts_.reduce_dtype);
    } else {
      reduce_input_ = at::zeros({layout_.padded_numel()}, ropts);
      for (size_t i = 0; i < params_.size(); ++i) {
        at::Tensor& g = params_[i].tensor.mutable_grad();
        if (!g.defined()) continue;
        const ParamSpan& s = layout_.params()[i];
        reduce_input_.narrow(0, s.offset, s.numel).copy_(g.reshape({-1}));
        g = at::Tensor();
      }
    }
    reduce_output_ = at::empty({layout_.shard_numel()}, ropts);
    ReduceScatterOptions ro;
    ro.op = ReduceOp::Avg;
    reduce_work_ = comm_->reduce_scatter(reduce_input_, reduce_output_, ro);
  }
  bool reducing() const { return static_cast<bool>(reduce_work_); }
  /// Waits for the reduce-scatter and adds its result to the gradient shard (full_grads: writes
  /// it there, the local accumulation having happened in the full buffer). With `replicas` (the
  /// ranks holding the same shard in hybrid sharding), the result is first averaged across them
  /// (all-reduce, ReduceOp::Avg; collective over `replicas`).
  void finish_reduce(Communicator* replicas = nullptr) {
    if (!finish_work(reduce_work_)) return;
    c10::NoGradGuard no_grad;
    if (replicas != nullptr && replicas->world_size() > 1) {
      AllReduceOptions ao;
      ao.op = ReduceOp::Avg;
      replicas->all_reduce(reduce_output_, ao)->wait();
    }
    if (opts_.full_grads)
      grad_shard_.copy_(reduce_output_);
    else
      grad_shard_.add_(reduce_output_);
    reduce_input_ = at::Tensor();
    reduce_output_ = at::Tensor();
  }
  /// Zeroes the gradient shard (and the full gradient buffer) in place: pieces keep aliasing it.
  void zero_grad() {
    c10::NoGradGuard no_grad;
    grad_shard_.zero_();
    if (opts_.full_grads) full_grad_.zero_();
  }
  /// Sum of squares of this rank's gradient shard, float64 on the device (padding is zero).
  at::Tensor grad_sq_sum() const { return grad_shard_.to(at::kDouble).pow(2).sum(); }

  // -- state ---------------------------------------------------------------------------------

  /// Every parameter's full value, gathered from all ranks into new tensors with the
  /// parameters' shapes (the full buffer is left as it was). Collective.
  std::vector<NamedTensor> gather_full_values() {
    c10::NoGradGuard no_grad;
    at::Tensor all = at::empty({layout_.padded_numel()}, shard_.options());
    at::Tensor in = shard_.clone();
    comm_->all_gather(in, all)->wait();
    std::vector<NamedTensor> out;
    for (size_t i = 0; i < params_.size(); ++i) {
      const ParamSpan& s = layout_.params()[i];
      out.push_back({s.name, all.narrow(0, s.offset, s.numel).view(s.shape).clone()});
    }
    return out;
  }

  /// Bytes this flat parameter holds now on this rank (shard + gradient shard + full buffers
  /// when materialized), counting shared storage once.
  int64_t resident_bytes() const {
    int64_t b = full_.storage().nbytes();
    if (!opts_.keep_full || low_precision()) b += shard_.nbytes();
    if (opts_.full_grads) b += full_grad_.nbytes();
    if (!opts_.full_grads || low_precision()) b += grad_shard_.nbytes();
    return b;
  }

 private:
  static std::vector<ParamSpan> spans(const std::vector<NamedTensor>& params) {
    std::vector<ParamSpan> out;
    for (const auto& p : params) out.push_back({p.name, p.tensor.sizes().vec(), 0, 0});
    return out;
  }

  std::vector<NamedTensor> params_;
  Communicator* comm_;
  Options opts_;
  FlatLayout layout_;
  at::Tensor full_, shard_, full_grad_, grad_shard_;
  std::vector<NamedTensor> pieces_;
  bool gathered_ = true;
  std::shared_ptr<Work> gather_work_;
  at::Tensor gather_input_;
  std::shared_ptr<Work> reduce_work_;
  at::Tensor reduce_input_, reduce_output_;
};

/// Frozen tensors (requires_grad false, any dtype) sharded as raw bytes: QLoRA's packed 4-bit
/// weights (uint8) with their quantization constants, or a LoRA base's frozen float weights. They
/// are laid end to end, each at a byte offset aligned to kAlign, the whole padded to a multiple
/// of kAlign * world_size, and rank r keeps bytes [r*S, (r+1)*S). The tensors become views of
/// the full byte buffer reinterpreted with their own dtype, so nothing is ever cast, summed or
/// checked as a float: a gather moves bytes, there are no gradients, and the optimizer never
/// sees them. Shard boundaries fall on multiples of kAlign, so every shard holds whole elements
/// of every dtype (sharded state dicts give pieces in elements).
class FrozenFlat {
 public:
  static constexpr int64_t kAlign = 16;
  /// Where one tensor's bytes are: [byte_offset, byte_offset + nbytes) of the full buffer.
  struct Span {
    std::string name;
    std::vector<int64_t> shape;
    at::ScalarType dtype = at::kByte;
    int64_t byte_offset = 0;
    int64_t nbytes = 0;
  };

  /// `tensors`: frozen leaves on `comm`'s device, the same on every rank (replicate_from_rank0).
  /// Afterwards each is a view of the full buffer, released until gather(). Throws Error on a
  /// tensor that requires grad or has no element.
  /// ABI 1.7: with `fill` (FlatParameter::Options::fill) the tensors hold no values yet and
  /// only this rank's bytes are read, element range by element range.
  FrozenFlat(std::vector<NamedTensor> tensors, Communicator& comm, std::string name,
             std::function<void(const NamedTensor&, int64_t, const at::Tensor&)> fill = {})
      : tensors_(std::move(tensors)), comm_(&comm), name_(std::move(name)) {
    c10::NoGradGuard no_grad;
    TR_CHECK(!tensors_.empty(), name_, ": no frozen tensors");
    int64_t off = 0;
    for (const auto& t : tensors_) {
      TR_CHECK(!t.tensor.requires_grad(), name_, ": '", t.name, "' requires grad; only frozen "
               "tensors are sharded as bytes");
      TR_CHECK(t.tensor.numel() > 0, name_, ": '", t.name, "' has no element");
      const int64_t n = static_cast<int64_t>(t.tensor.nbytes());
      spans_.push_back({t.name, t.tensor.sizes().vec(), t.tensor.scalar_type(), off, n});
      off += (n + kAlign - 1) / kAlign * kAlign;
    }
    const int64_t W = comm.world_size();
    shard_bytes_ = (off + kAlign * W - 1) / (kAlign * W) * kAlign;
    const auto bopts = tensors_.front().tensor.options().dtype(at::kByte).requires_grad(false);
    if (fill) {
      // Deferred loading: this rank's bytes only; shard boundaries are multiples of kAlign, so
      // each piece is whole elements of its tensor's dtype.
      shard_ = at::zeros({shard_bytes_}, bopts);
      const int64_t lo = comm.rank() * shard_bytes_, hi = lo + shard_bytes_;
      for (size_t i = 0; i < spans_.size(); ++i) {
        const Span& s = spans_[i];
        const int64_t a = std::max(lo, s.byte_offset), b = std::min(hi, s.byte_offset + s.nbytes);
        if (a >= b) continue;
        const int64_t esize = static_cast<int64_t>(c10::elementSize(s.dtype));
        fill(tensors_[i], (a - s.byte_offset) / esize, shard_.narrow(0, a - lo, b - a).view(s.dtype));
      }
      full_ = at::empty({shard_bytes_ * W}, bopts);
      for (size_t i = 0; i < tensors_.size(); ++i) {
        const Span& s = spans_[i];
        tensors_[i].tensor.set_data(full_.narrow(0, s.byte_offset, s.nbytes).view(s.dtype).view(s.shape));
      }
      release();
      return;
    }
    full_ = at::zeros({shard_bytes_ * W}, bopts);
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const Span& s = spans_[i];
      at::Tensor& t = tensors_[i].tensor;
      at::Tensor bytes = full_.narrow(0, s.byte_offset, s.nbytes);
      bytes.view(s.dtype).copy_(t.contiguous().reshape({-1}));
      t.set_data(bytes.view(s.dtype).view(s.shape));
    }
    shard_ = full_.narrow(0, comm.rank() * shard_bytes_, shard_bytes_).clone();
    release();
  }

  const std::vector<Span>& spans() const { return spans_; }
  /// The tensors, in layout order (views of the full buffer).
  const std::vector<NamedTensor>& tensors() const { return tensors_; }
  const std::string& name() const { return name_; }
  /// This rank's bytes [shard_bytes()], uint8.
  const at::Tensor& shard() const { return shard_; }
  int64_t shard_bytes() const { return shard_bytes_; }
  /// Bytes of the full buffer (all ranks' shards).
  int64_t padded_bytes() const { return full_.numel(); }
  bool materialized() const { return full_.storage().nbytes() > 0; }
  bool gathered() const { return gathered_; }

  /// Starts the all-gather of every rank's bytes (no-op when gathered or in flight). Collective.
  void gather_async() {
    if (gathered_ || work_) return;
    refill_storage(full_);
    work_ = comm_->all_gather(shard_, full_);
  }
  void gather() {
    gather_async();
    finish_work(work_);
    gathered_ = true;
  }
  /// Frees the full buffer (waiting for a gather in flight); the tensors must not be read until
  /// the next gather().
  void release() {
    finish_work(work_);
    free_storage(full_);
    gathered_ = false;
  }

  /// Every tensor's value, gathered into new tensors (the full buffer is left as it was).
  /// Collective.
  std::vector<NamedTensor> gather_full_values() {
    c10::NoGradGuard no_grad;
    at::Tensor all = at::empty({padded_bytes()}, shard_.options());
    comm_->all_gather(shard_, all)->wait();
    std::vector<NamedTensor> out;
    for (const Span& s : spans_)
      out.push_back({s.name, all.narrow(0, s.byte_offset, s.nbytes).view(s.dtype).view(s.shape).clone()});
    return out;
  }

  /// The elements of tensor `i` in this rank's shard: (first element, elements viewed with the
  /// tensor's dtype); numel 0 when the shard holds none of it.
  std::pair<int64_t, at::Tensor> local_piece(size_t i) const {
    const Span& s = spans_.at(i);
    const int64_t lo = comm_->rank() * shard_bytes_, hi = lo + shard_bytes_;
    const int64_t a = std::max(lo, s.byte_offset), b = std::min(hi, s.byte_offset + s.nbytes);
    const int64_t esize = static_cast<int64_t>(c10::elementSize(s.dtype));
    if (a >= b) return {0, at::empty({0}, shard_.options().dtype(s.dtype))};
    return {(a - s.byte_offset) / esize, shard_.narrow(0, a - lo, b - a).view(s.dtype)};
  }

  /// Bytes held now on this rank (shard, plus the full buffer when materialized).
  int64_t resident_bytes() const {
    return static_cast<int64_t>(shard_.nbytes()) + static_cast<int64_t>(full_.storage().nbytes());
  }

 private:
  std::vector<NamedTensor> tensors_;
  Communicator* comm_;
  std::string name_;
  std::vector<Span> spans_;
  int64_t shard_bytes_ = 0;
  at::Tensor full_, shard_;
  bool gathered_ = true;
  std::shared_ptr<Work> work_;
};

/// Global L2 norm of the gradient shards of `flats` over all ranks of `comm` (collective): the
/// norm the unsharded model's gradients have. Each parameter is in one flat parameter and each
/// element in one shard, so tied weights count once.
inline double global_grad_norm(const std::vector<FlatParameter*>& flats, Communicator& comm) {
  c10::NoGradGuard no_grad;
  at::Tensor sq;
  for (FlatParameter* f : flats) sq = sq.defined() ? sq + f->grad_sq_sum() : f->grad_sq_sum();
  if (!sq.defined()) return 0.0;
  sq = sq.reshape({1}).contiguous();
  if (comm.world_size() > 1) {
    AllReduceOptions o;
    o.op = ReduceOp::Sum;
    comm.all_reduce(sq, o)->wait();
  }
  return std::sqrt(sq.item<double>());
}

/// Groups parameters into buckets of at most `cap_elements` elements each, in the given order
/// (a parameter larger than the cap gets a bucket of its own); returns indices into `numels`.
/// ZeRO-1/2's reduce buckets (DeepSpeed's reduce_bucket_size, in elements).
inline std::vector<std::vector<size_t>> bucket_by_elements(const std::vector<int64_t>& numels,
                                                           const std::vector<size_t>& order,
                                                           int64_t cap_elements) {
  TR_CHECK(cap_elements > 0, "bucket size must be > 0 elements, got ", cap_elements);
  std::vector<std::vector<size_t>> out;
  int64_t cur = 0;
  for (size_t i : order) {
    if (out.empty() || (cur > 0 && cur + numels[i] > cap_elements)) {
      out.emplace_back();
      cur = 0;
    }
    out.back().push_back(i);
    cur += numels[i];
  }
  return out;
}

}  // namespace trainrun::v1::sharding
