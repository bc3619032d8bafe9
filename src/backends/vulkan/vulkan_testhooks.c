/*
 * Test hooks of the Vulkan backend (declared in vulkan_testhooks.h): single kernels run once
 * with the decode program's push constants, for vulkan_test to check against the CPU. Built
 * into the test programs only (CMakeLists.txt: *_testhooks.c), never into libanvil.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "decode/decode.h"
#include "vulkan_testhooks.h"

/* For the test hooks: the pipelines made on first use (attention specialised for nothing). */
static anvil_status test_pipelines(struct vk_backend *b) {
    if (b->have_pl) return ANVIL_OK;
    anvil_status st = vk_pipelines_create(b->d, 1, 128, b->kv_type, &b->pl);
    if (st == ANVIL_OK) b->have_pl = true;
    return st;
}

/* For the test hooks: one command buffer of dispatches (wgs workgroups each, laid out as the
 * decode program's grid(); wgs x gy where gy is not 0), each after a barrier (zero_first: that buffer filled with zeros
 * before them), submitted and waited for; host-visible results are readable when it returns
 * ANVIL_OK. */
struct test_dispatch { enum vk_kernel k; const void *push; size_t size; uint32_t wgs, gy, gz; /* (0: 1) */ };

static anvil_status test_run(struct vk_backend *b, const struct test_dispatch *ds, int n, VkBuffer zero_first) {
    struct vk_device *d = b->d;
    VkCommandBuffer cb = VK_NULL_HANDLE;
    anvil_status st = vk_cmd_alloc(d, &cb);
    if (st != ANVIL_OK) return st;
    VkCommandBufferBeginInfo bi = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL,
                                   VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, NULL};
    for (int i = 0; i < n && st == ANVIL_OK; i++) st = vk_pipeline_make(d, &b->pl, ds[i].k);
    if (st != ANVIL_OK) {
        vkFreeCommandBuffers(d->dev, d->pool, 1, &cb);
        return st;
    }
    vkBeginCommandBuffer(cb, &bi);
    if (zero_first) vkCmdFillBuffer(cb, zero_first, 0, VK_WHOLE_SIZE, 0);
    for (int i = 0; i < n; i++) {
        barrier(cb, STAGE_C | VK_PIPELINE_STAGE_TRANSFER_BIT, RW | VK_ACCESS_TRANSFER_WRITE_BIT, STAGE_C, RW);
        vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, b->pl.p[ds[i].k]);
        vkCmdPushConstants(cb, b->pl.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, (uint32_t)ds[i].size, ds[i].push);
        uint32_t gx, gy;
        grid(ds[i].wgs, &gx, &gy);
        if (ds[i].gy) gx = ds[i].wgs, gy = ds[i].gy;
        vkCmdDispatch(cb, gx, gy, ds[i].gz ? ds[i].gz : 1);
    }
    barrier(cb, STAGE_C, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
    st = vk_result(vkEndCommandBuffer(cb), "vkEndCommandBuffer");
    uint64_t v;
    if (st == ANVIL_OK) st = vk_submit(d, &cb, 1, &v);
    if (st == ANVIL_OK) st = vk_wait(d, v);
    if (st != ANVIL_OK) vk_idle(d); /* nothing freed under work still running */
    if (!d->abandoned) vkFreeCommandBuffers(d->dev, d->pool, 1, &cb);
    return st;
}

/* The tests' host-visible buffers: the control block, then n regions of bytes[i] each,
 * aligned; their offsets into off[], the buffer's size returned. */
static VkDeviceSize test_layout(int n, const VkDeviceSize *bytes, VkDeviceSize *off) {
    VkDeviceSize o = round_up(sizeof(struct vk_ctl) + 64, ALIGN);
    for (int i = 0; i < n; i++) {
        off[i] = o;
        o += round_up(bytes[i], ALIGN);
    }
    return o;
}

/* For the tests' products: matvec.comp's push constants for out [N] = w · (xq, xd), one
 * matrix of input width K */
static struct pc_matvec test_matvec_pc(struct vk_backend *b, const struct tensor_info *w, uint64_t ctl, uint64_t xq,
                                       uint64_t xd, uint64_t out, uint32_t K, uint32_t N) {
    struct pc_matvec pc = {0};
    pc.x = xq;
    pc.normw = xd;
    pc.ctl = ctl;
    pc.w0 = pc.w1 = pc.w2 = vk_weight_addr(b, w, false, false);
    pc.o0 = pc.o1 = pc.o2 = pc.res = out;
    pc.Kp8 = vk_weight_kp(b, w) / 8;
    pc.K = K;
    pc.rows0 = N;
    return pc;
}

