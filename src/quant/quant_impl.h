/* quant internals: the block-format row functions that quant.c's table points at. */
#ifndef ANVIL_QUANT_IMPL_H
#define ANVIL_QUANT_IMPL_H

#include <stdint.h>

/* Block formats whose row functions are not written yet set their entries to NULL here. */
#define QUANT_FNS(name) NULL, NULL

#endif
