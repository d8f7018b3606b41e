/* gpu.c: the host's GPUs through NVML and the CUDA driver (both dlopen'ed, symbols resolved
 * once per process behind pthread_once), and tsp_gpu_assign: Spark's addresses plus the
 * executor's CUDA_VISIBLE_DEVICES -> the workers' mask, by the rules R0-R8 of docs/gpu.md,
 * every refusal with that document's message. */
#include "torchspark/gpu.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cudaapi.h"
#include "util.h"

/* ---- the dlopen tables ---- */

static void loaded_path(void *sym, const char *fallback, char *out, size_t len)
{
    Dl_info info;
    if (sym && dladdr(sym, &info) && info.dli_fname)
        snprintf(out, len, "%s", info.dli_fname);
    else
        snprintf(out, len, "%s", fallback);
}

static struct {
    pthread_once_t once;
    tsp_cuda_api_t api;
    int ok;
    char missing[512]; /* dlerror() when the library could not be loaded */
} cuda = {.once = PTHREAD_ONCE_INIT};

static void cuda_load(void)
{
    const char *path = getenv("TORCHSPARK_LIBCUDA");
    const char *name = path && *path ? path : "libcuda.so.1";
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) { /* no driver: a CPU-only host */
        const char *e = dlerror();
        snprintf(cuda.missing, sizeof cuda.missing, "%s", e ? e : name);
        return;
    }
    cuda.api.handle = h;
    cuda.api.complete = 1;
#define TSP_API_RESOLVE(field, sym, ret, params)                                                   \
    cuda.api.field = (tsp_##sym##_fn)(uintptr_t)dlsym(h, #sym);                                    \
    if (!cuda.api.field)                                                                           \
        cuda.api.complete = 0;
    TSP_CUDA_FUNCS(TSP_API_RESOLVE)
#undef TSP_API_RESOLVE
    loaded_path((void *)(uintptr_t)cuda.api.init, name, cuda.api.path, sizeof cuda.api.path);
    cuda.ok = cuda.api.init && cuda.api.device_get_count;
}

const tsp_cuda_api_t *tsp__cuda_api(void)
{
    pthread_once(&cuda.once, cuda_load);
    return cuda.ok ? &cuda.api : NULL;
}

const char *tsp__cuda_missing(void)
{
    pthread_once(&cuda.once, cuda_load);
    return cuda.missing[0] ? cuda.missing : NULL;
}

static struct {
    pthread_once_t once;
    tsp_nvml_api_t api;
    int ok;
} nvml = {.once = PTHREAD_ONCE_INIT};

static void nvml_load(void)
{
    const char *path = getenv("TORCHSPARK_LIBNVML");
    const char *name = path && *path ? path : "libnvidia-ml.so.1";
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return;
    nvml.api.handle = h;
    int complete = 1;
#define TSP_API_RESOLVE(field, sym, ret, params)                                                   \
    nvml.api.field = (tsp_##sym##_fn)(uintptr_t)dlsym(h, #sym);                                    \
    if (!nvml.api.field)                                                                           \
        complete = 0;
    TSP_NVML_FUNCS(TSP_API_RESOLVE)
#undef TSP_API_RESOLVE
    loaded_path((void *)(uintptr_t)nvml.api.init, name, nvml.api.path, sizeof nvml.api.path);
    nvml.ok = complete;
}

const tsp_nvml_api_t *tsp__nvml_api(void)
{
    pthread_once(&nvml.once, nvml_load);
    return nvml.ok ? &nvml.api : NULL;
}

const char *tsp__cuda_error_name(tsp_cu_result rc)
{
    static _Thread_local char buf[32];
    const tsp_cuda_api_t *api = tsp__cuda_api();
    const char *name = NULL;
    if (api && api->get_error_name && api->get_error_name(rc, &name) == 0 && name)
        return name;
    switch (rc) {
    case 3:
        return "CUDA_ERROR_NOT_INITIALIZED";
    case 34:
        return "CUDA_ERROR_STUB_LIBRARY";
    case 35:
        return "CUDA_ERROR_INSUFFICIENT_DRIVER";
    case 46:
        return "CUDA_ERROR_DEVICES_UNAVAILABLE";
    case 100:
        return "CUDA_ERROR_NO_DEVICE";
    case 101:
        return "CUDA_ERROR_INVALID_DEVICE";
    case 999:
        return "CUDA_ERROR_UNKNOWN";
    default:
        snprintf(buf, sizeof buf, "CUDA error %u", rc);
        return buf;
    }
}

/* ---- small text helpers ---- */

static const char *host_or_self(const char *host, char *buf, size_t len)
{
    if (host && *host)
        return host;
    if (gethostname(buf, len - 1) != 0)
        snprintf(buf, len, "?");
    buf[len - 1] = 0;
    return buf;
}

/* A Python repr of a str: '...' with \ and ' escaped. */
static void cat_repr(char *buf, size_t len, const char *s, size_t n)
{
    tsp__err_append(buf, len, "'");
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\\' || s[i] == '\'')
            tsp__err_append(buf, len, "\\%c", s[i]);
        else
            tsp__err_append(buf, len, "%c", s[i]);
    }
    tsp__err_append(buf, len, "'");
}

