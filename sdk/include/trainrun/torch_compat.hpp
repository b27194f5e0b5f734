#pragma once
// One spelling for LibTorch APIs that changed between Debian's 1.13 and 2.x, chosen with
// TORCH_VERSION_MAJOR/MINOR, so plugins built against either compile without deprecation
// warnings (docs/gpus.md lists the differences).
#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/version.h>

namespace trainrun::v1::compat {

// LibTorch 2.4 replaced the per-device autocast functions (is_cpu_enabled, set_enabled,
// get_autocast_gpu_dtype, ...) by ones taking the device type.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
/// Whether autocast is on for `d` (kCPU or kCUDA).
inline bool autocast_enabled(c10::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
/// Turns autocast on or off for `d` (kCPU or kCUDA).
inline void set_autocast_enabled(c10::DeviceType d, bool on) {
  at::autocast::set_autocast_enabled(d, on);
}
/// The dtype autocast casts to on `d`.
inline c10::ScalarType autocast_dtype(c10::DeviceType d) {
  return at::autocast::get_autocast_dtype(d);
}
/// Sets the dtype autocast casts to on `d`.
inline void set_autocast_dtype(c10::DeviceType d, c10::ScalarType t) {
  at::autocast::set_autocast_dtype(d, t);
}
#else
inline bool autocast_enabled(c10::DeviceType d) {
  return d == c10::kCPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}
inline void set_autocast_enabled(c10::DeviceType d, bool on) {
  if (d == c10::kCPU)
    at::autocast::set_cpu_enabled(on);
  else
    at::autocast::set_enabled(on);
}
inline c10::ScalarType autocast_dtype(c10::DeviceType d) {
  return d == c10::kCPU ? at::autocast::get_autocast_cpu_dtype()
                        : at::autocast::get_autocast_gpu_dtype();
}
inline void set_autocast_dtype(c10::DeviceType d, c10::ScalarType t) {
  if (d == c10::kCPU)
    at::autocast::set_autocast_cpu_dtype(t);
  else
    at::autocast::set_autocast_gpu_dtype(t);
}
#endif

}  // namespace trainrun::v1::compat
