/* Stands in for NVIDIA's NVML library libnvidia-ml.so.1 (package libnvidia-compute-*); lab only. */
/* Same driver-state rule as the nvidia-smi stand-in: the module version loaded at boot is in
 * /run/nvidia-standin/loaded-version; NVML's return codes 9 and 18 mean not loaded / mismatch. */
#include <stdio.h>
#include <string.h>

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_LIB_RM_VERSION_MISMATCH 18

nvmlReturn_t nvmlInit_v2(void)
{
    char loaded[64] = {0};
    FILE *f = fopen("/run/nvidia-standin/loaded-version", "r");
    if (f == NULL)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    if (fgets(loaded, sizeof loaded, f) == NULL)
        loaded[0] = '\0';
    fclose(f);
    loaded[strcspn(loaded, "\r\n")] = '\0';
    return strcmp(loaded, DRIVER_VERSION) == 0 ? NVML_SUCCESS : NVML_ERROR_LIB_RM_VERSION_MISMATCH;
}

nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }

nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    if (length < sizeof DRIVER_VERSION)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(version, DRIVER_VERSION, sizeof DRIVER_VERSION);
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "Driver/library version mismatch";
    default: return "Unknown Error";
    }
}
