/* Vulkan device layer: the loader is opened at run time through volk, so a machine without
 * Vulkan still runs anvil on the CPU. Picks a discrete GPU first. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vulkan.h"

anvil_status vk_result(VkResult r, const char *what) {
    if (r == VK_SUCCESS) return ANVIL_OK;
    if (r == VK_ERROR_DEVICE_LOST)
        return err_set(ANVIL_ERR_BACKEND, "vulkan: %s: the GPU was lost (VK_ERROR_DEVICE_LOST: a GPU "
                       "fault, a driver reset or a hang); restart anvil", what);
    if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY)
        return err_set(ANVIL_ERR_NOMEM, "vulkan: %s: out of %s memory (VkResult %d)", what,
                       r == VK_ERROR_OUT_OF_DEVICE_MEMORY ? "device" : "host", (int)r);
    return err_set(ANVIL_ERR_BACKEND, "vulkan: %s failed (VkResult %d)", what, (int)r);
}

static bool loader_ready(void) {
    static int state; /* 0 unknown, 1 loaded, -1 absent */
    if (state == 0) state = volkInitialize() == VK_SUCCESS ? 1 : -1;
    return state > 0;
}

/* The environment's settings where no device is being made (listing, probing): a malformed
 * variable is reported where a device is made. */
static struct tuning env_tuning(void) {
    struct tuning t;
    (void)tuning_read(&t);
    return t;
}

static bool has_layer(const char *name) {
    uint32_t n = 0;
    vkEnumerateInstanceLayerProperties(&n, NULL);
    VkLayerProperties *l = calloc(n ? n : 1, sizeof *l);
    bool found = false;
    if (l && vkEnumerateInstanceLayerProperties(&n, l) == VK_SUCCESS)
        for (uint32_t i = 0; i < n; i++) found |= !strcmp(l[i].layerName, name);
    free(l);
    return found;
}

static bool has_instance_ext(const char *name) {
    uint32_t n = 0;
    vkEnumerateInstanceExtensionProperties(NULL, &n, NULL);
    VkExtensionProperties *e = calloc(n ? n : 1, sizeof *e);
    bool found = false;
    if (e && vkEnumerateInstanceExtensionProperties(NULL, &n, e) == VK_SUCCESS)
        for (uint32_t i = 0; i < n; i++) found |= !strcmp(e[i].extensionName, name);
    free(e);
    return found;
}

/* One instance per process, created on first use and kept until exit: every device (and
 * session) shares it, and the loader keeps the driver loaded for the process's lifetime. */
static struct {
    pthread_mutex_t lock;
    bool tried;
    anvil_status st;
    char err[512];
    struct vk_device holder; /* instance + messenger; validation messages counted here */
} g = {PTHREAD_MUTEX_INITIALIZER, false, ANVIL_OK, "", {0}};

static VKAPI_ATTR VkBool32 VKAPI_CALL on_message(VkDebugUtilsMessageSeverityFlagBitsEXT sev,
                                                 VkDebugUtilsMessageTypeFlagsEXT type,
                                                 const VkDebugUtilsMessengerCallbackDataEXT *data,
                                                 void *user) {
    (void)type;
    (void)user;
    struct vk_device *d = &g.holder;
    if (sev & (VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT)) {
        if (__atomic_fetch_add(&d->n_validation_msgs, 1, __ATOMIC_SEQ_CST) == 0)
            snprintf(d->validation_msg, sizeof d->validation_msg, "%s", data->pMessage);
        log_msg(LOG_ERROR, "vulkan validation: %s", data->pMessage);
    }
    return VK_FALSE;
}

/* the shared instance's Vulkan version (make_instance) */
static uint32_t instance_api = VK_API_VERSION_1_2;

static anvil_status make_instance(struct vk_device *d, bool validate) {
    /* Vulkan 1.3 where the loader has it: SPIR-V 1.6, which the workgroup matrices' kernel
     * (mm_cm2.comp) needs; anvil itself asks for no more than 1.2 */
    uint32_t api = VK_API_VERSION_1_2;
    if (vkEnumerateInstanceVersion && vkEnumerateInstanceVersion(&api) == VK_SUCCESS && api >= VK_API_VERSION_1_3)
        api = VK_API_VERSION_1_3;
    else
        api = VK_API_VERSION_1_2;
    instance_api = api;
    VkApplicationInfo app = {VK_STRUCTURE_TYPE_APPLICATION_INFO, NULL, "anvil", 1, "anvil", 1, api};
    const char *layers[1], *exts[1];
    uint32_t n_layers = 0, n_exts = 0;
    if (validate) {
        if (!has_layer("VK_LAYER_KHRONOS_validation"))
            return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: ANVIL_VALIDATE is set but the layer "
                           "VK_LAYER_KHRONOS_validation is not installed (vulkan-validationlayers)");
        layers[n_layers++] = "VK_LAYER_KHRONOS_validation";
    }
    bool debug = has_instance_ext(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
    if (debug) exts[n_exts++] = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
    VkInstanceCreateInfo ci = {VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, NULL, 0, &app, n_layers,
                               layers, n_exts, exts};
    anvil_status st = vk_result(vkCreateInstance(&ci, NULL, &d->instance), "vkCreateInstance");
    if (st != ANVIL_OK) return st;
    pin_loaded_libraries(); /* sanitizer builds: keep the driver mapped for leak reports */
    volkLoadInstanceOnly(d->instance);
    if (debug) {
        VkDebugUtilsMessengerCreateInfoEXT mi = {
            VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT, NULL, 0,
            VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
            VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT,
            on_message, NULL};
        st = vk_result(vkCreateDebugUtilsMessengerEXT(d->instance, &mi, NULL, &d->messenger),
                       "vkCreateDebugUtilsMessengerEXT");
    }
    return st;
}

/* The process's instance (validation on where the first user asks: ANVIL_VALIDATE). */
static anvil_status shared_instance(bool validate, VkInstance *out) {
    pthread_mutex_lock(&g.lock);
    if (!g.tried) {
        g.tried = true;
        g.st = make_instance(&g.holder, validate);
        if (g.st != ANVIL_OK) snprintf(g.err, sizeof g.err, "%s", err_get());
    }
    anvil_status st = g.st;
    *out = g.holder.instance;
    pthread_mutex_unlock(&g.lock);
    if (st != ANVIL_OK) return err_set(st, "%s", g.err);
    return ANVIL_OK;
}

