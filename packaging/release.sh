#!/bin/sh
# Builds the release artefacts of one target from the repository root:
#   dist/cotald-<version>-<target>.tar.gz  the binary (nats-server embedded), completions/
#                                          (bash, zsh, fish), man/cotald.1, README.md, LICENSE
#   dist/SHA256SUMS                        one line per tarball
# Usage: packaging/release.sh [TARGET]   (default: the host's target triple)
# A target other than the host needs its Rust standard library (`rustup target add TARGET`)
# and a linker for it; the completions and the man page then come from a host build.
set -eu

host=$(rustc -vV | sed -n 's/^host: //p')
target=${1:-$host}
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
out=${CARGO_TARGET_DIR:-target}
: "${COTALD_GIT_REVISION:=$(git describe --always --dirty --abbrev=12 2>/dev/null || echo "v$version")}"
export COTALD_GIT_REVISION

cargo build --release --locked --bin cotald --target "$target"
binary="$out/$target/release/cotald"
generator=$binary
if [ "$target" != "$host" ]; then
    cargo build --release --locked --bin cotald
    generator="$out/release/cotald"
fi

name="cotald-$version-$target"
stage="dist/$name"
rm -rf "$stage"
mkdir -p "$stage/completions" "$stage/man"
cp "$binary" "$stage/cotald"
"$generator" completions bash > "$stage/completions/cotald.bash"
"$generator" completions zsh > "$stage/completions/_cotald"
"$generator" completions fish > "$stage/completions/cotald.fish"
"$generator" man > "$stage/man/cotald.1"
cp README.md LICENSE "$stage/"

tar -C dist -czf "dist/$name.tar.gz" "$name"
rm -rf "$stage"
if command -v sha256sum > /dev/null; then
    sum=$(cd dist && sha256sum "$name.tar.gz")
else
    sum=$(cd dist && shasum -a 256 "$name.tar.gz")
fi
touch dist/SHA256SUMS
grep -v "  $name.tar.gz\$" dist/SHA256SUMS > dist/SHA256SUMS.new || true
echo "$sum" >> dist/SHA256SUMS.new
mv dist/SHA256SUMS.new dist/SHA256SUMS
echo "dist/$name.tar.gz"
