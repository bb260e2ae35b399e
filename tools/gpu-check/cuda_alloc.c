/* Allocates a known amount of GPU memory through the CUDA driver API (libcuda, loaded with
 * dlopen so no CUDA toolkit is needed to build this), prints how many GPUs it sees, holds the
 * memory for a while, and exits. Used by the GPU device check: usage `cuda_alloc MIB SECONDS`. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MIB SECONDS\n", argv[0]);
        return 2;
    }
    size_t mib = strtoull(argv[1], NULL, 10);
    unsigned seconds = (unsigned)atoi(argv[2]);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror());
        return 3;
    }
    CUresult (*cuInit)(unsigned) = dlsym(lib, "cuInit");
    CUresult (*cuDeviceGetCount)(int *) = dlsym(lib, "cuDeviceGetCount");
    CUresult (*cuDeviceGet)(CUdevice *, int) = dlsym(lib, "cuDeviceGet");
    CUresult (*cuCtxCreate)(CUcontext *, unsigned, CUdevice) = dlsym(lib, "cuCtxCreate_v2");
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = dlsym(lib, "cuMemAlloc_v2");
    CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t) = dlsym(lib, "cuMemsetD8_v2");
    if (!cuInit || !cuDeviceGetCount || !cuDeviceGet || !cuCtxCreate || !cuMemAlloc || !cuMemsetD8) {
        fprintf(stderr, "libcuda lacks a symbol\n");
        return 3;
    }
    int count = 0;
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr ptr;
    if (cuInit(0) || cuDeviceGetCount(&count) || cuDeviceGet(&dev, 0) || cuCtxCreate(&ctx, 0, dev)) {
        fprintf(stderr, "CUDA initialisation failed\n");
        return 4;
    }
    printf("visible_gpus=%d\n", count);
    if (mib > 0) {
        if (cuMemAlloc(&ptr, mib << 20) || cuMemsetD8(ptr, 1, mib << 20)) {
            fprintf(stderr, "allocating %zu MiB failed\n", mib);
            return 5;
        }
    }
    printf("allocated_mib=%zu\n", mib);
    fflush(stdout);
    sleep(seconds);
    return 0;
}
