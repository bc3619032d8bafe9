/* server: counters and their Prometheus text exposition (format version 0.0.4). */
#include "server_impl.h"

static const char *const endpoint_names[EP_COUNT] = {
    "/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics",
    "/tokenize", "/detokenize", "/props", "/apply-template", "/v1/embeddings", "other",
};

/* The statuses the server answers with; anything else is counted as the last. */
static const int statuses[METRICS_STATUSES] = {200, 204, 400, 401, 404, 405, 408,
                                               413, 429, 500, 503, 504, 0};

void metrics_init(struct metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    m->start_time = time_now();
}

void metrics_free(struct metrics *m) { pthread_mutex_destroy(&m->mu); }

void metrics_request(struct metrics *m, enum endpoint ep, int status) {
    int k = METRICS_STATUSES - 1;
    for (int i = 0; i < METRICS_STATUSES - 1; i++)
        if (statuses[i] == status) k = i;
    pthread_mutex_lock(&m->mu);
    m->requests[ep][k]++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_generation(struct metrics *m, int n_prompt, int n_cached, int n_generated,
                        double prompt_s, double generate_s, bool cancelled) {
    pthread_mutex_lock(&m->mu);
    m->generations++;
    m->cancelled += cancelled;
    m->prompt_tokens += (uint64_t)n_prompt;
    m->cached_tokens += (uint64_t)n_cached;
    m->generated_tokens += (uint64_t)n_generated;
    m->prompt_seconds += prompt_s;
    m->generate_seconds += generate_s;
    if (prompt_s > 0 && n_prompt > n_cached) m->last_prompt_tps = (n_prompt - n_cached) / prompt_s;
    if (generate_s > 0 && n_generated > 0) m->last_generate_tps = n_generated / generate_s;
    pthread_mutex_unlock(&m->mu);
}

void metrics_spec(struct metrics *m, int drafted, int accepted, int steps) {
    pthread_mutex_lock(&m->mu);
    m->spec_drafted += (uint64_t)drafted;
    m->spec_accepted += (uint64_t)accepted;
    m->spec_steps += (uint64_t)steps;
    pthread_mutex_unlock(&m->mu);
}

static void metric(struct sbuf *o, const char *name, const char *type, const char *help) {
    sbuf_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void metrics_render(struct metrics *m, const struct metrics_state *now, struct sbuf *o) {
    int queue_depth = now->queue_depth, running = now->running;
    bool ready = now->ready;
    pthread_mutex_lock(&m->mu);
    metric(o, "anvil_requests_total", "counter", "HTTP requests answered, by endpoint and status.");
    uint64_t errors = 0;
    for (int e = 0; e < EP_COUNT; e++)
        for (int k = 0; k < METRICS_STATUSES; k++) {
            if (!m->requests[e][k]) continue;
            if (k == METRICS_STATUSES - 1)
                sbuf_printf(o, "anvil_requests_total{endpoint=\"%s\",status=\"other\"} %llu\n",
                            endpoint_names[e], (unsigned long long)m->requests[e][k]);
            else
                sbuf_printf(o, "anvil_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n",
                            endpoint_names[e], statuses[k], (unsigned long long)m->requests[e][k]);
            if (k == METRICS_STATUSES - 1 || statuses[k] >= 400) errors += m->requests[e][k];
        }
    metric(o, "anvil_request_errors_total", "counter", "HTTP requests answered with a 4xx or 5xx status.");
    sbuf_printf(o, "anvil_request_errors_total %llu\n", (unsigned long long)errors);
    metric(o, "anvil_generations_total", "counter", "Generation requests run by the worker.");
    sbuf_printf(o, "anvil_generations_total %llu\n", (unsigned long long)m->generations);
    metric(o, "anvil_generations_cancelled_total", "counter", "Generations stopped because the client went away.");
    sbuf_printf(o, "anvil_generations_cancelled_total %llu\n", (unsigned long long)m->cancelled);
    metric(o, "anvil_prompt_tokens_total", "counter", "Prompt tokens of generation requests.");
    sbuf_printf(o, "anvil_prompt_tokens_total %llu\n", (unsigned long long)m->prompt_tokens);
    metric(o, "anvil_prompt_tokens_cached_total", "counter", "Prompt tokens reused from the cache instead of prefilled.");
    sbuf_printf(o, "anvil_prompt_tokens_cached_total %llu\n", (unsigned long long)m->cached_tokens);
    metric(o, "anvil_generated_tokens_total", "counter", "Tokens generated.");
    sbuf_printf(o, "anvil_generated_tokens_total %llu\n", (unsigned long long)m->generated_tokens);
    metric(o, "anvil_prompt_seconds_total", "counter", "Time spent prefilling prompts.");
    sbuf_printf(o, "anvil_prompt_seconds_total %.6f\n", m->prompt_seconds);
    metric(o, "anvil_generate_seconds_total", "counter", "Time spent generating tokens.");
    sbuf_printf(o, "anvil_generate_seconds_total %.6f\n", m->generate_seconds);
    metric(o, "anvil_prompt_tokens_per_second", "gauge", "Prefill speed of the last request.");
    sbuf_printf(o, "anvil_prompt_tokens_per_second %.3f\n", m->last_prompt_tps);
    metric(o, "anvil_generate_tokens_per_second", "gauge", "Generation speed of the last request.");
    sbuf_printf(o, "anvil_generate_tokens_per_second %.3f\n", m->last_generate_tps);
    metric(o, "anvil_spec_drafted_tokens_total", "counter", "Tokens drafted by speculative decoding (--spec).");
    sbuf_printf(o, "anvil_spec_drafted_tokens_total %llu\n", (unsigned long long)m->spec_drafted);
    metric(o, "anvil_spec_accepted_tokens_total", "counter",
           "Drafted tokens accepted (--spec): over anvil_spec_drafted_tokens_total, the acceptance rate.");
    sbuf_printf(o, "anvil_spec_accepted_tokens_total %llu\n", (unsigned long long)m->spec_accepted);
    metric(o, "anvil_spec_steps_total", "counter",
           "Speculative verify steps (--spec): each yields its accepted drafts plus one token.");
    sbuf_printf(o, "anvil_spec_steps_total %llu\n", (unsigned long long)m->spec_steps);
    double uptime = time_now() - m->start_time;
    pthread_mutex_unlock(&m->mu);
    metric(o, "anvil_queue_depth", "gauge", "Generation requests waiting for their turn.");
    sbuf_printf(o, "anvil_queue_depth %d\n", queue_depth);
    metric(o, "anvil_requests_running", "gauge", "Generation requests running (at most --parallel).");
    sbuf_printf(o, "anvil_requests_running %d\n", running);
    metric(o, "anvil_parallel", "gauge", "Requests that may generate at once (--parallel).");
    sbuf_printf(o, "anvil_parallel %d\n", now->parallel);
    metric(o, "anvil_batch_size", "gauge", "Sequences in the batch's last step (--parallel > 1).");
    sbuf_printf(o, "anvil_batch_size %d\n", now->batch_size);
    metric(o, "anvil_batch_steps_total", "counter", "Steps the batch ran (--parallel > 1).");
    sbuf_printf(o, "anvil_batch_steps_total %llu\n", (unsigned long long)now->batch_steps);
    metric(o, "anvil_batch_step_sequences_total", "counter",
           "Sequences in the batch's steps, summed over the steps: over anvil_batch_steps_total, "
           "the mean batch size.");
    sbuf_printf(o, "anvil_batch_step_sequences_total %llu\n", (unsigned long long)now->batch_step_seqs);
    metric(o, "anvil_kv_blocks_used", "gauge", "The batch's cache blocks in use (--parallel > 1).");
    sbuf_printf(o, "anvil_kv_blocks_used %d\n", now->kv_used);
    metric(o, "anvil_kv_blocks_total", "gauge", "The batch's cache blocks (--parallel > 1).");
    sbuf_printf(o, "anvil_kv_blocks_total %d\n", now->kv_total);
    metric(o, "anvil_kv_blocks_cached", "gauge",
           "The batch's cache blocks no request holds that the prefix cache keeps for later prompts "
           "(--parallel > 1; free for any request that needs room).");
    sbuf_printf(o, "anvil_kv_blocks_cached %d\n", now->kv_cached);
    metric(o, "anvil_model_loaded", "gauge", "1 once the model is loaded and requests are served.");
    sbuf_printf(o, "anvil_model_loaded %d\n", ready ? 1 : 0);
    metric(o, "anvil_uptime_seconds", "gauge", "Seconds since the server started.");
    sbuf_printf(o, "anvil_uptime_seconds %.3f\n", uptime);
}
