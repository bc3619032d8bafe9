/*
 * engine: many sequences at once (anvil_batch_*, docs/BATCHING.md). The batch owns a backend
 * whose states hold n_seq_max sequences: the attention caches are a pool of blocks of kv_block
 * rows, each sequence's block table maps its positions to them; a hybrid's conv and recurrent
 * states have a slice per sequence. A step runs prompt chunks (one sequence each, through a
 * prefill program of that many rows), then one decode program over every sequence past its
 * prompt, a row each, and chooses each row's next token with the sequence's own sampling chain
 * (sampler.h), exactly as anvil_session_generate does for one sequence: on the host from the
 * row's logits, or, where the backend can (run_batch_pick; ANVIL_VK_BATCH_PICK), on the device,
 * only the chosen ids coming back. A prompt's first token is always chosen on the host (from
 * its last chunk's logits, checked finite there: broken weights are caught before any choice
 * on the device).
 *
 * Block accounting: a sequence is admitted only when the pool's free blocks, less those promised
 * to the running sequences, hold its prompt and its budget (within the context); blocks are then
 * taken as it grows and all returned when it ends, so no running sequence finds the pool empty.
 *
 * Prefix cache: a block whose rows are all in the cache (positions below its sequence's pos) is
 * registered under its parent (the sequence's block before it, itself registered) and its
 * tokens, which name it exactly: two blocks with the same chain of parents and tokens hold the
 * same keys and values. A sequence whose prompt is at a block boundary adopts (refs + 1) the
 * registered block that continues it, instead of prefilling those rows; it never writes an
 * adopted block (it adopts whole blocks only, and never the one holding its prompt's last
 * token, whose logits it needs). A block no sequence holds stays registered (idle: counted
 * free for admissions) until grow needs it, least recently used first; unregistering a block
 * unregisters its descendants, whose parent's index would otherwise name other tokens.
 *
 * On a model with recurrent layers a block does not hold the state after its rows: there the
 * batch's graphs hold n_snap more sequences' state slices, snapshots. A prompt's chunks stop at
 * its last block boundary before its last token (and at those at or before each of its
 * snapshot tokens), and the states there are copied into a snapshot (backend states_copy)
 * attached to the block ending there; a later prompt adopts a chain only up to a block with a
 * snapshot, whose states it copies into its own slices. A snapshot goes with its block, or,
 * when all are taken, the least recently made or used goes first.
 */
#include <assert.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "anvil.h"
#include "base/tuning.h"
#include "batch_impl.h"
#include "engine_impl.h"
#include "sampler.h"

static anvil_status keep(anvil_batch *b, anvil_status st) {
    if (st != ANVIL_OK && b) snprintf(b->err, ERRMSG_LEN, "%s", err_get());
    return st;
}

anvil_batch_params anvil_batch_default_params(void) {
    anvil_batch_params p;
    memset(&p, 0, sizeof p);
    p.session = anvil_session_default_params();
    p.kv_block = 64;
    p.snapshot_token = -1;
    return p;
}

const char *anvil_batch_errmsg(const anvil_batch *b) { return b ? b->err : anvil_last_error(); }

void anvil_batch_destroy(anvil_batch *b) {
    if (!b) return;
    for (int i = 0; i < BATCH_PROGRAMS; i++)
        if (b->progs[i].p) b->backend->vt->program_destroy(b->progs[i].p);
    if (b->paged) b->backend->vt->program_destroy(b->paged);
    backend_destroy(b->backend);
    batch_pipe_free(b);
    for (int i = 0; b->seqs && i < b->n_seq_max; i++) {
        free(b->seqs[i].tokens);
        free(b->seqs[i].stop);
        free(b->seqs[i].logits);
    }
    free(b->seqs);
    free(b->tables);
    free(b->free_blocks);
    free(b->refs);
    free(b->parent);
    free(b->used);
    free(b->block_tok);
    free(b->block_snap);
    free(b->snap_block);
    free(b->snap_made);
    free(b->out);
    free(b->row_tok);
    free(b->row_seq);
    free(b->row_pos);
    free(b->pk);
    free(b->picked);
    free(b->scratch);
    free(b);
}

/* The pool's blocks where the caller gave none: n_seq_max whole contexts, fewer where the
 * device's free memory (less the weights still to upload, the states that are not blocks, and
 * an eighth for the programs' activations and scratch) holds fewer; at least one context
 * (which may then not fit: its allocation fails, saying so). */
static int pool_blocks(anvil_batch *b) {
    int whole = b->n_seq_max * b->max_blocks;
    if (!b->backend->vt->free_bytes) return whole;
    struct build_opts o = {1, b->max_blocks * b->kv_block, true, b->n_seq_max + b->n_snap, b->kv_block,
                           false, false, false, false, 0};
    struct graph g1, g2;
    if (model_build_graph(&b->model->model, &o, &g1) != ANVIL_OK) return whole;
    o.n_ctx = 2 * b->max_blocks * b->kv_block;
    if (model_build_graph(&b->model->model, &o, &g2) != ANVIL_OK) {
        graph_free(&g1);
        return whole;
    }
    uint64_t room = b->backend->vt->free_bytes(b->backend, &g1), w, s1, s2;
    graph_bytes(&g1, b->kv_type, &w, &s1);
    graph_bytes(&g2, b->kv_type, &w, &s2);
    graph_free(&g1);
    graph_free(&g2);
    uint64_t per_block = (s2 - s1) / (uint64_t)b->max_blocks, fixed = s1 - per_block * (uint64_t)b->max_blocks;
    uint64_t reserve = fixed + room / 8;
    if (!room || !per_block) return whole;
    uint64_t fit = room > reserve ? (room - reserve) / per_block : 0;
    int n = (int)MIN(fit, (uint64_t)whole);
    n = MAX(n, b->max_blocks);
    char rb[32];
    log_info("batch: a pool of %d blocks of %d rows (%.1f contexts of %d tokens; %d asked) in %s of free "
             "device memory", n, b->kv_block, (double)n / b->max_blocks, b->n_ctx, b->n_seq_max,
             fmt_bytes(rb, room));
    return n;
}

