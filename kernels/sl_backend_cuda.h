// sl_backend_cuda.h -- CUDA (NVRTC through mx.fast.cuda_kernel) definitions for sl_mamba.h.
// Lane type: float, one CUDA thread per (batch, channel).
// Strict mode uses the __f*_rn intrinsics, which the compiler never contracts into an FMA.
#ifndef SL_BACKEND_CUDA_H
#define SL_BACKEND_CUDA_H

#define SL_BACKEND_CUDA 1
#define SL_FN __device__ __forceinline__
#define SL_I64 long long
// The kernel bodies' thread index and its type; the argument (Metal's thread attribute, named
// in the shared bodies) is not used here.
#define SL_INDEX long long
#define SL_THREAD_INDEX(position) ((long long)blockIdx.x * blockDim.x + threadIdx.x)
#define SL_SPLAT(V, s) ((V)(s))
#define SL_LOAD(V, p) ((V)(p)[0])
#define SL_LOAD_STRIDED(V, p, s) ((V)(p)[0])
#define SL_STORE(p, v) ((p)[0] = (v))
#define SL_MUL(a, b) __fmul_rn((a), (b))
#define SL_ADD(a, b) __fadd_rn((a), (b))
#define SL_SUB(a, b) __fsub_rn((a), (b))
#define SL_DIV(a, b) __fdiv_rn((a), (b))
#define SL_PREFETCH(p, steps, stride) ((void)0)
#define SL_STRICT_FP_BEGIN
#define SL_UNROLL _Pragma("unroll")

SL_FN float sl_exp(float x) { return expf(x); }
SL_FN float sl_exp_fast(float x) { return __expf(x); }
SL_FN float sl_exp_fast_decay(float x) { return __expf(x); }
SL_FN float sl_exp_precise(float x) { return expf(x); }
SL_FN float sl_log(float x) { return logf(x); }
SL_FN float sl_log1p(float x) { return log1pf(x); }
SL_FN float sl_rint(float x) { return rintf(x); }
SL_FN float sl_abs(float x) { return fabsf(x); }
SL_FN float sl_max(float a, float b) { return fmaxf(a, b); }
// Fast variants (the CUDA scan's standard mode): the SFU's approximate 2^x (flushes denormals to
// zero: a decay that small is zero for the state either way), __logf and __fdividef.
#ifndef SL_CUDA_ON_CPU
SL_FN float sl_ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
#endif
SL_FN float sl_exp2_fast_decay(float x) { return sl_ex2_approx(x); }
SL_FN float sl_log_fast(float x) { return __logf(x); }
SL_FN float sl_recip_fast(float x) { return __fdividef(1.0f, x); }
SL_FN float sl_pow2_int(float k) { return __int_as_float((__float2int_rn(k) + 127) << 23); }

#endif  // SL_BACKEND_CUDA_H
