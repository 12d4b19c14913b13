#!/usr/bin/env bash
# Builds the CPU image the container tests use (tests/containers, tests/jobscripts), from
# container/Containerfile on the Debian base of build-base.sh:
#
#   bash .ci/container/build-image.sh           # image: localhost/hpcgpu:ci-cpu (HPCGPU_TEST_IMAGE)
#
# The wheels of hpcgpu and of its dependencies are built here, outside the image, with pip's cache
# (Python 3.11 on both sides: Debian bookworm), so the image build needs no network; the dependencies'
# wheels are cached per pyproject.toml, so a rebuild after a code change builds hpcgpu's wheel only. Podman as root with runc and cgroupfs (.ci/run writes
# /etc/containers/containers.conf.d/50-hpcgpu-ci.conf).
set -euo pipefail
cd "$(dirname "$0")/../.."
IMAGE=${HPCGPU_TEST_IMAGE:-localhost/hpcgpu:ci-cpu}
EXTRAS=mpich,apps
PODMAN=(podman --runtime runc --cgroup-manager cgroupfs)
started=$SECONDS

base=$(bash .ci/container/build-base.sh)
echo "[container] base $base ready after $(( SECONDS - started )) s"

# The same Python version as the image's (python3 of Debian bookworm): wheels with compiled code must
# match. pip runs from a small cached virtual environment (Debian's python3 has no pip of its own).
CACHE=${HPCGPU_CI_CACHE:-$HOME/.cache/hpcgpu-ci}
# setuptools and wheel stay installed there: hpcgpu's wheel builds without a fresh isolated environment.
if [ ! -x "$CACHE/wheel-venv/bin/python" ] || ! "$CACHE/wheel-venv/bin/python" -c "import setuptools, wheel" 2>/dev/null; then
    python3 -m venv "$CACHE/wheel-venv"
    "$CACHE/wheel-venv/bin/python" -m pip install --quiet "setuptools>=68" wheel
fi
host_python=$CACHE/wheel-venv/bin/python
image_version=$("${PODMAN[@]}" run --rm --network=host "$base" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
host_version=$("$host_python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$image_version" != "$host_version" ]; then
    echo "[container] ERROR: the base has Python $image_version but $host_python is $host_version: the wheels" \
         "built here would not install there; run this with a Python $image_version" >&2
    exit 1
fi
# The dependencies' wheels are kept per pyproject.toml (resolving them against PyPI takes minutes on a
# loaded CI machine); hpcgpu's own wheel is built every time, without its dependencies, in seconds.
dependency_wheels="$CACHE/wheels-$(cat pyproject.toml <(echo "$EXTRAS") | sha256sum | cut -c1-16)"
if [ ! -d "$dependency_wheels" ]; then
    rm -rf "$CACHE"/wheels-*
    "$host_python" -m pip wheel --quiet --no-build-isolation --wheel-dir "$dependency_wheels.part" ".[$EXTRAS]"
    rm -f "$dependency_wheels.part"/hpcgpu-*.whl
    mv "$dependency_wheels.part" "$dependency_wheels"
fi
rm -rf container/wheels
mkdir -p container/wheels
cp "$dependency_wheels"/*.whl container/wheels/
"$host_python" -m pip wheel --quiet --no-build-isolation --no-deps --wheel-dir container/wheels .
# What the two install steps depend on: the names of the dependencies' wheels, and the content of
# hpcgpu's wheel (its zip timestamps differ from build to build).
ids=$("$host_python" - container/wheels <<'PYTHON'
import hashlib, pathlib, sys, zipfile
dependencies, source = hashlib.sha256(), hashlib.sha256()
for wheel in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    if wheel.name.startswith("hpcgpu-"):
        with zipfile.ZipFile(wheel) as archive:
            for name in sorted(archive.namelist()):
                source.update(name.encode() + archive.read(name))
    else:
        dependencies.update(wheel.name.encode())
print(dependencies.hexdigest()[:16], source.hexdigest()[:16])
PYTHON
)
read -r dependencies_id source_id <<< "$ids"
echo "[container] $(ls container/wheels | wc -l) wheels in container/wheels after $(( SECONDS - started )) s"

# --network=host: no CNI network set-up (the build downloads nothing); layers are cached by Podman, so
# a change to the checkout reruns only the step that installs hpcgpu's wheel.
"${PODMAN[@]}" build --network=host --file container/Containerfile --tag "$IMAGE" \
    --build-arg BASE="$base" --build-arg EXTRAS="$EXTRAS" --build-arg DEPENDENCIES_ID="$dependencies_id" \
    --build-arg SOURCE_ID="$source_id" . >/tmp/hpcgpu-container-build.log 2>&1 \
    || { tail -30 /tmp/hpcgpu-container-build.log >&2; echo "podman build failed: /tmp/hpcgpu-container-build.log" >&2; exit 1; }
rm -rf container/wheels
# Layers of earlier builds of this tag would pile up from commit to commit.
"${PODMAN[@]}" image prune --force >/dev/null
echo "[container] built $IMAGE ($("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}')) in $(( SECONDS - started )) s"
