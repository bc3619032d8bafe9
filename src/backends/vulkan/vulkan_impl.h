/*
 * The Vulkan backend's internals, split by lifetime as its files are:
 *   device.c     the loader (volk), instance, physical device choice, logical device, queue,
 *                validation messages
 *   memory.c     buffers (every one reached by device address: no descriptors at all),
 *                device-local memory checks, the staging uploader
 *   pipelines.c  shader modules from the embedded SPIR-V, the persistent pipeline cache,
 *                one compute pipeline per kernel variant
 *   decode/      the decode program: graph -> fused kernels, a static memory plan, the step
 *                recorded once and resubmitted per token (decode/decode.h lists its files)
 *   prefill/     the prefill program: a chunk of tokens as matrix-matrix products and row
 *                kernels (prefill/prefill.h lists its files)
 *   vulkan.c     the backend object (weights, states) and its vtable
 */
#ifndef ANVIL_VULKAN_IMPL_H
#define ANVIL_VULKAN_IMPL_H

#include <pthread.h>
#include <stddef.h>
#include <volk.h>

#include "backends/backend.h"
#include "base/tuning.h"
#include "backends/vulkan/shaders/contract.h" /* flag bits and spec-constant ids shared with the shaders */

/* A logical device and what the sessions on it share (device.c): one per physical device and
 * set of enabled features in a process, made by the first session that asks for it and kept
 * after its last one (until the process exits or the device fails) for the next: tests and
 * programs make sessions one after another, and on lavapipe, whose VkPipelineCache keeps
 * nothing, each pipeline costs tens of milliseconds of SPIR-V -> NIR per session (perf rule
 * "pipelines once a process"). A session with injected faults (ANVIL_VK_FAULT) has one of its
 * own, shared with no other. */
struct vk_pipe; /* pipelines.c: a pipeline made on the device, by kernel and specialisation */
struct vk_shared {
    struct vk_shared *next; /* the process's list (device.c) */
    int refs;               /* the sessions on it */
    int index;              /* its physical device, in enumeration order */
    uint32_t features;      /* what it enables (device.c feature_bits) */
    bool solo;              /* one session's own (ANVIL_VK_FAULT): never shared, ends with it */
    VkDevice dev;
    VkQueue queue;
    pthread_mutex_t queue_lock; /* the queue is externally synchronised: one submit at a time */
    /* lost (read atomically): the device failed in some session; every session on it fails
     * from then on with lost_msg (written once, under queue_lock), as on real hardware */
    int lost;
    char lost_msg[256];
    bool abandoned; /* a session left work running on it (vk_idle): never destroyed */
    /* the pipelines (pipelines.c), under pl_lock: one push-constant layout, the persistent
     * cache, and every pipeline made, found again by kernel and specialisation constants */
    pthread_mutex_t pl_lock;
    VkPipelineLayout layout;
    VkPipelineCache cache;
    char cache_path[1024];
    struct vk_pipe *pipes;
    int n_pipes, cap_pipes, n_saved; /* n_saved: the pipelines in the cache file's last save */
    /* the weights uploaded (vulkan.c vk_weights_share), under w_lock: the backends on it that
     * read the same model's weight in the same form read one buffer */
    pthread_mutex_t w_lock;
    struct vk_shared_weight *sw;
    int n_sw, cap_sw;
};

/* A session's device: the shared logical device's handles (copied from sh: dev, queue...),
 * the physical device's properties and the features enabled (equal for every session on
 * sh), and what is the session's own: its command pool and timeline, its settings (tune,
 * timeout, memory cap), fault injection, memory accounting and failure state. */
struct vk_device {
    struct vk_shared *sh;
    VkInstance instance;
    VkDebugUtilsMessengerEXT messenger;
    VkPhysicalDevice phys;
    VkPhysicalDeviceProperties props;
    VkPhysicalDeviceMemoryProperties mem;
    uint32_t subgroup_size;
    uint32_t sm_count; /* streaming multiprocessors (VK_NV_shader_sm_builtins), 0 if unknown */
    bool shader_clock; /* VK_KHR_shader_clock's device clock (ANVIL_VK_MEGA_CLOCK=1): K_MEGA_BF16_CLK */
    VkDevice dev;
    VkQueue queue;
    uint32_t queue_family;
    VkCommandPool pool;    /* the session's own (command pools are externally synchronised) */
    VkSemaphore timeline; /* signalled with ++timeline_value by every submit */
    uint64_t timeline_value;
    uint64_t submitted_value; /* the last value a real vkQueueSubmit will signal */
    int index; /* in enumeration order */
    /* validation messages (errors, warnings): the process's count when this device was
     * created; any message after that makes the backend's next call fail */
    int n_validation_msgs;
    char validation_msg[512]; /* the first message (in the process's instance holder) */
    /* failure handling: once the device is lost (or stopped answering), every later submit
     * and wait fails at once with lost_msg instead of touching the device again (lost is
     * this session's view: vk_lost also takes a failure another session on sh met) */
    bool lost, hung; /* hung: a wait timed out (waiting again could block for ever) */
    char lost_msg[256];
    double timeout_s;      /* ANVIL_VK_TIMEOUT: longest wait for one submission (default 120) */
    bool poll_waits;       /* vk_wait polls before it blocks (backend_vulkan_poll_waits) */
    bool has_budget;       /* VK_EXT_memory_budget enabled */
    bool subgroup_shuffle; /* subgroupShuffleXor (attn_flash.comp) */
    bool exec_stats;       /* ANVIL_VK_PIPELINE_STATS=1 and VK_KHR_pipeline_executable_properties:
                              each pipeline's compiler statistics (registers...) to stderr */
    bool int_dot;          /* integer dot products enabled (shaderIntegerDotProduct): the K_QX
                              and K_MATVEC_*QX_* kernels exist (vk_use_qx says when they run;
                              the variants beyond the plain ones exist only then) */
    bool int_dot_fast;     /* and the device accelerates 4 x 8-bit packed ones */
    bool coopmat;          /* VK_NV_cooperative_matrix enabled (unless ANVIL_VK_COOPMAT=0): prefill's
                              K_MMH_* kernels exist */
    bool coopmat2;         /* and VK_NV_cooperative_matrix2's workgroup matrices (want_coopmat2):
                              the prefill's products on mm_cm2.comp */
    uint32_t cm2_gran[3];  /* their M, N, K granularity (float16 products, VK_CM2_THREADS): a
                              workgroup matrix's sides are multiples of it */
    bool cm2_reduce;       /* and their row reductions and per-element operations (vit_fa_cm2.comp) */
    bool coopmat_i8;       /* and int8 x int8 -> int32 16 x 16 x 32 subgroup matrices, shaderInt8 and
                              per-element operations (want_coopmat_i8): mmq_cm2.comp */
    VkDeviceSize max_mem;  /* ANVIL_VK_MAX_MEMORY: a cap on device memory (0: none) */
    /* a layer split's crossing without the host (chain.c): VK_EXT_external_memory_host enabled
     * (its pointers' alignment) and VK_KHR_external_semaphore_fd */
    bool ext_host_mem, ext_sem_fd;
    VkDeviceSize host_ptr_align;
    /* ANVIL_VK_FAULT=KIND:N makes the N-th submit (lost, hang) or device allocation (oom)
     * fail as a real device would: for testing the failure paths */
    int fault_kind, fault_at, n_submits, n_allocs;
    bool hang_injected;
    /* work still running on a device that stopped answering (vk_idle gave up): its objects
     * are left alone rather than freed under it (a leak on a failed device, not a crash) */
    bool abandoned;
    /* device-local memory allocated now, and the most at once (anvil_session_memory) */
    VkDeviceSize mem_now, mem_peak;
    struct tuning tune; /* the environment's settings (tuning.h), read once when the device is made */
};
enum { VK_FAULT_NONE, VK_FAULT_LOST, VK_FAULT_HANG, VK_FAULT_OOM };

