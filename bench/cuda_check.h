// Error checking for the standalone CUDA runtime programs under bench/: on a failed call, print where and why,
// and return 1 from the calling function (main, or a lambda that returns int).
#pragma once
#include <cstdio>

#include <cuda_runtime.h>

#define CHECK(x)                                                                             \
    do {                                                                                     \
        cudaError_t e = (x);                                                                 \
        if (e != cudaSuccess) {                                                              \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)