anvil_status anvil_batch_create(anvil_model *model, const anvil_batch_params *params,
                                anvil_batch **out) {
    if (!model || !out) return err_set(ANVIL_ERR_INVALID_ARG, "anvil_batch_create: NULL argument");
    *out = NULL;
    anvil_batch_params p = params ? *params : anvil_batch_default_params();
    const struct hparams *hp = &model->file->hp;
    struct tuning t;
    anvil_status st = tuning_read(&t);
    if (st != ANVIL_OK) return st;
    if (p.session.n_ctx < 0 || p.n_seq_max < 0 || p.kv_block < 0 || p.kv_blocks < 0 ||
        p.session.prefill_chunk < 0 || p.n_seq_max > 1024)
        return err_set(ANVIL_ERR_INVALID_ARG, "bad batch parameters: context %d, %d sequences, "
                       "blocks of %d rows, %d blocks, prefill chunk %d", p.session.n_ctx, p.n_seq_max,
                       p.kv_block, p.kv_blocks, p.session.prefill_chunk);
    if (p.session.backend != ANVIL_BACKEND_AUTO && p.session.backend != ANVIL_BACKEND_CPU &&
        p.session.backend != ANVIL_BACKEND_VULKAN)
        return err_set(ANVIL_ERR_INVALID_ARG, "unknown backend %d", (int)p.session.backend);
    int kv_type;
    if ((st = kv_cache_type(p.session.kv_cache, &t, &kv_type)) != ANVIL_OK) return st;
    anvil_batch *b = xcalloc(1, sizeof *b);
    if (!b) return ANVIL_ERR_NOMEM;
    b->model = model;
    b->kv_type = kv_type;
    b->V = hp->n_vocab;
    b->n_ctx = p.session.n_ctx ? p.session.n_ctx : default_n_ctx(hp);
    b->n_seq_max = p.n_seq_max ? p.n_seq_max : 4;
    b->kv_block = p.kv_block ? p.kv_block : 64;
    b->max_blocks = (b->n_ctx + b->kv_block - 1) / b->kv_block;
    b->prefill_chunk = p.session.prefill_chunk ? p.session.prefill_chunk : t.prefill_chunk;
    if (p.session.cpu_moe && !p.session.prefill_chunk) b->prefill_chunk = MIN(b->prefill_chunk, CPU_MOE_CHUNK);
    b->keep_logits = p.keep_logits != 0;
    if (p.kv_blocks && p.kv_blocks < b->max_blocks) {
        st = err_set(ANVIL_ERR_INVALID_ARG, "a pool of %d blocks of %d rows cannot hold one context of %d",
                     p.kv_blocks, b->kv_block, b->n_ctx);
        anvil_batch_destroy(b);
        return st;
    }
    int threads = p.session.n_threads ? p.session.n_threads : model->n_threads;
    p.session.n_threads = threads; /* (the CPU experts' threads, --cpu-moe) */
    if (p.session.cpu_moe && hp->n_expert <= 0)
        st = err_set(ANVIL_ERR_INVALID_ARG, "--cpu-moe: %s has no experts (not a mixture-of-experts model)",
                     model->file->path);
    /* the backend as a session chooses it: auto is Vulkan where there is a GPU (or the device
     * named), else the CPU */
    bool vk = p.session.backend == ANVIL_BACKEND_VULKAN ||
              (p.session.backend == ANVIL_BACKEND_AUTO && backend_vulkan_available(NULL, 0) &&
               (backend_vulkan_gpu_available() || p.session.device >= 0 || p.session.n_devices > 0 || t.device >= 0));
    if (!vk && p.session.n_devices > 0)
        st = err_set(ANVIL_ERR_INVALID_ARG, "--devices: a split runs on Vulkan devices, not the CPU backend");
    char why[256];
    if (st == ANVIL_OK && vk && !backend_vulkan_available(why, sizeof why))
        st = err_set(ANVIL_ERR_UNSUPPORTED, "--backend vulkan: %s", why);
    else if (st == ANVIL_OK && vk)
        st = session_vulkan_backend(&p.session, kv_type, model->file->hp.n_layer, &b->backend);
    else if (st == ANVIL_OK && !vk)
        st = backend_cpu_create(threads, kv_type, &b->backend);
    if (st != ANVIL_OK) {
        snprintf(model->err, ERRMSG_LEN, "%s", err_get());
        anvil_batch_destroy(b);
        return st;
    }
    b->pick = t.vk_batch_pick && b->backend->vt->run_batch_pick;
    b->paged_ok = b->pick && t.vk_batch_paged && b->backend->vt->run_paged && b->kv_block >= 2 &&
                  !(b->kv_block & (b->kv_block - 1));
    b->ahead_ok = t.vk_batch_paged != 3;
    b->groups = batch_pipe_groups(b, t.split_pipe);
    b->group_min = batch_pipe_group_min(t.split_pipe);
    b->stages = b->backend->vt->stages ? b->backend->vt->stages(b->backend) : 1;
    if (t.split_pipe > 1) b->stages = b->groups; /* (the groups ANVIL_SPLIT_PIPE sets) */
    /* a MoE model's groups of about 8 (§93 run 2, 30B-A3B at 32 sequences: 4 groups 1,670 t/s, 2
     * groups of 16 1,398); a dense model's one a device (8B: 2 groups 3,185, 4 of 8 2,796) */
    b->group_rows = t.split_pipe <= 1 && hp->n_expert > 0 ? BATCH_GROUP_ROWS : 0;
    b->sub_rows = b->groups <= 1 && hp->n_expert > 0 ? t.batch_moe_rows : 0;
    for (int l = 0; l < hp->n_layer; l++)
        if (hp->layer_recurrent[l]) b->recurrent = true;
    /* a recurrent model's prefix cache needs its states' snapshots (states_copy) */
    b->reuse = !p.no_prefix_cache && (!b->recurrent || b->backend->vt->states_copy);
    /* two a sequence, at most 16 (the 35B-A3B's states are ~63 MB a sequence) */
    b->n_snap = b->reuse && b->recurrent ? MIN(2 * b->n_seq_max, BATCH_SNAPSHOTS) : 0;
    b->snap_token = p.snapshot_token;
    b->kv_blocks = p.kv_blocks ? p.kv_blocks : pool_blocks(b);
    int rows = MAX(decode_rows(b->n_seq_max), b->prefill_chunk);
    b->seqs = xcalloc((size_t)b->n_seq_max, sizeof *b->seqs);
    b->tables = xcalloc((size_t)(b->n_seq_max + b->n_snap) * (size_t)b->max_blocks, sizeof *b->tables);
    b->block_snap = xmalloc((size_t)b->kv_blocks * sizeof *b->block_snap);
    b->snap_block = xmalloc((size_t)MAX(b->n_snap, 1) * sizeof *b->snap_block);
    b->snap_made = xcalloc((size_t)MAX(b->n_snap, 1), sizeof *b->snap_made);
    b->free_blocks = xmalloc((size_t)b->kv_blocks * sizeof *b->free_blocks);
    b->refs = xcalloc((size_t)b->kv_blocks, sizeof *b->refs);
    b->parent = xmalloc((size_t)b->kv_blocks * sizeof *b->parent);
    b->used = xcalloc((size_t)b->kv_blocks, sizeof *b->used);
    b->block_tok = xmalloc((size_t)b->kv_blocks * (size_t)b->kv_block * sizeof *b->block_tok);
    b->out = xmalloc((size_t)decode_rows(b->n_seq_max) * (size_t)b->V * sizeof *b->out);
    b->row_tok = xmalloc((size_t)rows * sizeof *b->row_tok);
    b->row_seq = xmalloc((size_t)rows * sizeof *b->row_seq);
    b->row_pos = xmalloc((size_t)rows * sizeof *b->row_pos);
    b->pk = xcalloc((size_t)decode_rows(b->n_seq_max), sizeof *b->pk);
    b->picked = xmalloc((size_t)decode_rows(b->n_seq_max) * sizeof *b->picked);
    b->scratch = xmalloc(SAMPLER_SCRATCH_BYTES);
    st = b->seqs && b->tables && b->free_blocks && b->refs && b->parent && b->used && b->block_tok &&
                 b->block_snap && b->snap_block && b->snap_made && b->out && b->row_tok && b->row_seq &&
                 b->row_pos && b->pk && b->picked && b->scratch ? ANVIL_OK : ANVIL_ERR_NOMEM;
    for (int i = 0; i < b->n_seq_max && st == ANVIL_OK; i++) {
        struct bseq *q = &b->seqs[i];
        q->blocks = b->tables + (size_t)i * (size_t)b->max_blocks;
        q->tokens = xmalloc(((size_t)b->n_ctx + 1) * sizeof *q->tokens);
        if (b->keep_logits) q->logits = xmalloc((size_t)b->V * sizeof *q->logits);
        if (!q->tokens || (b->keep_logits && !q->logits)) st = ANVIL_ERR_NOMEM;
    }
    if (st != ANVIL_OK) {
        anvil_batch_destroy(b);
        return st;
    }
    for (int i = 0; i < b->kv_blocks; i++) {
        b->free_blocks[i] = b->kv_blocks - 1 - i;
        b->parent[i] = -2;
        b->block_snap[i] = -1;
    }
    for (int i = 0; i < b->n_snap; i++) b->snap_block[i] = -1;
    b->n_free = b->kv_blocks;
    b->next_id = 1;
    *out = b;
    return ANVIL_OK;
}

