// cuda_cpu_shim.h -- the CUDA names that sl_backend_cuda.h and the *_body.h kernel bodies use,
// defined for a C++17 CPU compiler, so tests/test_metal_source.py can also compile the CUDA
// kernels' per-thread logic without a GPU. Not used on a GPU (MLX compiles the real thing with
// NVRTC). __expf is the C library's expf here; the __f*_rn intrinsics are plain IEEE float
// operations (compile with -ffp-contract=off so nothing is fused).
#ifndef SL_CUDA_CPU_SHIM_H
#define SL_CUDA_CPU_SHIM_H

#include <math.h>

#include <cstdint>
#include <cstring>

#define __device__
#define __forceinline__ inline

struct sl_dim3 {
  unsigned int x, y, z;
};
static thread_local sl_dim3 blockIdx, blockDim, threadIdx;

inline float __expf(float x) { return expf(x); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}

#endif  // SL_CUDA_CPU_SHIM_H
