#!/usr/bin/env python3
"""Random-weight GGUF files for the image benchmark against llama.cpp's mtmd (docs/perf/log.md
section 87): an mmproj of the Qwen3.5/3.6 vision tower at its real sizes (depth 27, width 1152,
16 heads, MLP 4304, patch 16, merge 2; clip.projector_type qwen3vl_merger, the tensor names
and types of llama.cpp's converter: weights F16, 1-D tensors and the position embedding F32), a
4-layer qwen35 language model of Qwen3.6-35B-A3B's width (2048) and heads that takes the
merger's output, and a 1024x1024 PNG. Both anvil and llama.cpp load the same files. Needs numpy.

  vl_bench_files.py OUTDIR [--small] [--tokenizer FILE] [--tokenizer-out FILE.json]

--tokenizer: the vocabulary (a GGUF's tokenizer.* keys, or a JSON written by --tokenizer-out;
default the tiny Qwen3.5's in ../shared/testdata); <|vision_start|>, <|vision_end|>,
<|image_pad|> and <|video_pad|> are appended. --tokenizer-out: write the vocabulary as JSON (to
make the files where ../shared is not, e.g. on the GPU machine). --small: tiny sizes, for a
check on the CPU (seconds).
"""
import json, os, struct, sys, zlib

import numpy as np

ALIGN = 32
F32, F16 = 0, 1


class Writer:
    def __init__(self):
        self.kv = bytearray()
        self.n_kv = 0
        self.tensors = []  # (name, shape (ggml order), type, filler)

    @staticmethod
    def _s(s):
        b = s.encode()
        return struct.pack('<Q', len(b)) + b

    def _key(self, k, t):
        self.kv += self._s(k) + struct.pack('<I', t)
        self.n_kv += 1

    def u32(self, k, v):
        self._key(k, 4)
        self.kv += struct.pack('<I', v)

    def f32(self, k, v):
        self._key(k, 6)
        self.kv += struct.pack('<f', v)

    def b(self, k, v):
        self._key(k, 7)
        self.kv += struct.pack('<?', v)

    def str(self, k, v):
        self._key(k, 8)
        self.kv += self._s(v)

    def arr(self, k, t, vals):
        self._key(k, 9)
        self.kv += struct.pack('<IQ', t, len(vals))
        fmt = {4: '<I', 5: '<i', 6: '<f', 7: '<?'}.get(t)
        for v in vals:
            self.kv += self._s(v) if t == 8 else struct.pack(fmt, v)

    def tensor(self, name, shape, typ, fill):
        self.tensors.append((name, shape, typ, fill))

    def write(self, path, block):
        hdr = bytearray(b'GGUF' + struct.pack('<IQQ', 3, len(self.tensors), self.n_kv))
        hdr += self.kv
        off = 0
        sizes = []
        for name, shape, typ, _ in self.tensors:
            n = int(np.prod(shape))
            size = n * (4 if typ == F32 else 2)
            hdr += self._s(name) + struct.pack('<I', len(shape))
            hdr += b''.join(struct.pack('<Q', d) for d in shape)
            hdr += struct.pack('<IQ', typ, off)
            sizes.append(size)
            off += (size + ALIGN - 1) // ALIGN * ALIGN
        hdr += b'\0' * ((-len(hdr)) % ALIGN)
        with open(path, 'wb') as f:
            f.write(hdr)
            for (name, shape, typ, fill), size in zip(self.tensors, sizes):
                n = size // (4 if typ == F32 else 2)
                if fill is None:  # random values from the block, tiled
                    raw = (block if typ == F16 else block.astype(np.float32)).view(np.uint8)
                    left = size
                    while left:
                        k = min(left, raw.size)
                        f.write(raw[:k].tobytes())
                        left -= k
                else:
                    f.write(np.full(n, fill, np.float32 if typ == F32 else np.float16).tobytes())
                f.write(b'\0' * ((-size) % ALIGN))


