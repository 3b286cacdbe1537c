/* A fake libnvidia-ml.so.1 for cli/tests/ps_cli.rs: the few NVML entry
 * points numapin calls, with the real signatures, answering from
 * environment variables of the process that loads it:
 *
 *   FAKE_NVML_GPUS   bus ids, comma-separated ("00000000:18:00.0,...")
 *   FAKE_NVML_PROCS  "gpu:pid:bytes" entries, comma-separated
 *   FAKE_NVML_HANG   when set, every process list call sleeps (an NVML
 *                    that blocks while another process pins memory)
 *
 * Built with -DNO_V3 it lacks the _v3 process calls, as drivers before
 * 510 do. Not NVML: a test fixture only.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} info_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} pci_t;

/* The n-th comma-separated field of an environment variable, into out. */
static int field(const char *var, unsigned n, char *out, size_t len) {
    const char *s = getenv(var);
    if (!s) return 0;
    for (unsigned i = 0; i < n; i++) {
        s = strchr(s, ',');
        if (!s) return 0;
        s++;
    }
    size_t k = strcspn(s, ",");
    if (k == 0 || k >= len) return 0;
    memcpy(out, s, k);
    out[k] = 0;
    return 1;
}

static unsigned gpu_count(void) {
    char b[64];
    unsigned n = 0;
    while (field("FAKE_NVML_GPUS", n, b, sizeof b)) n++;
    return n;
}

static unsigned gpu_of(void *d) { return (unsigned)((uintptr_t)d - 1); }

int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int r) { return r == 0 ? "Success" : "fake error"; }

int nvmlSystemGetDriverVersion(char *v, unsigned n) {
    snprintf(v, n, "%s", "550.54.15");
    return 0;
}

int nvmlDeviceGetCount_v2(unsigned *n) {
    *n = gpu_count();
    return 0;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **d) {
    if (i >= gpu_count()) return 2;
    *d = (void *)(uintptr_t)(i + 1);
    return 0;
}

int nvmlDeviceGetPciInfo_v3(void *d, pci_t *p) {
    memset(p, 0, sizeof *p);
    return field("FAKE_NVML_GPUS", gpu_of(d), p->busId, sizeof p->busId) ? 0 : 2;
}

int nvmlDeviceGetMinorNumber(void *d, unsigned *m) {
    *m = gpu_of(d);
    return 0;
}

/* The compute list of a GPU: NVML's protocol (a count that is too small
 * gives NVML_ERROR_INSUFFICIENT_SIZE and the count needed). */
static int compute(void *d, unsigned *count, info_t *infos) {
    if (getenv("FAKE_NVML_HANG")) sleep(3600);
    char e[96];
    unsigned n = 0;
    for (unsigned i = 0; field("FAKE_NVML_PROCS", i, e, sizeof e); i++) {
        unsigned gpu, pid;
        unsigned long long bytes;
        if (sscanf(e, "%u:%u:%llu", &gpu, &pid, &bytes) != 3 || gpu != gpu_of(d)) continue;
        if (infos && n < *count) {
            infos[n].pid = pid;
            infos[n].usedGpuMemory = bytes;
            infos[n].gpuInstanceId = 0xffffffff;
            infos[n].computeInstanceId = 0xffffffff;
        }
        n++;
    }
    int too_small = n > *count;
    *count = n;
    return too_small ? 7 : 0;
}

static int none(void *d, unsigned *count, info_t *infos) {
    (void)d;
    (void)infos;
    *count = 0;
    return 0;
}

#ifndef NO_V3
int nvmlDeviceGetComputeRunningProcesses_v3(void *d, unsigned *c, info_t *i) { return compute(d, c, i); }
int nvmlDeviceGetGraphicsRunningProcesses_v3(void *d, unsigned *c, info_t *i) { return none(d, c, i); }
#endif
int nvmlDeviceGetComputeRunningProcesses_v2(void *d, unsigned *c, info_t *i) { return compute(d, c, i); }
int nvmlDeviceGetGraphicsRunningProcesses_v2(void *d, unsigned *c, info_t *i) { return none(d, c, i); }