static int type_rank(VkPhysicalDeviceType t) {
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 3;
    default: return 4;
    }
}

static const char *type_name(VkPhysicalDeviceType t) {
    static const char *n[] = {"discrete", "integrated", "virtual", "cpu", "other"};
    return n[type_rank(t)];
}

/* Why a physical device cannot run anvil, or NULL. */
static const char *unusable(VkPhysicalDevice p) {
    VkPhysicalDeviceProperties pr;
    vkGetPhysicalDeviceProperties(p, &pr);
    if (pr.apiVersion < VK_API_VERSION_1_2) return "Vulkan 1.2 is required";
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceFeatures2 f = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f12};
    vkGetPhysicalDeviceFeatures2(p, &f);
    if (!f12.bufferDeviceAddress) return "no buffer device address";
    if (!f12.timelineSemaphore) return "no timeline semaphores";
    VkPhysicalDeviceSubgroupProperties sg = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sg};
    vkGetPhysicalDeviceProperties2(p, &p2);
    if (!(sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) ||
        !(sg.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT))
        return "no subgroup arithmetic in compute shaders";
    if (sg.subgroupSize < 4 || sg.subgroupSize > 128) return "unusual subgroup size";
    return NULL;
}

static anvil_status enumerate(VkInstance inst, VkPhysicalDevice **out, uint32_t *n) {
    *out = NULL;
    *n = 0;
    anvil_status st = vk_result(vkEnumeratePhysicalDevices(inst, n, NULL), "vkEnumeratePhysicalDevices");
    if (st != ANVIL_OK || *n == 0) return st;
    *out = calloc(*n, sizeof **out);
    if (!*out) return err_set(ANVIL_ERR_NOMEM, "out of memory");
    return vk_result(vkEnumeratePhysicalDevices(inst, n, *out), "vkEnumeratePhysicalDevices");
}

/* state: 0 unknown, 1 a usable device, 2 one of them a GPU (not a CPU device such as Mesa's
 * lavapipe), -1 none (reason says why) */
static int vk_probe(char *reason, size_t cap) {
    static int state;
    static char why[256];
    if (state == 0) {
        state = -1;
        if (!loader_ready()) {
            snprintf(why, sizeof why, "no Vulkan loader (libvulkan.so.1) on this system");
        } else {
            VkInstance inst;
            VkPhysicalDevice *pd = NULL;
            uint32_t n = 0;
            if (shared_instance(env_tuning().validate, &inst) != ANVIL_OK || enumerate(inst, &pd, &n) != ANVIL_OK) {
                snprintf(why, sizeof why, "%s", err_get());
            } else {
                for (uint32_t i = 0; i < n; i++) {
                    if (unusable(pd[i])) continue;
                    VkPhysicalDeviceProperties pr;
                    vkGetPhysicalDeviceProperties(pd[i], &pr);
                    state = MAX(state, pr.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? 1 : 2);
                }
                if (state < 0) snprintf(why, sizeof why, "no usable Vulkan device (%u found)", n);
            }
            free(pd);
        }
    }
    if (reason && cap) snprintf(reason, cap, "%s", state > 0 ? "" : why);
    return state;
}

int vk_device_count(void) {
    VkInstance inst;
    VkPhysicalDevice *pd = NULL;
    uint32_t n = 0;
    if (!loader_ready() || shared_instance(env_tuning().validate, &inst) != ANVIL_OK || enumerate(inst, &pd, &n) != ANVIL_OK)
        n = 0;
    free(pd);
    return (int)n;
}

bool vk_available(char *why, size_t why_cap) { return vk_probe(why, why_cap) > 0; }

bool vk_gpu_available(void) { return vk_probe(NULL, 0) == 2; }

/* backend.h's questions about the devices */
bool backend_vulkan_available(char *why, size_t cap) { return vk_available(why, cap); }
bool backend_vulkan_gpu_available(void) { return vk_gpu_available(); }
size_t backend_vulkan_describe_devices(char *buf, size_t cap) { return vk_describe_devices(buf, cap); }
int backend_vulkan_device_count(void) { return vk_device_count(); }

static bool want_coopmat(const struct tuning *t, VkPhysicalDevice pd, uint32_t subgroup_size);
static bool want_coopmat2(const struct tuning *t, VkInstance inst, VkPhysicalDevice pd, uint32_t api, uint32_t gran[3]);
static bool want_coopmat_i8(VkPhysicalDevice pd);

/* What the prefill's products run on there (as vk_device_create would choose) */
static const char *matrices(const struct tuning *t, VkInstance inst, VkPhysicalDevice pd, uint32_t api) {
    VkPhysicalDeviceSubgroupProperties sg = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sg};
    vkGetPhysicalDeviceProperties2(pd, &p2);
    if (!want_coopmat(t, pd, sg.subgroupSize)) return "";
    uint32_t g[3];
    if (want_coopmat2(t, inst, pd, api, g)) {
        static _Thread_local char s[128];
        snprintf(s, sizeof s, "; prefill on workgroup cooperative matrices (granularity %u x %u x %u)%s", g[0], g[1],
                 g[2], want_coopmat_i8(pd) ? " (and int8 ones)" : "");
        return s;
    }
    return "; prefill on cooperative matrices";
}