/* {mask!r}: 'a,b' or None */
static void cat_mask(char *buf, size_t len, const char *mask)
{
    if (mask)
        cat_repr(buf, len, mask, strlen(mask));
    else
        tsp__err_append(buf, len, "None");
}

#define MAX_ENTRIES 128

typedef struct {
    int n;
    const char *s[MAX_ENTRIES];
    size_t len[MAX_ENTRIES];
} list_t;

/* Splits on commas; entries are trimmed of blanks; an empty string is no entry at all. */
static int split(const char *csv, list_t *l)
{
    l->n = 0;
    if (!csv || !*csv)
        return 0;
    const char *p = csv;
    for (;;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        const char *a = p;
        while (n && isspace((unsigned char)*a))
            a++, n--;
        while (n && isspace((unsigned char)a[n - 1]))
            n--;
        if (l->n == MAX_ENTRIES)
            return -E2BIG;
        l->s[l->n] = a;
        l->len[l->n] = n;
        l->n++;
        if (!end)
            return 0;
        p = end + 1;
    }
}

/* {addrs}: Python's repr of a list of str, e.g. ['0', '01'] */
static void cat_list(char *buf, size_t len, const list_t *l)
{
    tsp__err_append(buf, len, "[");
    for (int i = 0; i < l->n; i++) {
        if (i)
            tsp__err_append(buf, len, ", ");
        cat_repr(buf, len, l->s[i], l->len[i]);
    }
    tsp__err_append(buf, len, "]");
}

static int is_int(const char *s, size_t n)
{
    if (n == 0 || n > 9)
        return 0;
    if (s[0] == '0')
        return n == 1;
    for (size_t i = 0; i < n; i++)
        if (!isdigit((unsigned char)s[i]))
            return 0;
    return 1;
}

static int is_hexdash(const char *s, size_t n)
{
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isxdigit((unsigned char)s[i]) && s[i] != '-')
            return 0;
    return 1;
}

static int has_prefix(const char *s, size_t n, const char *p)
{
    size_t k = strlen(p);
    return n >= k && strncmp(s, p, k) == 0;
}

/* R1: an integer without zero padding, GPU-<hex> (a unique prefix is enough), MIG-<hex>,
 * or the older MIG-GPU-<uuid>/<gi>/<ci>. */
enum { ADDR_BAD, ADDR_INT, ADDR_GPU, ADDR_MIG };

static int addr_kind(const char *s, size_t n)
{
    if (is_int(s, n))
        return ADDR_INT;
    if (has_prefix(s, n, "MIG-GPU-")) {
        for (size_t i = 8; i < n; i++)
            if (!isxdigit((unsigned char)s[i]) && s[i] != '-' && s[i] != '/')
                return ADDR_BAD;
        return n > 8 ? ADDR_MIG : ADDR_BAD;
    }
    if (has_prefix(s, n, "MIG-"))
        return is_hexdash(s + 4, n - 4) ? ADDR_MIG : ADDR_BAD;
    if (has_prefix(s, n, "GPU-"))
        return is_hexdash(s + 4, n - 4) ? ADDR_GPU : ADDR_BAD;
    return ADDR_BAD;
}

/* "GPU-8f2a61c3": the prefix and 8 hex digits */
static void uuid8(const char *uuid, char *out, size_t len)
{
    const char *dash = strchr(uuid, '-');
    size_t keep = dash ? (size_t)(dash - uuid) + 1 + 8 : 8;
    snprintf(out, len, "%.*s", (int)keep, uuid);
}