/* Whether a Vulkan loader and at least one device exist (cheap after the first call). */
bool vk_available(char *why, size_t why_cap);
/* Whether one of the usable devices is a GPU (not a CPU device such as Mesa's lavapipe). */
bool vk_gpu_available(void);
/* One line per physical device (index: name, type, memory, usability) into buf. */
size_t vk_describe_devices(char *buf, size_t cap);
/* Opens device index (enumeration order), or the best one (discrete first) when index < 0
 * (ANVIL_DEVICE overrides). ANVIL_VALIDATE=1 turns the validation layer on. */
anvil_status vk_device_create(int index, struct vk_device **out);
/* Waits for the session's work, frees its own objects and lets go of its shared device. */
void vk_device_destroy(struct vk_device *d);
/* Whether the device failed, in this session or another one on the same logical device (then
 * d->lost and d->lost_msg say so from now on). */
bool vk_lost(struct vk_device *d);
/* Fails with the first validation message if any arrived. */
anvil_status vk_check_validation(struct vk_device *d);
/* One submission of cbs that signals the next timeline value; returns it in *value. */
anvil_status vk_submit(struct vk_device *d, const VkCommandBuffer *cbs, uint32_t n, uint64_t *value);
/* Besides: a timeline semaphore value the submission waits for before it runs, and one it
 * signals with the session's (VK_NULL_HANDLE: none); a layer split's chain (chain.c). */
struct vk_sync {
    VkSemaphore wait;
    uint64_t wait_value;
    VkSemaphore signal;
    uint64_t signal_value;
};
anvil_status vk_submit_sync(struct vk_device *d, const VkCommandBuffer *cbs, uint32_t n, const struct vk_sync *sy,
                            uint64_t *value);
anvil_status vk_wait(struct vk_device *d, uint64_t value);
/* Whether a decode program made now uses the integer-dot-product matvecs: where the device
 * has them and accelerates them, or ANVIL_VK_QX=1 asks; ANVIL_VK_QX=0 never. */
bool vk_use_qx(const struct vk_device *d);
/* Waits until the session's work is done (before freeing what it may use). On a device that stopped
 * answering, waits at most max(ANVIL_VK_TIMEOUT, 10 s) for what was really submitted; past
 * that it gives up, sets d->abandoned and returns false (the destroy functions then leave
 * the device's objects alone). */
bool vk_idle(struct vk_device *d);
/* A primary command buffer from the device's pool; begin/end by the caller. */
anvil_status vk_cmd_alloc(struct vk_device *d, VkCommandBuffer *cb);
anvil_status vk_result(VkResult r, const char *what);

/* ---- memory ---- */

struct vk_buffer {
    VkBuffer buf;
    VkDeviceMemory mem;
    VkDeviceSize size;
    VkDeviceAddress addr;
    void *map; /* host-visible buffers: mapped for their lifetime */
    VkDeviceSize counted; /* bytes of device-local memory it adds to mem_now */
};

enum vk_mem_kind {
    VK_MEM_DEVICE,   /* DEVICE_LOCAL, never host memory */
    VK_MEM_CONTROL,  /* DEVICE_LOCAL | HOST_VISIBLE | HOST_COHERENT when the device has it
                        (resizable BAR), else HOST_VISIBLE | HOST_COHERENT */
    VK_MEM_READBACK, /* HOST_VISIBLE | HOST_CACHED (else coherent) */
    VK_MEM_STAGING,  /* HOST_VISIBLE | HOST_COHERENT */
};

anvil_status vk_buffer_create(struct vk_device *d, VkDeviceSize size, enum vk_mem_kind kind,
                              const char *what, struct vk_buffer *out);
void vk_buffer_destroy(struct vk_device *d, struct vk_buffer *b);
/* Bytes of device-local memory anvil may use: the largest device-local heap, or its budget
 * (VK_EXT_memory_budget: what other processes leave), capped by ANVIL_VK_MAX_MEMORY. */
VkDeviceSize vk_device_local_bytes(struct vk_device *d);
/* What the process may still allocate in device-local memory (VK_EXT_memory_budget: the largest
 * heap's budget less its usage), within the session's cap (ANVIL_VK_MAX_MEMORY less what the
 * session holds); 0: unknown (no budget extension and no cap). */
VkDeviceSize vk_device_free_bytes(struct vk_device *d);
/* The Vulkan devices there are (usable or not; 0 without a loader). */
int vk_device_count(void);

/* Copies host data into device buffers through one reused staging buffer. */
struct vk_uploader {
    struct vk_device *d;
    struct vk_buffer staging;
    VkCommandBuffer cb;
    VkDeviceSize used, cap; /* cap: the staging buffer's bytes */
    uint64_t total, done;   /* bytes, reported to progress() at each flush */
};
anvil_status vk_uploader_init(struct vk_uploader *u, struct vk_device *d, uint64_t total);
/* Copies n bytes; fill(dst, n, ctx) writes them into staging memory (so rows can be repacked
 * on the way). */
typedef void (*vk_fill_fn)(void *dst, size_t offset, size_t n, void *ctx);
anvil_status vk_upload(struct vk_uploader *u, struct vk_buffer *dst, VkDeviceSize dst_off,
                       size_t n, vk_fill_fn fill, void *ctx);