size_t vk_describe_devices(char *buf, size_t cap) {
    size_t len = 0;
#define OUT(...)                                                                           \
    do {                                                                                   \
        char *dst_ = len < cap ? buf + len : NULL;                                         \
        int k = snprintf(dst_, dst_ ? cap - len : 0, __VA_ARGS__);                         \
        if (k > 0) len += (size_t)k;                                                       \
    } while (0)
    if (cap) buf[0] = 0;
    char why[256];
    if (!loader_ready()) {
        OUT("no Vulkan loader (libvulkan.so.1): anvil runs on the CPU\n");
        return len;
    }
    VkInstance inst;
    VkPhysicalDevice *pd = NULL;
    uint32_t n = 0;
    struct tuning t = env_tuning();
    if (shared_instance(t.validate, &inst) != ANVIL_OK || enumerate(inst, &pd, &n) != ANVIL_OK) {
        OUT("Vulkan: %s\n", err_get());
    } else if (n == 0) {
        OUT("no Vulkan devices: anvil runs on the CPU\n");
    }
    for (uint32_t i = 0; i < n; i++) {
        VkPhysicalDeviceProperties pr;
        VkPhysicalDeviceMemoryProperties mp;
        vkGetPhysicalDeviceProperties(pd[i], &pr);
        vkGetPhysicalDeviceMemoryProperties(pd[i], &mp);
        VkDeviceSize local = 0;
        for (uint32_t h = 0; h < mp.memoryHeapCount; h++)
            if (mp.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
                local = MAX(local, mp.memoryHeaps[h].size);
        const char *u = unusable(pd[i]);
        OUT("%u: %s (%s, Vulkan %u.%u, %.1f GiB device-local%s)%s%s\n", i, pr.deviceName,
            type_name(pr.deviceType), VK_API_VERSION_MAJOR(pr.apiVersion),
            VK_API_VERSION_MINOR(pr.apiVersion), (double)local / (1 << 30),
            u ? "" : matrices(&t, inst, pd[i], pr.apiVersion), u ? ": unusable, " : "", u ? u : "");
    }
    (void)why;
    free(pd);
#undef OUT
    return len;
}

/* The failure-handling settings (see struct vk_device) from d->tune. */
static anvil_status read_failure_env(struct vk_device *d) {
    d->timeout_s = d->tune.vk_timeout;
    d->max_mem = d->tune.vk_max_memory;
    const char *e = d->tune.vk_fault;
    if (*e) {
        static const char *kinds[] = {"", "lost", "hang", "oom"};
        const char *colon = strchr(e, ':');
        char *end = NULL;
        long at = colon ? strtol(colon + 1, &end, 10) : 0;
        for (int k = 1; k < 4 && colon; k++)
            if ((size_t)(colon - e) == strlen(kinds[k]) && !strncmp(e, kinds[k], strlen(kinds[k])))
                d->fault_kind = k;
        if (!d->fault_kind || !end || *end || at < 1 || at > 1000000)
            return err_set(ANVIL_ERR_INVALID_ARG, "ANVIL_VK_FAULT=\"%s\": expected lost:N, hang:N or "
                           "oom:N", e);
        d->fault_at = (int)at;
    }
    return ANVIL_OK;
}

static bool has_device_ext(VkPhysicalDevice pd, const char *name);

/* Whether the device offers subgroup matrices of 16 x 16 x k with inputs of type in and sums of
 * type sum (VK_NV_cooperative_matrix's list). */
static bool has_nv_shape(VkPhysicalDevice pd, uint32_t k, VkComponentTypeNV in, VkComponentTypeNV sum) {
    uint32_t n = 0;
    if (!vkGetPhysicalDeviceCooperativeMatrixPropertiesNV ||
        vkGetPhysicalDeviceCooperativeMatrixPropertiesNV(pd, &n, NULL) != VK_SUCCESS || !n)
        return false;
    VkCooperativeMatrixPropertiesNV *p = calloc(n, sizeof *p);
    bool ok = false;
    for (uint32_t i = 0; p && i < n; i++) p[i].sType = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV;
    if (p && vkGetPhysicalDeviceCooperativeMatrixPropertiesNV(pd, &n, p) == VK_SUCCESS)
        for (uint32_t i = 0; i < n; i++)
            ok |= p[i].MSize == 16 && p[i].NSize == 16 && p[i].KSize == k && p[i].AType == in && p[i].BType == in &&
                  p[i].CType == sum && p[i].DType == sum && p[i].scope == VK_SCOPE_SUBGROUP_NV;
    free(p);
    return ok;
}

/* Whether the prefill's cooperative-matrix products (shaders/dq.comp, shaders/mm_h.comp) can
 * run: the device has VK_NV_cooperative_matrix with 16x16x16 float16 x float16 -> float32
 * subgroup matrices, float16 arithmetic, the Vulkan memory model (the shader's scopes) and
 * subgroups of 32. On by default (checked against the CPU on the H100: inputs rounded to
 * float16 move logits by ~1e-3 of their scale: perf rule "prefill on the matrix units"); ANVIL_VK_COOPMAT=0 turns it
 * off (the float32 shared-memory tiles of mm.comp then run everywhere). */
static bool want_coopmat(const struct tuning *t, VkPhysicalDevice pd, uint32_t subgroup_size) {
    if (!t->vk_coopmat || subgroup_size != 32 ||
        !has_device_ext(pd, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME) || !vkGetPhysicalDeviceCooperativeMatrixPropertiesNV)
        return false;
    VkPhysicalDeviceCooperativeMatrixFeaturesNV cm = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, .pNext = &cm};
    VkPhysicalDeviceFeatures2 f = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f12};
    vkGetPhysicalDeviceFeatures2(pd, &f);
    if (!cm.cooperativeMatrix || !f12.shaderFloat16 || !f12.vulkanMemoryModel) return false;
    return has_nv_shape(pd, 16, VK_COMPONENT_TYPE_FLOAT16_NV, VK_COMPONENT_TYPE_FLOAT32_NV);
}

/* VK_KHR_cooperative_matrix and VK_NV_cooperative_matrix2 postdate Debian 12's Vulkan headers
 * (1.3.239): the structures anvil needs, as the registry defines them. */
#define CM2_STYPE_KHR_FEATURES ((VkStructureType)1000506000)
#define CM2_STYPE_FEATURES ((VkStructureType)1000593000)
#define CM2_STYPE_FLEX_PROPERTIES ((VkStructureType)1000593001)
#define CM2_STYPE_PROPERTIES ((VkStructureType)1000593002)
struct cm_khr_features {
    VkStructureType sType;
    void *pNext;
    VkBool32 cooperativeMatrix, cooperativeMatrixRobustBufferAccess;
};
struct cm2_features {
    VkStructureType sType;
    void *pNext;
    VkBool32 workgroupScope, flexibleDimensions, reductions, conversions, perElementOperations,
        tensorAddressing, blockLoads;
};
struct cm2_properties {
    VkStructureType sType;
    void *pNext;
    uint32_t workgroupScopeMaxWorkgroupSize, flexibleDimensionsMaxDimension, workgroupScopeReservedSharedMemory;
};
struct cm2_flex {
    VkStructureType sType;
    void *pNext;
    uint32_t MGranularity, NGranularity, KGranularity;
    uint32_t AType, BType, CType, ResultType; /* VkComponentTypeKHR: 0 float16, 1 float32 */
    VkBool32 saturatingAccumulation;
    uint32_t scope; /* VkScopeKHR: 2 workgroup */
    uint32_t workgroupInvocations;
};
typedef VkResult(VKAPI_PTR *cm2_flex_fn)(VkPhysicalDevice, uint32_t *, struct cm2_flex *);