static struct bseq *find(const anvil_batch *b, int id) {
    for (int i = 0; id > 0 && i < b->n_seq_max; i++)
        if (b->seqs[i].id == id) return &b->seqs[i];
    return NULL;
}

const char *anvil_batch_backend_name(const anvil_batch *b) { return b->backend->vt->name; }

int anvil_batch_active(const anvil_batch *b) {
    int n = 0;
    for (int i = 0; i < b->n_seq_max; i++) n += b->seqs[i].id && !b->seqs[i].ended;
    return n;
}

int anvil_batch_kv_blocks(const anvil_batch *b, int *total) {
    if (total) *total = b->kv_blocks;
    return b->kv_blocks - b->n_free - b->n_idle;
}

int anvil_batch_kv_cached_blocks(const anvil_batch *b) { return b->n_idle; }

int anvil_batch_cached_tokens(const anvil_batch *b, int id) {
    const struct bseq *q = b ? find(b, id) : NULL;
    return q ? q->n_cached : -1;
}

/* The blocks a sequence of n_prompt and max_tokens is promised at its add. */
static int blocks_needed(const anvil_batch *b, int n_prompt, int max_tokens) {
    int64_t rows = MIN((int64_t)n_prompt + max_tokens, (int64_t)b->n_ctx);
    return (int)((rows + b->kv_block - 1) / b->kv_block);
}