def mmproj(path, c, block):
    w = Writer()
    w.str('general.architecture', 'clip')
    w.str('general.type', 'mmproj')
    w.str('general.name', 'vitcmp random tower')
    w.u32('general.file_type', 1)
    w.b('clip.has_vision_encoder', True)
    w.u32('clip.vision.projection_dim', c['lm_n'])
    w.u32('clip.vision.image_size', c['grid'] * 16)
    w.u32('clip.vision.patch_size', 16)
    w.u32('clip.vision.embedding_length', c['vn'])
    w.u32('clip.vision.feed_forward_length', c['vff'])
    w.u32('clip.vision.block_count', c['vdepth'])
    w.u32('clip.vision.attention.head_count', c['vheads'])
    w.arr('clip.vision.image_mean', 6, [0.5] * 3)
    w.arr('clip.vision.image_std', 6, [0.5] * 3)
    w.str('clip.projector_type', 'qwen3vl_merger')
    w.b('clip.use_gelu', True)
    w.u32('clip.vision.spatial_merge_size', 2)
    w.f32('clip.vision.attention.layer_norm_epsilon', 1e-6)
    w.arr('clip.vision.is_deepstack_layers', 7, [False] * c['vdepth'])
    w.u32('general.quantization_version', 2)
    n, ff = c['vn'], c['vff']
    for i in range(c['vdepth']):
        p = f'v.blk.{i}.'
        w.tensor(p + 'attn_out.bias', [n], F32, 0.0)
        w.tensor(p + 'attn_out.weight', [n, n], F16, None)
        w.tensor(p + 'attn_qkv.bias', [3 * n], F32, 0.0)
        w.tensor(p + 'attn_qkv.weight', [n, 3 * n], F16, None)
        w.tensor(p + 'ffn_up.bias', [ff], F32, 0.0)
        w.tensor(p + 'ffn_up.weight', [n, ff], F16, None)
        w.tensor(p + 'ffn_down.bias', [n], F32, 0.0)
        w.tensor(p + 'ffn_down.weight', [ff, n], F16, None)
        for ln in ('ln1', 'ln2'):
            w.tensor(p + ln + '.bias', [n], F32, 0.0)
            w.tensor(p + ln + '.weight', [n], F32, 1.0)
    m = 4 * n
    w.tensor('mm.0.bias', [m], F32, 0.0)
    w.tensor('mm.0.weight', [m, m], F16, None)
    w.tensor('mm.2.bias', [c['lm_n']], F32, 0.0)
    w.tensor('mm.2.weight', [m, c['lm_n']], F16, None)
    w.tensor('v.post_ln.bias', [n], F32, 0.0)
    w.tensor('v.post_ln.weight', [n], F32, 1.0)
    w.tensor('v.patch_embd.bias', [n], F32, 0.0)
    w.tensor('v.patch_embd.weight', [16, 16, 3, n], F16, None)
    w.tensor('v.patch_embd.weight.1', [16, 16, 3, n], F16, None)
    w.tensor('v.position_embd.weight', [n, c['grid'] ** 2], F32, None)  # F32 in llama.cpp's files
    w.write(path, block)