void tsp__gpu_inventory_text(const tsp_gpu_inventory_t *inv, char *out, size_t len)
{
    out[0] = 0;
    for (int i = 0; i < inv->ndev; i++) {
        char u[32];
        uuid8(inv->dev[i].uuid, u, sizeof u);
        tsp__err_append(out, len, "%s%d: %s %s %s", i ? "; " : "", inv->dev[i].index, u,
                        inv->dev[i].bus, inv->dev[i].name);
    }
    if (inv->ndev == 0)
        tsp__err_append(out, len, "none");
}

/* ---- inventory ---- */

/* NVML's "00000000:3B:00.0" -> "0000:3b:00.0" (the domain kept to 4 digits when it fits). */
static void normalise_bus(const char *in, char *out, size_t len)
{
    const char *p = in;
    const char *colon = strchr(in, ':');
    if (colon && colon - in == 8 && strncmp(in, "0000", 4) == 0)
        p = in + 4;
    size_t i = 0;
    for (; *p && i + 1 < len; p++)
        out[i++] = (char)tolower((unsigned char)*p);
    out[i] = 0;
}

static int nvml_fail(const tsp_nvml_api_t *api, tsp_nvml_return rc, const char *what,
                     const char *host, char *err, size_t errlen)
{
    if (err && errlen)
        snprintf(err, errlen, "torchspark: NVML failed on host %s: %s: %s (NVML error %u)", host,
                 what, api->error_string ? api->error_string(rc) : "?", rc);
    return -EIO;
}

static int inventory_on(const char *host_name, tsp_gpu_inventory_t *inv, char *err, size_t errlen)
{
    char hbuf[256];
    const char *host = host_or_self(host_name, hbuf, sizeof hbuf);
    memset(inv, 0, sizeof *inv);
    const tsp_nvml_api_t *api = tsp__nvml_api();
    if (!api)
        return -ENOENT;
    tsp_nvml_return rc = api->init();
    if (rc == TSP_NVML_ERROR_DRIVER_NOT_LOADED) {
        if (err && errlen)
            snprintf(err, errlen,
                     "torchspark: the NVIDIA driver is not loaded on host %s "
                     "(NVML_ERROR_DRIVER_NOT_LOADED); nvidia-smi fails there the same way",
                     host);
        return -ENODEV;
    }
    if (rc != TSP_NVML_SUCCESS)
        return nvml_fail(api, rc, "nvmlInit_v2", host, err, errlen);
    unsigned int n = 0;
    rc = api->get_count(&n);
    if (rc != TSP_NVML_SUCCESS) {
        int r = nvml_fail(api, rc, "nvmlDeviceGetCount_v2", host, err, errlen);
        api->shutdown();
        return r;
    }
    int out = 0;
    for (unsigned int i = 0; i < n && out < TSP_GPU_MAX; i++) {
        tsp_nvml_device d;
        rc = api->handle_by_index(i, &d);
        if (rc != TSP_NVML_SUCCESS) {
            int r = nvml_fail(api, rc, "nvmlDeviceGetHandleByIndex_v2", host, err, errlen);
            api->shutdown();
            return r;
        }
        tsp_gpu_info_t *g = &inv->dev[out++];
        g->index = (int)i;
        if (api->get_uuid(d, g->uuid, sizeof g->uuid) != TSP_NVML_SUCCESS)
            snprintf(g->uuid, sizeof g->uuid, "GPU-?");
        tsp_nvml_pci_info pci;
        memset(&pci, 0, sizeof pci);
        if (api->get_pci_info(d, &pci) == TSP_NVML_SUCCESS)
            normalise_bus(pci.busId, g->bus, sizeof g->bus);
        else
            snprintf(g->bus, sizeof g->bus, "?");
        if (api->get_name(d, g->name, sizeof g->name) != TSP_NVML_SUCCESS)
            snprintf(g->name, sizeof g->name, "?");
        tsp_nvml_memory mem;
        if (api->get_memory_info(d, &mem) == TSP_NVML_SUCCESS) {
            g->mem_total = mem.total;
            g->mem_used = mem.used;
        }
        unsigned int cur = 0, pending = 0, maxmig = 0, mode = 0;
        if (api->get_mig_mode(d, &cur, &pending) == TSP_NVML_SUCCESS)
            g->mig_mode = cur == TSP_NVML_DEVICE_MIG_ENABLE;
        if (g->mig_mode && api->get_max_mig_count(d, &maxmig) == TSP_NVML_SUCCESS) {
            for (unsigned int m = 0; m < maxmig && g->nmig < TSP_GPU_MAX_MIG; m++) {
                tsp_nvml_device md;
                if (api->get_mig_by_index(d, m, &md) != TSP_NVML_SUCCESS)
                    continue; /* NOT_FOUND: an empty slot */
                if (api->get_uuid(md, g->mig[g->nmig], TSP_GPU_UUID_MAX) == TSP_NVML_SUCCESS)
                    g->nmig++;
            }
        }
        if (api->get_compute_mode(d, &mode) == TSP_NVML_SUCCESS)
            g->compute_mode = (int)mode;
        tsp_nvml_process_info procs[64];
        unsigned int np = 64;
        rc = api->get_procs(d, &np, procs);
        if (rc == TSP_NVML_SUCCESS || rc == TSP_NVML_ERROR_INSUFFICIENT_SIZE) {
            g->nprocs = (int)np;
            for (unsigned int p = 0; rc == TSP_NVML_SUCCESS && p < np; p++)
                g->procs_mem += procs[p].usedGpuMemory;
        }
    }
    inv->ndev = out;
    api->shutdown();
    return 0;
}