int anvil_batch_fits(const anvil_batch *b, int n_prompt, int max_tokens) {
    if (!b || n_prompt < 1 || max_tokens < 1) return 0;
    bool slot = false;
    for (int i = 0; i < b->n_seq_max && !slot; i++) slot = !b->seqs[i].id;
    return slot && blocks_needed(b, n_prompt, max_tokens) <= b->n_free + b->n_idle - b->promised;
}

anvil_status anvil_batch_add(anvil_batch *b, const int32_t *prompt, int n_prompt,
                             const anvil_generate_params *gp, int *id) {
    if (!b || !prompt || n_prompt < 1 || !gp || !id || gp->max_tokens <= 0 ||
        gp->n_stop_tokens < 0 || (gp->n_stop_tokens > 0 && !gp->stop_tokens))
        return keep(b, err_set(ANVIL_ERR_INVALID_ARG, "anvil_batch_add: bad arguments"));
    if (gp->on_logits)
        return keep(b, err_set(ANVIL_ERR_UNSUPPORTED, "anvil_batch_add: no logits hook in a batch "
                               "(anvil_batch_logits reads them after a step)"));
    if (gp->spec && gp->spec->kind != ANVIL_SPEC_NONE)
        return keep(b, err_set(ANVIL_ERR_UNSUPPORTED, "anvil_batch_add: no speculative decoding "
                               "in a batch (a session runs it)"));
    if (gp->logit && (gp->logit->n_bias > 0 || gp->logit->on_logprobs))
        return keep(b, err_set(ANVIL_ERR_UNSUPPORTED, "anvil_batch_add: no logit bias or logprobs "
                               "in a batch (a session runs them)"));
    *id = 0;
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= b->V)
            return keep(b, err_set(ANVIL_ERR_RANGE, "token id %d out of range 0..%d", prompt[i], b->V - 1));
    if (n_prompt > b->n_ctx)
        return keep(b, err_set(ANVIL_ERR_RANGE, "a prompt of %d tokens is longer than the context (%d)",
                               n_prompt, b->n_ctx));
    struct bseq *q = NULL;
    for (int i = 0; i < b->n_seq_max && !q; i++)
        if (!b->seqs[i].id) q = &b->seqs[i];
    if (!q) return keep(b, err_set(ANVIL_ERR_RANGE, "the batch is full: %d sequences", b->n_seq_max));
    int need = blocks_needed(b, n_prompt, gp->max_tokens);
    if (need > b->n_free + b->n_idle - b->promised)
        return keep(b, err_set(ANVIL_ERR_RANGE, "the batch is full: %d cache blocks needed, %d free",
                               need, b->n_free + b->n_idle - b->promised));
    int32_t *stop = NULL;
    if (gp->n_stop_tokens > 0) {
        if (!(stop = xmalloc((size_t)gp->n_stop_tokens * sizeof *stop))) return keep(b, ANVIL_ERR_NOMEM);
        memcpy(stop, gp->stop_tokens, (size_t)gp->n_stop_tokens * sizeof *stop);
    }
    free(q->stop);
    q->stop = stop;
    q->gp = *gp;
    q->gp.stop_tokens = stop;
    sampler_prepare(&gp->sampling, b->V, &q->sp);
    memcpy(q->tokens, prompt, (size_t)n_prompt * sizeof *prompt);
    q->n_prompt = q->n_known = n_prompt;
    q->pos = q->n_generated = q->n_blocks = q->n_checked = q->n_cached = 0;
    q->promised = need;
    b->promised += need;
    q->ended = q->has_logits = q->stepped = false;
    q->flight = 0;
    q->arrival = ++b->clock;
    q->id = *id = b->next_id++;
    if (b->next_id <= 0) b->next_id = 1; /* after 2^31 adds: ids are unique among the live ones */
    return ANVIL_OK;
}

/* Lets go of block k: free, or idle where registered (the later blocks of a sequence are let go
 * first, so they are older: a chain is evicted from its end). */
static void release(anvil_batch *b, int32_t k) {
    if (--b->refs[k] > 0) return;
    if (b->parent[k] == -2) {
        b->free_blocks[b->n_free++] = k;
    } else {
        b->n_idle++;
        b->used[k] = ++b->clock;
    }
}

/* Unregisters block k and every block registered under it; the idle ones become free. */
static void unregister(anvil_batch *b, int32_t k) {
    b->parent[k] = -2;
    if (b->block_snap[k] >= 0) b->snap_block[b->block_snap[k]] = -1;
    b->block_snap[k] = -1;
    if (b->refs[k] == 0) {
        b->n_idle--;
        b->free_blocks[b->n_free++] = k;
    }
    for (int32_t c = 0; c < b->kv_blocks; c++)
        if (b->parent[c] == k) unregister(b, c);
}

/* A free block for a sequence to write: from the free stack, else the least recently used idle
 * block (unregistered with its descendants). The promises guarantee one exists. */
