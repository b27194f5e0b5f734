#pragma once
// The v1::Communicator functions every collective backend (gloo-cpu, mpi, nccl, and the cuda
// accelerator's staging through host memory) overrides alike, declared once. A default argument
// of a virtual function is taken from the static type of the call, so each override has to
// repeat the SDK's defaults (`= {}`) exactly; one list keeps the backends from drifting apart
// from each other and from v1::Communicator.
#include <trainrun/interfaces.hpp>

/// Declares, inside a class derived from v1::Communicator, the overrides of rank, world_size,
/// all_reduce, reduce_scatter, all_gather, broadcast, send, recv and barrier with the SDK's
/// signatures and default options. The class defines them in its source file; backend() and
/// new_group() (and recv_reduce where a backend has its own) stay declared in the class, where
/// their documentation differs.
#define TRAINRUN_COMMUNICATOR_OVERRIDES                                                          \
  int rank() const override;                                                                     \
  int world_size() const override;                                                               \
  std::shared_ptr<::trainrun::v1::Work> all_reduce(                                              \
      at::Tensor& tensor, const ::trainrun::v1::AllReduceOptions& opts = {}) override;           \
  std::shared_ptr<::trainrun::v1::Work> reduce_scatter(                                          \
      const at::Tensor& input, at::Tensor& output,                                               \
      const ::trainrun::v1::ReduceScatterOptions& opts = {}) override;                           \
  std::shared_ptr<::trainrun::v1::Work> all_gather(                                              \
      const at::Tensor& input, at::Tensor& output,                                               \
      const ::trainrun::v1::AllGatherOptions& opts = {}) override;                               \
  std::shared_ptr<::trainrun::v1::Work> broadcast(                                               \
      at::Tensor& tensor, const ::trainrun::v1::BroadcastOptions& opts = {}) override;           \
  std::shared_ptr<::trainrun::v1::Work> send(                                                    \
      const at::Tensor& tensor, const ::trainrun::v1::PointToPointOptions& opts) override;       \
  std::shared_ptr<::trainrun::v1::Work> recv(                                                    \
      at::Tensor& tensor, const ::trainrun::v1::PointToPointOptions& opts) override;             \
  std::shared_ptr<::trainrun::v1::Work> barrier(const ::trainrun::v1::BarrierOptions& opts = {}) \
      override
