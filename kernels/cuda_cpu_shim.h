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

#include <cmath>

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

// sl_gemm_cuda.h's bit casts and its warp-wide tensor-core product, emulated. Every thread of
// the block must call sl_mma_tf32 together, as on the GPU every lane of a warp does: each lane
// posts its fragments, all meet at the barrier, each computes its own four results from its
// warp's posted tiles with the fragment layout of PTX's mma.m16n8k8 (.tf32), and all meet again
// before the next post. As on the GPU, an operand's low 13 bits are ignored and the sum is
// truncated (here: exact, then rounded toward zero), so an accumulation that drifts shows here.
inline unsigned sl_float_bits(float x) {
  unsigned u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float sl_bits_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
constexpr int SL_CPU_MAX_WARPS = 32;
struct sl_cpu_warp_tiles {
  unsigned a[SL_CPU_MAX_WARPS][32][4], b[SL_CPU_MAX_WARPS][32][2];
};
inline void sl_mma_tf32(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  static sl_cpu_warp_tiles posted;
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  std::memcpy(posted.a[warp][lane], a, sizeof a);
  std::memcpy(posted.b[warp][lane], b, sizeof b);
  __syncthreads();
  const auto A = [&](int row, int k) {  // the tensor core reads only a TF32 operand's top bits
    const unsigned l = (row % 8) * 4 + k % 4, reg = (row >= 8 ? 1 : 0) + (k >= 4 ? 2 : 0);
    return sl_bits_float(posted.a[warp][l][reg] & 0xffffe000u);
  };
  const auto B = [&](int k, int col) {
    return sl_bits_float(posted.b[warp][col * 4 + k % 4][k >= 4 ? 1 : 0] & 0xffffe000u);
  };
  const int g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + i % 2;
    double sum = c[i];
    for (int k = 0; k < 8; ++k) sum += (double)A(row, k) * B(k, col);  // exact (11 x 11 bits)
    float rounded = (float)sum;
    if (std::fabs((double)rounded) > std::fabs(sum)) rounded = std::nextafter(rounded, 0.0f);
    c[i] = rounded;
  }
  __syncthreads();
}

// sl_gemm_cuda.h's asynchronous copies (done at once here: the barriers that follow a wait on
// the GPU order them the same way) and its warp shuffle (every thread of the block must call
// it together: each lane posts its value, all meet, each reads its partner's, all meet again).
inline void sl_cp_async16(float* dst, const float* src, bool valid) {
  if (valid) {
    std::memcpy(dst, src, 16);
  } else {
    std::memset(dst, 0, 16);
  }
}
inline void sl_cp_async_commit() {}
template <int PENDING>
inline void sl_cp_async_wait() {}
inline float sl_shfl_xor(float v, int mask) {
  static float posted[SL_CPU_MAX_WARPS * 32];
  posted[threadIdx.x] = v;
  __syncthreads();
  const float partner = posted[threadIdx.x ^ (unsigned)mask];
  __syncthreads();
  return partner;
}

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
