/* A stand-in for the driver's NVML library in the judge library's tests: two GPUs; the first
 * reports 500 MiB used plus the number of bytes written in the file FAKE_NVML_USED names, the
 * second refuses to be read (as a GPU not passed into a sandbox does). */
#include <stdio.h>
#include <stdlib.h>

typedef struct {
	unsigned long long total, free, used;
} nvmlMemory_t;

int nvmlInit_v2(void) { return 0; }

int nvmlShutdown(void) { return 0; }

int nvmlDeviceGetCount_v2(unsigned int *count) {
	*count = 2;
	return 0;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
	if (index > 1)
		return 2; /* NVML_ERROR_INVALID_ARGUMENT */
	*device = (void *)(unsigned long)(index + 1);
	return 0;
}

int nvmlDeviceGetMemoryInfo(void *device, nvmlMemory_t *memory) {
	unsigned long long used = 0;
	const char *path = getenv("FAKE_NVML_USED");
	FILE *f;
	if ((unsigned long)device != 1)
		return 4; /* NVML_ERROR_NO_PERMISSION */
	if (path && (f = fopen(path, "r"))) {
		if (fscanf(f, "%llu", &used) != 1)
			used = 0;
		fclose(f);
	}
	memory->total = 80ULL << 30;
	memory->used = (500ULL << 20) + used;
	memory->free = memory->total - memory->used;
	return 0;
}
