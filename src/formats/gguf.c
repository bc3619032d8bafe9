/* GGUF: not read yet (the GGUF issue adds the reader here). */
#include "model_file.h"

anvil_status gguf_model_open(const char *path, struct model_file *mf) {
    (void)mf;
    return err_set(ANVIL_ERR_UNSUPPORTED, "%s: GGUF files are not supported yet", path);
}

void gguf_model_close(struct model_file *mf) { (void)mf; }
