/* The router of a mixture of experts, shared by moe_topk.comp and matvec.comp (ROUTE): from
 * the E logits the caller put in lg (NaN as -inf, a total order), p = softmax in f32; the k
 * experts of highest logit (ties: the lower id) in rank order, each expert's rank counted as
 * the experts above it; their p divided by the sum of theirs when norm. Writes the routing
 * buffer the expert kernels read: ids at route[ro + 0 .. k) (uint bits), weights at
 * route[ro + 64 ..]. Called by the whole workgroup, after it filled lg. */
const uint EMAX = 1024u;
shared float lg[EMAX];
shared float red_v[64]; /* per subgroup (subgroups of 4 or more) */
shared uint chosen[64];
shared float mx_s;

void route_topk(uint E, uint k, bool norm, Floats route, uint ro) {
    uint t = gl_LocalInvocationID.x, sg = gl_SubgroupID, nt = gl_WorkGroupSize.x;
    barrier();
    float mx = -1.0 / 0.0;
    for (uint i = t; i < E; i += nt) mx = max(mx, lg[i]);
    mx = subgroupMax(mx);
    if (subgroupElect()) red_v[sg] = mx;
    barrier();
    if (t == 0u) {
        float m = -1.0 / 0.0;
        for (uint s = 0; s < gl_NumSubgroups; s++) m = max(m, red_v[s]);
        mx_s = m;
    }
    barrier();
    float sum = 0.0;
    for (uint i = t; i < E; i += nt) {
        float v = lg[i];
        sum += exp(v - mx_s);
        uint rank = 0u;
        for (uint e = 0u; e < E; e++) {
            float u = lg[e];
            rank += u > v || (u == v && e < i) ? 1u : 0u;
        }
        if (rank < k) chosen[rank] = i;
    }
    sum = subgroupAdd(sum);
    if (subgroupElect()) red_v[sg] = sum;
    barrier();
    if (t == 0u) {
        float s2 = 0.0;
        for (uint s = 0; s < gl_NumSubgroups; s++) s2 += red_v[s];
        float tot = 0.0;
        for (uint r = 0; r < k; r++) tot += exp(lg[chosen[r]] - mx_s) / s2;
        for (uint r = 0; r < k; r++) {
            float p = exp(lg[chosen[r]] - mx_s) / s2;
            route.v[ro + r] = uintBitsToFloat(chosen[r]);
            route.v[ro + 64u + r] = norm ? p / tot : p;
        }
    }
}
