// metal_cpu_shim.h -- the few Metal names that sl_backend_metal.h and the *_body.h kernel bodies
// use, defined for a C++17 CPU compiler, so tests/test_metal_source.py can compile the Metal
// kernels' per-thread logic on a machine without Metal and check it against the float64
// reference. Not used on a GPU.
//
// The shim's fast::exp is the C library's expf (the GPU's fast exp is less accurate; the tests'
// tolerances allow for that), precise:: names map to the C library as well.
#ifndef SL_METAL_CPU_SHIM_H
#define SL_METAL_CPU_SHIM_H

#include <cmath>
#include <cstdint>
#include <cstring>

#define device
#define constant
#define thread

typedef unsigned int uint;
struct uint3 {
  uint x, y, z;
};

template <typename T, typename U>
inline T as_type(U u) {
  static_assert(sizeof(T) == sizeof(U), "as_type needs equal sizes");
  T t;
  std::memcpy(&t, &u, sizeof(T));
  return t;
}

namespace metal {
inline float exp(float x) { return std::exp(x); }
inline float log(float x) { return std::log(x); }
inline float rint(float x) { return std::rint(x); }
inline float abs(float x) { return std::fabs(x); }
inline float max(float a, float b) { return std::fmax(a, b); }
namespace fast {
inline float exp(float x) { return std::exp(x); }
inline float exp2(float x) { return std::exp2(x); }
inline float log(float x) { return std::log(x); }
inline float divide(float a, float b) { return a / b; }
}  // namespace fast
namespace precise {
inline float exp(float x) { return std::exp(x); }
inline float log(float x) { return std::log(x); }
}  // namespace precise
}  // namespace metal

#endif  // SL_METAL_CPU_SHIM_H