int tsp_gpu_inventory(tsp_gpu_inventory_t *inv, char *err, size_t errlen)
{
    return inventory_on(NULL, inv, err, errlen);
}

/* ---- count ---- */

/* The UUID of the inventory device (or MIG child) an entry names, as CUDA resolves
 * CUDA_VISIBLE_DEVICES: an index, or a unique UUID prefix. dev/mig: where it was found
 * (mig -1 for a whole GPU). 0 when found; -ENOENT; -EEXIST when a prefix is ambiguous. */
static int resolve(const tsp_gpu_inventory_t *inv, const char *s, size_t n, int *dev, int *mig)
{
    int kind = addr_kind(s, n), found = 0;
    if (kind == ADDR_INT) {
        int idx = atoi(s);
        for (int i = 0; i < inv->ndev; i++)
            if (inv->dev[i].index == idx) {
                *dev = i;
                *mig = -1;
                return 0;
            }
        return -ENOENT;
    }
    for (int i = 0; i < inv->ndev; i++) {
        const tsp_gpu_info_t *g = &inv->dev[i];
        if (kind == ADDR_GPU && strncasecmp(g->uuid, s, n) == 0) {
            found++;
            *dev = i;
            *mig = -1;
        }
        for (int m = 0; kind == ADDR_MIG && m < g->nmig; m++)
            if (strncasecmp(g->mig[m], s, n) == 0) {
                found++;
                *dev = i;
                *mig = m;
            }
    }
    return found == 1 ? 0 : found ? -EEXIST : -ENOENT;
}

int tsp_gpu_count(int *count, char *err, size_t errlen)
{
    char hbuf[256];
    const char *host = host_or_self(NULL, hbuf, sizeof hbuf);
    const char *mask = getenv("CUDA_VISIBLE_DEVICES");
    *count = 0;
    if (err && errlen)
        err[0] = 0;
    tsp_gpu_inventory_t *inv = malloc(sizeof *inv);
    if (!inv)
        return -ENOMEM;
    int rc = tsp_gpu_inventory(inv, err, errlen);
    if (rc == 0) {
        /* The driver's rules: unset = all, "" = none, else the entries up to the first
         * that does not resolve. A MIG GPU counts as its first MIG device when unmasked. */
        if (!mask) {
            *count = inv->ndev;
        } else {
            list_t l;
            split(mask, &l);
            for (int i = 0; i < l.n; i++) {
                int d, m;
                if (resolve(inv, l.s[i], l.len[i], &d, &m) != 0)
                    break;
                ++*count;
            }
        }
        free(inv);
        return 0;
    }
    free(inv);
    if (rc == -ENODEV || rc == -EIO)
        return rc;
    /* No NVML: ask the CUDA driver (this creates driver state in the caller). */
    const tsp_cuda_api_t *api = tsp__cuda_api();
    if (!api)
        return 0;
    tsp_cu_result cr = api->init(0);
    if (cr == TSP_CUDA_ERROR_NO_DEVICE) {
        if (mask && err && errlen) {
            snprintf(err, errlen,
                     "torchspark: CUDA sees no GPU on host %s with CUDA_VISIBLE_DEVICES=", host);
            cat_mask(err, errlen, mask);
            tsp__err_append(err, errlen, " (cuInit: CUDA_ERROR_NO_DEVICE)");
        }
        return 0;
    }
    if (cr == TSP_CUDA_ERROR_STUB_LIBRARY) {
        if (err && errlen)
            snprintf(err, errlen,
                     "torchspark: %s is the CUDA toolkit's stub libcuda (CUDA_ERROR_STUB_LIBRARY, "
                     "34), not the NVIDIA driver: remove the stubs directory from LD_LIBRARY_PATH "
                     "on host %s",
                     api->path, host);
        return -EIO;
    }
    if (cr == TSP_CUDA_SUCCESS) {
        int n = 0;
        cr = api->device_get_count(&n);
        if (cr == TSP_CUDA_SUCCESS) {
            *count = n;
            return 0;
        }
    }
    if (err && errlen)
        snprintf(err, errlen,
                 "torchspark: the CUDA driver (%s) failed on host %s: %s (%u); check the driver "
                 "installation (nvidia-smi) or CUDA_VISIBLE_DEVICES",
                 api->path, host, tsp__cuda_error_name(cr), cr);
    return -EIO;
}

