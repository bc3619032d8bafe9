/* engine internals shared by the engine's modules (session, and generation as it lands). */
#ifndef ANVIL_ENGINE_IMPL_H
#define ANVIL_ENGINE_IMPL_H

#include "backends/backend.h"
#include "models/models.h"

#define ERRMSG_LEN 1024

struct anvil_model {
    struct model_file *file;
    struct model model;
    int n_threads;
    char err[ERRMSG_LEN];
};

struct anvil_session {
    anvil_model *model;
    struct backend *backend;
    int n_ctx;
    int pos;            /* tokens in the cache */
    int32_t *tokens;    /* [n_ctx]: the ids at positions 0 .. pos-1 */
    struct program *decode;  /* T = 1 */
    struct program *prefill; /* the last prefill program compiled, for prefill_T tokens */
    int prefill_T;
    int chunk_cap; /* (0: none) the largest chunk whose prefill program the device had room for */
    bool prefill_last_only;
    bool no_prefill; /* the backend has no prefill program for this model: token by token */
    char err[ERRMSG_LEN];
};

#endif
