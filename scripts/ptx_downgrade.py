#!/usr/bin/env python3
"""ptx_downgrade.py IN.so OUT.so [ARCH]: a CUDA library whose fatbins hold PTX newer than the
GPU machine's driver JITs, made loadable there (perf log §101: llama.cpp's CUDA backend as a
benchmark peer). For each fatbin in IN.so: its compute_ARCH PTX entry (default 90) decompressed
(zstd), `.version 9.1` rewritten `.version 9.0` (driver 580 = CUDA 13.0 JITs PTX ISA up to 9.0),
recompressed and written as the fatbin's only entry; every other entry (SASS for other GPUs, PTX
for other targets) dropped, so the copy compresses to ~21 MB with xz and travels to the device.
Nothing of the library is kept in this repository; the `zstd` command must be installed.

Fatbin layout (as read here): a header {u32 magic 0xBA55ED50, u16 version, u16 header size,
u64 entries' size}, then entries {u16 kind (1 PTX, 2 ELF), u16, u32 header size, u64 padded
payload size, u32 compressed size, u32, u16 minor, u16 major, u32 arch, ...} each followed by
its payload."""
import struct
import subprocess
import sys

MAGIC = struct.pack('<I', 0xBA55ED50)


def zstd(data, *args):
    return subprocess.run(['zstd', *args], input=data, capture_output=True, check=True).stdout


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    arch = int(sys.argv[3]) if len(sys.argv) == 4 else 90
    d = bytearray(open(sys.argv[1], 'rb').read())
    i, done = d.find(MAGIC), 0
    while i >= 0:
        _, hs, fs = struct.unpack_from('<HHQ', d, i + 4)
        p, end, found = i + hs, i + hs + fs, None
        while p < end:
            kind, _, ehs, psize = struct.unpack_from('<HHIQ', d, p)
            csize, _, _, _, earch = struct.unpack_from('<IIHHI', d, p + 16)
            if kind == 1 and earch == arch:
                found = (p, ehs, csize)
            p += ehs + psize
        if not found:
            sys.exit(f'a fatbin at {i:#x} has no compute_{arch} PTX')
        p, ehs, csize = found
        hdr = bytearray(d[p:p + ehs])
        ptx = zstd(bytes(d[p + ehs:p + ehs + csize]), '-dc')
        if ptx.count(b'.version 9.1') != 1:
            sys.exit(f'a fatbin at {i:#x}: its PTX is not version 9.1')
        c = zstd(ptx.replace(b'.version 9.1', b'.version 9.0'), '-c', '-19')
        padded = (len(c) + 7) // 8 * 8
        if ehs + padded > fs:
            sys.exit(f'a fatbin at {i:#x}: the recompressed PTX does not fit')
        struct.pack_into('<Q', hdr, 8, padded)
        struct.pack_into('<I', hdr, 16, len(c))
        struct.pack_into('<HH', hdr, 24, 0, 9)
        entry = bytes(hdr) + c + bytes(padded - len(c))
        d[i + hs:end] = entry + bytes(end - i - hs - len(entry))
        struct.pack_into('<Q', d, i + 8, len(entry))
        done += 1
        i = d.find(MAGIC, end)
    open(sys.argv[2], 'wb').write(d)
    print(f'{done} fatbins rewritten')


if __name__ == '__main__':
    main()
