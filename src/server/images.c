/* server: images in chat requests (OpenAI image_url content parts) — a data: URL's base64
 * decoded, the image decoded and preprocessed for the model (anvil_image_decode) into the job;
 * the server fetches nothing, so remote URLs are refused (docs/SERVER.md, Images). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_impl.h"

#define BAD(e, param, ...) api_error_set(e, 400, "invalid_request_error", NULL, param, __VA_ARGS__)

/* base64 (RFC 4648, whitespace skipped, padding optional) into a new buffer; NULL if not */
static uint8_t *base64_decode(const char *s, size_t *len) {
    size_t n = strlen(s), at = 0;
    uint8_t *out = xmalloc(n / 4 * 3 + 3);
    uint32_t acc = 0;
    int bits = 0;
    for (const char *c = s; out && *c && *c != '='; c++) {
        int v = *c >= 'A' && *c <= 'Z' ? *c - 'A' : *c >= 'a' && *c <= 'z' ? *c - 'a' + 26
                : *c >= '0' && *c <= '9' ? *c - '0' + 52 : *c == '+' || *c == '-' ? 62
                : *c == '/' || *c == '_' ? 63 : -1;
        if (v < 0) {
            if (*c == ' ' || *c == '\n' || *c == '\r' || *c == '\t') continue;
            free(out);
            return NULL;
        }
        acc = acc << 6 | (uint32_t)v;
        if ((bits += 6) >= 8) out[at++] = (uint8_t)(acc >> (bits -= 8));
    }
    *len = at;
    return out;
}

bool api_take_image(struct server *s, struct job *j, const cJSON *part, const char *msg, const char *param,
                       struct api_error *e) {
    const cJSON *iu = cJSON_GetObjectItemCaseSensitive(part, "image_url");
    const cJSON *url = cJSON_IsObject(iu) ? cJSON_GetObjectItemCaseSensitive(iu, "url") : iu;
    if (!s->vision) {
        BAD(e, msg, "'%s': this model takes no images (images need a Qwen3.5 or Qwen3.6 model with "
            "its vision tower: a checkpoint that has one, or a GGUF served with --mmproj)", param);
        return false;
    }
    if (!cJSON_IsString(url)) {
        BAD(e, msg, "'%s' must be {\"type\": \"image_url\", \"image_url\": {\"url\": ...}}", param);
        return false;
    }
    const char *u = url->valuestring, *comma = strchr(u, ',');
    if (strncmp(u, "data:", 5) != 0) {
        bool remote = !strncmp(u, "http://", 7) || !strncmp(u, "https://", 8);
        BAD(e, msg, "'%s': %s; send the image inline as a data: URL (data:image/png;base64,...)", param,
            remote ? "this server fetches nothing, remote image URLs are refused" : "the url must be a data: URL");
        return false;
    }
    if (!comma || comma - u < 12 || strncmp(comma - 7, ";base64", 7) != 0) {
        BAD(e, msg, "'%s': the data: URL must hold base64 (data:image/png;base64,...)", param);
        return false;
    }
    if (j->n_images == (int)ARRAY_LEN(j->images)) {
        BAD(e, msg, "at most %d images per request", (int)ARRAY_LEN(j->images));
        return false;
    }
    size_t len = 0;
    uint8_t *bytes = base64_decode(comma + 1, &len);
    if (!bytes) {
        BAD(e, msg, "'%s': the image's base64 is not valid", param);
        return false;
    }
    anvil_image *img = NULL;
    anvil_status st = anvil_image_decode(s->model, bytes, len, param, &img);
    free(bytes);
    if (st != ANVIL_OK) {
        BAD(e, msg, "%s", anvil_last_error());
        return false;
    }
    j->images[j->n_images++] = img;
    return true;
}
