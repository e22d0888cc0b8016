#!/usr/bin/env bash
# Builds the fuzz targets with libFuzzer coverage instrumentation on the stable toolchain and
# runs one of them. Usage: fuzz/run.sh <subject|envelope|link|frame> [seconds] [extra libFuzzer args]
set -euo pipefail

target=${1:?usage: fuzz/run.sh <subject|envelope|link|frame> [seconds] [libFuzzer args...]}
seconds=${2:-180}
shift $(( $# >= 2 ? 2 : 1 ))

here=$(cd "$(dirname "$0")" && pwd)
triple=$(rustc -vV | sed -n 's/^host: //p')
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$here/target}
# The sancov pass and its LLVM options are stable codegen flags; --target keeps them off build
# scripts and proc macros, which are linked without the libFuzzer runtime.
export RUSTFLAGS="-Cpasses=sancov-module \
 -Cllvm-args=-sanitizer-coverage-level=4 \
 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
 -Cllvm-args=-sanitizer-coverage-pc-table \
 -Cllvm-args=-sanitizer-coverage-trace-compares \
 --cfg fuzzing -Cdebug-assertions -Coverflow-checks"

cargo build --manifest-path "$here/Cargo.toml" --release --target "$triple" --bin "$target"

mkdir -p "$here/corpus/$target" "$here/artifacts/$target"
exec "$CARGO_TARGET_DIR/$triple/release/$target" \
  "$here/corpus/$target" "$here/seeds/$target" \
  -artifact_prefix="$here/artifacts/$target/" \
  -max_total_time="$seconds" -print_final_stats=1 "$@"