anvil_status vk_uploader_finish(struct vk_uploader *u);

/* ---- pipelines ---- */

/* The weight types the matvec and embedding kernels read, in the order of vk_weight_kind (F32,
 * F16, BF16, Q8_0, then the 4- to 6-bit block types): the type as DT_ names it, as the
 * SPIR-V's names spell it. Every one has the kernels of VK_TYPE_KERNELS. */
#define VK_WEIGHT_TYPES(X) \
    X(F32, f32) X(F16, f16) X(BF16, bf16) X(Q8_0, q8_0) X(Q4_0, q4_0) X(Q4_1, q4_1) X(Q5_0, q5_0) \
    X(Q5_1, q5_1) X(Q4_K, q4_k) X(Q5_K, q5_k) X(Q6_K, q6_k) X(Q2_K, q2_k) X(Q3_K, q3_k) \
    X(IQ4_NL, iq4_nl) X(IQ4_XS, iq4_xs) X(IQ3_XXS, iq3_xxs) X(IQ3_S, iq3_s) X(IQ2_XXS, iq2_xxs) \
    X(IQ2_XS, iq2_xs) X(IQ2_S, iq2_s) X(IQ1_S, iq1_s) X(IQ1_M, iq1_m)
#define VK_WEIGHT_KINDS 22
/* A weight type's index among them, or -1. */
int vk_weight_kind(int dtype);
/* The weight type (DT_*) of kind `kind`, 0 <= kind < VK_WEIGHT_KINDS. */
int vk_weight_kind_dtype(int kind);
/* The weight types with integer-dot-product matvecs (dtype_rounds_x), each with the kernels
 * of VK_QX_TYPE_KERNELS; a type's index among them (the QX shapes' and knobs' order) or -1,
 * and the type of an index. */
#define VK_QX_TYPES(X) \
    X(Q8_0, q8_0) X(Q4_K, q4_k) X(Q5_K, q5_k) X(Q6_K, q6_k) X(Q2_K, q2_k) X(Q3_K, q3_k) X(IQ4_NL, iq4_nl) \
    X(IQ4_XS, iq4_xs) X(IQ3_XXS, iq3_xxs) X(IQ3_S, iq3_s) X(IQ2_XXS, iq2_xxs) X(IQ2_XS, iq2_xs) X(IQ2_S, iq2_s) \
    X(IQ1_S, iq1_s) X(IQ1_M, iq1_m)
#define VK_QX_KINDS 15
int vk_qx_index(int dtype);
int vk_qx_dtype(int index);

/* What a kernel computes, for the kernels looked up by weight type (vk_kernel_for, vk_kernel_qx) */
enum vk_op {
    VK_OP_NONE,          /* a kernel of its own, named by its id only */
    VK_OP_MATVEC,        /* matvec.comp MODE 0: y = W x, up to 3 matrices of one input */
    VK_OP_MATVEC_SWIGLU, /* MODE 1: gate/up -> SwiGLU */
    VK_OP_MOE_GU,        /* MODE 2: the chosen experts' gate/up -> SwiGLU */
    VK_OP_MOE_DOWN,      /* MODE 3: their down projections, summed by weight */
    VK_OP_MATVEC_ROUTE,  /* the MoE router's product choosing the experts itself (ROUTE) */
    VK_OP_MOE_DOWN_ROUND, /* MODE 3 rounding its outputs for the next product (MDR) */
    VK_OP_EMBED,         /* embed.comp: the token's row of the table */
    VK_OP_MM,            /* the prefill's products (mm.comp MODE 0) */
    VK_OP_EMBED_ROWS,    /* the prefill's embedding rows (mm.comp MODE 1) */
    VK_OP_MM_EXPERTS,    /* the prefill's experts, grouped by expert (mm.comp MODE 2) */
    VK_OP_DQ,            /* weights dequantised to float16 rows (dq.comp) for mm_h.comp */
    VK_OP_MEGA,          /* the persistent decode step (mega.comp) */
    VK_OP_MMB,           /* the small-batch products (mmb.comp: up to 32 rows, each weight read
                            once; QX: on integer dot products of inputs mmb_round.comp rounded) */
};

/* The weight types mm_cm2.comp decodes itself (WQ), each with the kernels of VK_CM2Q_KERNELS:
 * vk_cm2q_kernel finds them */
#define VK_CM2Q_TYPES(X) X(Q4_K, q4_k) X(Q5_K, q5_k) X(Q6_K, q6_k) X(Q8_0, q8_0)
#define VK_CM2Q_KERNELS(T, t) K_MMH_CM2_##T, K_MMH_CM2_MOE_##T,

/* The weight types besides Q4_K and Q6_K whose experts mmq_cm2.comp multiplies on the int8
 * matrix units (K_MMQL_Q8_0 .. K_MMQL_IQ1_M) */
#define VK_MMQL_TYPES(X) X(Q8_0, q8_0) X(Q5_K, q5_k) X(Q2_K, q2_k) X(Q3_K, q3_k) X(IQ4_NL, iq4_nl) X(IQ4_XS, iq4_xs) X(IQ3_XXS, iq3_xxs) \
    X(IQ3_S, iq3_s) X(IQ2_XXS, iq2_xxs) X(IQ2_XS, iq2_xs) X(IQ2_S, iq2_s) X(IQ1_S, iq1_s) X(IQ1_M, iq1_m)
#define VK_MMQL_KERNEL(T, t) K_MMQL_##T,

/* The kernels: one compute pipeline each (pipelines.c's table says its SPIR-V, name, op,
 * weight type and specialisation). The ids are names, never computed: a kernel for an op and a
 * weight type is found by vk_kernel_for / vk_kernel_qx. Adding a kernel: docs/VULKAN.md. */
/* the kernels of every weight type of VK_WEIGHT_TYPES */
#define VK_TYPE_KERNELS(T, t) \
    K_MATVEC_##T, K_MATVEC_SWIGLU_##T, K_MOE_GU_##T, K_MOE_DOWN_##T, K_EMBED_##T, K_MM_##T, K_EMBEDT_##T, \
    K_MMOE_##T, K_DQ_##T, K_MMB_##T,
/* matvec.comp's QX products (MODE 0) and SwiGLUs (MODE 1) of every type of VK_QX_TYPES: plain
 * (XM 0), on inputs rounded in blocks of 8 by their producer (_X1; _X2: with the norm's
 * 1 / rms left to them), and as teams of threads a workgroup (QXT, by the same XM); and the
 * small-batch product on integer dot products (mmb.comp QX); the experts' gate/up on inputs
 * rounded by the norm's consumer (_X2, decode) or in blocks of 32 (plain: a few-row program's
 * rows rounded by mmb_round.comp, prefill/moe.c) */
