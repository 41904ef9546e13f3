// cuda_cpu_shim.h -- the CUDA names that sl_backend_cuda.h and the *_body.h kernel bodies use,
// defined for a C++17 CPU compiler, so tests/test_metal_source.py can also compile the CUDA
// kernels' per-thread logic without a GPU. Not used on a GPU (MLX compiles the real thing with
// NVRTC). __expf is the C library's expf here; the __f*_rn intrinsics are plain IEEE float
// operations (compile with -ffp-contract=off so nothing is fused). A block's threads run as
// std::threads of their own (sl_cuda_cpu_launch), so __shared__ arrays and __syncthreads behave
// as on the GPU: one array per block, every thread waits at the barrier (link with -pthread).
#ifndef SL_CUDA_CPU_SHIM_H
#define SL_CUDA_CPU_SHIM_H

#include <math.h>

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#define SL_CUDA_ON_CPU 1
#define __device__
#define __global__
#define __forceinline__ inline
// One block runs at a time, so a function-local static is that block's shared memory.
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct __attribute__((aligned(16))) float4 {
  float x, y, z, w;
};

struct sl_dim3 {
  unsigned int x, y, z;
};
static thread_local sl_dim3 blockIdx, blockDim, threadIdx;

inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float sl_ex2_approx(float x) { return exp2f(x); }
inline float __ldg(const float* p) { return *p; }
inline float4 __ldg(const float4* p) { return *p; }
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

// The barrier of the block that is running: all blockDim.x threads must reach it.
struct sl_cpu_barrier {
  std::mutex m;
  std::condition_variable cv;
  unsigned count = 0, waiting = 0, generation = 0;
  void wait() {
    std::unique_lock<std::mutex> lock(m);
    const unsigned gen = generation;
    if (++waiting == count) {
      waiting = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return gen != generation; });
    }
  }
};
inline sl_cpu_barrier& sl_cpu_block_barrier() {
  static sl_cpu_barrier barrier;
  return barrier;
}
inline void __syncthreads() { sl_cpu_block_barrier().wait(); }

// Runs fn() once per thread of a 1-D grid of `blocks` x `threads`, one block after the other,
// the threads of a block concurrently (so they meet at __syncthreads).
template <typename F>
void sl_cuda_cpu_launch(unsigned blocks, unsigned threads, F fn) {
  sl_cpu_block_barrier().count = threads;
  for (unsigned blk = 0; blk < blocks; ++blk) {
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (unsigned i = 0; i < threads; ++i) {
      pool.emplace_back([=] {
        blockIdx = {blk, 0, 0};
        blockDim = {threads, 1, 1};
        threadIdx = {i, 0, 0};
        fn();
      });
    }
    for (auto& worker : pool) worker.join();
  }
}

#endif  // SL_CUDA_CPU_SHIM_H
