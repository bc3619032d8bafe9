#!/bin/bash
# Compiles the kernels that Debian 12's glslc cannot (GL_NV_cooperative_matrix2 needs glslang
# 14.3 or newer) into src/backends/vulkan/shaders/prebuilt/NAME.inc, the form glslc -mfmt=c
# writes, which the build embeds as it embeds the others. Each file records the source's
# sha256 (and, where it includes files, the sha256 of their sha256s, a line each, depth first); the test
# prebuilt_shaders_current fails when either changed and this was not rerun.
#   GLSLANG=/path/to/glslang scripts/prebuild-shaders.sh
set -euo pipefail
cd "$(dirname "$0")/.."
GLSLANG=${GLSLANG:-glslang}
SRC=src/backends/vulkan/shaders
OUT=$SRC/prebuilt
# name source defines
VARIANTS=(
  "mm_cm2 mm_cm2.comp -DBM=128 -DBN=128 -DBK=64 -DU=4"
  "mm_cm2_moe mm_cm2.comp -DBM=32 -DBN=128 -DBK=64 -DU=4 -DMOE"
  # (unscaled rows: no epilogue, NO_XS)
  "mm_cm2_u mm_cm2.comp -DBM=128 -DBN=128 -DBK=64 -DU=4 -DNO_XS"
  "mm_cm2_moe_u mm_cm2.comp -DBM=32 -DBN=128 -DBK=64 -DU=4 -DMOE -DNO_XS"
  # (small tiles for products of few tiles)
  "mm_cm2_s mm_cm2.comp -DBM=64 -DBN=64 -DBK=64 -DU=4 -DNO_XS"
  # (whole tiles where K is a multiple of 16, not of 256: the vision tower's)
  "mm_cm2_uk mm_cm2.comp -DBM=128 -DBN=128 -DBK=64 -DU=4 -DNO_XS -DKTAIL"
  # (the vision encoder's attention as products)
  "vit_mm_cm2 vit_mm_cm2.comp"
  "vit_mm_cm2_n80 vit_mm_cm2.comp -DBN=80"
  # (the same as one flash pass: queries x keys a step)
  "vit_fa_cm2 vit_fa_cm2.comp"
  "vit_fa_cm2_r128 vit_fa_cm2.comp -DBR=128"
  "vit_fa_cm2_c128 vit_fa_cm2.comp -DBC=128"
)
# the same from the quantised weights themselves (WQ: decoded as the tiles load)
for t in q4_k q5_k q6_k q8_0; do
  T=${t^^}
  VARIANTS+=("mm_cm2_$t mm_cm2.comp -DBM=128 -DBN=128 -DBK=64 -DU=4 -DW_$T"
             "mm_cm2_moe_$t mm_cm2.comp -DBM=32 -DBN=128 -DBK=64 -DU=4 -DMOE -DW_$T")
done
# the experts' products on the int8 matrix units (mmq_cm2.comp)
# (tiles of 32 rows of an expert, and of 16)
for t in q4_k q6_k; do
  VARIANTS+=("mmq_cm2_moe_$t mmq_cm2.comp -DW_${t^^}" "mmq_cm2_moe16_$t mmq_cm2.comp -DW_${t^^} -DBM=16")
done
# (x rounded to int8 before: XQ8)
for t in q4_k q6_k; do
  VARIANTS+=("mmq8_cm2_moe_$t mmq_cm2.comp -DW_${t^^} -DXQ8" "mmq8_cm2_moe16_$t mmq_cm2.comp -DW_${t^^} -DBM=16 -DXQ8")
done
# (... on workgroups of 128 threads: two an SM)
for t in q4_k q6_k; do
  VARIANTS+=("mmq8w_cm2_moe_$t mmq_cm2.comp -DW_${t^^} -DXQ8 -DNT=128" "mmq8w_cm2_moe16_$t mmq_cm2.comp -DW_${t^^} -DBM=16 -DXQ8 -DNT=128")
done
# (... and of Q8_0, Q5_K and the low-bit types: XQ8 on 128 threads, tiles of 32 rows)
for t in q8_0 q5_k q2_k q3_k iq4_nl iq4_xs iq3_xxs iq3_s iq2_xxs iq2_xs iq2_s iq1_s iq1_m; do
  VARIANTS+=("mmq8w_cm2_moe_$t mmq_cm2.comp -DW_${t^^} -DXQ8 -DNT=128")
done
# (the gate and up products in one, the SwiGLU and h's rounding in its epilogue: GU)
for t in q4_k q6_k; do
  VARIANTS+=("mmq8g_cm2_moe_$t mmq_cm2.comp -DW_${t^^} -DXQ8 -DNT=128 -DGU")
done
# a batch step's products of 16 and 32 rows on them (mmqb_cm2.comp)
for t in q4_k q6_k; do
  VARIANTS+=("mmqb_cm2_${t}_16 mmqb_cm2.comp -DW_${t^^} -DTT=16" "mmqb_cm2_${t}_32 mmqb_cm2.comp -DW_${t^^} -DTT=32")
done
# the sha256 of each file FILE includes ("..."), a line each, each followed by its own includes',
# depth first (check_prebuilt.cmake lists them alike)
includes() {
  local d i
  d=$(dirname "$1")
  { grep -E '^[[:space:]]*#include "' "$1" || true; } | sed -E 's/^[^"]*"([^"]+)".*/\1/' | while read -r i; do
    sha256sum "$d/$i" | cut -d' ' -f1
    includes "$d/$i"
  done
}
version=$("$GLSLANG" --version | sed -n 's/^Glslang Version: //p')
mkdir -p "$OUT"
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
for v in "${VARIANTS[@]}"; do
  read -r name src defs <<<"$v"
  # shellcheck disable=SC2086
  "$GLSLANG" -V --target-env vulkan1.3 $defs -x -o "$tmp" "$SRC/$src" > /dev/null
  sum=$(sha256sum "$SRC/$src" | cut -d' ' -f1)
  inc=$(includes "$SRC/$src")
  if [ -n "$inc" ]; then inc="includes sha256 $(printf '%s\n' "$inc" | sha256sum | cut -d' ' -f1); "; fi
  {
    echo "/* $name: $src $defs, glslang $version; ${inc}source sha256 $sum */"
    echo "{"
    grep -v '^[[:space:]]*//' "$tmp"
    echo "}"
  } > "$OUT/$name.inc"
  echo "$OUT/$name.inc"
done