anvil_status vk_qxr_once(struct vk_backend *b, const struct tensor_info *wa, const struct tensor_info *wb,
                         const struct tensor_info *wc, const float *x, const float *res, const float *nw, float eps,
                         int8_t *xq, float *xd, float *y, uint8_t *yq, float *z) {
    struct vk_device *d = b->d;
    const struct tensor_info *ws[3] = {wa, wb, wc};
    uint32_t K = (uint32_t)wa->ne[0], N1 = (uint32_t)wa->ne[1], N2 = (uint32_t)wc->ne[1], Kq = (K + 255) / 256 * 256;
    int qa = vk_qx_index(wa->type), qc = vk_qx_index(wc->type);
    if (!d->int_dot || qa < 0 || qc < 0 || N1 % 256 || wc->ne[0] != N1 || (wb && (wb->type != wa->type ||
        wb->ne[0] != K || wb->ne[1] != N1)) || (wb && res))
        return err_set(ANVIL_ERR_UNSUPPORTED, "vk_qxr_once: no such products");
    anvil_status st = test_pipelines(b);
    if (st != ANVIL_OK) return st;
    int ka = vk_kernel_qx(wb ? VK_OP_MATVEC_SWIGLU : VK_OP_MATVEC, wa->type, true, 0),
        kc = vk_kernel_qx(VK_OP_MATVEC, wc->type, false, nw ? 2 : 1);
    if (!vk_pipeline_supported(b->d, &b->pl, ka) || !vk_pipeline_supported(b->d, &b->pl, kc)) return err_set(ANVIL_ERR_UNSUPPORTED, "vk_qxr_once: no pipelines");
    for (int i = 0; i < 3 && st == ANVIL_OK; i++)
        if (ws[i]) st = vk_upload_tensor(b, ws[i]);
    if (st != ANVIL_OK) return st;
    /* one host-visible buffer: ctl | x [Kq] | xq [Kq bytes] + xd [Kq / 32] | res [N1] | nw [N1] | y [N1]
     * | yq [2 N1 bytes] | z [N2] */
    VkDeviceSize f1 = (VkDeviceSize)N1 * 4, o[7];
    VkDeviceSize size = test_layout(7, (VkDeviceSize[7]){(VkDeviceSize)Kq * 4, Kq + Kq / 8, f1, f1, f1,
                                                          2 * (VkDeviceSize)N1, (VkDeviceSize)N2 * 4}, o);
    VkDeviceSize o_x = o[0], o_q = o[1], o_r = o[2], o_n = o[3], o_y = o[4], o_yq = o[5], o_z = o[6];
    struct vk_buffer buf = {0};
    if ((st = vk_buffer_create(d, size, VK_MEM_READBACK, "test qxr", &buf)) != ANVIL_OK) return st;
    uint8_t *m = buf.map;
    memset(m, 0, size);
    memcpy(m + o_x, x, (size_t)K * 4);
    if (res) memcpy(m + o_r, res, (size_t)N1 * 4);
    if (nw) memcpy(m + o_n, nw, (size_t)N1 * 4);
    struct pc_qx pq = {buf.addr + o_x, buf.addr + o_x, buf.addr, buf.addr + o_q, buf.addr + o_q + Kq, K, Kq, 0, eps};
    struct pc_qxt pa = {test_matvec_pc(b, wa, buf.addr, buf.addr + o_q, buf.addr + o_q + Kq, buf.addr + o_y, K, N1), 0, 0};
    if (wb) pa.m.w1 = vk_weight_addr(b, wb, false, false);
    if (res) pa.m.res = buf.addr + o_r;
    pa.m.flags = MV_ROUND | (res ? MV_RES : 0u) | (nw ? MV_ROUND_NW : 0u);
    pa.m.eps = eps;
    pa.xq = buf.addr + o_yq;
    pa.nw = nw ? buf.addr + o_n : pa.m.o0;
    struct pc_matvec pc = test_matvec_pc(b, wc, buf.addr, buf.addr + o_yq, buf.addr + o_yq + N1, buf.addr + o_z, N1, N2);
    pc.eps = eps;
    uint32_t nr = vk_matvec_rows(&b->pl, (enum vk_kernel)kc);
    struct test_dispatch ds[3] = {{K_QX, &pq, sizeof pq, (Kq + 1023) / 1024, 0, 0},
                                  {(enum vk_kernel)ka, &pa, sizeof pa, N1 / 8, 0, 0},
                                  {(enum vk_kernel)kc, &pc, sizeof pc, (N2 + nr - 1) / nr, 0, 0}};
    st = test_run(b, ds, 3, VK_NULL_HANDLE);
    if (st == ANVIL_OK) {
        memcpy(xq, m + o_q, Kq);
        memcpy(xd, m + o_q + Kq, (size_t)Kq / 8);
        memcpy(y, m + o_y, (size_t)N1 * 4);
        memcpy(yq, m + o_yq, (size_t)N1 * 2);
        memcpy(z, m + o_z, (size_t)N2 * 4);
    }
    vk_buffer_destroy(d, &buf);
    return st;
}

/* n floats from the host into the start of buffer to (waited for) */
static anvil_status upload_floats(struct vk_device *d, struct vk_buffer *to, const float *x, int n) {
    struct vk_uploader u;
    struct plain f = {(const uint8_t *)x, 0, 0};
    anvil_status st = vk_uploader_init(&u, d, (uint64_t)n * 4);
    if (st == ANVIL_OK) st = vk_upload(&u, to, 0, (size_t)n * 4, fill_plain, &f);
    anvil_status s2 = vk_uploader_finish(&u);
    return st == ANVIL_OK ? s2 : st;
}