/* Whether the prefill's products can run on workgroup-scope matrices (shaders/mm_cm2.comp):
 * VK_NV_cooperative_matrix2 with workgroup scope, flexible dimensions and tensor addressing,
 * workgroups of VK_CM2_THREADS, and float16 x float16 -> float32 products whose granularity
 * divides the kernel's tile (VK_CM2_BM x VK_CM2_BN, VK_CM2_BK at a time). Only where the
 * subgroup matrices (want_coopmat) are on too; ANVIL_VK_CM2=0 turns it off. The kernel is
 * SPIR-V 1.6: the instance and the device (its Vulkan version api) must be 1.3. */
static bool want_coopmat2(const struct tuning *t, VkInstance inst, VkPhysicalDevice pd, uint32_t api, uint32_t gran[3]) {
    gran[0] = gran[1] = gran[2] = 0;
    if (!t->vk_cm2 || instance_api < VK_API_VERSION_1_3 || api < VK_API_VERSION_1_3 ||
        !has_device_ext(pd, "VK_KHR_cooperative_matrix") ||
        !has_device_ext(pd, "VK_NV_cooperative_matrix2"))
        return false;
    cm2_flex_fn flex =
        (cm2_flex_fn)vkGetInstanceProcAddr(inst, "vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV");
    if (!flex) return false;
    struct cm2_features f2 = {.sType = CM2_STYPE_FEATURES};
    struct cm_khr_features fk = {.sType = CM2_STYPE_KHR_FEATURES, .pNext = &f2};
    VkPhysicalDeviceFeatures2 f = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &fk};
    vkGetPhysicalDeviceFeatures2(pd, &f);
    if (!fk.cooperativeMatrix || !f2.workgroupScope || !f2.flexibleDimensions || !f2.tensorAddressing) return false;
    struct cm2_properties pr = {.sType = CM2_STYPE_PROPERTIES};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &pr};
    vkGetPhysicalDeviceProperties2(pd, &p2);
    if (pr.workgroupScopeMaxWorkgroupSize < VK_CM2_THREADS || pr.flexibleDimensionsMaxDimension < VK_CM2_BM ||
        pr.flexibleDimensionsMaxDimension < VK_CM2_BN)
        return false;
    uint32_t n = 0;
    if (flex(pd, &n, NULL) != VK_SUCCESS || !n) return false;
    struct cm2_flex *p = calloc(n, sizeof *p);
    bool ok = false;
    for (uint32_t i = 0; p && i < n; i++) p[i].sType = CM2_STYPE_FLEX_PROPERTIES;
    if (p && flex(pd, &n, p) == VK_SUCCESS)
        for (uint32_t i = 0; i < n; i++) {
            bool fits = p[i].AType == 0 && p[i].BType == 0 && p[i].CType == 1 && p[i].ResultType == 1 &&
                        p[i].scope == 2 && p[i].workgroupInvocations == VK_CM2_THREADS && p[i].MGranularity &&
                        VK_CM2_BM % p[i].MGranularity == 0 && p[i].NGranularity && VK_CM2_BN % p[i].NGranularity == 0 &&
                        p[i].KGranularity && VK_CM2_BK % p[i].KGranularity == 0;
            if (fits && !ok) { /* (the first that fits: the kernels' other sizes must be multiples of it) */
                gran[0] = p[i].MGranularity;
                gran[1] = p[i].NGranularity;
                gran[2] = p[i].KGranularity;
            }
            ok |= fits;
        }
    free(p);
    return ok;
}

/* Whether the experts' products can run on the int8 matrix units (shaders/mmq_cm2.comp): the
 * workgroup matrices' device (want_coopmat2) with per-element operations, shaderInt8 and
 * int8 x int8 -> int32 subgroup matrices of 16 x 16 x 32. */
static bool want_coopmat_i8(VkPhysicalDevice pd) {
    struct cm2_features f2 = {.sType = CM2_STYPE_FEATURES};
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, .pNext = &f2};
    VkPhysicalDeviceFeatures2 f = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f12};
    vkGetPhysicalDeviceFeatures2(pd, &f);
    if (!f2.perElementOperations || !f12.shaderInt8) return false;
    return has_nv_shape(pd, 32, VK_COMPONENT_TYPE_SINT8_NV, VK_COMPONENT_TYPE_SINT32_NV);
}

/* Whether the workgroup matrices take row reductions and per-element operations (the vision
 * encoder's flash attention, vit_fa_cm2.comp) */
static bool want_cm2_reduce(VkPhysicalDevice pd) {
    struct cm2_features f2 = {.sType = CM2_STYPE_FEATURES};
    VkPhysicalDeviceFeatures2 f = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f2};
    vkGetPhysicalDeviceFeatures2(pd, &f);
    return f2.reductions && f2.perElementOperations;
}

static bool has_device_ext(VkPhysicalDevice pd, const char *name) {
    uint32_t n = 0;
    if (vkEnumerateDeviceExtensionProperties(pd, NULL, &n, NULL) != VK_SUCCESS || n == 0) return false;
    VkExtensionProperties *e = malloc(n * sizeof *e);
    bool found = false;
    if (e && vkEnumerateDeviceExtensionProperties(pd, NULL, &n, e) == VK_SUCCESS)
        for (uint32_t i = 0; i < n && !found; i++) found = !strcmp(e[i].extensionName, name);
    free(e);
    return found;
}

/* What the logical device enables on d->phys, from the device and d->tune: d->has_budget,
 * coopmat, coopmat2, int_dot (int_dot_fast), exec_stats, shader_clock. */