/* ---- assignment ---- */

static void copy_entry(char *dst, size_t len, const char *s, size_t n)
{
    snprintf(dst, len, "%.*s", (int)n, s);
}

static int same_set(const list_t *a, const list_t *b)
{
    if (a->n != b->n)
        return 0;
    for (int i = 0; i < a->n; i++) {
        int hit = 0;
        for (int j = 0; j < b->n && !hit; j++)
            hit = a->len[i] == b->len[j] && strncmp(a->s[i], b->s[j], a->len[i]) == 0;
        if (!hit)
            return 0;
    }
    return 1;
}

/* What every step of an assignment names in its messages; e collects the message. */
typedef struct {
    const char *task, *host, *mask;
    char e[4096];
} assign_ctx_t;

/* R0-R2: Spark's addresses and the executor's mask can be used at all. */
static int check_addresses(assign_ctx_t *c, const list_t *a, const list_t *m)
{
    const char *task = c->task, *host = c->host;
    char *e = c->e;
    /* R0 */
    if (a->n == 0) {
        snprintf(e, sizeof c->e,
                 "torchspark: task %s on host %s has no 'gpu' resource from Spark, but "
                 "use_gpu=True: set spark.executor.resource.gpu.amount and "
                 "spark.task.resource.gpu.amount (and a discovery script), or pass use_gpu=False",
                 task, host);
        return -EINVAL;
    }
    /* R1 */
    for (int i = 0; i < a->n; i++)
        if (addr_kind(a->s[i], a->len[i]) == ADDR_BAD) {
            tsp__err_append(e, sizeof c->e, "Found GPU addresses ");
            cat_list(e, sizeof c->e, a);
            tsp__err_append(
                e, sizeof c->e,
                " which are not all in the correct format for CUDA_VISIBLE_DEVICES, which "
                "requires integers with no zero padding.");
            return -EINVAL;
        }
    if (c->mask && m->n == 0) { /* R2 */
        snprintf(e, sizeof c->e,
                 "torchspark: CUDA_VISIBLE_DEVICES is set to an empty string for the executor on "
                 "host %s, which hides every GPU, but Spark gave task %s GPU addresses ",
                 host, task);
        cat_list(e, sizeof c->e, a);
        tsp__err_append(
            e, sizeof c->e,
            ": unset it (spark.executorEnv.CUDA_VISIBLE_DEVICES or the executor's environment)");
        return -EINVAL;
    }
    return 0;
}

/* R3-R5: the workers' entries w from Spark's addresses a under the executor's mask m. */
static int narrow(assign_ctx_t *c, const list_t *a, const list_t *m, list_t *w)
{
    char *e = c->e;
    if (!c->mask) { /* R5 */
        *w = *a;
        return 0;
    }
    if (same_set(a, m)) { /* R3: already narrowed to the task's GPUs */
        *w = *m;
        return 0;
    }
    /* R4: indices into the mask (a UUID must be one of its entries) */
    w->n = a->n;
    for (int i = 0; i < a->n; i++) {
        int hit = -1;
        if (addr_kind(a->s[i], a->len[i]) == ADDR_INT) {
            int idx = atoi(a->s[i]);
            hit = idx < m->n ? idx : -1;
        } else {
            for (int j = 0; j < m->n && hit < 0; j++)
                if (m->len[j] == a->len[i] && strncmp(m->s[j], a->s[i], a->len[i]) == 0)
                    hit = j;
        }
        if (hit < 0) {
            tsp__err_append(e, sizeof c->e, "GPU addresses ");
            cat_list(e, sizeof c->e, a);
            tsp__err_append(e, sizeof c->e,
                            " given by Spark do not fit into CUDA_VISIBLE_DEVICES=");
            cat_mask(e, sizeof c->e, c->mask);
            tsp__err_append(
                e, sizeof c->e,
                " on host %s: set the executors' CUDA_VISIBLE_DEVICES to all the GPUs Spark "
                "may assign, or unset it",
                c->host);
            return -EINVAL;
        }
        w->s[i] = m->s[hit];
        w->len[i] = m->len[hit];
    }
    return 0;
}

