/*
 * engine: a batch's decode rows pipelined over a layer split's devices (docs/MULTIGPU.md
 * "Pipelining"). A step of all the decoding sequences over a split runs its parts one after the
 * other, so one device works while the others wait. Here the sequences are cut into groups,
 * each stepping on a batch program of its own, submitted without waiting (backend batch_submit:
 * the parts chained on the devices, the hidden rows and completion handed over there), so that
 * while the last device runs one group's step through the last layers, the first runs
 * another's through the first layers.
 *
 * A call (the decode half of anvil_batch_step) is one round: the sequences not in flight are
 * submitted as new groups, enough for `groups` with those still in flight from the last call;
 * then each group in flight, oldest first, is waited for and its tokens delivered, and the next
 * step of its sequences that go on is submitted at once (before the next group's wait), but
 * for the last group's: so the devices keep working while the host delivers, and each call
 * returns with all groups but one in flight, the last one's sequences free for the caller to
 * remove or stop before their next step. With two devices and two groups: device 0 runs group
 * B's first half while device 1 runs group A's second, then A's next first half while B's
 * second half runs.
 *
 * A group in flight across calls may hold a sequence that the caller removes meanwhile (a stop
 * string, a cancel): its row still runs, writing that sequence's cache row at its position (a
 * block now released, perhaps another's) and a hybrid's state slices of its slot. Both are
 * harmless because every later writer of those blocks and slices is submitted after it, on
 * the same devices (each device runs its submissions in order), and a new sequence writes every
 * row it reads before it reads it (and starts its slot's states at position 0, or copies a
 * snapshot over them); the row's token is dropped (its slot's id is another's by then).
 *
 * Sizes: G = one group a device; a MoE model's ceil(live sequences / 8) (BATCH_GROUP_ROWS:
 * its steps of at most 15 rows read each row's experts on the decode's kernels), at least one a
 * device; at most live / 2 (a group of one sequence runs a one-row program, much slower per row than a
 * larger one), each at most ceil(live / G) sequences; sequences beyond that wait a round (held), joining the next group resubmitted, so
 * joiners and leavers even the groups out again.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "batch_impl.h"

int batch_pipe_groups(const anvil_batch *b, int split_pipe) {
    const struct backend_vtable *vt = b->backend->vt;
    if (!vt->batch_submit || !vt->batch_wait || !vt->stages || split_pipe == 1) return 1;
    int n = vt->stages(b->backend);
    if (n < 2) return 1;
    return split_pipe > 1 ? MIN(split_pipe, BATCH_GROUPS_MAX) : BATCH_GROUPS_MAX;
}

/* The groups n decoding sequences are cut into: one a device (or as ANVIL_SPLIT_PIPE sets
 * them), more where group_rows asks (a MoE model: ceil(n / group_rows)); within groups, and of
 * at least group_min sequences. */
static int group_count(const anvil_batch *b, int n) {
    int G = b->group_rows ? MAX(b->stages, (n + b->group_rows - 1) / b->group_rows) : b->stages;
    return MAX(1, MIN(MIN(G, b->groups), n / b->group_min));
}

void batch_pipe_free(anvil_batch *b) {
    for (int i = 0; i < BATCH_GROUPS; i++) {
        struct batch_group *g = &b->grp[i];
        free(g->slot);
        free(g->id);
        free(g->pk);
        free(g->picked);
        free(g->out);
        memset(g, 0, sizeof *g);
    }
}

/* A group not in flight, its row arrays made; NULL: none (or out of memory). */
static struct batch_group *take_group(anvil_batch *b, int *gi) {
    bool used[BATCH_GROUPS] = {false};
    for (int i = 0; i < b->n_fly; i++) used[b->fly[i]] = true;
    for (int i = 0; i < BATCH_GROUPS; i++) {
        if (used[i]) continue;
        struct batch_group *g = &b->grp[i];
        size_t R = (size_t)decode_rows(b->n_seq_max);
        if (!g->slot) {
            g->slot = xmalloc(R * sizeof *g->slot);
            g->id = xmalloc(R * sizeof *g->id);
            g->pk = xcalloc(R, sizeof *g->pk);
            g->picked = xmalloc(R * sizeof *g->picked);
            if (!g->slot || !g->id || !g->pk || !g->picked) return NULL;
        }
        *gi = i;
        return g;
    }
    return NULL;
}

/* Submits group gi's step (g->B sequences in g->slot, their ids recorded; blocks grown), its
 * rows padded with dead ones to the program's R, and puts it last in flight. */