anvil_status vk_sample_once(struct vk_backend *b, const float *logits, int V, const struct sampling_params *sp,
                            const int32_t *hist, int n_hist, int32_t draft, int32_t *out) {
    struct vk_device *d = b->d;
    if (V < 1 || n_hist < 1) return err_set(ANVIL_ERR_INVALID_ARG, "vk_sample_once: bad arguments");
    anvil_status st = test_pipelines(b);
    if (st != ANVIL_OK) return st;
    int n_ctx = n_hist + 1;
    uint32_t nwg = ((uint32_t)V + SAMPLE_CH - 1) / SAMPLE_CH;
    struct vk_buffer lg = {0}, ctl = {0}, scratch = {0};
    st = vk_buffer_create(d, (VkDeviceSize)V * 4, VK_MEM_DEVICE, "test logits", &lg);
    if (st == ANVIL_OK)
        st = vk_buffer_create(d, sizeof(struct vk_ctl) + (size_t)n_ctx * 12, VK_MEM_CONTROL, "test control", &ctl);
    if (st == ANVIL_OK)
        st = vk_buffer_create(d, SAMPLE_PART_BYTES(nwg) + SAMPLE_CNT_BYTES(nwg), VK_MEM_DEVICE, "test scratch",
                              &scratch);
    if (st == ANVIL_OK) st = upload_floats(d, &lg, logits, V);
    if (st != ANVIL_OK) goto done;
    volatile struct vk_ctl *c = ctl.map;
    memset(ctl.map, 0, ctl.size);
    c->n_ctx = (uint32_t)n_ctx;
    c->token = (uint32_t)hist[n_hist - 1];
    c->pos = (uint32_t)(n_hist - 1);
    c->budget = 1;
    for (int i = 0; i < n_hist - 1; i++) c->data[2 * n_ctx + i] = (uint32_t)hist[i];
    ctl_set_sampling(c, (uint32_t)V, sp);
    c->draft = draft >= 0 ? (uint32_t)draft + 1 : 0;
    struct pc_sample ps = {lg.addr, ctl.addr, scratch.addr, scratch.addr + SAMPLE_PART_BYTES(nwg), (uint32_t)V, nwg, 0};
    struct test_dispatch one = {K_SAMPLE, &ps, sizeof ps, nwg, 0, 0};
    st = test_run(b, &one, 1, scratch.buf);
    if (st == ANVIL_OK && c->n_out != 1)
        st = err_set(ANVIL_ERR_BACKEND, "vk_sample_once: the kernel chose no token (stop %u)", c->stop);
    if (st == ANVIL_OK) *out = (int32_t)c->data[n_ctx];
done:
    if (st != ANVIL_OK) vk_idle(d); /* nothing freed under an upload still running */
    vk_buffer_destroy(d, &lg);
    vk_buffer_destroy(d, &ctl);
    vk_buffer_destroy(d, &scratch);
    return st;
}

anvil_status vk_logprobs_once(struct vk_backend *b, const float *logits, int V, const int32_t *bias_ids,
                              const float *bias, int n_bias, int top, int32_t chosen, anvil_token_logprobs *out) {
    struct vk_device *d = b->d;
    if (V < 1 || n_bias < 0 || n_bias > (int)LP_MAX_BIAS || top < 0 || top > (int)LP_MAX_TOP)
        return err_set(ANVIL_ERR_INVALID_ARG, "vk_logprobs_once: bad arguments");
    anvil_status st = test_pipelines(b);
    if (st != ANVIL_OK) return st;
    uint32_t nwg = ((uint32_t)V + LP_CH - 1) / LP_CH;
    VkDeviceSize part = round_up((VkDeviceSize)nwg * LP_PART_WORDS * 4, ALIGN);
    struct vk_buffer lg = {0}, ctl = {0}, scratch = {0}, lpb = {0};
    st = vk_buffer_create(d, (VkDeviceSize)V * 4, VK_MEM_DEVICE, "test logits", &lg);
    if (st == ANVIL_OK) st = vk_buffer_create(d, sizeof(struct vk_ctl) + 12, VK_MEM_CONTROL, "test control", &ctl);
    if (st == ANVIL_OK) st = vk_buffer_create(d, part + ALIGN, VK_MEM_DEVICE, "test scratch", &scratch);
    if (st == ANVIL_OK)
        st = vk_buffer_create(d, (LP_BIAS_WORDS + (VkDeviceSize)LP_RING * LP_REC_WORDS) * 4, VK_MEM_CONTROL,
                              "test logprobs", &lpb);
    if (st == ANVIL_OK) st = upload_floats(d, &lg, logits, V);
    if (st != ANVIL_OK) goto done;
    volatile struct vk_ctl *c = ctl.map;
    memset(ctl.map, 0, ctl.size);
    memset(lpb.map, 0, lpb.size);
    c->n_ctx = 1;
    c->n_out = 1; /* the step generated `chosen` */
    c->data[1] = (uint32_t)chosen;
    c->lp_top = (uint32_t)top;
    c->n_bias = (uint32_t)n_bias;
    uint32_t *w = lpb.map;
    for (int i = 0; i < n_bias; i++) {
        w[2 * i] = (uint32_t)bias_ids[i];
        memcpy(&w[2 * i + 1], &bias[i], 4);
    }
    struct pc_logprobs pc = {lg.addr, ctl.addr, scratch.addr, scratch.addr + part, lpb.addr, (uint32_t)V, nwg};
    struct test_dispatch ds[2] = {{K_LOGIT_BIAS, &pc, sizeof pc, 1, 0, 0}, {K_LOGPROBS, &pc, sizeof pc, nwg, 0, 0}};
    st = test_run(b, ds, 2, scratch.buf);
    if (st == ANVIL_OK && c->lp_done != 1)
        st = err_set(ANVIL_ERR_BACKEND, "vk_logprobs_once: the kernel wrote no record");
    if (st == ANVIL_OK) {
        const uint32_t *rec = w + LP_BIAS_WORDS;
        out->token = (int32_t)rec[0];
        memcpy(&out->logprob, &rec[1], 4);
        out->n_top = (int)rec[2];
        for (int k = 0; k < out->n_top && k < (int)LP_MAX_TOP; k++) {
            out->top_token[k] = (int32_t)rec[4 + 2 * k];
            memcpy(&out->top_logprob[k], &rec[5 + 2 * k], 4);
        }
    }
done:
    if (st != ANVIL_OK) vk_idle(d); /* nothing freed under an upload still running */
    vk_buffer_destroy(d, &lg);
    vk_buffer_destroy(d, &ctl);
    vk_buffer_destroy(d, &scratch);
    vk_buffer_destroy(d, &lpb);
    return st;
}