/* R6 for entry i of w, resolved to (dev, mig): not a second worker on one GPU, not a MIG
 * GPU by index; R7: a GPU already busy is a warning in out. */
static int check_resolved(assign_ctx_t *c, const tsp_gpu_inventory_t *inv, const list_t *w,
                          const int *dev, const int *mig, int i, tsp_gpu_assignment_t *out)
{
    char *e = c->e, entry[TSP_GPU_UUID_MAX];
    copy_entry(entry, sizeof entry, w->s[i], w->len[i]);
    const tsp_gpu_info_t *g = &inv->dev[dev[i]];
    char u[32];
    uuid8(mig[i] >= 0 ? g->mig[mig[i]] : g->uuid, u, sizeof u);
    for (int j = 0; j < i; j++) {
        if (dev[j] != dev[i] || mig[j] != mig[i])
            continue;
        char other[TSP_GPU_UUID_MAX];
        copy_entry(other, sizeof other, w->s[j], w->len[j]);
        list_t pair = {.n = 2, .s = {other, entry}, .len = {strlen(other), strlen(entry)}};
        snprintf(e, sizeof c->e,
                 "torchspark: task %s on host %s would put two workers on one GPU: ", c->task,
                 c->host);
        cat_list(e, sizeof c->e, &pair);
        tsp__err_append(e, sizeof c->e, " with CUDA_VISIBLE_DEVICES=");
        cat_mask(e, sizeof c->e, c->mask);
        tsp__err_append(e, sizeof c->e,
                        " both resolve to %s (%s); NCCL refuses that (\"Duplicate GPU detected\")",
                        g->bus, u);
        return -EINVAL;
    }
    if (mig[i] < 0 && g->mig_mode) {
        snprintf(e, sizeof c->e,
                 "torchspark: GPU %s (%s) on host %s is in MIG mode, so CUDA cannot use it "
                 "by index: have the discovery script report MIG device UUIDs (MIG-…), and "
                 "note that NCCL does not run over MIG devices (NVIDIA/nccl#1716): train "
                 "with backend gloo there",
                 entry, u, c->host);
        return -EINVAL;
    }
    if (mig[i] < 0 && g->nprocs > 0)
        tsp__err_append(
            out->warnings, sizeof out->warnings,
            "torchspark: WARNING: GPU %s (%s) on host %s already runs %d compute "
            "process(es) using %.1f GiB: another task or a leftover process shares it%s\n",
            entry, u, c->host, g->nprocs, (double)g->procs_mem / (1024.0 * 1024 * 1024),
            g->compute_mode == 3 ? " (and it is in exclusive-process mode: the workers "
                                   "will not get a CUDA context on it)"
                                 : "");
    return 0;
}

/* R6: every entry of w on the host's inventory; R7: warnings. */
static int resolve_all(assign_ctx_t *c, const tsp_gpu_inventory_t *inv, const list_t *w,
                       tsp_gpu_assignment_t *out)
{
    char invtext[1024];
    tsp__gpu_inventory_text(inv, invtext, sizeof invtext);
    int dev[MAX_ENTRIES], mig[MAX_ENTRIES];
    for (int i = 0; i < w->n; i++) {
        char entry[TSP_GPU_UUID_MAX];
        copy_entry(entry, sizeof entry, w->s[i], w->len[i]);
        int r = resolve(inv, w->s[i], w->len[i], &dev[i], &mig[i]);
        if (r != 0 && addr_kind(w->s[i], w->len[i]) == ADDR_INT) {
            snprintf(c->e, sizeof c->e,
                     "torchspark: Spark gave task %s GPU %s, but host %s has %d GPU(s) (%s): "
                     "check spark.executor.resource.gpu.discoveryScript on this host",
                     c->task, entry, c->host, inv->ndev, invtext);
            return -EINVAL;
        }
        if (r != 0) {
            snprintf(c->e, sizeof c->e,
                     "torchspark: Spark gave task %s GPU %s, which is not a GPU of host %s (%s)",
                     c->task, entry, c->host, invtext);
            return -EINVAL;
        }
        int rc = check_resolved(c, inv, w, dev, mig, i, out);
        if (rc)
            return rc;
    }
    out->checked = 1;
    return 0;
}

