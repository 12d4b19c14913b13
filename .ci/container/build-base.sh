#!/usr/bin/env bash
# The CI's base image for the CPU container: Debian bookworm (minbase) with python3 and python3-venv,
# made with debootstrap from Debian's archive and imported into Podman, because no image registry is
# reachable from CI. Users build on a registry image instead (container/Containerfile, BASE=...).
#
#   bash .ci/container/build-base.sh            # prints the image name; ~0 s when it exists already
#
# The root file system is cached as a tarball in $HPCGPU_CI_CACHE (default ~/.cache/hpcgpu-ci) so a
# fresh Podman store imports it in seconds instead of running debootstrap again.
set -euo pipefail
BASE_IMAGE=${HPCGPU_CI_BASE_IMAGE:-localhost/hpcgpu-ci-base:bookworm}
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${HPCGPU_CI_CACHE:-$HOME/.cache/hpcgpu-ci}
PODMAN=(podman --runtime runc --cgroup-manager cgroupfs)
# python3 and python3-venv: the Containerfile then needs no apt-get; libgomp1: numba's threading layer.
PACKAGES=python3,python3-venv,ca-certificates
TARBALL="$CACHE/debian-$SUITE-minbase-$(echo "$PACKAGES" | md5sum | cut -c1-8).tar"

if "${PODMAN[@]}" image exists "$BASE_IMAGE"; then
    echo "$BASE_IMAGE"
    exit 0
fi
mkdir -p "$CACHE"
if [ ! -s "$TARBALL" ]; then
    root=$(mktemp -d "${TMPDIR:-/tmp}/hpcgpu-rootfs.XXXXXX")
    trap 'rm -rf "$root"' EXIT
    echo "[container] debootstrap --variant=minbase $SUITE ($PACKAGES) from $MIRROR" >&2
    debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
        || { tail -20 "$CACHE/debootstrap.log" >&2; echo "debootstrap failed: $CACHE/debootstrap.log" >&2; exit 1; }
    # Smaller and reproducible: no package lists, caches or docs the image never needs.
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
           "$root"/usr/share/man/* "$root"/usr/share/locale/* "$root"/var/log/*.log
    tar -C "$root" --numeric-owner -cf "$TARBALL.part" .
    mv "$TARBALL.part" "$TARBALL"
fi
echo "[container] podman import $TARBALL -> $BASE_IMAGE" >&2
"${PODMAN[@]}" import --quiet --change 'CMD ["/bin/bash"]' "$TARBALL" "$BASE_IMAGE" >/dev/null
echo "$BASE_IMAGE"