#define VK_QX_TYPE_KERNELS(T, t) \
    K_MATVEC_QX_##T, K_MATVEC_SWIGLU_QX_##T, K_MATVEC_QX_##T##_X1, K_MATVEC_SWIGLU_QX_##T##_X1, \
    K_MATVEC_QX_##T##_X2, K_MATVEC_SWIGLU_QX_##T##_X2, K_MATVEC_QXT_##T##_X0, K_MATVEC_SWIGLU_QXT_##T##_X0, \
    K_MATVEC_QXT_##T##_X1, K_MATVEC_SWIGLU_QXT_##T##_X1, K_MATVEC_QXT_##T##_X2, K_MATVEC_SWIGLU_QXT_##T##_X2, \
    K_MMB_QX_##T, K_MOE_GU_QX_##T##_X2, K_MOE_GU_QX_##T,
enum vk_kernel {
    K_NONE, /* no kernel (its pipeline is always VK_NULL_HANDLE) */
    VK_WEIGHT_TYPES(VK_TYPE_KERNELS)
    K_ATTENTION,
    K_ARGMAX,
    K_EW,       /* ew.comp: add, sigmoid_mul, swiglu, rms_norm left unfused */
    K_MOE_TOPK, /* the router */
    K_GDN,      /* a Gated DeltaNet layer */
    K_SAMPLE,
    K_LOGIT_BIAS, K_LOGPROBS, /* logprobs.comp's modes: the bias list added, the chosen's logprobs */
    K_MM_REDUCE, /* mm.comp MODE 4: the experts' products summed per token */
    /* rows.comp's modes */
    K_ROWS_NORM, K_ROWS_ROPE, K_ROWS_ADD, K_ROWS_SWIGLU, K_ROWS_KVWRITE, K_ROWS_SIGMUL, K_ROWS_NORM_ROPE,
    K_ROWS_IMAGE, /* rows.comp MODE 7: an image's embedding rows in place of token rows */
    K_ROWS_HALF,  /* rows.comp MODE 8: rows as float16, scaled into its range */
    K_ATTN_PREFILL,
    /* float16 products on cooperative matrices (mm_h.comp; tiles of 64 tokens x 64 outputs,
     * 32 weights of K per step), only where d->coopmat */
    K_MMH_64X64_K32,
    /* the same on workgroup-scope matrices (mm_cm2.comp), only where d->coopmat2 */
    K_MMH_CM2, K_MMH_CM2_MOE, K_MMH_MOE /* the experts, rows gathered */,
    K_MMH_CM2_U, K_MMH_CM2_MOE_U, /* mm_cm2.comp NO_XS: the same for unscaled rows */
    K_MMH_CM2_S, /* mm_cm2.comp NO_XS in 64 x 64 tiles (VK_CM2_SMALL): products of few tiles */
    K_MMH_CM2_UK, /* mm_cm2.comp NO_XS KTAIL: K a multiple of 16, not of 4 VK_CM2_BK (made on first use) */
    /* mm_cm2.comp WQ: the products (and MOE the experts') from the weights' own blocks,
     * decoded as the tiles load (VK_CM2Q_TYPES) */
    VK_CM2Q_TYPES(VK_CM2Q_KERNELS)
    /* mmq_cm2.comp: the experts' products from their Q4_K / Q6_K blocks on the int8 matrix
     * units, x rounded to int8 in the kernel (vk_mmq_kernel), where d->coopmat_i8 */
    K_MMQ_MOE_Q4_K, K_MMQ_MOE_Q6_K, K_MMQ_MOE16_Q4_K, K_MMQ_MOE16_Q6_K, /* (tiles of 32 rows, of 16) */
    K_MMQ8_MOE_Q4_K, K_MMQ8_MOE_Q6_K, K_MMQ8_MOE16_Q4_K, K_MMQ8_MOE16_Q6_K, /* (XQ8: x rounded before) */
    K_MMQ8W_MOE_Q4_K, K_MMQ8W_MOE_Q6_K, K_MMQ8W_MOE16_Q4_K, K_MMQ8W_MOE16_Q6_K, /* (and 128 threads, BN 64) */
    /* ... and of Q8_0, Q5_K and the low-bit types (mmq_cm2.comp W_Q8_0, W_Q5_K, W_LOW: wlow.glsl's
     * units staged as int8), XQ8 on 128 threads in tiles of 32 rows only */
    VK_MMQL_TYPES(VK_MMQL_KERNEL)
    K_MMQ8G_MOE_Q4_K, K_MMQ8G_MOE_Q6_K, /* (GU: the gate and up in one, the SwiGLU in its epilogue: vk_mmq_gu_kernel) */
    K_ATTN_FLASH, /* the prefill's causal attention on cooperative matrices (attn_flash.comp),
                     where d->coopmat and the heads fit it (vk_flash_fits): two passes over
                     the keys */
    K_ATTN_FLASH1, /* (the same in one pass, ONE_PASS: ANVIL_VK_FLASH=2) */
    K_ATTN_SPLIT, /* a batch program's attention split over each row's positions (attn_split.comp) */
    /* moe_topk.comp for the prefill: MODE 1 routes every token, MODE 2 sorts them by expert,
     * MODE 3 lists a few rows' choices ordered by expert */
    K_MOE_ROUTE, K_MOE_BUCKET, K_MOE_PAIRS,
    /* moe_rows.comp: MODE 0 the experts' row offsets, 1 their x rows gathered, 2 scattered back */
    K_MOE_OFFS, K_MOE_GATHER, K_MOE_SCATTER,
    /* gdn.comp for the prefill: MODE 1 a chunk's tokens in turn, MODE 2 the conv ring; MODE 3
     * the decode step with each head's columns split over workgroups; MODE 4 MODE 1's rows on
     * MODE 3's split (a session's few rows, its states kept in registers between them) */
    K_GDN_PREFILL, K_GDN_RING, K_GDN_SPLIT, K_GDN_PSPLIT,
    /* gdn_chunk.comp: the prefill's Gated DeltaNet in the chunked form, its MODE 0, 1, 2 (the
     * conv and norms; within each block of 64 tokens; the state carried over the blocks) */
    K_GDNC_PREP, K_GDNC_INTRA, K_GDNC_RECUR,
    /* the decode matvecs on integer dot products (where d->int_dot): qx.comp rounds an input
     * to int8 blocks, matvec.comp QX multiplies; the variants beyond the plain ones (XM 1, 2,
     * teams: vk_kernel_qx) exist only where vk_use_qx */
    K_QX,
    VK_QX_TYPES(VK_QX_TYPE_KERNELS)
    /* the MoE router's matvec choosing the experts itself (matvec.comp ROUTE, MODE 0) */
    K_MATVEC_ROUTE_F32, K_MATVEC_ROUTE_F16, K_MATVEC_ROUTE_BF16,
    /* the o projection as teams (QXT) with the MoE router folded in (matvec.comp RFOLD), by the XM
     * of its input (vk_kernel_qxt_rf) */
    K_MATVEC_QXTR_Q8_0_X0, K_MATVEC_QXTR_Q8_0_X1, K_MATVEC_QXTR_Q4_K_X0, K_MATVEC_QXTR_Q4_K_X1,
    K_MATVEC_QXTR_Q5_K_X0, K_MATVEC_QXTR_Q5_K_X1, K_MATVEC_QXTR_Q6_K_X0, K_MATVEC_QXTR_Q6_K_X1,
    K_MATVEC_QXTR_IQ4_XS_X0, K_MATVEC_QXTR_IQ4_XS_X1,
    /* the experts' down projection (MODE 3) rounding its outputs for the next product's integer
     * dot products (matvec.comp MDR), for the weight types of K-quant, Q8_0 and the common low-bit
     * MoE files */
    K_MOE_DOWN_R_Q8_0, K_MOE_DOWN_R_Q4_K, K_MOE_DOWN_R_Q5_K, K_MOE_DOWN_R_Q6_K,
    K_MOE_DOWN_R_Q2_K, K_MOE_DOWN_R_Q3_K, K_MOE_DOWN_R_IQ4_NL, K_MOE_DOWN_R_IQ4_XS, K_MOE_DOWN_R_IQ2_XXS,
    /* the same on integer dot products, its input the gate/up's SwiGLU outputs rounded in blocks of
     * 8 by the gate/up as teams (MODE 2 QXT: K_MOE_GU_QXT_*; matvec.comp MDR with QX) */
    K_MOE_DOWN_RQ_Q8_0, K_MOE_DOWN_RQ_Q4_K, K_MOE_DOWN_RQ_Q5_K, K_MOE_DOWN_RQ_Q6_K,
    K_MOE_GU_QXT_Q8_0_X2, K_MOE_GU_QXT_Q4_K_X2, K_MOE_GU_QXT_Q5_K_X2, K_MOE_GU_QXT_Q6_K_X2,
    /* the decode step's float matvecs and attentions in one persistent dispatch (mega.comp),
     * per float weight kind, where mega_grid (pipelines.c mega_shape) says so */
    K_MEGA_F32, K_MEGA_F16, K_MEGA_BF16,
    K_MEGA_BF16_CLK, /* the same timing its phases, where d->shader_clock */
    K_MEGA_QX,       /* Q4_K, Q6_K and Q8_0 weights on integer dot products, where d->int_dot */
    K_MEGA_QX_CLK,
    K_MEGA_QXK, K_MEGA_QX8, /* the same compiled for Q4_K and Q6_K only, for Q8_0 only */
    K_PREFETCH, /* weights read ahead into the L2 cache (prefetch.comp, decode/prefetch.c add_prefetch) */
    /* the vision encoder's kernels (vit.comp's modes, in its MODE order; prefill/vit.c) */
    K_VIT_NORM, K_VIT_BIAS, K_VIT_POS, K_VIT_ROPE, K_VIT_ATTN, K_VIT_SOFTMAX,
    /* its attention as products (ANVIL_VK_VIT_FLASH=4): on workgroup matrices (vit_mm_cm2.comp,
     * prebuilt; where d->coopmat2; _N80 tiles of 80 columns for O of heads of up to 80), else
     * in float32 tiles (vit_mm.comp) */
    K_VIT_MM_CM2, K_VIT_MM_CM2_N80, K_VIT_MM,
    /* its attention as one flash pass on workgroup matrices (vit_fa_cm2.comp, prebuilt;
     * ANVIL_VK_VIT_FLASH=7-9: 64 queries x 64 keys a step, 128 x 64, 64 x 128), where
     * d->cm2_reduce and a head has at most 80 dimensions */
    K_VIT_FA_CM2, K_VIT_FA_CM2_R128, K_VIT_FA_CM2_C128,
    /* its attention on cooperative matrices (vit_flash.comp: two passes over the keys; one,
     * ONE_PASS), where d->coopmat and the head padded to vit_dp fits (vk_pipelines.vit_dp) */
    K_VIT_FLASH, K_VIT_FLASH1, K_VIT_FLASH1_BK64 /* (the same, 64 keys a step) */,
    /* the inputs of mmb.comp's QX products rounded to int8 (mmb_round.comp) */
    K_MMB_ROUND,
    /* the small-batch products on integer dot products, tiled (mmbt.comp): of more than 8 rows,
     * where the device has subgroup shuffles (vk_mmb_qx) */
    K_MMBT_Q8_0, K_MMBT_Q4_K, K_MMBT_Q5_K, K_MMBT_Q6_K,
    /* the few-row products on integer dot products (mmbx.comp): of 2, 4, 8, 16 and 32 rows of x
     * (CT; 16 and 32 its MMBX_WIDE SPIR-V), of up to ANVIL_VK_MMBX rows where the device has
     * subgroup shuffles (vk_mmb_qx) */
    K_MMBX_Q8_0_2, K_MMBX_Q8_0_4, K_MMBX_Q8_0_8, K_MMBX_Q8_0_16, K_MMBX_Q8_0_32,
    K_MMBX_Q4_K_2, K_MMBX_Q4_K_4, K_MMBX_Q4_K_8, K_MMBX_Q4_K_16, K_MMBX_Q4_K_32,
    K_MMBX_Q5_K_2, K_MMBX_Q5_K_4, K_MMBX_Q5_K_8, K_MMBX_Q5_K_16, K_MMBX_Q5_K_32,
    K_MMBX_Q6_K_2, K_MMBX_Q6_K_4, K_MMBX_Q6_K_8, K_MMBX_Q6_K_16, K_MMBX_Q6_K_32,
    /* a batch step's products of 16 and 32 rows of x on the int8 matrix units (mmqb_cm2.comp),
     * where d->coopmat_i8 and ANVIL_VK_MMQB (vk_mmb_qx) */
    K_MMQB_Q4_K_16, K_MMQB_Q4_K_32, K_MMQB_Q6_K_16, K_MMQB_Q6_K_32,
    K_COUNT,
};
/* mm_cm2.comp's kernel decoding weights of type dtype itself (MOE: the experts'), or K_NONE
 * for a type it does not decode; made only where the device takes it (vk_pipeline_supported) */