/* R8: one MIG device per process; per-worker masks are not built yet. */
static int check_mig_count(assign_ctx_t *c, const list_t *w)
{
    int nmig = 0;
    for (int i = 0; i < w->n; i++)
        nmig += addr_kind(w->s[i], w->len[i]) == ADDR_MIG;
    if (nmig <= 1)
        return 0;
    snprintf(c->e, sizeof c->e,
             "torchspark: task %s on host %s has %d MIG devices, but a process can use only "
             "one MIG device; run one task per MIG device (spark.task.resource.gpu.amount=1)",
             c->task, c->host, nmig);
    return -EINVAL;
}

int tsp__gpu_assign_with(const tsp_gpu_request_t *req, const tsp_gpu_inventory_t *inv,
                         tsp_gpu_assignment_t *out, char *err, size_t errlen)
{
    char hbuf[256];
    assign_ctx_t *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    c->host = host_or_self(req->host, hbuf, sizeof hbuf);
    c->task = req->task && *req->task ? req->task : "?";
    c->mask = req->mask;
    memset(out, 0, sizeof *out);
    if (err && errlen)
        err[0] = 0;
    int rc = -EINVAL;
    list_t a, m, w; /* Spark's addresses, the executor's mask, the workers' entries */
    if (split(req->addrs, &a) || split(c->mask, &m))
        snprintf(c->e, sizeof c->e, "torchspark: task %s on host %s: more than %d GPU entries",
                 c->task, c->host, MAX_ENTRIES);
    else if ((rc = check_addresses(c, &a, &m)) == 0 && (rc = narrow(c, &a, &m, &w)) == 0 &&
             (rc = check_mig_count(c, &w)) == 0 && inv)
        rc = resolve_all(c, inv, &w, out);
    if (rc == 0 && !inv)
        tsp__err_append(
            out->warnings, sizeof out->warnings,
            "torchspark: WARNING: NVML (libnvidia-ml.so.1) is not available on host %s, so task "
            "%s's GPUs were not checked against the host's devices\n",
            c->host, c->task);
    if (rc == 0) {
        for (int i = 0; i < w.n; i++) {
            tsp__err_append(out->mask, sizeof out->mask, "%s%.*s", i ? "," : "", (int)w.len[i],
                            w.s[i]);
            out->integers |= addr_kind(w.s[i], w.len[i]) == ADDR_INT;
        }
        out->count = w.n;
    } else if (err && errlen) {
        snprintf(err, errlen, "%s", c->e);
    }
    free(c);
    return rc;
}

int tsp_gpu_assign(const tsp_gpu_request_t *req, tsp_gpu_assignment_t *out, char *err,
                   size_t errlen)
{
    tsp_gpu_inventory_t *inv = malloc(sizeof *inv);
    if (!inv)
        return -ENOMEM;
    char nverr[512] = "";
    int rc = inventory_on(req->host, inv, nverr, sizeof nverr);
    if (rc == -ENODEV) { /* L2: the GPUs cannot work here at all */
        free(inv);
        memset(out, 0, sizeof *out);
        if (err && errlen)
            snprintf(err, errlen, "%s", nverr);
        return rc;
    }
    rc = tsp__gpu_assign_with(req, rc == 0 ? inv : NULL, out, err, errlen);
    if (rc == 0 && nverr[0]) { /* NVML failed otherwise: R6 skipped, say why */
        const char *why = strncmp(nverr, "torchspark: ", 12) == 0 ? nverr + 12 : nverr;
        out->warnings[0] = 0;
        tsp__err_append(
            out->warnings, sizeof out->warnings,
            "torchspark: WARNING: %s; task %s's GPUs were not checked against the host's "
            "devices\n",
            why, req->task && *req->task ? req->task : "?");
    }
    free(inv);
    return rc;
}
