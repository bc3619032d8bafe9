/*
 * The push-constant layouts (shaders/push.h) as the shaders were compiled: for every kernel
 * of pipelines.c's table, the offsets of its SPIR-V's push-constant block's members against
 * the host struct of its layout (vk_kernel_info's push), field for field. This holds the
 * prebuilt SPIR-V (mm_cm2.comp, compiled elsewhere, declares its block itself) and any shader
 * whose block stops following its list. Needs no device.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "backends/vulkan/decode/decode.h"
#include "testutil.h"

/* a layout's field offsets, in order, from its list */
struct layout {
    const char *name;
    size_t n, off[32], size;
};
#define OFF_A(type, name) offsetof(PC_TYPE, name),
#define OFF_U(name) offsetof(PC_TYPE, name),
#define LAYOUT(tag, LIST)                                                                       \
    {#tag, sizeof((size_t[]){LIST(OFF_A, OFF_U, OFF_U)}) / sizeof(size_t), {LIST(OFF_A, OFF_U, OFF_U)}, \
     sizeof(PC_TYPE)}

static const struct layout *layout_of(enum vk_push push) {
    static struct layout all[VK_PUSH_COUNT];
    static bool made;
    if (!made) {
#define PC_TYPE struct pc_matvec
        all[PUSH_MATVEC] = (struct layout)LAYOUT(pc_matvec, PC_MATVEC);
#undef PC_TYPE
#define PC_TYPE struct pc_qxt
        /* pc_qxt: pc_matvec's fields (m), then its own */
        all[PUSH_MATVEC_QXT] = (struct layout)LAYOUT(pc_qxt, PC_MATVEC_QXT);
        {
            struct layout *q = &all[PUSH_MATVEC_QXT], *m = &all[PUSH_MATVEC];
            size_t tail = q->n;
            memmove(q->off + m->n, q->off, tail * sizeof *q->off);
            memcpy(q->off, m->off, m->n * sizeof *q->off);
            q->n += m->n;
        }
#undef PC_TYPE
#define ONE(push, tag, LIST)                                                                        \
        do {                                                                                        \
            all[push] = (struct layout)LAYOUT(tag, LIST);                                           \
        } while (0)
#define PC_TYPE struct pc_qx
        ONE(PUSH_QX, pc_qx, PC_QX);
#undef PC_TYPE
#define PC_TYPE struct pc_embed
        ONE(PUSH_EMBED, pc_embed, PC_EMBED);
#undef PC_TYPE
#define PC_TYPE struct pc_attn
        ONE(PUSH_ATTN, pc_attn, PC_ATTN);
#undef PC_TYPE
#define PC_TYPE struct pc_ew
        ONE(PUSH_EW, pc_ew, PC_EW);
#undef PC_TYPE
#define PC_TYPE struct pc_topk
        ONE(PUSH_TOPK, pc_topk, PC_TOPK);
#undef PC_TYPE
#define PC_TYPE struct pc_gdn
        ONE(PUSH_GDN, pc_gdn, PC_GDN);
#undef PC_TYPE
#define PC_TYPE struct pc_argmax
        ONE(PUSH_ARGMAX, pc_argmax, PC_ARGMAX);
#undef PC_TYPE
#define PC_TYPE struct pc_sample
        ONE(PUSH_SAMPLE, pc_sample, PC_SAMPLE);
#undef PC_TYPE
#define PC_TYPE struct pc_logprobs
        ONE(PUSH_LOGPROBS, pc_logprobs, PC_LOGPROBS);
#undef PC_TYPE
#define PC_TYPE struct pc_prefetch
        ONE(PUSH_PREFETCH, pc_prefetch, PC_PREFETCH);
#undef PC_TYPE
#define PC_TYPE struct pc_mega
        ONE(PUSH_MEGA, pc_mega, PC_MEGA);
#undef PC_TYPE
#define PC_TYPE struct pc_mm
        ONE(PUSH_MM, pc_mm, PC_MM);
#undef PC_TYPE
#define PC_TYPE struct pc_mmh
        ONE(PUSH_MMH, pc_mmh, PC_MMH);
#undef PC_TYPE
#define PC_TYPE struct pc_dq
        ONE(PUSH_DQ, pc_dq, PC_DQ);
#undef PC_TYPE
#define PC_TYPE struct pc_rows
        ONE(PUSH_ROWS, pc_rows, PC_ROWS);
#undef PC_TYPE
#define PC_TYPE struct pc_moe_rows
        ONE(PUSH_MOE_ROWS, pc_moe_rows, PC_MOE_ROWS);
#undef PC_TYPE
#define PC_TYPE struct pc_attn_pf
        ONE(PUSH_ATTN_PF, pc_attn_pf, PC_ATTN_PF);
#undef PC_TYPE
#define PC_TYPE struct pc_gdnc
        ONE(PUSH_GDNC, pc_gdnc, PC_GDNC);
#undef PC_TYPE
#define PC_TYPE struct pc_vit
        ONE(PUSH_VIT, pc_vit, PC_VIT);
#undef PC_TYPE
#define PC_TYPE struct pc_vitmm
        ONE(PUSH_VITMM, pc_vitmm, PC_VITMM);
#undef PC_TYPE
#define PC_TYPE struct pc_mmb
        ONE(PUSH_MMB, pc_mmb, PC_MMB);
#undef PC_TYPE
#define PC_TYPE struct pc_mmb_round
        ONE(PUSH_MMB_ROUND, pc_mmb_round, PC_MMB_ROUND);
#undef PC_TYPE
#define PC_TYPE struct pc_attn_split
        ONE(PUSH_ATTN_SPLIT, pc_attn_split, PC_ATTN_SPLIT);
#undef PC_TYPE
        made = true;
    }
    return &all[push];
}

