/*
 * tuning: every environment variable anvil reads, in one table (tuning.c): its name, type,
 * default, range, a line of documentation and its class. The variables are parsed once, when a
 * session, backend or device is made (tuning_read), into a struct tuning that the code reads
 * afterwards; nothing else calls getenv (but the logging setup, base.c, for ANVIL_LOG).
 * docs/TUNING.md is generated from the table (`anvil tuning --markdown`; tuning_test fails
 * when the committed file is stale).
 *
 * Classes: user (what a user may set; the same settings are API parameters and CLI flags
 * where they have them), diagnostic (tests, CI, debugging: validation, fault injection,
 * profiles), experiment (kernel shapes and switches kept for measuring on other GPUs; their
 * defaults are the measured best, docs/perf).
 *
 * Per-type knobs: a name with "<T>" stands for one variable per suffix (ANVIL_VK_QX_NR_<T>:
 * ANVIL_VK_QX_NR_Q4_K, ANVIL_VK_QX_NR_Q4_K_SWIGLU, ...), parsed into an array in the
 * suffixes' order.
 *
 * The abbreviations in the knobs' names (QX, QXR, QXT, MQX, MEGA, NR, WG, PIPE, NSG, LPR, RPC,
 * GS, PF, CM2, MMH, DQ...) are explained where the shaders' contract is defined:
 * src/backends/vulkan/shaders/contract.h.
 */
#ifndef ANVIL_TUNING_H
#define ANVIL_TUNING_H

#include <stdint.h>
#include <stdio.h>

#include "base/base.h"

/* The suffixes of the per-type knobs, in their arrays' order */
enum { TUNE_QX_KINDS = 30 };     /* Q8_0, Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, the i-quants, then the same _SWIGLU (vk_qx_index order) */
enum { TUNE_WEIGHT_KINDS = 22 }; /* F32 .. Q6_K, Q2_K, Q3_K, the i-quants (vk_weight_kind order) */

/* Where a knob is unset its field holds the default; -1 (or 0 where the doc says so) means
 * "the code's own rule" where a knob has no fixed default. */