enum vk_kernel vk_cm2q_kernel(int dtype, bool moe);
/* mmq_cm2.comp GU's kernel (the gate and up products in one, the SwiGLU and h's int8 rounding in
 * its epilogue) for gate / up weights of dtype (Q4_K, Q6_K), else K_NONE */
enum vk_kernel vk_mmq_gu_kernel(int dtype);
/* mmq_cm2.comp's experts' kernel for weights of dtype in tiles of bm (16 or 32) rows, x rounded
 * by the kernel or before it (x8), on 128 threads (wg128, with x8): Q4_K and Q6_K in each form,
 * the types of VK_MMQL_TYPES in tiles of 32 with x8 and wg128 only; else K_NONE */
enum vk_kernel vk_mmq_kernel(int dtype, uint32_t bm, bool x8, bool wg128);

/* The push-constant layouts (shaders/push.h), one struct pc_* each */
enum vk_push {
    PUSH_NONE, PUSH_MATVEC, PUSH_MATVEC_QXT, PUSH_QX, PUSH_EMBED, PUSH_ATTN, PUSH_EW, PUSH_TOPK, PUSH_GDN,
    PUSH_ARGMAX, PUSH_SAMPLE, PUSH_PREFETCH, PUSH_MEGA, PUSH_MM, PUSH_MMH, PUSH_DQ, PUSH_ROWS, PUSH_MOE_ROWS,
    PUSH_ATTN_PF, PUSH_GDNC, PUSH_VIT, PUSH_MMB, PUSH_MMB_ROUND, PUSH_LOGPROBS, PUSH_ATTN_SPLIT, PUSH_VITMM, VK_PUSH_COUNT
};