static int32_t take_block(anvil_batch *b) {
    if (b->n_free == 0) { /* only idle blocks are left */
        int32_t lru = -1;
        for (int32_t k = 0; k < b->kv_blocks; k++)
            if (b->refs[k] == 0 && b->parent[k] != -2 && (lru < 0 || b->used[k] < b->used[lru])) lru = k;
        unregister(b, lru);
    }
    return b->free_blocks[--b->n_free];
}

/* Returns q's blocks to the pool and its promise; it runs no more. */
static void end_seq(anvil_batch *b, struct bseq *q) {
    for (int i = q->n_blocks - 1; i >= 0; i--) release(b, q->blocks[i]);
    b->promised -= q->promised;
    q->n_blocks = q->promised = 0;
    q->ended = true;
}

anvil_status anvil_batch_remove(anvil_batch *b, int id) {
    struct bseq *q = b ? find(b, id) : NULL;
    if (!q) return keep(b, err_set(ANVIL_ERR_INVALID_ARG, "anvil_batch_remove: no sequence %d", id));
    if (!q->ended) end_seq(b, q);
    q->id = 0;
    return ANVIL_OK;
}

int64_t anvil_batch_device_choices(const anvil_batch *b) { return b->device_choices; }

anvil_status anvil_batch_logits(const anvil_batch *b, int id, float *out) {
    const struct bseq *q = b ? find(b, id) : NULL;
    if (!q || !q->has_logits || !out)
        return err_set(ANVIL_ERR_INVALID_ARG, "anvil_batch_logits: no logits kept for sequence %d", id);
    memcpy(out, q->logits, (size_t)b->V * sizeof *out);
    return ANVIL_OK;
}

/* Gives q the blocks its positions below end reach (promised at its add). */
void batch_grow(anvil_batch *b, struct bseq *q, int end) {
    while (q->n_blocks * b->kv_block < end) {
        int32_t k = take_block(b);
        b->refs[k] = 1;
        q->blocks[q->n_blocks++] = k;
        q->promised--;
        b->promised--;
    }
}

/* The registered block under parent holding tokens[kv_block], or -1. */
static int32_t lookup(const anvil_batch *b, int32_t parent, const int32_t *tokens) {
    size_t n = (size_t)b->kv_block;
    for (int32_t k = 0; k < b->kv_blocks; k++)
        if (b->parent[k] == parent && b->block_tok[(size_t)k * n] == tokens[0] &&
            !memcmp(&b->block_tok[(size_t)k * n], tokens, n * sizeof *tokens))
            return k;
    return -1;
}

/* q, at a block boundary of its prompt, adopts the registered blocks that continue it, all
 * but the one holding its last token; on a recurrent model only up to the last of them with a
 * snapshot, whose states then become q's. */
static anvil_status adopt(anvil_batch *b, struct bseq *q) {
    if (!b->reuse || q->pos != q->n_blocks * b->kv_block || q->n_checked != q->n_blocks)
        return ANVIL_OK;
    int n = q->n_blocks, upto = n, snap = -1;
    for (int pos = q->pos; pos + b->kv_block < q->n_prompt; pos += b->kv_block) {
        int32_t k = lookup(b, n ? q->blocks[n - 1] : -1, q->tokens + pos);
        if (k < 0) break;
        q->blocks[n++] = k; /* (held only if adopted, below) */
        if (!b->recurrent || b->block_snap[k] >= 0) {
            upto = n;
            snap = b->recurrent ? b->block_snap[k] : -1;
        }
    }
    if (snap >= 0) {
        int self = (int)(q - b->seqs);
        b->snap_made[snap] = ++b->clock; /* (used: the last to go) */
        anvil_status st = b->backend->vt->states_copy(b->backend, b->n_seq_max + b->n_snap, b->n_seq_max + snap, self);
        if (st != ANVIL_OK) return st;
    }
    for (; q->n_blocks < upto; q->n_blocks++) {
        int32_t k = q->blocks[q->n_blocks];
        if (b->refs[k]++ == 0) b->n_idle--;
        q->n_checked++;
        q->promised--; /* (its promise covers the whole prompt: more than this) */
        b->promised--;
        q->pos += b->kv_block;
        q->n_cached += b->kv_block;
    }
    return ANVIL_OK;
}

/* The first block boundary past from where a recurrent model's prompt q leaves a snapshot: its
 * last before its last token, and those at or before a snapshot token; INT_MAX: none. */
static int snap_after(const anvil_batch *b, const struct bseq *q, int from) {
    if (!b->n_snap) return INT_MAX;
    int last = (q->n_prompt - 1) / b->kv_block * b->kv_block;
    for (int i = from + 1; i < last && b->snap_token >= 0; i++)
        if (q->tokens[i] == b->snap_token && i / b->kv_block * b->kv_block > from) return i / b->kv_block * b->kv_block;
    return last > from ? last : INT_MAX;
}

/* After q's chunk ending at a point of snap_after (at): the states there into a snapshot (a free one, else
 * the oldest) attached to q's block ending there, if registered and without one. */
static anvil_status take_snapshot(anvil_batch *b, struct bseq *q, int at) {
    if (!b->n_snap || q->pos != at || q->pos == 0) return ANVIL_OK;
    int32_t k = q->blocks[q->pos / b->kv_block - 1];
    if (b->parent[k] == -2 || b->block_snap[k] >= 0) return ANVIL_OK;
    int s = 0;
    for (int i = 0; i < b->n_snap; i++)
        if (b->snap_block[i] < 0 || (b->snap_block[s] >= 0 && b->snap_made[i] < b->snap_made[s])) s = i;
    anvil_status st = b->backend->vt->states_copy(b->backend, b->n_seq_max + b->n_snap, (int)(q - b->seqs), b->n_seq_max + s);
    if (st != ANVIL_OK) return st;
    if (b->snap_block[s] >= 0) b->block_snap[b->snap_block[s]] = -1;
    b->snap_block[s] = k;
    b->block_snap[k] = s;
    b->snap_made[s] = ++b->clock;
    return ANVIL_OK;
}

