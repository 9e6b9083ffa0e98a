#!/usr/bin/env bash
# Builds the container image raftmq:latest from this workspace, pulling nothing.
#
#   deploy/build-image.sh            # cargo build --release, then docker build
#
# The image is `FROM scratch` plus the release binaries (nameserver, broker-node, raftmq,
# raftmq-health) and the shared libraries they link, as `ldd` lists them (with the dynamic
# loader), copied from this machine. So it needs only cargo and a Docker engine; no registry.
#
# Environment:
#   RAFTMQ_IMAGE       image name                                     [raftmq:latest]
#   RAFTMQ_IMAGE_BINS  binaries to put in the image (space separated) [nameserver broker-node raftmq raftmq-health]
#   RAFTMQ_IMAGE_STRIP 1 strips debug info from the image's copies    [1]
#   CARGO_TARGET_DIR   cargo's target directory                       [<workspace>/target]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE="${RAFTMQ_IMAGE:-raftmq:latest}"
BINS="${RAFTMQ_IMAGE_BINS:-nameserver broker-node raftmq raftmq-health}"
STRIP="${RAFTMQ_IMAGE_STRIP:-1}"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
case "$TARGET_DIR" in /*) ;; *) TARGET_DIR="$ROOT/$TARGET_DIR" ;; esac
RELEASE="$TARGET_DIR/release"
CONTEXT="$TARGET_DIR/docker-image"

die() { echo "build-image.sh: $*" >&2; exit 1; }

command -v cargo >/dev/null || die "cargo not found; install Rust (https://rustup.rs)"
command -v docker >/dev/null || die "docker not found"
command -v ldd >/dev/null || die "ldd not found (part of the C library's tools)"
docker info >/dev/null 2>&1 || die "no Docker engine answers (docker info failed)"

# Binary -> cargo package that builds it.
package_of() {
    case "$1" in
        nameserver) echo raftmq-nameserver ;;
        broker-node) echo raftmq-broker-node ;;
        raftmq) echo raftmq-cli ;;
        raftmq-health) echo raftmq-health ;;
        *) die "unknown binary '$1' in RAFTMQ_IMAGE_BINS" ;;
    esac
}

packages=()
for bin in $BINS; do packages+=(-p "$(package_of "$bin")"); done

echo "==> cargo build --release ${packages[*]}"
(cd "$ROOT" && cargo build --release "${packages[@]}")

echo "==> assembling the build context in $CONTEXT"
rm -rf "$CONTEXT"
mkdir -p "$CONTEXT/rootfs/usr/local/bin" "$CONTEXT/rootfs/var/lib/raftmq" "$CONTEXT/rootfs/tmp" \
    "$CONTEXT/rootfs/etc"
chmod 1777 "$CONTEXT/rootfs/tmp"
cp "$ROOT/deploy/Dockerfile" "$CONTEXT/Dockerfile"
# Minimal user database and NSS order for the C library; Docker itself provides /etc/hosts,
# /etc/resolv.conf and /etc/hostname in every container.
printf 'root:x:0:0:root:/root:/nonexistent\nnobody:x:65534:65534:nobody:/nonexistent:/nonexistent\n' \
    >"$CONTEXT/rootfs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$CONTEXT/rootfs/etc/group"
printf 'hosts: files dns\n' >"$CONTEXT/rootfs/etc/nsswitch.conf"

libs=()
for bin in $BINS; do
    src="$RELEASE/$bin"
    [ -x "$src" ] || die "$src was not built"
    dst="$CONTEXT/rootfs/usr/local/bin/$bin"
    cp "$src" "$dst"
    if [ "$STRIP" = 1 ] && command -v strip >/dev/null; then strip --strip-debug "$dst"; fi
    # ldd prints "name => /path (addr)" for libraries and "/path (addr)" for the loader.
    if ldd_out="$(ldd "$src" 2>&1)"; then
        if grep -q 'not found' <<<"$ldd_out"; then die "$bin links a library that is not found:"$'\n'"$ldd_out"; fi
        while read -r lib; do libs+=("$lib"); done < <(
            awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$ldd_out")
    elif grep -q 'not a dynamic executable' <<<"$ldd_out"; then
        : # statically linked: nothing to copy
    else
        die "ldd $src failed: $ldd_out"
    fi
done

for lib in $(printf '%s\n' "${libs[@]}" | sort -u); do
    mkdir -p "$CONTEXT/rootfs$(dirname "$lib")"
    cp -L "$lib" "$CONTEXT/rootfs$lib"
done
echo "    binaries: $BINS"
echo "    libraries: $(printf '%s ' $(printf '%s\n' "${libs[@]}" | sort -u))"

revision="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "==> docker build -t $IMAGE (FROM scratch, nothing pulled)"
DOCKER_BUILDKIT="${DOCKER_BUILDKIT:-0}" docker build --pull=false \
    --label "org.opencontainers.image.title=raftmq" \
    --label "org.opencontainers.image.revision=$revision" \
    -t "$IMAGE" "$CONTEXT"

echo "==> smoke test: every binary starts in the image"
for bin in $BINS; do
    docker run --rm "$IMAGE" "$bin" --help >/dev/null || die "$bin does not start inside $IMAGE"
done

size_bytes="$(docker image inspect -f '{{.Size}}' "$IMAGE")"
echo "==> built $IMAGE: $(docker image ls "$IMAGE" --format '{{.Size}}') ($size_bytes bytes)"