/* A kernel's entry in the table (pipelines.c) */
struct vk_kernel_info {
    const uint32_t *code; /* its SPIR-V (size bytes) */
    size_t size;
    const char *name;
    uint8_t op;      /* enum vk_op */
    int8_t dtype;    /* the weight type it reads (DT_*) where op is not VK_OP_NONE */
    uint8_t qx;      /* matvec.comp QX: on integer dot products (MQX for mega.comp) */
    uint8_t teams;   /* QXT: teams of threads a workgroup, 8 rows in all (KQ_RF: RFOLD's) */
    uint8_t xm;      /* matvec.comp's XM: how a QX product's input was rounded (contract.h) */
    uint8_t mode;    /* its MODE specialisation constant (matvec.comp, mm.comp, rows.comp...);
                        mega.comp: QT, the MQX weight types it is compiled for */
    uint8_t specs;   /* which specialisation constants it takes (pipelines.c enum specs) */
    uint8_t push;    /* its push constants' layout (enum vk_push; push_test checks its SPIR-V) */
};
const struct vk_kernel_info *vk_kernel_info(enum vk_kernel k);
/* The kernel of op `op` (not on integer dot products) for weights of type dtype (DT_*), or
 * K_NONE where there is none. */
enum vk_kernel vk_kernel_for(enum vk_op op, int dtype);
/* matvec.comp's product (op VK_OP_MATVEC) or SwiGLU (VK_OP_MATVEC_SWIGLU) on integer dot
 * products for weights of type dtype, as teams (QXT) or not, of an input rounded as xm says
 * (XM 0, 1, 2); K_NONE where there is none. The device and the decode take it where
 * vk_pipeline_supported says so. */
enum vk_kernel vk_kernel_qx(enum vk_op op, int dtype, bool teams, int xm);
/* The product as teams (QXT) of weights of type dtype on an input rounded as xm says (0 or 1)
 * with the MoE router folded in (matvec.comp RFOLD, MV_RFOLD); K_NONE where there is none. */
enum vk_kernel vk_kernel_qxt_rf(int dtype, int xm);
/* Rows of W a workgroup of small-batch product kernel k (K_MMB_*, K_MMB_QX_*, K_MMBT_*) takes:
 * its grid is ceil(N / vk_mmb_rows) workgroups (numbered x + y * gx where it is 2-D): 32 for
 * mmbt.comp, mmb.comp's subgroups of ANVIL_VK_MMB_RS rows for the others. */
uint32_t vk_mmb_rows(const struct vk_device *d, enum vk_kernel k);

#define VK_PUSH_BYTES 128
/* mm_cm2.comp's tile: VK_CM2_BM tokens x VK_CM2_BN outputs, K walked VK_CM2_BK at a time, by
 * workgroups of VK_CM2_THREADS: the sizes scripts/prebuild-shaders.sh compiles it with, which
 * the device must take (want_coopmat2) */
#define VK_CM2_BM 128
#define VK_CM2_BN 128
#define VK_CM2_BK 64
#define VK_CM2_THREADS 256
/* the small tiles' side (VK_CM2_SMALL x VK_CM2_SMALL): K_MMH_CM2_S */
#define VK_CM2_SMALL 64
/* mm_cm2.comp MOE's tile: VK_CM2_MOE_BM rows of one expert x VK_CM2_BN outputs */
#define VK_CM2_MOE_BM 32
/* matvec threads per workgroup where a tuned shape does not fit the device (the float
 * kernels' shapes: ANVIL_VK_MATVEC_*, tuning.c) */
#define MATVEC_WG 128

/* A session's pipelines: the shapes its settings choose, and each kernel's pipeline as
 * specialised for them, the shared device's (vk_shared: made once for every session that
 * specialises it alike) */
