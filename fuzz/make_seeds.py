#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/ (run from the repo root; output is committed).

Seeds are small valid inputs (and a few near-misses) for each target; libFuzzer mutates them.
The safetensors seeds are the tiny Qwen3 of fuzz/tiny_model.h in a few dtypes and layouts.
"""
import json, os, shutil, struct, glob

ROOT = os.path.dirname(os.path.abspath(__file__))
TESTDATA = os.path.join(ROOT, "..", "..", "shared", "testdata", "reference")

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


def main():
    shutil.rmtree(os.path.join(ROOT, "corpus"), ignore_errors=True)
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
    d = os.path.join(ROOT, "dicts")
    os.makedirs(d, exist_ok=True)
    for t in ["fuzz_safetensors", "fuzz_config", "fuzz_hf_index"]:
        with open(os.path.join(d, t + ".dict"), "w") as f:
            f.write("# JSON syntax and the keys anvil's Hugging Face loader reads (make_seeds.py)\n")
            for w in words:
                f.write(w + "\n")
            for k in keys:
                f.write('"\\"%s\\""\n' % k)
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