anvil_status vk_qx_matvec_once(struct vk_backend *b, const struct tensor_info *w, const float *x,
                               const float *normw, float eps, float *out, int8_t *xq, float *xd, float *out_mega) {
    struct vk_device *d = b->d;
    int qxi = vk_qx_index(w->type);
    if (!d->int_dot || qxi < 0) return err_set(ANVIL_ERR_UNSUPPORTED, "vk_qx_matvec_once: no integer dot products for %s", dtype_name(w->type));
    anvil_status st = test_pipelines(b);
    if (st != ANVIL_OK) return st;
    int wt = mqx_wt(w->type);
    if (out_mega && (wt < 0 || !b->pl.mega_grid || !vk_pipeline_supported(b->d, &b->pl, K_MEGA_QX)))
        return err_set(ANVIL_ERR_UNSUPPORTED, "vk_qx_matvec_once: no persistent step for %s", dtype_name(w->type));
    if ((st = vk_upload_tensor(b, w)) != ANVIL_OK) return st;
    uint32_t K = (uint32_t)w->ne[0], N = (uint32_t)w->ne[1], Kq = (K + 255) / 256 * 256;
    /* one host-visible buffer: ctl | x [Kq] | normw [Kq] | xq [Kq bytes] + xd [Kq / 32] | out [N]
     * | out_mega [N] | the phase record | the counter */
    VkDeviceSize fk = (VkDeviceSize)Kq * 4, fn = (VkDeviceSize)N * 4, o[7];
    VkDeviceSize size = test_layout(7, (VkDeviceSize[7]){fk, fk, Kq + Kq / 8, fn, fn, sizeof(struct vk_phase),
                                                          MEGA_CNT_BYTES}, o);
    VkDeviceSize o_x = o[0], o_n = o[1], o_q = o[2], o_o = o[3], o_m = o[4], o_p = o[5], o_c = o[6];
    struct vk_buffer buf = {0};
    if ((st = vk_buffer_create(d, size, VK_MEM_READBACK, "test qx", &buf)) != ANVIL_OK) return st;
    uint8_t *m = buf.map;
    memset(m, 0, size);
    memcpy(m + o_x, x, (size_t)K * 4);
    if (normw) memcpy(m + o_n, normw, (size_t)K * 4);
    struct pc_qx pq = {buf.addr + o_x, buf.addr + o_n, buf.addr, buf.addr + o_q, buf.addr + o_q + Kq, K, Kq,
                       normw ? 1u : 0u, eps};
    struct pc_matvec pc = test_matvec_pc(b, w, buf.addr, buf.addr + o_q, buf.addr + o_q + Kq, buf.addr + o_o, K, N);
    enum vk_kernel kq = vk_kernel_qx(VK_OP_MATVEC, w->type, false, 0);
    uint32_t nr = vk_matvec_rows(&b->pl, kq);
    /* the persistent step's phase: the product of the float input */
    struct vk_phase *ph = (struct vk_phase *)(m + o_p);
    struct pc_matvec pm = pc;
    pm.x = buf.addr + o_x;
    pm.normw = normw ? buf.addr + o_n : pm.x;
    pm.flags = normw ? MV_NORM : 0u;
    pm.eps = eps;
    pm.o0 = pm.o1 = pm.o2 = pm.res = buf.addr + o_m;
    *ph = (struct vk_phase){.kind = 1, .tasks = N, .wt = (uint32_t)wt};
    memcpy(ph->push, &pm, sizeof pm);
    struct pc_mega pg = {buf.addr + o_p, buf.addr, buf.addr + o_c, 0, 1};
    struct test_dispatch ds[3] = {{K_QX, &pq, sizeof pq, (Kq + 1023) / 1024, 0, 0},
                                  {kq, &pc, sizeof pc, (N + nr - 1) / nr, 0, 0},
                                  {K_MEGA_QX, &pg, sizeof pg, b->pl.mega_grid, 0, 0}};
    st = test_run(b, ds, out_mega ? 3 : 2, VK_NULL_HANDLE);
    if (st == ANVIL_OK) {
        memcpy(out, m + o_o, (size_t)N * 4);
        if (out_mega) memcpy(out_mega, m + o_m, (size_t)N * 4);
        memcpy(xq, m + o_q, Kq);
        memcpy(xd, m + o_q + Kq, (size_t)Kq / 8);
    }
    vk_buffer_destroy(d, &buf);
    return st;
}

