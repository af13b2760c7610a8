#!/usr/bin/env bash
# Every C++ file of the checkout is as `clang-format` (the repository's
# .clang-format) writes it. The files are read from the checkout itself,
# which the runfiles link to, so the test is never cached (tag "external").
set -euo pipefail

root="$TEST_SRCDIR/$TEST_WORKSPACE"
checkout=$(dirname "$(readlink -f "$root/.clang-format")")
cd "$checkout"
mapfile -t files < <(git ls-files '*.cc' '*.h')
((${#files[@]} > 0)) || { echo "FAIL: no C++ files found in $checkout" >&2; exit 1; }
if ! clang-format --dry-run --Werror "${files[@]}"; then
  echo "FAIL: run clang-format -i on the files above" >&2
  exit 1
fi
echo "PASS: ${#files[@]} files formatted"