static void choose_features(struct vk_device *d) {
    d->has_budget = has_device_ext(d->phys, VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
    d->coopmat = want_coopmat(&d->tune, d->phys, d->subgroup_size);
    d->coopmat2 = d->coopmat && want_coopmat2(&d->tune, d->instance, d->phys, d->props.apiVersion, d->cm2_gran);
    d->coopmat_i8 = d->coopmat2 && want_coopmat_i8(d->phys);
    d->cm2_reduce = d->coopmat2 && want_cm2_reduce(d->phys);
    if (has_device_ext(d->phys, VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME)) {
        VkPhysicalDeviceShaderIntegerDotProductFeatures idf = {
            .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES};
        VkPhysicalDeviceShaderIntegerDotProductProperties idp = {
            .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_PROPERTIES};
        VkPhysicalDeviceProperties2 ip2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &idp};
        vkGetPhysicalDeviceProperties2(d->phys, &ip2);
        VkPhysicalDeviceFeatures2 if2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &idf};
        vkGetPhysicalDeviceFeatures2(d->phys, &if2);
        d->int_dot = idf.shaderIntegerDotProduct;
        d->int_dot_fast = idp.integerDotProduct4x8BitPackedSignedAccelerated &&
                          idp.integerDotProduct4x8BitPackedMixedSignednessAccelerated;
    }
    /* a layer split's crossing without the host (chain.c): host memory both devices import,
     * timeline semaphores one device exports and the next imports */
    d->ext_host_mem = has_device_ext(d->phys, VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME);
    d->ext_sem_fd = has_device_ext(d->phys, VK_KHR_EXTERNAL_SEMAPHORE_FD_EXTENSION_NAME);
    if (d->ext_host_mem) {
        VkPhysicalDeviceExternalMemoryHostPropertiesEXT hp = {
            .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT};
        VkPhysicalDeviceProperties2 hp2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &hp};
        vkGetPhysicalDeviceProperties2(d->phys, &hp2);
        d->host_ptr_align = hp.minImportedHostPointerAlignment;
    }
    d->exec_stats = d->tune.vk_pipeline_stats &&
                    has_device_ext(d->phys, VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
    /* the device's clock in shaders, for measuring mega.comp's phases (ANVIL_VK_MEGA_CLOCK=1) */
    if (d->tune.vk_mega_clock && has_device_ext(d->phys, VK_KHR_SHADER_CLOCK_EXTENSION_NAME)) {
        VkPhysicalDeviceShaderClockFeaturesKHR clf = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CLOCK_FEATURES_KHR};
        VkPhysicalDeviceFeatures2 cf2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &clf};
        vkGetPhysicalDeviceFeatures2(d->phys, &cf2);
        d->shader_clock = clf.shaderDeviceClock;
    }
}

/* The features choose_features chose, as bits: sessions share a logical device only where
 * these are equal. */
static uint32_t feature_bits(const struct vk_device *d) {
    return (uint32_t)d->has_budget | (uint32_t)d->coopmat << 1 | (uint32_t)d->coopmat2 << 2 |
           (uint32_t)d->int_dot << 3 | (uint32_t)d->exec_stats << 4 | (uint32_t)d->shader_clock << 5 |
           (uint32_t)d->coopmat_i8 << 6 | (uint32_t)d->cm2_reduce << 7;
}

/* The logical device of d's physical device and features, and its queue, into sh. */
static anvil_status make_logical(const struct vk_device *d, struct vk_shared *sh) {
    float prio = 1.0f;
    VkDeviceQueueCreateInfo qi = {VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, NULL, 0,
                                  d->queue_family, 1, &prio};
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    f12.bufferDeviceAddress = VK_TRUE;
    f12.timelineSemaphore = VK_TRUE;
    const char *dev_exts[12];
    uint32_t n_dev_exts = 0;
    if (d->has_budget) dev_exts[n_dev_exts++] = VK_EXT_MEMORY_BUDGET_EXTENSION_NAME;
    if (d->ext_host_mem) dev_exts[n_dev_exts++] = VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME;
    if (d->ext_sem_fd) dev_exts[n_dev_exts++] = VK_KHR_EXTERNAL_SEMAPHORE_FD_EXTENSION_NAME;
    VkPhysicalDeviceCooperativeMatrixFeaturesNV cmf = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV,
                                                       .cooperativeMatrix = VK_TRUE};
    if (d->coopmat) {
        dev_exts[n_dev_exts++] = VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME;
        f12.shaderFloat16 = VK_TRUE;
        f12.vulkanMemoryModel = VK_TRUE;
        f12.pNext = &cmf;
    }
    struct cm2_features cm2f = {.sType = CM2_STYPE_FEATURES, .workgroupScope = VK_TRUE, .flexibleDimensions = VK_TRUE,
                                .tensorAddressing = VK_TRUE};
    struct cm_khr_features cmkf = {.sType = CM2_STYPE_KHR_FEATURES, .pNext = &cm2f, .cooperativeMatrix = VK_TRUE};
    if (d->coopmat2) {
        dev_exts[n_dev_exts++] = "VK_KHR_cooperative_matrix";
        dev_exts[n_dev_exts++] = "VK_NV_cooperative_matrix2";
        cm2f.pNext = f12.pNext;
        f12.pNext = &cmkf;
    }
    if (d->cm2_reduce) cm2f.reductions = cm2f.perElementOperations = VK_TRUE;
    if (d->coopmat_i8) {
        cm2f.perElementOperations = VK_TRUE;
        f12.shaderInt8 = VK_TRUE;
    }
    /* integer dot products (VK_KHR_shader_integer_dot_product's own feature structure, not
     * Vulkan 1.3's: the same on a 1.2 device and on a 1.3 one) */
    VkPhysicalDeviceShaderIntegerDotProductFeatures idf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES,
        .pNext = f12.pNext, .shaderIntegerDotProduct = VK_TRUE};
    if (d->int_dot) {
        dev_exts[n_dev_exts++] = VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME;
        f12.pNext = &idf;
    }
    VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR pef = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR,
        .pNext = f12.pNext, .pipelineExecutableInfo = VK_TRUE};
    if (d->exec_stats) {
        dev_exts[n_dev_exts++] = VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME;
        f12.pNext = &pef;
    }
    VkPhysicalDeviceShaderClockFeaturesKHR clf = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CLOCK_FEATURES_KHR,
                                                  .pNext = f12.pNext, .shaderDeviceClock = VK_TRUE};
    if (d->shader_clock) {
        dev_exts[n_dev_exts++] = VK_KHR_SHADER_CLOCK_EXTENSION_NAME;
        f12.pNext = &clf;
    }
    VkDeviceCreateInfo dci = {VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, &f12, 0, 1, &qi, 0, NULL,
                              n_dev_exts, dev_exts, NULL};
    anvil_status st = vk_result(vkCreateDevice(d->phys, &dci, NULL, &sh->dev), "vkCreateDevice");
    if (st != ANVIL_OK) return st;
    volkLoadDevice(sh->dev);
    vkGetDeviceQueue(sh->dev, d->queue_family, 0, &sh->queue);
    return ANVIL_OK;
}