anvil_status vk_topk_once(struct vk_backend *b, const float *logits, int E, int k, bool norm, int32_t *ids,
                          float *weights) {
    struct vk_device *d = b->d;
    if (E < 1 || E > 1024 || k < 1 || k > 64 || k > E)
        return err_set(ANVIL_ERR_INVALID_ARG, "vk_topk_once: %d of %d experts", k, E);
    anvil_status st = test_pipelines(b);
    if (st != ANVIL_OK) return st;
    /* one host-visible buffer: ctl | logits [E] | routing [128] */
    VkDeviceSize o[2], size = test_layout(2, (VkDeviceSize[2]){(VkDeviceSize)E * 4, 128 * 4}, o);
    VkDeviceSize o_l = o[0], o_r = o[1];
    struct vk_buffer buf = {0};
    if ((st = vk_buffer_create(d, size, VK_MEM_READBACK, "test top-k", &buf)) != ANVIL_OK) return st;
    uint8_t *m = buf.map;
    memset(m, 0, buf.size);
    memcpy(m + o_l, logits, (size_t)E * 4);
    struct pc_topk pt = {buf.addr + o_l, buf.addr + o_r, buf.addr, (uint32_t)E, (uint32_t)k, norm ? 1u : 0u, 1};
    struct test_dispatch one = {K_MOE_TOPK, &pt, sizeof pt, 1, 0, 0};
    st = test_run(b, &one, 1, VK_NULL_HANDLE);
    if (st == ANVIL_OK) {
        const float *r = (const float *)(m + o_r);
        for (int i = 0; i < k; i++) {
            memcpy(&ids[i], &r[i], 4);
            weights[i] = r[64 + i];
        }
    }
    vk_buffer_destroy(d, &buf);
    return st;
}

anvil_status vk_pick_once(struct vk_backend *b, const float *logits, int E, int k, bool norm, int32_t *ids,
                          float *weights, int32_t *picked) {
    struct vk_device *d = b->d;
    int sg = (int)d->subgroup_size;
    if (E < 1 || E > 512 || E > 32 * sg || k < 1 || k > sg || k > E)
        return err_set(ANVIL_ERR_INVALID_ARG, "vk_pick_once: %d of %d experts (subgroups of %d)", k, E, sg);
    anvil_status st = test_pipelines(b);
    if (st != ANVIL_OK) return st;
    /* ctl | logits [E] | routing [132] | x [8] | gate rows [E, 8] | up rows [E, 8] | outputs [k, 4] */
    VkDeviceSize o[6], size = test_layout(6, (VkDeviceSize[6]){(VkDeviceSize)E * 4, 132 * 4, 32, (VkDeviceSize)E * 32,
                                                                (VkDeviceSize)E * 32, (VkDeviceSize)k * 16}, o);
    struct vk_buffer buf = {0};
    if ((st = vk_buffer_create(d, size, VK_MEM_READBACK, "test pick", &buf)) != ANVIL_OK) return st;
    uint8_t *m = buf.map;
    memset(m, 0, buf.size);
    memcpy(m + o[0], logits, (size_t)E * 4);
    float *x = (float *)(m + o[2]), *wg = (float *)(m + o[3]), *wu = (float *)(m + o[4]);
    x[0] = 1;
    for (int e = 0; e < E; e++) { /* expert e's output: silu(20) * (e + 1) */
        wg[e * 8] = 20;
        wu[e * 8] = (float)(e + 1);
    }
    struct pc_matvec pc = {0};
    pc.x = pc.normw = buf.addr + o[2];
    pc.ctl = buf.addr;
    pc.w0 = pc.w2 = buf.addr + o[3];
    pc.w1 = buf.addr + o[4];
    pc.o0 = pc.res = buf.addr + o[5];
    pc.o1 = buf.addr + o[1];
    pc.o2 = buf.addr + o[0];
    pc.Kp8 = 1;
    pc.K = 8;
    pc.rows0 = 1;
    pc.rows1 = (uint32_t)k;
    pc.rows2 = 4;
    pc.flags = MV_TOPK;
    pc.route_k = (uint32_t)k | (norm ? 1u << 16 : 0) | (uint32_t)E << 17;
    struct test_dispatch one = {K_MOE_GU_F32, &pc, sizeof pc, 1, (uint32_t)k, 0};
    st = test_run(b, &one, 1, VK_NULL_HANDLE);
    if (st == ANVIL_OK) {
        const float *r = (const float *)(m + o[1]), *y = (const float *)(m + o[5]);
        for (int i = 0; i < k; i++) {
            memcpy(&ids[i], &r[i], 4);
            weights[i] = r[64 + i];
            picked[i] = (int32_t)lroundf(y[i * 4] / 20.0f) - 1;
        }
    }
    vk_buffer_destroy(d, &buf);
    return st;
}