/* Registers q's blocks that its pos has filled since the last call. Where a registered block
 * holds the same rows (the same tokens under the same parent), q reads that one from then on
 * and lets its own go (the chain goes on through it). Every full block q holds is registered
 * (its own, adopted, or another's in its place), and registered blocks are unregistered only
 * when idle, with their descendants, so q's parent block is always registered. */
void batch_check_blocks(anvil_batch *b, struct bseq *q) {
    if (!b->reuse) return;
    for (; (q->n_checked + 1) * b->kv_block <= q->pos; q->n_checked++) {
        int32_t k = q->blocks[q->n_checked];
        int32_t parent = q->n_checked ? q->blocks[q->n_checked - 1] : -1;
        const int32_t *t = q->tokens + (size_t)q->n_checked * (size_t)b->kv_block;
        if (b->parent[k] != -2) continue; /* adopted */
        assert(parent < 0 || b->parent[parent] != -2);
        int32_t dup = lookup(b, parent, t);
        if (dup >= 0) {
            if (b->refs[dup]++ == 0) b->n_idle--;
            q->blocks[q->n_checked] = dup;
            release(b, k);
            continue;
        }
        b->parent[k] = parent;
        memcpy(&b->block_tok[(size_t)k * (size_t)b->kv_block], t, (size_t)b->kv_block * sizeof *t);
    }
}

/* The program for T rows (last_only: the last row's logits only), compiled on first use. */
anvil_status batch_program_for(anvil_batch *b, int T, bool last_only, struct batch_program **out) {
    struct batch_program *lru = NULL;
    for (int i = 0; i < BATCH_PROGRAMS; i++) {
        struct batch_program *bp = &b->progs[i];
        if (bp->busy) continue;
        if (bp->p && bp->T == T && bp->last_only == last_only) {
            bp->used = ++b->clock;
            *out = bp;
            return ANVIL_OK;
        }
        if (!lru || !bp->p || (lru->p && bp->used < lru->used)) lru = bp;
    }
    if (!lru) return err_set(ANVIL_ERR_BACKEND, "batch: every program has a step in flight");
    if (lru->p) b->backend->vt->program_destroy(lru->p);
    lru->p = NULL;
    struct build_opts o = {T, b->kv_blocks * b->kv_block, last_only, b->n_seq_max + b->n_snap, b->kv_block,
                           false, false, false, false, 0};
    struct graph g;
    anvil_status st = model_build_graph(&b->model->model, &o, &g);
    if (st != ANVIL_OK) return st;
    st = b->backend->vt->compile(b->backend, &g, &lru->p);
    graph_free(&g);
    if (st != ANVIL_OK) return st;
    lru->T = T;
    lru->last_only = last_only;
    lru->used = ++b->clock;
    *out = lru;
    return ANVIL_OK;
}

/* A step of q, the one decoding sequence (chosen on the device), on the solo decode program
 * over the pool, its token into *tok; queued: the step is the one the last call queued ahead.
 * The next step is queued ahead too (the device feeds it the token chosen here) where it will
 * run alone: no other sequence in the batch, its token needed (the budget and the context go
 * on past this step's), chosen on the device; the next call takes it (queued), or a later
 * call not taking it has the backend throw it away (it wrote q's cache row at pos + 1, which
 * q never registered, and advanced a hybrid's states of q's slot: q left). *ran false
 * (nothing run) where the program cannot be made: the caller then runs the batch program of
 * one row. The program is made on the first such step
 * from the session graph of one token over the pool's rows, its caches the batch's (the same
 * states, the same shapes: a hybrid's declared as the batch graphs', state_seqs), read through
 * q's blocks, a hybrid's states at q's slot's slices. */
static anvil_status run_paged(anvil_batch *b, struct bseq *q, bool queued, int32_t *tok, bool *ran) {
    *ran = false;
    if (!b->paged) {
        struct build_opts o = {1, b->kv_blocks * b->kv_block, true, 0, 0, false, false, false, false,
                               b->n_seq_max + b->n_snap}; /* (a hybrid's states: the batch's) */
        struct graph g;
        anvil_status st = model_build_graph(&b->model->model, &o, &g);
        if (st != ANVIL_OK) return st;
        g.kv_block = b->kv_block;
        st = b->backend->vt->compile(b->backend, &g, &b->paged);
        graph_free(&g);
        if (st != ANVIL_OK) { /* (a model the paged program does not take: the batch program's) */
            log_info("batch: steps of one sequence on a batch program: %s", err_get());
            b->paged = NULL;
            b->paged_ok = false;
            return ANVIL_OK;
        }
    }
    *ran = true;
    bool ahead = b->ahead_ok && anvil_batch_active(b) == 1 && q->n_generated + 1 < q->gp.max_tokens &&
                 q->pos + 1 < b->n_ctx && batch_pick_history(&q->sp, q->pos + 1) <= BATCH_PICK_HISTORY;
    if (ahead) batch_grow(b, q, q->pos + 2); /* (within its promise: the row is needed) */
    struct paged_step s = {q->tokens[q->pos], q->pos, q->blocks, &q->sp, q->tokens, queued, ahead, (int)(q - b->seqs)};
    anvil_status st = b->backend->vt->run_paged(b->paged, &s, tok);
    b->paged_steps++;
    if (st == ANVIL_OK && ahead) {
        b->ahead_id = q->id;
        b->ahead_pos = q->pos + 1;
    }
    return st;
}