/* The process's logical devices (struct vk_shared), shared or kept for the next session. */
static struct {
    pthread_mutex_t lock;
    struct vk_shared *list;
} devices = {PTHREAD_MUTEX_INITIALIZER, NULL};

static void end_kept_devices(void);

/* d->sh: a logical device of d's physical device and features that has not failed, made where
 * there is none; one of d's own where it injects faults. */
static anvil_status share_device(struct vk_device *d) {
    bool solo = d->fault_kind != VK_FAULT_NONE;
    uint32_t features = feature_bits(d);
    pthread_mutex_lock(&devices.lock);
    struct vk_shared *sh = NULL;
    for (struct vk_shared *s = solo ? NULL : devices.list; s && !sh; s = s->next)
        if (s->index == d->index && s->features == features && !__atomic_load_n(&s->lost, __ATOMIC_SEQ_CST) &&
            !s->abandoned)
            sh = s;
    anvil_status st = ANVIL_OK;
    static bool at_exit;
    if (!at_exit) at_exit = atexit(end_kept_devices) == 0;
    if (!sh) {
        sh = xcalloc(1, sizeof *sh);
        if (!sh) st = ANVIL_ERR_NOMEM;
        else if ((st = make_logical(d, sh)) != ANVIL_OK) {
            free(sh);
            sh = NULL;
        } else {
            sh->index = d->index;
            sh->features = features;
            sh->solo = solo;
            pthread_mutex_init(&sh->queue_lock, NULL);
            pthread_mutex_init(&sh->pl_lock, NULL);
            pthread_mutex_init(&sh->w_lock, NULL);
            sh->next = devices.list;
            devices.list = sh;
        }
    }
    if (sh) sh->refs++;
    pthread_mutex_unlock(&devices.lock);
    d->sh = sh;
    return st;
}

/* A logical device no session uses any more destroyed (one a session abandoned work on is
 * left alone: vk_idle). */
static void end_device(struct vk_shared *sh) {
    if (!sh->abandoned) { /* (its sessions waited for their work) */
        vk_shared_pipelines_destroy(sh);
        vkDestroyDevice(sh->dev, NULL);
    }
    pthread_mutex_destroy(&sh->queue_lock);
    pthread_mutex_destroy(&sh->pl_lock);
    pthread_mutex_destroy(&sh->w_lock);
    free(sh->sw); /* (empty: each backend let its weights go) */
    free(sh);
}

/* At exit, the devices kept for a next session that did not come: destroyed, as a last
 * session would have destroyed them (the driver's objects freed before the sanitizers' leak
 * check). Those that sessions still hold are theirs. */
static void end_kept_devices(void) {
    pthread_mutex_lock(&devices.lock);
    struct vk_shared *ended = NULL;
    for (struct vk_shared **s = &devices.list; *s;) {
        struct vk_shared *sh = *s;
        if (sh->refs) {
            s = &sh->next;
            continue;
        }
        *s = sh->next;
        sh->next = ended;
        ended = sh;
    }
    pthread_mutex_unlock(&devices.lock);
    while (ended) {
        struct vk_shared *next = ended->next;
        end_device(ended);
        ended = next;
    }
}

/* A session lets go of its logical device: kept for the next session where it is shared and
 * working (until the process exits: end_kept_devices), else destroyed with its last session. */
static void release_device(struct vk_shared *sh, bool abandoned) {
    pthread_mutex_lock(&devices.lock);
    sh->abandoned |= abandoned;
    bool last = --sh->refs == 0;
    bool end = last && (sh->solo || __atomic_load_n(&sh->lost, __ATOMIC_SEQ_CST) || sh->abandoned);
    if (end)
        for (struct vk_shared **s = &devices.list; *s; s = &(*s)->next)
            if (*s == sh) {
                *s = sh->next;
                break;
            }
    pthread_mutex_unlock(&devices.lock);
    if (end) end_device(sh);
}