anvil_status vk_q8_rows_once(struct vk_backend *b, const float *x, const float *up, int T, int K, int8_t *q, float *ds) {
    if (T < 1 || K < 32 || K % 32 || T > 4096 || K > 65536)
        return err_set(ANVIL_ERR_INVALID_ARG, "vk_q8_rows_once: %d rows of %d", T, K);
    anvil_status st = test_pipelines(b);
    if (st != ANVIL_OK) return st;
    uint32_t R = up ? (uint32_t)T : ((uint32_t)T + 15) / 16 * 16, n = (uint32_t)T * (uint32_t)K;
    /* x, up, the lists (expert 0's count, its entries 0 .. T - 1), aux (offsets 0, R; the rows'
     * entries), row scales, out (R rows of K int8s, then their blocks' pairs), prm */
    VkDeviceSize o[7], bytes[7] = {(VkDeviceSize)n * 4, (VkDeviceSize)n * 4, (VkDeviceSize)(1 + T) * 4,
                                   (VkDeviceSize)(2 + R + T) * 4, (VkDeviceSize)R * 4,
                                   (VkDeviceSize)R * (VkDeviceSize)K * 5 / 4, 64};
    VkDeviceSize size = test_layout(7, bytes, o);
    struct vk_buffer buf = {0};
    if ((st = vk_buffer_create(b->d, size, VK_MEM_READBACK, "test q8 rows", &buf)) != ANVIL_OK) return st;
    uint8_t *m = buf.map;
    memset(m, 0, buf.size);
    memcpy(m + o[0], x, (size_t)n * 4);
    if (up) memcpy(m + o[1], up, (size_t)n * 4);
    uint32_t *lists = (uint32_t *)(m + o[2]), *aux = (uint32_t *)(m + o[3]);
    lists[0] = (uint32_t)T;
    for (int t = 0; t < T; t++) lists[1 + t] = (uint32_t)t;
    aux[0] = 0, aux[1] = R;
    uint64_t a = buf.addr;
    struct pc_moe_rows mr = {a + o[2], a + o[6], a + o[0], a + o[5], a + o[3], 1, 1, (uint32_t)T, (uint32_t)K, 16, R,
                             a + o[4], MOE_ROWS_Q8};
    struct pc_rows sw = {a + o[0], a + o[1], a + o[6], a + o[0], a + o[6], (uint32_t)K, R, 0, 0, 0, ROWS_Q8, a + o[5],
                         a + o[6], a + o[6], 0};
    struct test_dispatch one = up ? (struct test_dispatch){K_ROWS_SWIGLU, &sw, sizeof sw, R, 0, 0}
                                  : (struct test_dispatch){K_MOE_GATHER, &mr, sizeof mr, R, 0, 0};
    st = test_run(b, &one, 1, VK_NULL_HANDLE);
    if (st == ANVIL_OK) {
        memcpy(q, m + o[5], (size_t)n);
        memcpy(ds, m + o[5] + (VkDeviceSize)R * (VkDeviceSize)K, (size_t)n / 32 * 8);
    }
    vk_buffer_destroy(b->d, &buf);
    return st;
}

anvil_status vk_moe_sum_once(struct vk_backend *b, int T, int k, int E, int C, int bm, const int32_t *ids, const float *w,
                             const float *y, bool rsum, float *out) {
    if (T < 1 || k < 1 || k > 64 || E < k || E > 1024 || C < 4 || C % 4 || (bm != 16 && bm != 32) || T > 4096)
        return err_set(ANVIL_ERR_INVALID_ARG, "vk_moe_sum_once: T %d k %d E %d C %d bm %d", T, k, E, C, bm);
    for (int i = 0; i < T * k; i++)
        if (ids[i] < 0 || ids[i] >= E) return err_set(ANVIL_ERR_INVALID_ARG, "vk_moe_sum_once: expert %d", ids[i]);
    anvil_status st = test_pipelines(b);
    if (st != ANVIL_OK) return st;
    uint32_t n = (uint32_t)(T * k), R = (n + (uint32_t)E * (bm - 1) + bm - 1) / bm * bm;
    /* lists (counts, entries), route, aux (offsets, map, inverse), x and its gathered float16
     * rows with their scales, the down's rows, slots, out, prm */
    VkDeviceSize o[10], bytes[10] = {((VkDeviceSize)E + (VkDeviceSize)E * T) * 4, (VkDeviceSize)T * 128 * 4,
                                     ((VkDeviceSize)E + 1 + R + n) * 4, (VkDeviceSize)T * C * 4, (VkDeviceSize)R * C * 2,
                                     (VkDeviceSize)R * 4, (VkDeviceSize)R * C * 4, (VkDeviceSize)n * C * 4,
                                     (VkDeviceSize)T * C * 4, 64};
    VkDeviceSize size = test_layout(10, bytes, o);
    struct vk_buffer buf = {0};
    if ((st = vk_buffer_create(b->d, size, VK_MEM_READBACK, "test moe sum", &buf)) != ANVIL_OK) return st;
    uint8_t *m = buf.map;
    memset(m, 0, buf.size);
    uint32_t *lists = (uint32_t *)(m + o[0]);
    float *route = (float *)(m + o[1]), *dc = (float *)(m + o[6]);
    /* each expert's entries in order, as moe_topk.comp MODE 2 lists them; the rows the gather
     * will give them (offsets of counts rounded up to bm) */
    uint32_t *offs = calloc((size_t)E + 1, 4);
    if (!offs) {
        vk_buffer_destroy(b->d, &buf);
        return err_set(ANVIL_ERR_NOMEM, "vk_moe_sum_once");
    }
    for (uint32_t en = 0; en < n; en++) {
        uint32_t e = (uint32_t)ids[en];
        lists[E + e * T + lists[e]++] = en;
        route[(en / k) * 128 + en % k] = (float)e;
        route[(en / k) * 128 + 64 + en % k] = w[en];
    }
    for (int e = 0; e < E; e++) offs[e + 1] = offs[e] + (lists[e] + bm - 1) / bm * bm;
    for (size_t i = 0; i < (size_t)R * C; i++) dc[i] = NAN; /* padding rows: never read */
    for (int e = 0; e < E; e++)
        for (uint32_t i = 0; i < lists[e]; i++)
            memcpy(dc + (size_t)(offs[e] + i) * C, y + (size_t)lists[E + e * T + i] * C, (size_t)C * 4);
    free(offs);
    uint64_t a = buf.addr;
    struct pc_moe_rows mr = {a + o[0], a + o[1], a + o[3], a + o[4], a + o[2], (uint32_t)E, (uint32_t)k, (uint32_t)T,
                             (uint32_t)C, (uint32_t)bm, R, a + o[5], 0};
    struct pc_moe_rows sc = {a + o[0], a + o[1], a + o[6], a + o[7], a + o[2], (uint32_t)E, (uint32_t)k, (uint32_t)T,
                             (uint32_t)C, (uint32_t)bm, R, 0, 0};
    struct pc_mm sum = {a + o[7], a + o[9], a + o[8], a + o[9], a + o[9], (uint32_t)T, 0, (uint32_t)C, 0, 0, a + o[9],
                        0, 0, (uint32_t)E, (uint32_t)k, 0};
    if (rsum) {
        sum.x = a + o[6];
        sum.flags = MM_ROWS;
        sum.lists = a + o[2] + ((VkDeviceSize)E + 1 + R) * 4;
        sum.route = a + o[1];
    }
    uint32_t nsum = ((uint32_t)(T * C) / (rsum ? 4u : 1u) + 255) / 256;
    struct test_dispatch ds[4] = {{K_MOE_OFFS, &mr, sizeof mr, 1, 0, 0}, {K_MOE_GATHER, &mr, sizeof mr, R, 0, 0},
                                  {K_MOE_SCATTER, &sc, sizeof sc, R, 0, 0}, {K_MM_REDUCE, &sum, sizeof sum, nsum, 0, 0}};
    if (rsum) ds[2] = ds[3];
    st = test_run(b, ds, rsum ? 3 : 4, VK_NULL_HANDLE);
    if (st == ANVIL_OK) memcpy(out, m + o[8], (size_t)T * C * 4);
    vk_buffer_destroy(b->d, &buf);
    return st;
}