def text(path, c, tok, block):
    w = Writer()
    a = 'qwen35.'
    n, ff, L = c['lm_n'], c['lm_ff'], c['lm_layers']
    hd, nh, nkv = c['hd'], c['heads'], c['kv']
    gk, gv, dk = c['ssm_k'], c['ssm_v'], c['ssm_d']
    toks = list(tok['tokenizer.ggml.tokens'])
    types = list(tok['tokenizer.ggml.token_type'])
    extra = ['<|vision_start|>', '<|vision_end|>', '<|image_pad|>', '<|video_pad|>']
    extra += [f'<|vitcmp_pad_{i}|>' for i in range((-(len(toks) + len(extra))) % 8)]
    toks += extra
    types += [3] * len(extra)
    nv = len(toks)
    w.str('general.architecture', 'qwen35')
    w.str('general.type', 'model')
    w.str('general.name', 'vitcmp random qwen35')
    w.u32(a + 'block_count', L)
    w.u32(a + 'context_length', 16384)
    w.u32(a + 'embedding_length', n)
    w.u32(a + 'feed_forward_length', ff)
    w.u32(a + 'attention.head_count', nh)
    w.u32(a + 'attention.head_count_kv', nkv)
    w.f32(a + 'rope.freq_base', 1e7)
    w.f32(a + 'attention.layer_norm_rms_epsilon', 1e-6)
    w.u32(a + 'attention.key_length', hd)
    w.u32(a + 'attention.value_length', hd)
    w.u32('general.file_type', 1)
    w.u32(a + 'ssm.conv_kernel', 4)
    w.u32(a + 'ssm.state_size', dk)
    w.u32(a + 'ssm.group_count', gk)
    w.u32(a + 'ssm.time_step_rank', gv)
    w.u32(a + 'ssm.inner_size', gv * dk)
    w.arr(a + 'attention.recurrent_layers', 7, [(i + 1) % 4 != 0 for i in range(L)])
    w.u32(a + 'full_attention_interval', 4)
    w.u32(a + 'rope.dimension_count', hd // 4)
    w.arr(a + 'rope.dimension_sections', 5, c['sections'] + [0])
    w.u32('general.quantization_version', 2)
    w.str('tokenizer.ggml.model', tok['tokenizer.ggml.model'])
    w.str('tokenizer.ggml.pre', tok['tokenizer.ggml.pre'])
    w.arr('tokenizer.ggml.tokens', 8, toks)
    w.arr('tokenizer.ggml.token_type', 5, types)
    w.arr('tokenizer.ggml.merges', 8, tok['tokenizer.ggml.merges'])
    w.u32('tokenizer.ggml.eos_token_id', toks.index('<|im_end|>'))
    w.u32('tokenizer.ggml.padding_token_id', toks.index('<|endoftext|>'))
    w.b('tokenizer.ggml.add_bos_token', False)
    w.str('tokenizer.chat_template', tok['tokenizer.chat_template'])
    w.tensor('output.weight', [n, nv], F16, None)
    w.tensor('token_embd.weight', [n, nv], F16, None)
    conv = 2 * gk * dk + gv * dk
    for i in range(L):
        p = f'blk.{i}.'
        w.tensor(p + 'attn_norm.weight', [n], F32, 1.0)
        if (i + 1) % 4:
            w.tensor(p + 'ssm_a', [gv], F32, -1.0)
            w.tensor(p + 'ssm_conv1d.weight', [4, conv], F32, 0.25)
            w.tensor(p + 'ssm_dt.bias', [gv], F32, 0.0)
            w.tensor(p + 'ssm_alpha.weight', [n, gv], F16, None)
            w.tensor(p + 'ssm_beta.weight', [n, gv], F16, None)
            w.tensor(p + 'attn_qkv.weight', [n, conv], F16, None)
            w.tensor(p + 'attn_gate.weight', [n, gv * dk], F16, None)
            w.tensor(p + 'ssm_norm.weight', [dk], F32, 1.0)
            w.tensor(p + 'ssm_out.weight', [gv * dk, n], F16, None)
        else:
            w.tensor(p + 'attn_k_norm.weight', [hd], F32, 1.0)
            w.tensor(p + 'attn_k.weight', [n, nkv * hd], F16, None)
            w.tensor(p + 'attn_output.weight', [nh * hd, n], F16, None)
            w.tensor(p + 'attn_q_norm.weight', [hd], F32, 1.0)
            w.tensor(p + 'attn_q.weight', [n, 2 * nh * hd], F16, None)
            w.tensor(p + 'attn_v.weight', [n, nkv * hd], F16, None)
        w.tensor(p + 'ffn_down.weight', [ff, n], F16, None)
        w.tensor(p + 'ffn_gate.weight', [n, ff], F16, None)
        w.tensor(p + 'ffn_up.weight', [n, ff], F16, None)
        w.tensor(p + 'post_attention_norm.weight', [n], F32, 1.0)
    w.tensor('output_norm.weight', [n], F32, 1.0)
    w.write(path, block)


TOKENIZER_KEYS = ['tokenizer.ggml.model', 'tokenizer.ggml.pre', 'tokenizer.ggml.tokens',
                  'tokenizer.ggml.token_type', 'tokenizer.ggml.merges', 'tokenizer.chat_template']


def read_tokenizer(path):
    """The tokenizer.* keys of a GGUF file (or the JSON --tokenizer-out wrote)."""
    if path.endswith('.json'):
        return json.load(open(path))
    f = open(path, 'rb')
    if f.read(4) != b'GGUF':
        sys.exit(f'{path}: not a GGUF file')

    def rd(fmt):
        return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]

    def rstr():
        return f.read(rd('<Q')).decode('utf-8')
    scalar = {0: '<B', 1: '<b', 2: '<H', 3: '<h', 4: '<I', 5: '<i', 6: '<f', 7: '<?', 10: '<Q',
              11: '<q', 12: '<d'}

    def rval(t):
        if t == 8:
            return rstr()
        if t == 9:
            at, n = rd('<I'), rd('<Q')
            return [rval(at) for _ in range(n)]
        return rd(scalar[t])
    rd('<I')
    rd('<Q')
    kv = {}
    for _ in range(rd('<Q')):
        k = rstr()
        kv[k] = rval(rd('<I'))
    missing = [k for k in TOKENIZER_KEYS if k not in kv]
    if missing:
        sys.exit(f'{path}: no {", ".join(missing)}')
    return {k: kv[k] for k in TOKENIZER_KEYS}


