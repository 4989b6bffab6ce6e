// What one synchronisation between dependent phases of a decode step costs on this GPU, measured three ways:
//   launches  a CUDA graph of N kernels, each waiting for the one before (plain stream order);
//   pdl       the same with programmatic dependent launch (each kernel triggers its dependents on entry and waits
//             with griddepcontrol.wait, as tooltrie's decode kernels do);
//   barrier   one persistent kernel whose blocks pass N grid-wide barriers (one atomic per block on a counter,
//             then a spin on it until every block has arrived).
// Each phase reads a value the previous phase wrote (so the dependency is real) and writes one. The grid is two
// 256-thread blocks per SM, like the decode GEMVs. Prints microseconds per synchronisation as JSON.
//   nvcc -arch=sm_90 -O3 -o build/gpu_sync_cost bench/gpu_sync_cost.cu && build/gpu_sync_cost
#include <cstdio>
#include <cuda_runtime.h>

#include "cuda_check.h"

__device__ __forceinline__ void phase_work(float* buf, int phase) {
    // one dependent L2 round trip per block: read what the previous phase wrote, write for the next
    if (threadIdx.x == 0) {
        const float v = __ldcg(buf + ((blockIdx.x + 7) % gridDim.x) * 32 + (phase & 1) * 16);
        __stcg(buf + blockIdx.x * 32 + ((phase + 1) & 1) * 16, v + 1.0f);
    }
}

__global__ void phase_kernel(float* buf, int phase, int pdl) {
    if (pdl) {
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
        asm volatile("griddepcontrol.wait;" ::: "memory");
    }
    phase_work(buf, phase);
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__global__ void barrier_kernel(float* buf, unsigned* counter, int phases) {
    for (int phase = 0; phase < phases; ++phase) {
        phase_work(buf, phase);
        __syncthreads();
        if (threadIdx.x == 0) {
            const unsigned target = (unsigned)(phase + 1) * gridDim.x;
            __threadfence();
            atomicAdd(counter, 1u);
            while (ld_acquire(counter) < target) {
            }
        }
        __syncthreads();
    }
}

int main() {
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int blocks = 2 * sms, threads = 256, phases = 140, repeats = 50;
    float* buf;
    unsigned* counter;
    CHECK(cudaMalloc(&buf, blocks * 32 * sizeof(float)));
    CHECK(cudaMalloc(&counter, sizeof(unsigned)));
    CHECK(cudaMemset(buf, 0, blocks * 32 * sizeof(float)));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    float us[2];
    for (int pdl = 0; pdl < 2; ++pdl) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int p = 0; p < phases; ++p) {
            cudaLaunchConfig_t cfg = {};
            cudaLaunchAttribute attr;
            attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
            attr.val.programmaticStreamSerializationAllowed = 1;
            cfg.gridDim = dim3(blocks);
            cfg.blockDim = dim3(threads);
            cfg.stream = s;
            cfg.attrs = &attr;
            cfg.numAttrs = pdl;
            CHECK(cudaLaunchKernelEx(&cfg, phase_kernel, buf, p, pdl));
        }
        CHECK(cudaStreamEndCapture(s, &g));
        CHECK(cudaGraphInstantiate(&ge, g, 0));
        CHECK(cudaGraphLaunch(ge, s));
        CHECK(cudaEventRecord(a, s));
        for (int r = 0; r < repeats; ++r) CHECK(cudaGraphLaunch(ge, s));
        CHECK(cudaEventRecord(b, s));
        CHECK(cudaEventSynchronize(b));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        us[pdl] = ms * 1e3f / repeats / phases;
    }
    float ms_barrier = 0;
    for (int r = -1; r < repeats; ++r) {
        CHECK(cudaMemsetAsync(counter, 0, sizeof(unsigned), s));
        if (r == 0) CHECK(cudaEventRecord(a, s));
        barrier_kernel<<<blocks, threads, 0, s>>>(buf, counter, phases);
        CHECK(cudaGetLastError());
    }
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    CHECK(cudaEventElapsedTime(&ms_barrier, a, b));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("{\"device\": \"%s\", \"blocks\": %d, \"threads\": %d, \"phases\": %d, \"us_per_launch\": %.3f, "
           "\"us_per_pdl_launch\": %.3f, \"us_per_grid_barrier\": %.3f}\n",
           prop.name, blocks, threads, phases, us[0], us[1], ms_barrier * 1e3f / repeats / phases);
    return 0;
}