anvil_status vk_device_create(int index, struct vk_device **out) {
    *out = NULL;
    if (!loader_ready())
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: no Vulkan loader (libvulkan.so.1) on this system");
    struct vk_device *d = xcalloc(1, sizeof *d);
    if (!d) return ANVIL_ERR_NOMEM;
    VkPhysicalDevice *pd = NULL;
    uint32_t n = 0;
    anvil_status st = tuning_read(&d->tune); /* the environment's settings, read here once */
    if (st == ANVIL_OK) st = read_failure_env(d);
    if (st != ANVIL_OK) {
        free(d);
        return st;
    }
    if (index < 0) index = d->tune.device;
    st = shared_instance(d->tune.validate, &d->instance);
    d->n_validation_msgs = __atomic_load_n(&g.holder.n_validation_msgs, __ATOMIC_SEQ_CST);
    if (st == ANVIL_OK) st = enumerate(d->instance, &pd, &n);
    if (st != ANVIL_OK) goto fail;
    if (n == 0) {
        st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: no Vulkan devices");
        goto fail;
    }
    int pick = -1;
    if (index >= 0) {
        if ((uint32_t)index >= n) {
            char list[512] = "";
            for (uint32_t k = 0; k < n; k++) {
                VkPhysicalDeviceProperties pr;
                vkGetPhysicalDeviceProperties(pd[k], &pr);
                size_t used = strlen(list);
                snprintf(list + used, sizeof list - used, "%s%u: %s", k ? ", " : "", k, pr.deviceName);
            }
            st = err_set(ANVIL_ERR_INVALID_ARG, "vulkan: device %d does not exist; the devices are %s",
                         index, list);
            goto fail;
        }
        const char *u = unusable(pd[index]);
        if (u) {
            st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: device %d cannot run anvil: %s", index, u);
            goto fail;
        }
        pick = index;
    } else {
        int best_rank = 99;
        for (uint32_t i = 0; i < n; i++) {
            VkPhysicalDeviceProperties pr;
            vkGetPhysicalDeviceProperties(pd[i], &pr);
            if (!unusable(pd[i]) && type_rank(pr.deviceType) < best_rank) {
                best_rank = type_rank(pr.deviceType);
                pick = (int)i;
            }
        }
        if (pick < 0) {
            st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: none of the %u devices can run anvil", n);
            goto fail;
        }
    }
    d->index = pick;
    d->phys = pd[pick];
    vkGetPhysicalDeviceProperties(d->phys, &d->props);
    vkGetPhysicalDeviceMemoryProperties(d->phys, &d->mem);
    VkPhysicalDeviceSubgroupProperties sg = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sg};
    vkGetPhysicalDeviceProperties2(d->phys, &p2);
    d->subgroup_size = sg.subgroupSize;
    if (has_device_ext(d->phys, VK_NV_SHADER_SM_BUILTINS_EXTENSION_NAME)) {
        VkPhysicalDeviceShaderSMBuiltinsPropertiesNV sm = {
            .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SM_BUILTINS_PROPERTIES_NV};
        VkPhysicalDeviceProperties2 smp = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sm};
        vkGetPhysicalDeviceProperties2(d->phys, &smp);
        d->sm_count = sm.shaderSMCount;
    }
    d->subgroup_shuffle = (sg.supportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_BIT) != 0;

    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(d->phys, &nq, NULL);
    VkQueueFamilyProperties qf[64];
    nq = MIN(nq, 64);
    vkGetPhysicalDeviceQueueFamilyProperties(d->phys, &nq, qf);
    d->queue_family = UINT32_MAX;
    for (uint32_t i = 0; i < nq && d->queue_family == UINT32_MAX; i++)
        if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) d->queue_family = i;
    if (d->queue_family == UINT32_MAX) {
        st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: %s has no compute queue", d->props.deviceName);
        goto fail;
    }
    choose_features(d);
    st = share_device(d);
    if (st != ANVIL_OK) goto fail;
    d->dev = d->sh->dev;
    d->queue = d->sh->queue;
    /* the session's own command pool and timeline */
    VkCommandPoolCreateInfo pci = {VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, NULL,
                                   VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, d->queue_family};
    st = vk_result(vkCreateCommandPool(d->dev, &pci, NULL, &d->pool), "vkCreateCommandPool");
    if (st != ANVIL_OK) goto fail;
    VkSemaphoreTypeCreateInfo sti = {VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO, NULL,
                                     VK_SEMAPHORE_TYPE_TIMELINE, 0};
    VkSemaphoreCreateInfo sci = {VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO, &sti, 0};
    st = vk_result(vkCreateSemaphore(d->dev, &sci, NULL, &d->timeline), "vkCreateSemaphore");
    if (st != ANVIL_OK) goto fail;
    free(pd);
    log_info("vulkan: device %d: %s (subgroup %u%s%s)", pick, d->props.deviceName, d->subgroup_size,
             d->coopmat_i8 ? ", workgroup and int8 cooperative matrices for prefill"
             : d->coopmat2  ? ", workgroup cooperative matrices for prefill"
             : d->coopmat ? ", cooperative matrices for prefill"
                          : "",
             d->int_dot_fast ? ", integer dot products" : "");
    *out = d;
    return ANVIL_OK;
fail:
    free(pd);
    vk_device_destroy(d);
    return st;
}

void vk_device_destroy(struct vk_device *d) {
    if (!d) return;
    if (d->dev && vk_idle(d)) {
        if (d->timeline) vkDestroySemaphore(d->dev, d->timeline, NULL);
        if (d->pool) vkDestroyCommandPool(d->dev, d->pool, NULL);
        if (d->sh) release_device(d->sh, false);
    } else if (d->sh) {
        release_device(d->sh, true);
    }
    free(d); /* the instance is the process's (shared_instance) */
}

anvil_status vk_check_validation(struct vk_device *d) {
    /* messages since this device was created (d->n_validation_msgs holds the count then) */
    int n = __atomic_load_n(&g.holder.n_validation_msgs, __ATOMIC_SEQ_CST) - d->n_validation_msgs;
    if (n > 0)
        return err_set(ANVIL_ERR_BACKEND, "vulkan validation (%d messages): %s", n,
                       g.holder.validation_msg);
    return ANVIL_OK;
}

/* Marks the device unusable from now on, for every session on it; returns the error (already
 * recorded). */
static anvil_status device_failed(struct vk_device *d, anvil_status st) {
    if (!d->lost) {
        d->lost = true;
        snprintf(d->lost_msg, sizeof d->lost_msg, "%s", anvil_last_error());
    }
    struct vk_shared *sh = d->sh;
    pthread_mutex_lock(&sh->queue_lock);
    if (!sh->lost) snprintf(sh->lost_msg, sizeof sh->lost_msg, "%s", d->lost_msg);
    __atomic_store_n(&sh->lost, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&sh->queue_lock);
    return st;
}

bool vk_lost(struct vk_device *d) {
    struct vk_shared *sh = d->sh;
    if (!d->lost && sh && __atomic_load_n(&sh->lost, __ATOMIC_SEQ_CST)) {
        pthread_mutex_lock(&sh->queue_lock);
        snprintf(d->lost_msg, sizeof d->lost_msg, "%s", sh->lost_msg);
        pthread_mutex_unlock(&sh->queue_lock);
        d->lost = true;
    }
    return d->lost;
}

static anvil_status check_lost(struct vk_device *d) {
    if (!vk_lost(d)) return ANVIL_OK;
    return err_set(ANVIL_ERR_BACKEND, "%s (the device failed earlier; nothing more runs on it)",
                   d->lost_msg);
}

anvil_status vk_submit(struct vk_device *d, const VkCommandBuffer *cbs, uint32_t n, uint64_t *value) {
    return vk_submit_sync(d, cbs, n, NULL, value);
}

