#!/bin/sh
# embed_file.sh IN OUT [NAME]: writes IN's bytes as a relocatable object
# file OUT, in a read-only section between the symbols NAME_start and
# NAME_end (NAME: dray_embedded_model, which embedded_model.cc reads), so
# that the dray binary carries the file (the embedded model, FLUX's tiny
# tokenizers). Used by Bazel's genrules and by CMakeLists.txt.
set -eu
in=$1 out=$2 name=${3:-dray_embedded_model}
sym=_binary_$(echo "$in" | sed 's/[^A-Za-z0-9]/_/g')
ld -r -b binary -z noexecstack -o "$out.tmp" "$in"
objcopy --rename-section .data=.rodata,alloc,load,readonly,data,contents \
  --redefine-sym "${sym}_start=${name}_start" \
  --redefine-sym "${sym}_end=${name}_end" \
  --strip-symbol "${sym}_size" "$out.tmp" "$out"
rm "$out.tmp"