struct vk_pipelines {
    VkPipelineLayout layout; /* push constants only (the shared device's) */
    /* made on first use (vk_pipeline_make): VK_NULL_HANDLE until then, so never a test of
     * whether the device takes a kernel (vk_pipeline_supported is) */
    VkPipeline p[K_COUNT];
    bool refused[K_COUNT];  /* the driver turned it down (mm_cm2.comp's: shaders/prebuilt) */
    int attn_g, attn_d; /* the attention pipeline's specialisation */
    int vit_dp; /* vit_flash.comp's: the vision heads' dimensions padded to 16 (0: none yet; the
                   first image sets it, prefill/vit.c) */
    int kv_type;          /* every pipeline's (common.glsl's KV16) */
    uint32_t attn_nsg;  /* and its subgroups per workgroup */
    uint32_t attn_lpr;  /* and its lanes a cache row (0: the shader's rule) */
    uint32_t attn_gs;   /* and the workgroups a kv head's query heads are split over */
    uint32_t attn_form; /* and its ATTN_FORM_* bits (contract.h) */
    bool attn_paged;    /* attention.comp's cache read through a block table: a batch's backend,
                           whose only decode program is paged (ATTN_SPEC_PAGED) */
    uint32_t matvec_wg, matvec_nr, matvec_nr_q;
    uint32_t matvec_nr_moe; /* the experts' kernels' rows per workgroup, 0: as the kind's */
    uint32_t moe_down_nr;   /* the plain experts' down's (moe_down_<type>: a few rows'), 0: as above */
    /* per weight kind, for tuning: ANVIL_VK_MATVEC_NR_<KIND> / _WG_<KIND> (KIND as in
     * the type's name, dtype_name: Q6_K), 0 where not set */
    uint32_t matvec_nr_kind[VK_WEIGHT_KINDS], matvec_wg_kind[VK_WEIGHT_KINDS];
    /* the integer-dot-product kernels' shapes, [vk_qx_index][MODE 0 | 1 (SwiGLU)]: tuned
     * defaults (pipelines.c), ANVIL_VK_QX_NR_<KIND>[_SWIGLU] / _WG_ / _PIPE_ (rows, threads
     * per workgroup, units per thread per iteration) */
    uint32_t qx_nr[VK_QX_KINDS][2], qx_wg[VK_QX_KINDS][2], qx_pipe[VK_QX_KINDS][2];
    /* knobs of the QXT variants (pipelines.c qxv_spec): threads a team by XM, 0 for the
     * default (ANVIL_VK_QXT_TW, _TW1 for XM 1: the down projections), rows a team of Q6_K
     * weights (ANVIL_VK_QXT_NR_Q6_K), threads a team of the SwiGLUs (ANVIL_VK_QXT_TW_SWIGLU,
     * over the others) */
    uint32_t qxt_tw[3], qxt_nr6, qxt_tw_swiglu;
    uint32_t iq4_lut; /* wlow.glsl's IQ4 lookup form (SPEC_IQ4L, ANVIL_VK_IQ4_LUT) */
    /* mega.comp: workgroups (0: no persistent step), threads per workgroup, groups of 8
     * weights a lane loads at a time, subgroups per workgroup taking attention units, rows a
     * subgroup multiplies at once, attention's lanes a row and rows a chunk; MQX: slots of 64
     * weights a lane loads at a time, the next batch's loads pipelined, lane groups (bools) */
    uint32_t mega_grid, mega_wg, mega_pf, mega_asg, mega_r, mega_lpr, mega_rpc, mega_pfq, mega_qlg;
};

/* Sets up a session's pipelines (their shapes; each pipeline is made on first use by
 * vk_pipeline_make, but mm_cm2.comp's, made here where the device takes them); attention is
 * specialised for G query heads per kv head and head dim D, and every pipeline for the
 * attention caches' type (kv_type: float16; common.glsl's KV16). The shared device's first one
 * makes its layout and loads the pipeline cache from $XDG_CACHE_HOME/anvil (or ~/.cache/anvil). */
anvil_status vk_pipelines_create(struct vk_device *d, int attn_g, int attn_d, int kv_type, struct vk_pipelines *out);
/* Whether kernel k runs on this device with these shapes (its pipeline made or still to make). */
bool vk_pipeline_supported(const struct vk_device *d, const struct vk_pipelines *p, enum vk_kernel k);
/* The small-batch product on integer dot products of T rows (2 .. 32) for weights of type
 * dtype: for Q8_0, Q4_K, Q5_K and Q6_K mmbx.comp (K_MMBX_*: of the smallest CT >= T) at up to
 * ANVIL_VK_MMBX rows, mmbt.comp's tiles (K_MMBT_*) past them and 8 rows; else mmb.comp QX
 * (K_MMB_QX_*); K_NONE where there is none or the device lacks it. Its input is
 * mmb_round.comp's (all three read the same layout). */
enum vk_kernel vk_mmb_qx(const struct vk_device *d, const struct vk_pipelines *pl, int dtype, uint32_t T);
/* Makes kernel k's pipeline p->p[k] if it is not made yet and the device takes it (else it stays
 * VK_NULL_HANDLE): before anything records a dispatch of it. */
anvil_status vk_pipeline_make(struct vk_device *d, struct vk_pipelines *p, enum vk_kernel k);
/* The session's pipelines let go of (they stay the shared device's); saves the pipeline cache
 * where pipelines were made since its last save. */
void vk_pipelines_destroy(struct vk_device *d, struct vk_pipelines *p);
/* The shared device's pipelines, layout and cache destroyed (device.c, with the device). */
void vk_shared_pipelines_destroy(struct vk_shared *sh);
/* matvec.comp's specialisation constants for kernel k, by id: SPEC_WG (workgroup size),
 * MV_SPEC_NR (rows per workgroup), MV_SPEC_MODE, MV_SPEC_PIPE (units per thread per
 * iteration); false if k is not a matvec kernel. */
bool vk_matvec_spec(const struct vk_pipelines *p, enum vk_kernel k, uint32_t vals[4]);
static inline const char *vk_kernel_name(enum vk_kernel k) { return vk_kernel_info(k)->name; }
/* attn_flash.comp's shapes: heads of a multiple of 16 dimensions up to 128, a number of query
 * heads per kv head that divides its 64 query rows */
/* attn_flash.comp's shared memory for heads of d dimensions (its hb, ph and sb: 47 KiB at 256) */
static inline uint32_t vk_flash_smem(int d) { return (uint32_t)(64 * (d + 8) * 2 + 64 * 40 * 2 + 4 * 16 * 32 * 4); }
static inline bool vk_flash_fits(int g, int d, int dmax) { return g >= 1 && 64 % g == 0 && d % 16 == 0 && d >= 16 && d <= dmax; }

/* Rows per workgroup of matvec kernel k (its specialisation: the dispatch's grid follows it). */
static inline uint32_t vk_matvec_rows(const struct vk_pipelines *p, enum vk_kernel k) {
    uint32_t v[4];
    return vk_matvec_spec(p, k, v) ? v[MV_SPEC_NR] : 1;
}

/* ---- push constants: the shaders' layouts, from their lists in shaders/push.h ---- */

