/* Stands in for NVIDIA's CUDA driver library libcuda.so.1 (package libnvidia-compute-*); lab only. */
/* cuInit answers from the stand-in driver's state in /run/nvidia-standin (the real library
 * asks the kernel driver; a container sees the same directory, mounted by nvidia-container-cli):
 *   loaded-version missing        -> CUDA_ERROR_NO_DEVICE (100): no driver, no device;
 *   loaded-version != this build  -> CUDA_ERROR_SYSTEM_DRIVER_MISMATCH (803): cuda.h, "a mismatch
 *                                    between the versions of the display driver and the CUDA driver";
 *   fabric-state present and not "Completed" -> CUDA_ERROR_SYSTEM_NOT_READY (802): cuda.h, "the
 *                                    system is not yet ready to start any CUDA work ... all required
 *                                    driver daemons are actively running"; NVIDIA's Fabric Manager
 *                                    user guide: on NVSwitch systems CUDA initialisation fails with
 *                                    cudaErrorSystemNotReady until the fabric manager has configured
 *                                    the NVSwitches. load-module writes "Not Started" at boot on a
 *                                    node with NVSwitches, nv-fabricmanager "Completed" while it runs.
 * DTLAB_STANDIN_RUN_DIR replaces /run/nvidia-standin in unit tests only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_SYSTEM_NOT_READY 802
#define CUDA_ERROR_SYSTEM_DRIVER_MISMATCH 803

static int read_state(const char *name, char *out, size_t size)
{
    char path[512];
    const char *dir = getenv("DTLAB_STANDIN_RUN_DIR");
    FILE *f;
    snprintf(path, sizeof path, "%s/%s", dir && *dir ? dir : "/run/nvidia-standin", name);
    f = fopen(path, "r");
    if (f == NULL)
        return -1;
    if (fgets(out, (int)size, f) == NULL)
        out[0] = '\0';
    fclose(f);
    out[strcspn(out, "\r\n")] = '\0';
    return 0;
}

CUresult cuInit(unsigned int flags)
{
    char state[64] = {0};
    (void)flags;
    if (read_state("loaded-version", state, sizeof state) != 0)
        return CUDA_ERROR_NO_DEVICE;
    if (strcmp(state, DRIVER_VERSION) != 0)
        return CUDA_ERROR_SYSTEM_DRIVER_MISMATCH;
    if (read_state("fabric-state", state, sizeof state) == 0 && strcmp(state, "Completed") != 0)
        return CUDA_ERROR_SYSTEM_NOT_READY;
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version)
{
    if (version == 0)
        return CUDA_ERROR_INVALID_VALUE;
    *version = CUDA_DRIVER_API_VERSION;
    return CUDA_SUCCESS;
}
