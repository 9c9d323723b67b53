// Three small sm_90a kernels whose compiler output is the fixture of
// tests/experiments/test_kernel_facts.py (how it was made: README.md here).
#include <cstdint>
#include <mma.h>
#include <cuda_bf16.h>

// mma.sync through wmma: HMMA in SASS.
extern "C" __global__ void tile_mma(const __nv_bfloat16* a,
                                    const __nv_bfloat16* b, float* c) {
  using namespace nvcuda;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  wmma::fill_fragment(fc, 0.0f);
  for (int i = 0; i < 4; ++i) {
    wmma::load_matrix_sync(fa, a + 256 * i, 16);
    wmma::load_matrix_sync(fb, b + 256 * i, 16);
    wmma::mma_sync(fc, fa, fb, fc);
  }
  wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}

// 32 live floats under a 32-register cap: spills.
extern "C" __global__ void pressure(const float* x, float* y, int n) {
  float acc[32];
#pragma unroll
  for (int j = 0; j < 32; ++j) acc[j] = x[threadIdx.x * 32 + j];
  for (int i = 0; i < n; ++i) {
#pragma unroll
    for (int j = 0; j < 32; ++j) acc[j] = acc[j] * acc[(j + i) % 32] + 1.0f;
  }
  float s = 0;
#pragma unroll
  for (int j = 0; j < 32; ++j) s += acc[j];
  y[threadIdx.x] = s;
}

// Four warpgroup MMAs (wgmma.mma_async): HGMMA in SASS. Descriptors are
// arguments: the kernel is compiled, never run.
extern "C" __global__ void tile_wgmma(uint64_t da, uint64_t db, float* out) {
  float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  for (int i = 0; i < 4; ++i) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
        : "l"(da + 2 * i), "l"(db + 2 * i), "r"(1));
  }
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  out[threadIdx.x * 4 + 0] = d0;
  out[threadIdx.x * 4 + 1] = d1;
  out[threadIdx.x * 4 + 2] = d2;
  out[threadIdx.x * 4 + 3] = d3;
}