def png(path, side):
    y, x = np.mgrid[0:side, 0:side]
    img = np.stack([(x * 255 // side), (y * 255 // side), ((x ^ y) & 255)], -1).astype(np.uint8)
    raw = b''.join(b'\0' + img[r].tobytes() for r in range(side))

    def chunk(t, d):
        return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d) & 0xffffffff)
    with open(path, 'wb') as f:
        f.write(b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', side, side, 8, 2, 0, 0, 0))
                + chunk(b'IDAT', zlib.compress(raw, 6)) + chunk(b'IEND', b''))


def main():
    args = sys.argv[1:]
    opt = {}
    for k in ('--tokenizer', '--tokenizer-out'):
        if k in args:
            i = args.index(k)
            opt[k] = args[i + 1]
            del args[i:i + 2]
    small = '--small' in args
    args = [a for a in args if a != '--small']
    if len(args) != 1:
        sys.exit(__doc__)
    out = args[0]
    here = os.path.dirname(os.path.abspath(__file__))
    tok = read_tokenizer(opt.get('--tokenizer', os.path.join(
        here, '..', '..', 'shared', 'testdata', 'gguf', 'qwen3_5-tiny', 'qwen3_5-tiny-F16.gguf')))
    if '--tokenizer-out' in opt:
        json.dump(tok, open(opt['--tokenizer-out'], 'w'))
    if small:
        c = dict(vdepth=2, vn=64, vff=128, vheads=4, grid=16, lm_n=64, lm_ff=160, lm_layers=4,
                 hd=64, heads=4, kv=2, ssm_k=2, ssm_v=4, ssm_d=16, sections=[3, 3, 2])
    else:  # the real tower (Qwen3.5/3.6), a 4-layer language model of Qwen3.6-35B-A3B's width
        c = dict(vdepth=27, vn=1152, vff=4304, vheads=16, grid=48, lm_n=2048, lm_ff=6144, lm_layers=4,
                 hd=256, heads=16, kv=2, ssm_k=16, ssm_v=32, ssm_d=128, sections=[11, 11, 10])
    rng = np.random.default_rng(1)
    block = rng.uniform(-0.03, 0.03, 1 << 22).astype(np.float16)
    os.makedirs(out, exist_ok=True)
    mmproj(os.path.join(out, 'mmproj.gguf'), c, block)
    text(os.path.join(out, 'text.gguf'), c, tok, block)
    png(os.path.join(out, 'img1024.png'), 1024 if not small else 224)


if __name__ == '__main__':
    main()
