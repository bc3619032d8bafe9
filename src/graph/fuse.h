/*
 * fuse: which nodes of a graph may run as one kernel, asked once here for every backend. Each
 * query recognises one pattern around a node and returns the nodes that form the region; the
 * backend decides whether it has a kernel for it (weight types, sizes, its own state) and
 * lowers it. Nothing here knows a device: a region is a statement about the graph (who reads
 * what, in which order, where the plan put the memory).
 *
 *   graph_only_reader    the one node that reads a node (the link every pattern below walks)
 *   graph_fuse_add       a node whose only reader adds it to a residual: the add folded into
 *                        the node's store (a product's, the experts' sum)
 *   graph_fuse_swiglu    gate and up products of one input read only by their SwiGLU
 *   graph_fuse_norm_rope an rms_norm read only by a rope (the q/k norms)
 *   graph_fuse_qk        an attention input that is rope(rms_norm(x)): the norm, the rope, x
 *   graph_norm_folds     an rms_norm whose every reader applies it as it reads (products, a
 *                        MoE's input, a rope): the norm needs no kernel of its own
 *   graph_fuse_gated_norm  a Gated DeltaNet node followed by its gated norm (rms_norm, then
 *                        swiglu(z, norm))
 *   graph_fuse_shared_expert  a MoE node plus its shared expert's gated output (Qwen3-Next,
 *                        3.5/3.6): the shared expert's down product summed with the experts'
 *   graph_fuse_siblings  the products of one input that follow each other with nothing
 *                        computed between them (an attention's q, k, v; an FFN's gate and up):
 *                        they may run as one pass over the input, side by side
 *
 * Every query takes the graph's plan (graph/plan.h) for its views and readers.
 *
 * Who asks: the Vulkan decode program (decode/lower.c: all of them) and prefill program
 * (prefill/lower.c: the adds, the q/k norm + rope, the siblings' groups). The CPU backend runs
 * every node on its own, unfused: it is the oracle the others are checked against, and its
 * kernels already take a node's work in one pass, so the only region it could use cheaply is
 * the siblings' one parallel loop (q, k, v; gate, up) instead of one each: 3 loops fewer a
 * layer. Measured (docs/perf/log.md, session 24's "the shaders' contract and the sibling
 * products"; on a 2-core machine, tried and not kept): the same logits bit for bit, and no
 * speed outside the noise (Qwen3-0.6B Q8_0 decode: 84 loops fewer a token, one loop 12-67 us
 * against 0.7-1.3 s a token there, under 0.5%).
 */
#ifndef ANVIL_GRAPH_FUSE_H
#define ANVIL_GRAPH_FUSE_H

#include <stdbool.h>

#include "plan.h"

/* The node that is node i's only reader, reading it directly (in one or more of its sources;
 * no view of i is read), or -1. */
int graph_only_reader(const struct graph_plan *P, int i);

/* Properties a backend asks of a region on top of the pattern itself. */
enum graph_fuse_prop {
    /* The add is the next node after i that the plan gave a block (graph_plan_memory): where
     * blocks are released one planned node late (graph_mem.release_delay 1), the add's block
     * is then apart from every input of node i, so i may write the sum there itself. A
     * backend whose nodes never share memory (the decode program) does not ask it. */
    GRAPH_FUSE_NEXT_BLOCK = 1,
    /* graph_fuse_siblings: every later product of the same input, wherever it is, and through
     * views of it (the same root): where no two nodes share memory (the decode program), a
     * product may run as soon as its input exists. */
    GRAPH_FUSE_APART = 2,
};

/* The residual add after node i: the OP_ADD that is i's only reader, whose other term is
 * another node computed before i (returned in *other, as the add names it: a view where it
 * reads one). Returns the add, or -1. props: graph_fuse_prop bits. */
int graph_fuse_add(const struct graph_plan *P, int i, unsigned props, int *other);

/* Product i as one of a SwiGLU's two products of one input, each read only by it: returns the
 * SwiGLU (its src0 the gate, src1 the up product) and sets *pair to the other product's
 * node; else -1. */
int graph_fuse_swiglu(const struct graph_plan *P, int i, int *pair);

/* The rope that is rms_norm i's only reader (the q/k norms), or -1. */
int graph_fuse_norm_rope(const struct graph_plan *P, int i);

/* Whether node src (an attention's q or k) is rope(rms_norm(x)), through views: sets the
 * norm's and the rope's nodes and x (as the norm names it). */
bool graph_fuse_qk(const struct graph_plan *P, int src, int *norm, int *rope, int *x);

/* Whether every reader of rms_norm i takes it where a kernel can apply the norm as it reads:
 * a product's input, a MoE's input, a rope (graph_fuse_qk's). Then i needs no kernel. */
bool graph_norm_folds(const struct graph_plan *P, int i);

/* Gated DeltaNet node i followed by its gated norm: i's only reader an rms_norm (*norm), whose
 * only reader is a SwiGLU taking it as its up term (returned; its gate is z). Else -1. */
int graph_fuse_gated_norm(const struct graph_plan *P, int i, int *norm);

/* The shared expert added to MoE node i's output (Qwen3-Next, 3.5/3.6):
 *   add = i + sigmoid_mul(down, logit),  down = matmul(swiglu, W_down),
 *   swiglu = swiglu(gate, up),  gate and up products of one input (graph_fuse_swiglu),
 *   logit a product of one output (the expert's gate logit),
 * add i's only reader, and add, the sigmoid_mul, down and the swiglu each read once. */
struct graph_shared_expert {
    int add, gated, down, logit, swiglu, gate, up;
};
bool graph_fuse_shared_expert(const struct graph_plan *P, int i, struct graph_shared_expert *r);

/* The sibling products from product i on: i, then each OP_MATMUL after it that reads the
 * same node as i (its src[0], not a view of it) times a weight, up to the first node between
 * them that computes something (anything but the graph's leaves and views: a node a later
 * product might read); with GRAPH_FUSE_APART (props) every later one reading i's input's
 * root. None of them reads another's output, so they may run in any order or as one. Writes
 * up to max node indices to run (i first); returns how many (1: i alone; 0: i is no product
 * of a weight). */
int graph_fuse_siblings(const struct graph_plan *P, int i, unsigned props, int *run, int max);

#endif