static anvil_status submit(anvil_batch *b, int gi) {
    struct batch_group *g = &b->grp[gi];
    g->R = decode_rows(g->B);
    bool logits = b->keep_logits;
    for (int r = 0; r < g->R; r++) {
        struct bseq *q = r < g->B ? &b->seqs[g->slot[r]] : NULL;
        if (q) {
            batch_grow(b, q, q->pos + 1);
            g->id[r] = q->id;
        }
        b->row_tok[r] = q ? q->tokens[q->pos] : 0;
        b->row_seq[r] = q ? g->slot[r] : -1;
        b->row_pos[r] = q ? q->pos : 0;
        /* chosen on the device where it can be (its penalty window within the records') */
        bool dev = q && b->pick && batch_pick_history(&q->sp, q->pos) <= BATCH_PICK_HISTORY;
        g->pk[r].sp = dev ? &q->sp : NULL;
        g->pk[r].history = dev ? q->tokens : NULL;
        logits |= q && !dev;
    }
    if (logits && g->out_rows < g->R) {
        free(g->out);
        g->out_rows = (g->out = xmalloc((size_t)g->R * (size_t)b->V * sizeof *g->out)) ? g->R : 0;
        if (!g->out) return ANVIL_ERR_NOMEM;
    }
    anvil_status st = batch_program_for(b, g->R, false, &g->bp);
    if (st != ANVIL_OK) return st;
    struct batch_rows rows = {b->row_tok, b->row_seq, b->row_pos, b->tables, b->max_blocks, NULL};
    st = b->backend->vt->batch_submit(g->bp->p, &rows, g->pk, logits);
    if (st != ANVIL_OK) return st;
    b->overlapped += b->n_fly > 0;
    g->bp->busy = true;
    g->logits = logits;
    for (int r = 0; r < g->B; r++) b->seqs[g->slot[r]].flight = gi + 1;
    b->fly[b->n_fly++] = gi;
    return ANVIL_OK;
}

/* Waits for the oldest group in flight (out of the list into *gi) and delivers its tokens to
 * its sequences still there (a removed one's row is dropped). */
static anvil_status wait_oldest(anvil_batch *b, int *gi, anvil_batch_event *ev, int *n_ev) {
    *gi = b->fly[0];
    memmove(b->fly, b->fly + 1, (size_t)--b->n_fly * sizeof *b->fly);
    struct batch_group *g = &b->grp[*gi];
    anvil_status st = b->backend->vt->batch_wait(g->bp->p, g->pk, g->picked, g->logits ? g->out : NULL);
    g->bp->busy = false;
    for (int r = 0; r < g->B && st == ANVIL_OK; r++) {
        struct bseq *q = &b->seqs[g->slot[r]];
        if (q->id != g->id[r] || q->ended) { /* (left while in flight) */
            b->dropped++;
            continue;
        }
        q->flight = 0;
        float *logits = g->logits ? g->out + (size_t)r * (size_t)b->V : NULL;
        for (int i = 0; logits && i < b->V; i++)
            if (!isfinite(logits[i]))
                return err_set(ANVIL_ERR_FORMAT, "%s: the model computed a non-finite logit (%g for token %d): its "
                               "weights are likely NaN or Inf", b->model->file->path, (double)logits[i], i);
        q->stepped = true;
        batch_row_done(b, q, logits, g->pk[r].sp != NULL, g->picked[r], ev, n_ev);
    }
    return st;
}

anvil_status batch_pipe_step(anvil_batch *b, anvil_batch_event *ev, int *n_ev) {
    /* the decoding sequences not in flight (free), and those in flight still there (live) */
    int free_slots[1024], n_free = 0, n_live = 0;
    for (int i = 0; i < b->n_seq_max; i++) {
        const struct bseq *q = &b->seqs[i];
        if (!q->id || q->ended) continue;
        if (q->flight) n_live++;
        else if (!q->stepped && q->pos >= q->n_prompt) free_slots[n_free++] = i;
    }
    int n = n_free + n_live, G = group_count(b, n), per = MAX(1, (n + G - 1) / G);
    anvil_status st = ANVIL_OK;
    int k = 0; /* free ones taken; those past k are held for a resubmitted group, or the next call */
    while (st == ANVIL_OK && b->n_fly < G && k < n_free) {
        int gi;
        struct batch_group *g = take_group(b, &gi);
        if (!g) return ANVIL_ERR_NOMEM;
        g->B = MIN(per, n_free - k);
        memcpy(g->slot, free_slots + k, (size_t)g->B * sizeof *g->slot);
        k += g->B;
        st = submit(b, gi);
    }
    /* the round: each group waited for in turn, its next step submitted again at once (with
     * held ones, up to per), but the last one's and past G - 1 in flight */
    int round = b->n_fly, again = 0;
    for (int j = 0; j < round && st == ANVIL_OK; j++) {
        int gi;
        st = wait_oldest(b, &gi, ev, n_ev);
        if (st != ANVIL_OK || j == round - 1 || again >= G - 1) continue;
        struct batch_group *g = &b->grp[gi];
        int m = 0;
        for (int r = 0; r < g->B && m < per; r++) {
            const struct bseq *q = &b->seqs[g->slot[r]];
            if (q->id == g->id[r] && !q->ended && q->stepped) g->slot[m++] = g->slot[r];
        }
        while (m < per && k < n_free) {
            const struct bseq *q = &b->seqs[free_slots[k++]];
            if (q->id && !q->ended) g->slot[m++] = (int32_t)(q - b->seqs);
        }
        g->B = m;
        if (m > 0) {
            st = submit(b, gi);
            again++;
        }
    }
    return st;
}