anvil_status vk_f16_once(struct vk_backend *b, const float *x, int n, uint16_t *out) {
    if (n < 8 || n % 8) return err_set(ANVIL_ERR_INVALID_ARG, "vk_f16_once: %d floats", n);
    anvil_status st = test_pipelines(b);
    if (st != ANVIL_OK) return st;
    VkDeviceSize o[2], size = test_layout(2, (VkDeviceSize[2]){(VkDeviceSize)n * 4, (VkDeviceSize)n * 2}, o);
    struct vk_buffer buf = {0};
    if ((st = vk_buffer_create(b->d, size, VK_MEM_READBACK, "test float16", &buf)) != ANVIL_OK) return st;
    uint8_t *m = buf.map;
    memset(m, 0, buf.size);
    memcpy(m + o[0], x, (size_t)n * 4);
    /* one row of n floats: n / 8 units of 8 */
    struct pc_dq pd = {buf.addr + o[0], buf.addr + o[1], 0, 1, (uint32_t)n / 8, (uint32_t)n};
    struct test_dispatch one = {K_DQ_F32, &pd, sizeof pd, ((uint32_t)n / 8 + 255) / 256, 0, 0};
    st = test_run(b, &one, 1, VK_NULL_HANDLE);
    if (st == ANVIL_OK) memcpy(out, m + o[1], (size_t)n * 2);
    vk_buffer_destroy(b->d, &buf);
    return st;
}

anvil_status vk_vit_attention_once(struct vk_backend *b, const float *q, const float *k, const float *v, int N, int H,
                                   int D, int flash, float *out) {
    if (N < 1 || H < 1 || D < 4 || D % 4 || D > 256)
        return err_set(ANVIL_ERR_INVALID_ARG, "vk_vit_attention_once: %d x %d heads of %d", N, H, D);
    anvil_status st = test_pipelines(b);
    if (st != ANVIL_OK) return st;
    int was = b->d->tune.vk_vit_flash;
    b->d->tune.vk_vit_flash = flash;
    enum vk_kernel ker = vk_vit_attention_kernel(b, (uint32_t)D);
    b->d->tune.vk_vit_flash = was;
    if (flash && ker == K_VIT_ATTN)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vk_vit_attention_once: no vit_flash pipeline for heads of %d", D);
    VkDeviceSize n = (VkDeviceSize)N * H * D * 4, o[4];
    VkDeviceSize size = test_layout(4, (VkDeviceSize[4]){n, n, n, n}, o);
    struct vk_buffer buf = {0};
    if ((st = vk_buffer_create(b->d, size, VK_MEM_READBACK, "test vision attention", &buf)) != ANVIL_OK) return st;
    uint8_t *m = buf.map;
    memset(m, 0, buf.size);
    memcpy(m + o[0], q, n);
    memcpy(m + o[1], k, n);
    memcpy(m + o[2], v, n);
    struct pc_vit pc = {.a = buf.addr + o[0], .b = buf.addr + o[1], .c = buf.addr + o[2], .d = buf.addr + o[2],
                        .out_ = buf.addr + o[3], .e = buf.addr + o[3], .n = (uint32_t)(H * D), .rows = (uint32_t)N,
                        .H = (uint32_t)H, .D = (uint32_t)D, .scale = 1.0f / sqrtf((float)D)};
    /* (prefill/vit.c's grids) */
    struct test_dispatch one = {ker, &pc, sizeof pc, (uint32_t)H, (uint32_t)(flash ? (N + 63) / 64 : (N + 7) / 8), 0};
    st = test_run(b, &one, 1, VK_NULL_HANDLE);
    if (st == ANVIL_OK) memcpy(out, m + o[3], n);
    vk_buffer_destroy(b->d, &buf);
    return st;
}

