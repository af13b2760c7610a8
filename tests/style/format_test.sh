#!/usr/bin/env bash
# Every C++ file of the checkout is as `clang-format` (the repository's
# .clang-format) writes it. The files are read from the checkout itself,
# which the runfiles link to, so the test is never cached (tag "external").
set -euo pipefail

# Each clang-format release formats some constructs its own way; the
# checkout is formatted by Debian 12's (deploy/install-deps.sh).
version=$(clang-format --version | sed -n 's/.*version \([0-9]*\)\..*/\1/p')
if [[ $version != 14 ]]; then
  echo "SKIPPED: the checkout is formatted by clang-format 14; this is ${version:-unknown}"
  exit 0
fi

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
