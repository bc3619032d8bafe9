/* The end of a decode step, shared by argmax.comp and sample.comp: run by one thread after
 * every other reader of the control block in the dispatch. The step's token is now in the
 * cache at pos: it is recorded in the history and the position advances. The next input is
 * the next fed token, or else `chosen`, which is also appended to the generated tokens.
 * Stops on the budget, a stop token, or a full context; every later step then does nothing. */
void step_end(Ctl ctl, bool feeding, bool done, uint chosen) {
    uint n_ctx = ctl.n_ctx, fi = ctl.feed_idx, n_out = ctl.n_out;
    ctl.steps += 1u;
    uint pos = ctl.pos;
    ctl.data[2u * n_ctx + pos] = ctl.token;
    pos += 1u;
    ctl.pos = pos;
    if (feeding) {
        ctl.token = ctl.data[fi];
        ctl.feed_idx = fi + 1u;
        if (pos >= n_ctx) ctl.stop = CTL_STOP_CONTEXT;
        return;
    }
    if (done) {
        ctl.stop = CTL_STOP_BUDGET;
        return;
    }
    for (uint e = 0; e < ctl.n_eos; e++)
        if (ctl.eos[e] == chosen) {
            ctl.eos_hit = chosen;
            ctl.stop = CTL_STOP_EOS;
            return;
        }
    ctl.data[n_ctx + n_out] = chosen;
    ctl.n_out = n_out + 1u;
    ctl.token = chosen;
    if (pos >= n_ctx) ctl.stop = CTL_STOP_CONTEXT;
}