int64_t batch_paged_steps(const anvil_batch *b) { return b->paged_steps; }

int64_t batch_sub_steps(const anvil_batch *b) { return b->sub_steps; }

int64_t batch_pipe_counts(const anvil_batch *b, int64_t *dropped) {
    if (dropped) *dropped = b->dropped;
    return b->overlapped;
}

int anvil_batch_paged_decode(const anvil_batch *b) { return b && b->paged_ok; }

/* Keeps the logits q's next choice is made from, where the batch keeps them. */
void batch_keep_logits(anvil_batch *b, struct bseq *q, const float *logits) {
    if (!b->keep_logits) return;
    memcpy(q->logits, logits, (size_t)b->V * sizeof *logits);
    q->has_logits = true;
}

void batch_row_done(anvil_batch *b, struct bseq *q, float *logits, bool device_chose, int32_t picked,
                    anvil_batch_event *ev, int *n_ev) {
    q->pos++;
    batch_check_blocks(b, q);
    if (!device_chose) {
        batch_choose(b, q, logits, &ev[(*n_ev)++]);
        return;
    }
    if (logits) batch_keep_logits(b, q, logits);
    batch_deliver(b, q, picked, &ev[(*n_ev)++]);
    b->device_choices++;
}

/* q's next token is tok: reports it in *ev, as anvil_session_generate would. */
void batch_deliver(anvil_batch *b, struct bseq *q, int32_t tok, anvil_batch_event *ev) {
    ev->id = q->id;
    ev->token = tok;
    ev->stop = ANVIL_STOP_NONE;
    for (int i = 0; i < q->gp.n_stop_tokens; i++)
        if (q->gp.stop_tokens[i] == tok) {
            ev->token = -1;
            ev->stop = ANVIL_STOP_EOS;
        }
    if (ev->stop == ANVIL_STOP_NONE) {
        q->tokens[q->n_known++] = tok;
        q->n_generated++;
        if (q->pos >= b->n_ctx) ev->stop = ANVIL_STOP_CONTEXT; /* it cannot enter the cache */
        else if (q->n_generated >= q->gp.max_tokens) ev->stop = ANVIL_STOP_LENGTH;
    }
    if (ev->stop != ANVIL_STOP_NONE) end_seq(b, q);
}

/* Chooses q's next token on the host from its logits (modified: penalties) and delivers it. */
void batch_choose(anvil_batch *b, struct bseq *q, float *logits, anvil_batch_event *ev) {
    batch_keep_logits(b, q, logits); /* (before the penalties) */
    int32_t tok = sampler_sample_prepared(logits, b->V, &q->sp, q->tokens, q->pos, (uint32_t)q->pos, b->scratch);
    batch_deliver(b, q, tok, ev);
}

/* Runs rows [0, T) of b->row_* (their sequences' blocks grown; rows from n_live on dead: a
 * program's padding) through a program; out, when not NULL, receives the logits of the last row
 * (last_only) or of every row, those of the live rows finite (else the weights are broken: an
 * error, never a garbage token). pick: the rows with b->pk[t].sp choose on the device, into
 * b->picked (run_batch_pick). */
static anvil_status run_rows(anvil_batch *b, int T, int n_live, bool last_only, bool pick, float *out) {
    struct batch_program *bp;
    anvil_status st = batch_program_for(b, T, last_only, &bp);
    if (st != ANVIL_OK) return st;
    struct program *p = bp->p;
    struct batch_rows r = {b->row_tok, b->row_seq, b->row_pos, b->tables, b->max_blocks, NULL};
    st = pick ? b->backend->vt->run_batch_pick(p, &r, b->pk, b->picked, out) : b->backend->vt->run_batch(p, &r, out);
    if (st != ANVIL_OK || !out) return st;
    size_t n = (size_t)(last_only ? 1 : n_live) * (size_t)b->V;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(out[i]))
            return err_set(ANVIL_ERR_FORMAT, "%s: the model computed a non-finite logit (%g for token "
                           "%d): its weights are likely NaN or Inf", b->model->file->path,
                           (double)out[i], (int)(i % (size_t)b->V));
    return ANVIL_OK;
}

/* The next joining sequence (oldest first), or NULL. */
static struct bseq *next_prompt(anvil_batch *b) {
    struct bseq *best = NULL;
    for (int i = 0; i < b->n_seq_max; i++) {
        struct bseq *q = &b->seqs[i];
        if (q->id && !q->ended && q->pos < q->n_prompt && (!best || q->arrival < best->arrival)) best = q;
    }
    return best;
}

/* One decode step of the B sequences rows[0 .. B) (their blocks grown), a row each, their
 * tokens delivered into ev; all: the step's decoding sequences in all (one alone may take the
 * solo decode program over the pool). */
