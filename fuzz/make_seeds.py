#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/, the dictionaries under fuzz/dicts/ and the
tokenizer fixture fuzz/fixtures/qwen3-tokenizer/ (output is committed; needs ../shared/testdata).

Seeds are small valid inputs (and a few near-misses) for each target; libFuzzer mutates them.
The safetensors and GGUF seeds are the tiny Qwen3 of fuzz/tiny_model.h in a few dtypes and
layouts. The tokenizer fixture is the qwen3-small test tokenizer cut to its first 400 tokens
(the merges among them, the added tokens renumbered after them) with its chat template.
"""
import json, os, shutil, struct, glob

ROOT = os.path.dirname(os.path.abspath(__file__))
TESTDATA = os.path.join(ROOT, "..", "..", "shared", "testdata", "reference")
TOK_TOKENS = 400

TENSORS = [
    ("model.embed_tokens.weight", [16, 8]),
    ("model.norm.weight", [8]),
    ("model.layers.0.input_layernorm.weight", [8]),
    ("model.layers.0.post_attention_layernorm.weight", [8]),
    ("model.layers.0.self_attn.q_proj.weight", [8, 8]),
    ("model.layers.0.self_attn.k_proj.weight", [4, 8]),
    ("model.layers.0.self_attn.v_proj.weight", [4, 8]),
    ("model.layers.0.self_attn.o_proj.weight", [8, 8]),
    ("model.layers.0.self_attn.q_norm.weight", [4]),
    ("model.layers.0.self_attn.k_norm.weight", [4]),
    ("model.layers.0.mlp.gate_proj.weight", [8, 8]),
    ("model.layers.0.mlp.up_proj.weight", [8, 8]),
    ("model.layers.0.mlp.down_proj.weight", [8, 8]),
]
SIZES = {"F32": 4, "F16": 2, "BF16": 2}


def safetensors(tensors, dtype="F32", metadata=None, pad=False):
    header, off = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    for name, shape in tensors:
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n * SIZES[dtype]]}
        off += n * SIZES[dtype]
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + bytes(range(256)) * (off // 256) + bytes(off % 256)


def put(target, name, data):
    d = os.path.join(ROOT, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---- GGUF ----

def gs(x):
    b = x.encode() if isinstance(x, str) else x
    return struct.pack("<Q", len(b)) + b


U8, I32, U32, F32, BOOL, STR, ARR, U64, I64, F64 = 0, 5, 4, 6, 7, 8, 9, 10, 11, 12


def gkv(key, t, payload):
    return gs(key) + struct.pack("<I", t) + payload


def gu32(key, v):
    return gkv(key, U32, struct.pack("<I", v))


def garr_str(key, items):
    return gkv(key, ARR, struct.pack("<IQ", STR, len(items)) + b"".join(gs(i) for i in items))


def gguf(kvs, tensors, align=32):
    h = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs)
    off, blobs = 0, b""
    for name, ne, data in tensors:
        h += gs(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        h += struct.pack("<IQ", 0, off)
        pad = (-len(data)) % align
        blobs += data + bytes(pad)
        off += len(data) + pad
    h += bytes((-len(h)) % align)
    return h + blobs


def gguf_tiny():
    kvs = [gkv("general.architecture", STR, gs("qwen3")), gu32("qwen3.block_count", 1),
           gu32("qwen3.embedding_length", 8), gu32("qwen3.attention.head_count", 2),
           gu32("qwen3.attention.head_count_kv", 1), gu32("qwen3.attention.key_length", 4),
           gu32("qwen3.feed_forward_length", 8), gu32("qwen3.context_length", 64),
           gkv("qwen3.rope.freq_base", F32, struct.pack("<f", 10000.0)),
           gkv("qwen3.attention.layer_norm_rms_epsilon", F32, struct.pack("<f", 1e-6)),
           garr_str("tokenizer.ggml.tokens", ["t%d" % i for i in range(16)])]
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    gg = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
          "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
          "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
          "mlp.down_proj": "ffn_down"}
    tensors = []
    for name, shape in TENSORS:
        if name in names:
            g = names[name]
        else:
            g = "blk.0." + gg[name[len("model.layers.0."):-len(".weight")]] + ".weight"
        n = 1
        for d in shape:
            n *= d
        tensors.append((g, list(reversed(shape)), struct.pack("<%df" % n, *([0.01] * n))))
    return gguf(kvs, tensors)


def gguf_types():
    kvs = [gkv("u8", U8, b"\x07"), gkv("i64", I64, struct.pack("<q", -5)),
           gkv("f64", F64, struct.pack("<d", 2.5)), gkv("bool", BOOL, b"\x01"),
           gkv("u64", U64, struct.pack("<Q", 1 << 40)), gkv("i32", I32, struct.pack("<i", -1)),
           gkv("nested", ARR, struct.pack("<IQ", ARR, 2) + struct.pack("<IQ", U32, 2) +
               struct.pack("<II", 1, 2) + struct.pack("<IQ", STR, 1) + gs("x")),
           gu32("general.alignment", 64),
           gkv("floats", ARR, struct.pack("<IQ", F32, 3) + struct.pack("<3f", 1, 2, 3))]
    return gguf(kvs, [("x", [4, 2], bytes(32))], align=64)


# ---- the tokenizer fixture ----

def tokenizer_fixture():
    src = os.path.join(TESTDATA, "qwen3-small")
    with open(os.path.join(src, "tokenizer.json"), encoding="utf-8") as f:
        d = json.load(f)
    vocab = {k: v for k, v in d["model"]["vocab"].items() if v < TOK_TOKENS}
    merges = [m for m in d["model"]["merges"]
              if m[0] in vocab and m[1] in vocab and (m[0] + m[1]) in vocab]
    d["model"]["vocab"], d["model"]["merges"] = vocab, merges
    for i, a in enumerate(d["added_tokens"]):
        a["id"] = TOK_TOKENS + i
    out = os.path.join(ROOT, "fixtures", "qwen3-tokenizer")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(d, f, ensure_ascii=False)
    with open(os.path.join(src, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)
    return d, cfg


def gguf_tokenizer(d, cfg):
    inv = sorted(d["model"]["vocab"].items(), key=lambda kv: kv[1])
    toks = [k for k, _ in inv] + [a["content"] for a in d["added_tokens"]]
    types = [1] * len(inv) + [3] * len(d["added_tokens"])
    kvs = [gkv("tokenizer.ggml.model", STR, gs("gpt2")), gkv("tokenizer.ggml.pre", STR, gs("qwen2")),
           garr_str("tokenizer.ggml.tokens", toks),
           gkv("tokenizer.ggml.token_type", ARR, struct.pack("<IQ", I32, len(types)) +
               struct.pack("<%di" % len(types), *types)),
           garr_str("tokenizer.ggml.merges", ["%s %s" % (a, b) for a, b in d["model"]["merges"]]),
           gu32("tokenizer.ggml.eos_token_id", len(inv) + 2),
           gkv("tokenizer.chat_template", STR, gs(cfg["chat_template"]))]
    return gguf(kvs, [])


def main():
    # only the corpora written here (others, such as fuzz_openai_request's, are kept by hand)
    for t in ["fuzz_safetensors", "fuzz_config", "fuzz_hf_index", "fuzz_gguf",
              "fuzz_chat_template", "fuzz_tokenizer_json", "fuzz_tokenize"]:
        shutil.rmtree(os.path.join(ROOT, "corpus", t), ignore_errors=True)
    put("fuzz_safetensors", "tiny-f32", safetensors(TENSORS))
    put("fuzz_safetensors", "tiny-bf16-meta", safetensors(TENSORS, "BF16", {"format": "pt"}, pad=True))
    put("fuzz_safetensors", "tiny-f16-untied",
        safetensors(TENSORS + [("lm_head.weight", [16, 8])], "F16"))
    put("fuzz_safetensors", "two-tensors", safetensors(TENSORS[1:3]))
    put("fuzz_safetensors", "empty-header", struct.pack("<Q", 2) + b"{}")

    for cfg in sorted(glob.glob(os.path.join(TESTDATA, "*", "config.json"))):
        with open(cfg) as f:
            put("fuzz_config", os.path.basename(os.path.dirname(cfg)), f.read())
    tiny = {"model_type": "qwen3", "hidden_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
            "intermediate_size": 8, "vocab_size": 16, "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5, "tie_word_embeddings": False}
    put("fuzz_config", "tiny-top-level-rope", json.dumps(tiny))
    mm = {"model_type": "qwen3_5", "tie_word_embeddings": True,
          "text_config": dict(tiny, model_type="qwen3_5_text", layer_types=["linear_attention"],
                              linear_conv_kernel_dim=4, linear_num_key_heads=2,
                              linear_num_value_heads=4, linear_key_head_dim=8,
                              linear_value_head_dim=8, full_attention_interval=4)}
    put("fuzz_config", "multimodal-text-config", json.dumps(mm))

    wm = {name: "model-0000%d-of-00002.safetensors" % (1 if i < 4 else 2)
          for i, (name, _) in enumerate(TENSORS)}
    put("fuzz_hf_index", "valid", json.dumps({"metadata": {"total_size": 2752}, "weight_map": wm}))
    bad = dict(wm)
    bad["model.norm.weight"] = "../model-00001-of-00002.safetensors"
    put("fuzz_hf_index", "traversal", json.dumps({"weight_map": bad}))
    put("fuzz_hf_index", "one-shard", json.dumps({"weight_map": {TENSORS[1][0]: wm[TENSORS[1][0]]}}))

    put("fuzz_gguf", "tiny-qwen3", gguf_tiny())
    put("fuzz_gguf", "all-types", gguf_types())
    tok, cfg = tokenizer_fixture()
    put("fuzz_gguf", "tokenizer", gguf_tokenizer(tok, cfg))

    def chat(bits, msgs):
        return bytes([bits]) + b"\0".join(b"\0".join(f.encode() for f in m) for m in msgs)
    put("fuzz_chat_template", "simple",
        chat(1, [("system", "You are helpful.", "", ""), ("user", "Hi!", "", "")]))
    put("fuzz_chat_template", "think",
        chat(7, [("user", "2+2?", "", ""), ("assistant", "<think>add</think>4", "", ""),
                 ("user", "and 3+3?", "", "")]))
    put("fuzz_chat_template", "tools",
        chat(5, [("user", "weather?", "", ""),
                 ("assistant", "", "thinking",
                  '[{"function": {"name": "get", "arguments": {"city": "Paris"}}}]'),
                 ("tool", '{"t": 20}', "", ""), ("user", "ok", "", "")]))

    words = ['"{"', '"}"', '"["', '"]"', '":"', '","', '"\\""', '"null"', '"true"', '"false"',
             '"-1"', '"0"', '"1e309"', '"4294967296"', '"0.5"', '"\\\\u0000"']
    keys = ["model_type", "text_config", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
            "max_position_embeddings", "num_experts", "num_experts_per_tok",
            "moe_intermediate_size", "shared_expert_intermediate_size", "linear_conv_kernel_dim",
            "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
            "linear_value_head_dim", "norm_topk_prob", "tie_word_embeddings", "rms_norm_eps",
            "rope_parameters", "rope_theta", "partial_rotary_factor", "rope_type", "layer_types",
            "full_attention_interval", "linear_attention", "full_attention", "qwen3", "qwen3_moe",
            "qwen3_next", "qwen3_5", "qwen3_5_moe", "__metadata__", "dtype", "shape",
            "data_offsets", "BF16", "F16", "F32", "I8", "weight_map", "lm_head.weight",
            "model.embed_tokens.weight", "model.language_model.", "model.layers.0.", ".."]
    tok_keys = ["model", "vocab", "merges", "added_tokens", "pre_tokenizer", "pretokenizers",
                "Sequence", "Split", "ByteLevel", "pattern", "Regex", "behavior", "Isolated",
                "invert", "add_prefix_space", "use_regex", "normalizer", "normalizers", "NFC",
                "decoder", "type", "BPE", "content", "special", "id", "lstrip", "rstrip",
                "normalized", "single_word", "ignore_merges", "byte_fallback", "<|im_start|>",
                "<|im_end|>", "<|endoftext|>", "\\xc4\\xa0"]
    d = os.path.join(ROOT, "dicts")
    os.makedirs(d, exist_ok=True)
    for t in ["fuzz_safetensors", "fuzz_config", "fuzz_hf_index", "fuzz_tokenizer_json"]:
        with open(os.path.join(d, t + ".dict"), "w") as f:
            f.write("# JSON syntax and the keys anvil's loaders read (make_seeds.py)\n")
            for w in words:
                f.write(w + "\n")
            for k in keys + (tok_keys if t == "fuzz_tokenizer_json" else []):
                f.write('"\\"%s\\""\n' % k)
    gkeys = ["general.architecture", "general.alignment", "qwen3", "qwen3moe", "qwen35", "qwen3next",
             ".block_count", ".embedding_length", ".attention.head_count", ".attention.head_count_kv",
             ".attention.key_length", ".attention.value_length", ".feed_forward_length",
             ".context_length", ".rope.freq_base", ".rope.dimension_count", ".expert_count",
             ".expert_used_count", ".ssm.conv_kernel", ".ssm.state_size", ".ssm.group_count",
             ".ssm.time_step_rank", ".ssm.inner_size", ".full_attention_interval",
             ".attention.recurrent_layers", "tokenizer.ggml.model", "tokenizer.ggml.pre",
             "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
             "tokenizer.ggml.eos_token_id", "tokenizer.chat_template", "gpt2", "qwen2",
             "token_embd.weight", "output.weight", "blk.0.attn_q.weight"]
    with open(os.path.join(d, "fuzz_gguf.dict"), "w") as f:
        f.write("# GGUF magic, small integers and the metadata keys anvil reads (make_seeds.py)\n")
        for w in ['"GGUF"', '"\\x03\\x00\\x00\\x00"', '"\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00"',
                  '"\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xff"', '"\\x09\\x00\\x00\\x00"',
                  '"\\x08\\x00\\x00\\x00"']:
            f.write(w + "\n")
        for k in gkeys:
            f.write('"%s"\n' % k)

    tokenizer_seeds()


def tokenizer_seeds():
    """Seeds for fuzz_tokenizer_json (small tokenizer.json files) and fuzz_tokenize."""
    byte_tokens = {}
    bs = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
    k = 0
    for b in range(256):
        byte_tokens[chr(b) if b in bs else chr(256 + (k := k + 1) - 1)] = b
    vocab = dict(byte_tokens)
    merges = [["\u0120", "t"], ["h", "e"], ["\u0120t", "he"], ["a", "a"]]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    regex = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
             "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
    pre = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    added = [{"id": len(vocab), "content": "<|im_end|>", "special": True, "lstrip": False,
              "rstrip": False, "single_word": False, "normalized": False}]
    def tok(merge_form, normalizer):
        return json.dumps({"version": "1.0", "added_tokens": added, "normalizer": normalizer,
                           "pre_tokenizer": pre, "decoder": {"type": "ByteLevel"},
                           "model": {"type": "BPE", "vocab": vocab, "merges": merge_form}},
                          ensure_ascii=False)
    put("fuzz_tokenizer_json", "pairs-nfc", tok(merges, {"type": "NFC"}))
    put("fuzz_tokenizer_json", "strings", tok([a + " " + b for a, b in merges], None))
    put("fuzz_tokenizer_json", "gpt2-regex", json.dumps(
        {"model": {"vocab": vocab, "merges": []}, "pre_tokenizer": {"type": "ByteLevel", "use_regex": True}}))
    for name, text in [("prose", "\x00The quick brown fox, it's 42 <|im_end|> the end.\n"),
                       ("plain", "\x01<|im_end|><think> a"),
                       ("unicode", "\x00caf\u00e9 cafe\u0301 \u4e2d\u6587 \U0001F600  \n\n\t x"),
                       ("runs", "\x00" + "a" * 300 + " " * 300 + "!" * 50),
                       ("ids", b"\x02\xe4\x00\xb8\x00\xad\x00a\x00\xf0\x00"),
                       ("invalid", b"\x00ab\xff\xc3")]:
        put("fuzz_tokenize", name, text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))



if __name__ == "__main__":
    main()