anvil_status vk_submit_sync(struct vk_device *d, const VkCommandBuffer *cbs, uint32_t n, const struct vk_sync *sy,
                            uint64_t *value) {
    anvil_status st = check_lost(d);
    if (st != ANVIL_OK) return st;
    uint64_t v = d->timeline_value + 1;
    /* sy's semaphore, then the session's timeline (last: once a wait for it returns, the
     * submission is done with the other too; lavapipe signals them in order) */
    bool wait = sy && sy->wait, sig = sy && sy->signal;
    uint64_t sig_vals[2] = {sig ? sy->signal_value : v, v};
    VkSemaphore sigs[2] = {sig ? sy->signal : d->timeline, d->timeline};
    VkPipelineStageFlags wait_stage = VK_PIPELINE_STAGE_ALL_COMMANDS_BIT;
    VkTimelineSemaphoreSubmitInfo ti = {VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO, NULL, wait,
                                        wait ? &sy->wait_value : NULL, 1 + sig, sig_vals};
    VkSubmitInfo si = {VK_STRUCTURE_TYPE_SUBMIT_INFO, &ti, wait, wait ? &sy->wait : NULL, wait ? &wait_stage : NULL,
                       n, cbs, 1 + sig, sigs};
    VkResult r;
    bool fault = ++d->n_submits == d->fault_at;
    if (fault && d->fault_kind == VK_FAULT_LOST) r = VK_ERROR_DEVICE_LOST;
    else if (fault && d->fault_kind == VK_FAULT_HANG) {
        r = VK_SUCCESS; /* never signals */
        d->hang_injected = true;
    }
    else {
        pthread_mutex_lock(&d->sh->queue_lock);
        r = vkQueueSubmit(d->queue, 1, &si, VK_NULL_HANDLE);
        pthread_mutex_unlock(&d->sh->queue_lock);
        if (r == VK_SUCCESS) d->submitted_value = v;
    }
    st = vk_result(r, "vkQueueSubmit");
    if (st != ANVIL_OK) return r == VK_ERROR_DEVICE_LOST ? device_failed(d, st) : st;
    d->timeline_value = v;
    if (value) *value = v;
    return ANVIL_OK;
}

bool vk_use_qx(const struct vk_device *d) {
    if (!d->int_dot || d->tune.vk_qx == 0) return false;
    return d->int_dot_fast || d->tune.vk_qx == 1;
}

#define VK_POLL_S 1e-3

anvil_status vk_wait(struct vk_device *d, uint64_t value) {
    anvil_status st = check_lost(d);
    if (st != ANVIL_OK) return st;
    VkSemaphoreWaitInfo wi = {VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO, NULL, 0, 1, &d->timeline, &value};
    /* A GPU's short work polled for first (up to VK_POLL_S) where the backend asked
     * (backend_vulkan_poll_waits: --cpu-moe, whose decode step waits for 49 short parts; a
     * blocking wait's wake-up took ~0.1-0.2 ms on the H200, perf log §86). Not elsewhere: the
     * decode loop's waits polled cost the host ~150 us of CPU a token for no speed (§88). Not
     * on a CPU device, whose threads do the work this one would take the core from. */
    uint64_t now_v = 0;
    if (d->poll_waits && d->props.deviceType != VK_PHYSICAL_DEVICE_TYPE_CPU) {
        double until = time_now() + VK_POLL_S;
        while (vkGetSemaphoreCounterValue(d->dev, d->timeline, &now_v) == VK_SUCCESS && now_v < value &&
               time_now() < until) {
        }
    }
    /* in slices of a second, so that a GPU that stopped answering becomes an error rather
     * than a process that waits forever */
    VkResult r = now_v >= value ? VK_SUCCESS : VK_TIMEOUT;
    for (double waited = 0; r == VK_TIMEOUT && waited < d->timeout_s; waited += 1.0)
        r = vkWaitSemaphores(d->dev, &wi, 1000000000ull);
    if (r == VK_TIMEOUT) {
        err_set(ANVIL_ERR_BACKEND, "vulkan: %s has not finished its work in %.0f s: the GPU is hung "
                "or far too slow for this model (ANVIL_VK_TIMEOUT sets the limit)%s",
                d->props.deviceName, d->timeout_s, d->hang_injected ? " [the hang ANVIL_VK_FAULT injected]" : "");
        d->hung = true;
        return device_failed(d, ANVIL_ERR_BACKEND);
    }
    st = vk_result(r, "vkWaitSemaphores");
    if (st != ANVIL_OK) return r == VK_ERROR_DEVICE_LOST ? device_failed(d, st) : st;
    return vk_check_validation(d);
}

bool vk_idle(struct vk_device *d) {
    if (d->abandoned) return false;
    if (!d->timeline) return true; /* (a device being made: nothing submitted yet) */
    /* the session's own work: what it really submitted (not vkDeviceWaitIdle, which would wait
     * for the other sessions' too and needs the queue to itself) */
    VkSemaphoreWaitInfo wi = {VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO, NULL, 0, 1, &d->timeline,
                              &d->submitted_value};
    /* an injected hang submitted nothing: the device does become idle */
    if (!d->hung || d->hang_injected) {
        vkWaitSemaphores(d->dev, &wi, UINT64_MAX);
        return true;
    }
    /* a wait timed out: waiting without a limit could block for ever, but what was really
     * submitted may still be running (an injected hang, a slow device): wait for it, within
     * the limit, so that nothing it uses is freed under it */
    /* (seen under the sanitizers on a loaded machine: a batch still running on lavapipe
     * after its 1 s limit, and freed under it) */
    if (vkWaitSemaphores(d->dev, &wi, (uint64_t)(MAX(d->timeout_s, 10.0) * 1e9)) == VK_SUCCESS) return true;
    d->abandoned = true;
    return false;
}

anvil_status vk_cmd_alloc(struct vk_device *d, VkCommandBuffer *cb) {
    VkCommandBufferAllocateInfo ai = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, NULL, d->pool,
                                      VK_COMMAND_BUFFER_LEVEL_PRIMARY, 1};
    return vk_result(vkAllocateCommandBuffers(d->dev, &ai, cb), "vkAllocateCommandBuffers");
}

void backend_vulkan_poll_waits(struct backend *base, bool on) {
    ((struct vk_backend *)base)->d->poll_waits = on;
}