struct tuning {
    /* user */
    int kv_cache;            /* ANVIL_KV_CACHE: 0 f16, 1 f32, 2 q8_0 */
    int prefill_chunk;       /* ANVIL_PREFILL_CHUNK */
    int device;              /* ANVIL_DEVICE (-1: the best) */
    double vk_timeout;       /* ANVIL_VK_TIMEOUT, seconds */
    uint64_t vk_max_memory;  /* ANVIL_VK_MAX_MEMORY, bytes (0: no cap) */
    char api_key[512];       /* ANVIL_API_KEY ("" unset) */
    /* diagnostic */
    int validate;            /* ANVIL_VALIDATE */
    char vk_fault[64];       /* ANVIL_VK_FAULT ("" unset) */
    int vk_profile;          /* ANVIL_VK_PROFILE */
    int vk_pipeline_stats;   /* ANVIL_VK_PIPELINE_STATS */
    int vk_mega_clock;       /* ANVIL_VK_MEGA_CLOCK */
    int vk_qx;               /* ANVIL_VK_QX: -1 auto, 0 off, 1 on */
    int cpu_qx;              /* ANVIL_CPU_QX */
    int cpu_gdn_chunk;       /* ANVIL_CPU_GDN_CHUNK (0: the recurrent form) */
    int cpu_isa;             /* ANVIL_CPU_ISA: 0 best, 1 AVX2 at most, 2 plain C */
    int vk_gdn_chunk;        /* ANVIL_VK_GDN_CHUNK: 1 the chunked form in prefill, 0 the recurrent */
    int vk_coopmat;          /* ANVIL_VK_COOPMAT */
    int vk_cm2;              /* ANVIL_VK_CM2 */
    int vk_cm2_decode;       /* ANVIL_VK_CM2_DECODE */
    int vk_cm2_float;        /* ANVIL_VK_CM2_FLOAT */
    int vk_cm2_small;        /* ANVIL_VK_CM2_SMALL */
    int vk_moe_decode;       /* ANVIL_VK_MOE_DECODE */
    int vk_moe_mmq;          /* ANVIL_VK_MOE_MMQ */
    int vk_mmqb;             /* ANVIL_VK_MMQB */
    int vk_mmq_x8;           /* ANVIL_VK_MMQ_X8 */
    int vk_mmq_skip;         /* ANVIL_VK_MMQ_SKIP */
    int vk_mmq_wg;           /* ANVIL_VK_MMQ_WG */
    int vk_moe_gu;           /* ANVIL_VK_MOE_GU */
    int vk_mm_beside;        /* ANVIL_VK_MM_BESIDE */
    int vk_mm_split;         /* ANVIL_VK_MM_SPLIT */
    int vk_moe_rsum;         /* ANVIL_VK_MOE_RSUM */
    int vk_dq_emulate;       /* ANVIL_VK_DQ_EMULATE */
    int vk_f16_scale;        /* ANVIL_VK_F16_SCALE */
    int vk_mega;             /* ANVIL_VK_MEGA: -1 auto, 0 off, 1 on */
    int vk_mega_qx;          /* ANVIL_VK_MEGA_QX: -1 auto, 0 never, 1 always */
    double vk_qx_min_mb;     /* ANVIL_VK_QX_MIN_MB */
    double vk_mqx_max_mb;    /* ANVIL_VK_MQX_MAX_MB */
    double vk_prefetch_mb;   /* ANVIL_VK_PREFETCH_MB (-1: 16 on discrete NVIDIA GPUs, else 0) */
    int vk_overlap;          /* ANVIL_VK_OVERLAP */
    int vk_pace;             /* ANVIL_VK_PACE */
    int vk_attn_chunks;      /* ANVIL_VK_ATTN_CHUNKS */
    int vk_flash;            /* ANVIL_VK_FLASH */
    int vk_vit_flash;        /* ANVIL_VK_VIT_FLASH: 0 off, 1 two passes, 2 one, 4-6 products, 7-9 (8 default) flash on cm2 */
    int vk_vit_scores_mb;    /* ANVIL_VK_VIT_SCORES_MB */
    int vk_vit_mm;           /* ANVIL_VK_VIT_MM: 1 O on 80-column tiles, 2 S's whole tiles unclamped */
    int vk_pf_group;         /* ANVIL_VK_PF_GROUP */
    int vk_pf_hoist;         /* ANVIL_VK_PF_HOIST */
    int vk_mmb;              /* ANVIL_VK_MMB */
    int vk_mmb_rs;           /* ANVIL_VK_MMB_RS */
    int vk_mmbq_rows;        /* ANVIL_VK_MMBQ_ROWS */
    int vk_mmbx;             /* ANVIL_VK_MMBX */
    int vk_mmbx_rs;          /* ANVIL_VK_MMBX_RS */
    int vk_mmbx_ch;          /* ANVIL_VK_MMBX_CH */
    int vk_mmbx_wg;          /* ANVIL_VK_MMBX_WG */
    int vk_mmb_beside;       /* ANVIL_VK_MMB_BESIDE */
    int vk_few_attn;         /* ANVIL_VK_FEW_ATTN */
    int vk_mmb_fuse;         /* ANVIL_VK_MMB_FUSE */
    int vk_batch_mmb;        /* ANVIL_VK_BATCH_MMB */
    int vk_batch_pick;       /* ANVIL_VK_BATCH_PICK */
    int vk_batch_paged;      /* ANVIL_VK_BATCH_PAGED */
    int vk_spec_pick;        /* ANVIL_VK_SPEC_PICK */
    int vk_states_wait;      /* ANVIL_VK_STATES_WAIT */
    int vk_few_round;        /* ANVIL_VK_FEW_ROUND */
    int vk_batch_attn;       /* ANVIL_VK_BATCH_ATTN */
    int vk_moe_cm2;          /* ANVIL_VK_MOE_CM2 */
    int vk_moe_few;          /* ANVIL_VK_MOE_FEW */
    int vk_moe_pairs;        /* ANVIL_VK_MOE_PAIRS */
    int vk_route_fuse;       /* ANVIL_VK_ROUTE_FUSE */
    int vk_route_fold;       /* ANVIL_VK_ROUTE_FOLD */
    int vk_moe_pick;         /* ANVIL_VK_MOE_PICK */
    int vk_moe_down_nr;      /* ANVIL_VK_MOE_DOWN_NR */
    int vk_moe_qx;           /* ANVIL_VK_MOE_QX */
    int vk_moe_dqx;          /* ANVIL_VK_MOE_DQX */
    int vk_gdn_qx;           /* ANVIL_VK_GDN_QX */
    int vk_gdn_split;        /* ANVIL_VK_GDN_SPLIT */
    int vk_attn_gate;        /* ANVIL_VK_ATTN_GATE */
    int vk_qxr;              /* ANVIL_VK_QXR */
    int vk_qxt_all;          /* ANVIL_VK_QXT_ALL */
    int vk_batch;            /* ANVIL_VK_BATCH */
    int split_form;          /* ANVIL_SPLIT_FORM */
    int split_pipe;          /* ANVIL_SPLIT_PIPE */
    int batch_moe_rows;      /* ANVIL_BATCH_MOE_ROWS */
    /* experiment */
    int vk_dq_max_mb;        /* ANVIL_VK_DQ_MAX_MB */
    int vk_matvec_wg;        /* ANVIL_VK_MATVEC_WG */
    int vk_matvec_nr;        /* ANVIL_VK_MATVEC_NR */
    int vk_matvec_nr_q;      /* ANVIL_VK_MATVEC_NR_Q */
    int vk_matvec_nr_moe;    /* ANVIL_VK_MATVEC_NR_MOE (0: the kind's) */
    int vk_matvec_nr_kind[TUNE_WEIGHT_KINDS]; /* ANVIL_VK_MATVEC_NR_<T> (0: unset) */
    int vk_matvec_wg_kind[TUNE_WEIGHT_KINDS]; /* ANVIL_VK_MATVEC_WG_<T> (0: unset) */
    int vk_qx_nr[TUNE_QX_KINDS];   /* ANVIL_VK_QX_NR_<T> (0: the tuned shape) */
    int vk_qx_wg[TUNE_QX_KINDS];   /* ANVIL_VK_QX_WG_<T> (0: the tuned shape) */
    int vk_qx_pipe[TUNE_QX_KINDS]; /* ANVIL_VK_QX_PIPE_<T> (0: the tuned shape) */
    int vk_qxt_tw;           /* ANVIL_VK_QXT_TW (0: the rule) */
    int vk_qxt_tw1;          /* ANVIL_VK_QXT_TW1 (0: ANVIL_VK_QXT_TW's) */
    int vk_qxt_nr_q6_k;      /* ANVIL_VK_QXT_NR_Q6_K (0: 2) */
    int vk_qxt_tw_swiglu;    /* ANVIL_VK_QXT_TW_SWIGLU (0: the rule) */
    int vk_iq4_lut;          /* ANVIL_VK_IQ4_LUT */
    int vk_attn_nsg;         /* ANVIL_VK_ATTN_NSG */
    int vk_attn_lpr;         /* ANVIL_VK_ATTN_LPR (0: the shader's rule) */
    int vk_attn_gs;          /* ANVIL_VK_ATTN_GS (0: the rule) */
    int vk_attn_two;         /* ANVIL_VK_ATTN_TWO */
    int vk_attn_whole;       /* ANVIL_VK_ATTN_WHOLE */
    int vk_attn_wmerge;      /* ANVIL_VK_ATTN_WMERGE */
    int vk_attn_comb;        /* ANVIL_VK_ATTN_COMB */
    int vk_attn_tree;        /* ANVIL_VK_ATTN_TREE */
    int vk_mega_grid;        /* ANVIL_VK_MEGA_GRID (0: the SM count) */
    int vk_mega_wg;          /* ANVIL_VK_MEGA_WG (0: 256) */
    int vk_mega_r;           /* ANVIL_VK_MEGA_R */
    int vk_mega_lpr;         /* ANVIL_VK_MEGA_LPR */
    int vk_mega_rpc;         /* ANVIL_VK_MEGA_RPC */
    int vk_mega_pf;          /* ANVIL_VK_MEGA_PF */
    int vk_mega_pfq;         /* ANVIL_VK_MEGA_PFQ */
    int vk_mega_qlg;         /* ANVIL_VK_MEGA_QLG */
    int vk_mega_attn;        /* ANVIL_VK_MEGA_ATTN */
    int vk_mega_skip;        /* ANVIL_VK_MEGA_SKIP */
    int vk_prefetch_wg;      /* ANVIL_VK_PREFETCH_WG (0: the rule) */
};

/* The table's defaults, then every variable set in the environment. A malformed or
 * out-of-range value is an error naming the variable (t then holds the default for it). */
anvil_status tuning_read(struct tuning *t);
/* The defaults alone (no environment). */
void tuning_defaults(struct tuning *t);

/* The table as docs/TUNING.md (markdown), or (markdown false) as a plain list with each
 * variable's value in the environment now. */
void tuning_write(FILE *f, bool markdown);

/* "123", "512M", "8G", "1.5G" (K, M, G, T: powers of 1024) -> bytes; false if malformed. */
bool tuning_parse_size(const char *s, uint64_t *out);

/* The user's cache directory for anvil: $XDG_CACHE_HOME/anvil, else $HOME/.cache/anvil,
 * into out (cap bytes); false where neither is set or it does not fit. */
bool tuning_cache_dir(char *out, size_t cap);

#endif
