#!/bin/sh
# embed_weights.sh IN OUT: writes IN's bytes as a relocatable object file
# OUT, in a read-only section between the symbols dray_embedded_model_start
# and dray_embedded_model_end (embedded_model.cc reads them), so that the
# dray binary carries the embedded model. Used by Bazel's genrule and by
# CMakeLists.txt.
set -eu
in=$1 out=$2
sym=_binary_$(echo "$in" | sed 's/[^A-Za-z0-9]/_/g')
ld -r -b binary -z noexecstack -o "$out.tmp" "$in"
objcopy --rename-section .data=.rodata,alloc,load,readonly,data,contents \
  --redefine-sym "${sym}_start=dray_embedded_model_start" \
  --redefine-sym "${sym}_end=dray_embedded_model_end" \
  --strip-symbol "${sym}_size" "$out.tmp" "$out"
rm "$out.tmp"