PC_STRUCT(pc_matvec, PC_MATVEC); /* matvec.comp: the decode program's products, the prefill's one-row ones */
struct pc_qxt {                  /* matvec.comp QXT, where it rounds its outputs (flags & MV_ROUND) */
    struct pc_matvec m;
    PC_MATVEC_QXT(PC_C_A, PC_C_U, PC_C_F)
};
PC_STRUCT(pc_qx, PC_QX);             /* qx.comp */
PC_STRUCT(pc_embed, PC_EMBED);       /* embed.comp */
PC_STRUCT(pc_attn, PC_ATTN);         /* attention.comp */
PC_STRUCT(pc_ew, PC_EW);             /* ew.comp */
PC_STRUCT(pc_topk, PC_TOPK);         /* moe_topk.comp */
PC_STRUCT(pc_gdn, PC_GDN);           /* gdn.comp */
PC_STRUCT(pc_argmax, PC_ARGMAX);     /* argmax.comp */
PC_STRUCT(pc_sample, PC_SAMPLE);     /* sample.comp */
PC_STRUCT(pc_logprobs, PC_LOGPROBS); /* logprobs.comp */
PC_STRUCT(pc_prefetch, PC_PREFETCH); /* prefetch.comp */
PC_STRUCT(pc_mega, PC_MEGA);         /* mega.comp */
PC_STRUCT(pc_mm, PC_MM);             /* mm.comp */
PC_STRUCT(pc_mmh, PC_MMH);           /* mm_h.comp, mm_cm2.comp */
PC_STRUCT(pc_dq, PC_DQ);             /* dq.comp */
PC_STRUCT(pc_rows, PC_ROWS);         /* rows.comp */
PC_STRUCT(pc_moe_rows, PC_MOE_ROWS); /* moe_rows.comp */
PC_STRUCT(pc_attn_pf, PC_ATTN_PF);   /* attn_prefill.comp, attn_flash.comp */
PC_STRUCT(pc_attn_split, PC_ATTN_SPLIT); /* attn_split.comp */
PC_STRUCT(pc_gdnc, PC_GDNC);         /* gdn_chunk.comp */
PC_STRUCT(pc_vit, PC_VIT);           /* vit.comp */
PC_STRUCT(pc_vitmm, PC_VITMM);       /* vit_mm.comp, vit_mm_cm2.comp */
PC_STRUCT(pc_mmb, PC_MMB);           /* mmb.comp */
PC_STRUCT(pc_mmb_round, PC_MMB_ROUND); /* mmb_round.comp */
/* matvec.comp QXT's block has pc_matvec's fields, then its own */
_Static_assert(offsetof(struct pc_qxt, xq) == sizeof(struct pc_matvec), "pc_qxt: xq right after pc_matvec");
_Static_assert(sizeof(struct pc_qxt) <= VK_PUSH_BYTES && sizeof(struct pc_attn) <= VK_PUSH_BYTES &&
                   sizeof(struct pc_gdn) <= VK_PUSH_BYTES && sizeof(struct pc_mm) <= VK_PUSH_BYTES &&
                   sizeof(struct pc_mmh) <= VK_PUSH_BYTES && sizeof(struct pc_rows) <= VK_PUSH_BYTES,
               "push constants within VK_PUSH_BYTES");
/* mega.comp's word indices of the phases' fields (push.h MVW_*, ATW_*) */
#define PC_WORD(s, f, w) (offsetof(struct s, f) == 4 * (w))
_Static_assert(PC_WORD(pc_matvec, x, MVW_X) && PC_WORD(pc_matvec, normw, MVW_NORMW) && PC_WORD(pc_matvec, w0, MVW_W0) &&
                   PC_WORD(pc_matvec, w1, MVW_W1) && PC_WORD(pc_matvec, w2, MVW_W2) && PC_WORD(pc_matvec, o0, MVW_O0) &&
                   PC_WORD(pc_matvec, o1, MVW_O1) && PC_WORD(pc_matvec, o2, MVW_O2) && PC_WORD(pc_matvec, res, MVW_RES) &&
                   PC_WORD(pc_matvec, Kp8, MVW_KP8) && PC_WORD(pc_matvec, K, MVW_K) &&
                   PC_WORD(pc_matvec, rows0, MVW_ROWS0) && PC_WORD(pc_matvec, rows1, MVW_ROWS1) &&
                   PC_WORD(pc_matvec, flags, MVW_FLAGS) && PC_WORD(pc_matvec, eps, MVW_EPS),
               "push.h MVW_*: pc_matvec's words");
_Static_assert(PC_WORD(pc_attn, q, ATW_Q) && PC_WORD(pc_attn, k, ATW_K) && PC_WORD(pc_attn, v, ATW_V) &&
                   PC_WORD(pc_attn, qnorm, ATW_QNORM) && PC_WORD(pc_attn, knorm, ATW_KNORM) &&
                   PC_WORD(pc_attn, kc, ATW_KC) && PC_WORD(pc_attn, vc, ATW_VC) && PC_WORD(pc_attn, rope, ATW_ROPE) &&
                   PC_WORD(pc_attn, part, ATW_PART) && PC_WORD(pc_attn, out_, ATW_OUT) &&
                   PC_WORD(pc_attn, Hkv, ATW_HKV) && PC_WORD(pc_attn, NC, ATW_NC) &&
                   PC_WORD(pc_attn, eps, ATW_EPS) && PC_WORD(pc_attn, scale, ATW_SCALE),
               "push.h ATW_*: pc_attn's words");

/* ---- the control block (matches Ctl in shaders/common.glsl) ---- */

struct vk_ctl {
    uint32_t token, pos, stop, n_out, budget, n_feed, feed_idx, n_ctx, n_eos, eos_hit, steps;
    uint32_t fault; /* mega.comp's workgroups did not all meet (the grid was not resident) */
    uint32_t seq;  /* gdn.comp: the sequence whose slices of the states a step runs (common.glsl) */
    uint32_t hist0; /* the position of data[2 n_ctx]'s token (common.glsl) */
    uint32_t draft; /* a draft offered to the step's choice, plus 1 (0: none; sample.comp) */
    uint32_t pad4;
    uint32_t eos[16];
    /* the sampling chain's parameters (struct sampling_params), set per request */
    float s_inv_temp, s_rp, s_inv_rp, s_presence, s_frequency, s_top_p, s_min_p;
    uint32_t s_greedy, s_penalties, s_K, s_window, s_seed_lo, s_seed_hi;
    /* logprobs.comp: the top ones asked (LP_MAX_TOP at most), the records written (of the n_out
     * generated tokens), the bias list's entries */
    uint32_t lp_top, lp_done, n_bias;
    uint32_t data[]; /* [n_ctx] feed, [n_ctx] generated, [n_ctx] history (token at each position) */
};
#define CTL_STOP_BUDGET 1
#define CTL_STOP_EOS 2
#define CTL_STOP_CONTEXT 3
#define CTL_MAX_EOS 16
/* A control block's (or a batch row's record's) sampling chain from sp (decode/run.c). */
void ctl_set_sampling(volatile struct vk_ctl *c, uint32_t V, const struct sampling_params *sp);

#endif
