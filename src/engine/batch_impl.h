/*
 * engine: a batch's internals (anvil_batch_*, docs/BATCHING.md), shared by batch.c (sequences,
 * blocks, the prefix cache, a step) and batch_pipe.c (the decode rows pipelined over a layer
 * split's devices, docs/MULTIGPU.md "Pipelining").
 */
#ifndef ANVIL_BATCH_IMPL_H
#define ANVIL_BATCH_IMPL_H

#include "anvil.h"
#include "backends/backend.h"
#include "engine_impl.h"

#define BATCH_PROGRAMS 16  /* compiled programs kept (by rows, kind and use), least recently used out */
#define BATCH_SNAPSHOTS 16 /* the most recurrent-state snapshots a batch keeps (the prefix cache) */

/* One slot: a sequence, from its add to its remove. */
struct bseq {
    int id;            /* 0: the slot is free */
    bool ended;        /* stopped: runs no more, holds no blocks, waits for its remove */
    uint64_t arrival;  /* prompts prefill oldest first */
    int32_t *tokens;   /* [n_ctx + 1]: the prompt, then the generated tokens */
    int n_prompt;
    int n_known;       /* prompt + generated tokens */
    int pos;           /* tokens in the cache: the next row's position */
    int n_generated;
    anvil_generate_params gp; /* gp.stop_tokens points at stop */
    struct sampling_params sp; /* gp.sampling prepared (sampler_prepare) */
    int32_t *stop;
    int32_t *blocks;   /* its row of the block tables: [max_blocks] */
    int n_blocks;      /* blocks it holds */
    int n_checked;     /* its blocks registered (or adopted) so far, from the first */
    int n_cached;      /* prompt tokens adopted from the prefix cache */
    int promised;      /* blocks it may still take */
    bool stepped;      /* ran this step already */
    float *logits;     /* keep_logits: [V], the logits of its last choice */
    bool has_logits;
    int flight;        /* its step is in flight (batch_pipe.c): in the group of that index + 1 */
};

struct batch_program {
    struct program *p;
    int T;
    bool last_only;
    uint64_t used;
    bool busy;         /* a step submitted and not yet waited for (batch_pipe.c) */
};

#define BATCH_GROUPS 32 /* groups in flight at once, at most (twice the most a step is cut into) */
#define BATCH_GROUPS_MAX 12 /* the most a step is cut into: each in flight holds a program (of
                               BATCH_PROGRAMS: the rest for prompt chunks) */

/* A group of decoding sequences whose step runs on a program of its own, submitted (in flight)
 * or waiting to be (batch_pipe.c). */
struct batch_group {
    struct batch_program *bp;
    int B, R;               /* its sequences, its program's rows */
    int32_t *slot, *id;     /* [decode_rows(n_seq_max)]: each row's sequence (slot, id at the submit) */
    struct batch_pick *pk;  /* [decode_rows(n_seq_max)] */
    int32_t *picked;        /* [decode_rows(n_seq_max)] */
    float *out;             /* [R][V] where logits: made on first use (out_rows of them) */
    int out_rows;
    bool logits;
};