/* The vision attention's tests: q, k and v as float16 rows at o[0..2], the output at o[3]. */
static void stage_qkv(const struct vk_buffer *buf, const VkDeviceSize *o, VkDeviceSize n, const float *q,
                      const float *k, const float *v, struct vit_att *a) {
    uint8_t *m = buf->map;
    memset(m, 0, buf->size);
    const float *in[3] = {q, k, v};
    for (int i = 0; i < 3; i++)
        for (VkDeviceSize j = 0; j < n; j++) ((uint16_t *)(m + o[i]))[j] = f32_to_f16(in[i][j]);
    a->q = buf->addr + o[0];
    a->k = buf->addr + o[1];
    a->v = buf->addr + o[2];
    a->out = buf->addr + o[3];
}

anvil_status vk_vit_attention_products(struct vk_backend *b, const float *q, const float *k, const float *v, int N,
                                       int H, int D, bool s16, uint64_t budget, float *out) {
    if (N < 1 || N % 4 || H < 1 || D < 4 || D % 4 || D > 256)
        return err_set(ANVIL_ERR_INVALID_ARG, "vk_vit_attention_products: %d x %d heads of %d", N, H, D);
    anvil_status st = test_pipelines(b);
    if (st != ANVIL_OK) return st;
    struct vit_att a = {.N = (uint32_t)N, .H = (uint32_t)H, .D = (uint32_t)D, .scale = 1.0f / sqrtf((float)D),
                        .s16 = s16};
    int was = b->d->tune.vk_vit_flash;
    b->d->tune.vk_vit_flash = 5;
    a.mm = vk_vit_products(b);
    vk_vit_att_kernels(b, &a);
    b->d->tune.vk_vit_flash = was;
    uint32_t hc, R;
    vk_vit_att_chunk(a.N, a.H, budget, &hc, &R);
    VkDeviceSize n = (VkDeviceSize)N * H * D, e = (VkDeviceSize)hc * R * N, o[6];
    VkDeviceSize size = test_layout(6, (VkDeviceSize[6]){2 * n, 2 * n, 2 * n, 4 * n, (s16 ? 2 : 4) * e, 2 * e}, o);
    struct vk_buffer buf = {0};
    if ((st = vk_buffer_create(b->d, size, VK_MEM_READBACK, "test vision attention", &buf)) != ANVIL_OK) return st;
    uint8_t *m = buf.map;
    stage_qkv(&buf, o, n, q, k, v, &a);
    a.s = buf.addr + o[4];
    a.p = buf.addr + o[5];
    /* (prefill/vit.c's chunks, each run alone: they reuse the scores) */
    for (uint32_t h0 = 0; h0 < a.H && st == ANVIL_OK; h0 += hc)
        for (uint32_t r0 = 0; r0 < a.N && st == ANVIL_OK; r0 += R) {
            struct vit_att_ops c;
            vk_vit_att_ops(&a, h0, MIN(hc, a.H - h0), r0, MIN(R, a.N - r0), &c);
            struct test_dispatch ds[3] = {{a.mm, &c.s, sizeof c.s, c.gs[0], c.gs[1], c.gs[2]},
                                          {K_VIT_SOFTMAX, &c.sm, sizeof c.sm, c.gsm, 0, 0},
                                          {a.mo, &c.o, sizeof c.o, c.go[0], c.go[1], c.go[2]}};
            st = test_run(b, ds, 3, VK_NULL_HANDLE);
        }
    if (st == ANVIL_OK) memcpy(out, m + o[3], 4 * n);
    vk_buffer_destroy(b->d, &buf);
    return st;
}

anvil_status vk_vit_attention_fa(struct vk_backend *b, const float *q, const float *k, const float *v, int N, int H,
                                 int D, int variant, float *out) {
    if (N < 1 || H < 1 || D < 4 || D % 4 || D > 256 || variant < 7 || variant > 9)
        return err_set(ANVIL_ERR_INVALID_ARG, "vk_vit_attention_fa: %d x %d heads of %d, variant %d", N, H, D, variant);
    anvil_status st = test_pipelines(b);
    if (st != ANVIL_OK) return st;
    struct vit_att a = {.N = (uint32_t)N, .H = (uint32_t)H, .D = (uint32_t)D, .whole = true}; /* (where N allows) */
    int was = b->d->tune.vk_vit_flash;
    b->d->tune.vk_vit_flash = variant;
    a.fa = vk_vit_fa(b, a.D);
    b->d->tune.vk_vit_flash = was;
    if (a.fa == K_NONE)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vk_vit_attention_fa: no workgroup matrices with row reductions");
    VkDeviceSize n = (VkDeviceSize)N * H * D, o[4];
    VkDeviceSize size = test_layout(4, (VkDeviceSize[4]){2 * n, 2 * n, 2 * n, 4 * n}, o);
    struct vk_buffer buf = {0};
    if ((st = vk_buffer_create(b->d, size, VK_MEM_READBACK, "test vision attention", &buf)) != ANVIL_OK) return st;
    uint8_t *m = buf.map;
    stage_qkv(&buf, o, n, q, k, v, &a);
    struct pc_vitmm pc = vk_vit_fa_pc(&a);
    uint32_t br = vk_vit_fa_rows(a.fa);
    struct test_dispatch ds[1] = {{a.fa, &pc, sizeof pc, (a.N + br - 1) / br, a.H, 0}};
    st = test_run(b, ds, 1, VK_NULL_HANDLE);
    if (st == ANVIL_OK) memcpy(out, m + o[3], 4 * n);
    vk_buffer_destroy(b->d, &buf);
    return st;
}