static anvil_status decode_rows_step(anvil_batch *b, struct bseq **rows, int B, int all, anvil_batch_event *ev,
                                     int *n_ev) {
    anvil_status st = ANVIL_OK;
    for (int r = 0; r < B; r++) {
        struct bseq *q = rows[r];
        b->row_tok[r] = q->tokens[q->pos];
        b->row_seq[r] = (int32_t)(q - b->seqs);
        b->row_pos[r] = q->pos;
    }
    /* the decode programs are of 1, 2, 4, 8 ... rows: the rest of the step's are dead rows, so
     * that a batch whose size moves reuses a few programs (each is recorded on first use) */
    int R = decode_rows(B);
    for (int r = B; r < R; r++) {
        b->row_tok[r] = 0;
        b->row_seq[r] = -1;
        b->row_pos[r] = 0;
    }
    /* each row chosen on the device where it can be (its penalty window within the records');
     * the logits come back only for the rest, or to be kept */
    bool pick = false, host = b->keep_logits;
    for (int r = 0; r < R; r++) {
        struct bseq *q = r < B ? rows[r] : NULL;
        bool dev = q && b->pick && batch_pick_history(&q->sp, q->pos) <= BATCH_PICK_HISTORY;
        b->pk[r].sp = dev ? &q->sp : NULL;
        b->pk[r].history = dev ? q->tokens : NULL;
        pick |= dev;
        host |= q && !dev;
    }
    /* one sequence, chosen on the device, no logits wanted: the solo decode program */
    bool ran = false;
    if (all == 1 && b->paged_ok && b->pk[0].sp && !host)
        st = run_paged(b, rows[0], false, &b->picked[0], &ran);
    if (!ran && st == ANVIL_OK) st = run_rows(b, R, B, false, pick, host ? b->out : NULL);
    for (int r = 0; r < B && st == ANVIL_OK; r++) {
        struct bseq *q = rows[r];
        float *logits = b->out + (size_t)r * (size_t)b->V;
        batch_row_done(b, q, !b->pk[r].sp || host ? logits : NULL, b->pk[r].sp != NULL, b->picked[r], ev, n_ev);
    }
    return st;
}

anvil_status anvil_batch_step(anvil_batch *b, anvil_batch_event *ev, int cap, int *n_ev) {
    if (!b || !ev || !n_ev || cap < b->n_seq_max)
        return keep(b, err_set(ANVIL_ERR_INVALID_ARG, "anvil_batch_step: bad arguments (room for "
                               "%d events at least)", b ? b->n_seq_max : 0));
    *n_ev = 0;
    anvil_status st = ANVIL_OK;
    for (int i = 0; i < b->n_seq_max; i++) b->seqs[i].stepped = false;
    /* 1. prompt chunks, oldest first, at most prefill_chunk tokens in all */
    for (int budget = b->prefill_chunk; budget > 0 && st == ANVIL_OK;) {
        struct bseq *q = next_prompt(b);
        if (!q || q->stepped) break;
        if ((st = adopt(b, q)) != ANVIL_OK) break;
        int T = MIN(q->n_prompt - q->pos, budget), at = snap_after(b, q, q->pos);
        if (q->pos + T > at) T = at - q->pos; /* a chunk ends at the snapshot's point */
        batch_grow(b, q, q->pos + T);
        for (int t = 0; t < T; t++) {
            b->row_tok[t] = q->tokens[q->pos + t];
            b->row_seq[t] = (int32_t)(q - b->seqs);
            b->row_pos[t] = q->pos + t;
        }
        bool last = q->pos + T == q->n_prompt;
        st = run_rows(b, T, T, true, false, last ? b->out : NULL);
        if (st != ANVIL_OK) break;
        q->pos += T;
        q->stepped = true;
        budget -= T;
        batch_check_blocks(b, q);
        if ((st = take_snapshot(b, q, at)) != ANVIL_OK) break;
        if (last) batch_choose(b, q, b->out, &ev[(*n_ev)++]);
    }
    /* 2. one token for every other running sequence: the one it chose last enters the cache.
     * Over a chained layer split, in groups whose steps are pipelined over the devices */
    if (b->groups > 1) {
        if (st == ANVIL_OK) st = batch_pipe_step(b, ev, n_ev);
        return keep(b, st);
    }
    /*
     * First the sequence whose step the last one queued ahead on the paged program, if it
     * still decodes there: its token is that step's */
    struct bseq *a = b->ahead_id ? find(b, b->ahead_id) : NULL;
    if (a && (a->ended || a->stepped || a->pos != b->ahead_pos)) a = NULL;
    b->ahead_id = 0;
    int32_t a_tok = -1;
    bool a_ran = false;
    if (a && st == ANVIL_OK) {
        a->stepped = true; /* (not a row below) */
        st = run_paged(b, a, true, &a_tok, &a_ran);
    }
    if (a_ran && st == ANVIL_OK) {
        a->pos++;
        batch_check_blocks(b, a);
        batch_deliver(b, a, a_tok, &ev[(*n_ev)++]);
        b->device_choices++;
    }
    int B = 0;
    struct bseq *rows[1024];
    for (int i = 0; i < b->n_seq_max && st == ANVIL_OK; i++) {
        struct bseq *q = &b->seqs[i];
        if (!q->id || q->ended || q->stepped || q->pos < q->n_prompt) continue;
        batch_grow(b, q, q->pos + 1);
        rows[B++] = q;
    }
    /* a MoE model's rows in steps of at most sub_rows (ANVIL_BATCH_MOE_ROWS), one after the other */
    int per = b->sub_rows > 0 ? b->sub_rows : MAX(B, 1);
    b->sub_steps += B > per;
    for (int r0 = 0; r0 < B && st == ANVIL_OK; r0 += per)
        st = decode_rows_step(b, rows + r0, MIN(per, B - r0), B, ev, n_ev);
    return keep(b, st);
}