struct anvil_batch {
    anvil_model *model;
    struct backend *backend;
    int V, n_ctx, n_seq_max, kv_block, kv_blocks, max_blocks, prefill_chunk;
    bool keep_logits;
    bool pick;              /* decode rows chosen on the device where they can be */
    struct bseq *seqs;      /* [n_seq_max] */
    int32_t *tables;        /* [n_seq_max + n_snap][max_blocks] (the snapshots' rows unused) */
    int32_t *free_blocks;   /* [kv_blocks]: a stack of the pool's free blocks (not registered) */
    int n_free, promised;   /* the stack's blocks; of them and the idle ones, promised to running sequences */
    bool reuse;             /* the prefix cache is on */
    int n_idle;             /* registered blocks no sequence holds */
    int32_t *refs;          /* [kv_blocks]: sequences holding each block */
    int32_t *parent;        /* [kv_blocks]: a registered block's parent (-1: the first), else -2 */
    uint64_t *used;         /* [kv_blocks]: when an idle block was last held */
    int32_t *block_tok;     /* [kv_blocks][kv_block]: a registered block's tokens */
    bool recurrent;         /* the model has recurrent layers: chains end at snapshots */
    int kv_type;            /* the attention caches' (anvil_kv_cache) */
    int32_t snap_token;     /* anvil_batch_params.snapshot_token */
    int n_snap;             /* snapshots: the graphs' sequences n_seq_max .. n_seq_max + n_snap - 1 */
    int32_t *block_snap;    /* [kv_blocks]: the snapshot of the states at a block's end, or -1 */
    int32_t *snap_block;    /* [n_snap]: the block a snapshot belongs to, or -1 */
    uint64_t *snap_made;    /* [n_snap]: when it was made */
    int next_id;
    uint64_t clock;
    struct batch_program progs[BATCH_PROGRAMS];
    /* a step of one decoding sequence: the solo decode program over the pool (run_paged;
     * ANVIL_VK_BATCH_PAGED), compiled on the first such step; paged_ok: it may be used */
    struct program *paged;
    bool paged_ok;
    bool ahead_ok;          /* its step after may be queued ahead (ANVIL_VK_BATCH_PAGED 1, 2; not 3) */
    int64_t paged_steps;    /* steps it ran */
    int64_t sub_steps;      /* decode steps run as several programs (sub_rows) */
    int ahead_id, ahead_pos; /* the sequence whose step at ahead_pos is queued there (0: none) */
    float *out;             /* [decode_rows(n_seq_max)][V]: a run's logits */
    int32_t *row_tok, *row_seq, *row_pos; /* [max(decode_rows(n_seq_max), prefill_chunk)] */
    struct batch_pick *pk;  /* [decode_rows(n_seq_max)]: each decode row's choice on the device */
    int32_t *picked;        /* [decode_rows(n_seq_max)]: the tokens chosen there */
    int64_t device_choices; /* tokens chosen there, in all */
    void *scratch;          /* SAMPLER_SCRATCH_BYTES */
    /* the decode rows pipelined over a layer split's devices (batch_pipe.c): at most groups of
     * them (1: none); the groups in flight, oldest first (fly[n_fly], indices into grp) */
    int groups, group_min;  /* ... of at least group_min sequences each (but where all are fewer) */
    int sub_rows;           /* one device: a MoE model's decode rows in steps of at most this many (0: one) */
    int stages, group_rows; /* the split's devices (ANVIL_SPLIT_PIPE's groups where it sets them);
                               the sequences a MoE model's group aims at (0: one group a stage) */
    struct batch_group grp[BATCH_GROUPS];
    int fly[BATCH_GROUPS], n_fly;
    int64_t overlapped;     /* group steps submitted while another's was in flight */
    int64_t dropped;        /* rows whose sequence left while in flight (their tokens dropped) */
    char err[ERRMSG_LEN];
};

/* The rows of the decode program that runs B sequences: the power of two >= B. */
static inline int decode_rows(int B) {
    int R = 1;
    while (R < B) R *= 2;
    return R;
}

/* Gives q the blocks its positions below end reach (promised at its add). */
void batch_grow(anvil_batch *b, struct bseq *q, int end);
/* Registers q's blocks that its pos has filled since the last call (the prefix cache). */
void batch_check_blocks(anvil_batch *b, struct bseq *q);
/* q's next token is tok: reports it in *ev, as anvil_session_generate would. */
void batch_deliver(anvil_batch *b, struct bseq *q, int32_t tok, anvil_batch_event *ev);
/* Chooses q's next token on the host from its logits (modified: penalties) and delivers it. */
void batch_choose(anvil_batch *b, struct bseq *q, float *logits, anvil_batch_event *ev);
/* Keeps the logits q's next choice is made from, where the batch keeps them. */
void batch_keep_logits(anvil_batch *b, struct bseq *q, const float *logits);
/* Decode row q of a step done: its position advanced, its filled blocks registered, its next
 * token chosen on the host from logits (device_chose false) or the device's `picked` delivered
 * (logits, if not NULL, kept for the next choice); one event in ev[(*n_ev)++]. */
void batch_row_done(anvil_batch *b, struct bseq *q, float *logits, bool device_chose, int32_t picked,
                    anvil_batch_event *ev, int *n_ev);
/* The program for T rows (last_only: the last row's logits only), compiled on first use; one
 * whose step is in flight (busy) is neither taken nor evicted. */
anvil_status batch_program_for(anvil_batch *b, int T, bool last_only, struct batch_program **out);

/* ---- batch_pipe.c ---- */

/* The groups a batch's decoding sequences may be cut into on b's backend (its stages, within
 * ANVIL_SPLIT_PIPE): 1 where nothing is pipelined. */
int batch_pipe_groups(const anvil_batch *b, int split_pipe);
/* The sequences a MoE model's group aims at: 8 (its steps of at most 15 rows keep each row's
 * experts on the decode's kernels; over 15 they take the prefill's grouped experts, slower per
 * row: §93 run 2). A dense model's groups are one a device (more, smaller groups lost there). */
#define BATCH_GROUP_ROWS 8
/* The fewest sequences in a group: 2 (a group of one runs a one-row program, far slower per
 * row than a larger one's), 1 where ANVIL_SPLIT_PIPE sets the groups (tests, measuring). */
static inline int batch_pipe_group_min(int split_pipe) { return split_pipe > 1 ? 1 : 2; }
/* The pipelined decode: one token for every decoding sequence not stepped yet (their groups'
 * steps submitted, each waited for in turn; all but the last group's next steps submitted
 * again before returning), events appended at ev[*n_ev]. */
anvil_status batch_pipe_step(anvil_batch *b, anvil_batch_event *ev, int *n_ev);
/* Frees the groups' buffers (their steps waited for by the programs' destroy). */
void batch_pipe_free(anvil_batch *b);

#endif