/* The member offsets of the SPIR-V module's push-constant block: its count, or -1 where it
 * has none. SPIR-V: a header of 5 words, then instructions of (word count << 16 | opcode). */
static int spirv_push_offsets(const uint32_t *w, size_t words, size_t *off, int cap) {
    enum { OP_TYPE_POINTER = 32, OP_VARIABLE = 59, OP_MEMBER_DECORATE = 72, DECO_OFFSET = 35, SC_PUSH = 9 };
    uint32_t block = 0, ptr = 0;
    for (int pass = 0; pass < 2; pass++) /* the variable's pointer type, then the block it points to */
        for (size_t i = 5; i < words;) {
            uint32_t op = w[i] & 0xffff, n = w[i] >> 16;
            if (n == 0 || i + n > words) return -1;
            if (pass == 0 && op == OP_VARIABLE && n >= 4 && w[i + 3] == SC_PUSH) ptr = w[i + 1];
            if (pass == 1 && op == OP_TYPE_POINTER && w[i + 1] == ptr) block = w[i + 3];
            i += n;
        }
    if (!block) return -1;
    int count = 0;
    for (size_t i = 5; i < words; i += w[i] >> 16)
        if ((w[i] & 0xffff) == OP_MEMBER_DECORATE && w[i + 1] == block && w[i + 3] == DECO_OFFSET &&
            (int)w[i + 2] < cap) {
            off[w[i + 2]] = w[i + 4];
            if ((int)w[i + 2] + 1 > count) count = (int)w[i + 2] + 1;
        }
    return count;
}

static void test_push_layouts(void **state) {
    (void)state;
    int checked = 0;
    for (int k = 1; k < K_COUNT; k++) {
        const struct vk_kernel_info *ki = vk_kernel_info((enum vk_kernel)k);
        assert_non_null(ki->code);
        assert_true(ki->push > PUSH_NONE && ki->push < VK_PUSH_COUNT);
        const struct layout *want = layout_of((enum vk_push)ki->push);
        assert_true(want->size <= VK_PUSH_BYTES);
        size_t have[64];
        int n = spirv_push_offsets(ki->code, ki->size / 4, have, 64);
        if (n != (int)want->n)
            fail_msg("%s: %d push-constant fields in its SPIR-V, %zu in struct %s", ki->name, n, want->n, want->name);
        for (int i = 0; i < n; i++)
            if (have[i] != want->off[i])
                fail_msg("%s: push-constant field %d at byte %zu in its SPIR-V, %zu in struct %s", ki->name, i,
                         have[i], want->off[i], want->name);
        checked++;
    }
    fprintf(stderr, "%d kernels' push constants as their layouts say\n", checked);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_push_layouts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
