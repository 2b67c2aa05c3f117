#!/usr/bin/env bash
# Build the workbench GPU image from the repository root.
#
#   docker/build.sh                      build workbench:<version> and workbench:latest
#   docker/build.sh --pin-base           first resolve the base image tag to its digest and
#                                        build FROM that digest (reproducible)
#   docker/build.sh --print              print the docker command instead of running it
#   docker/build.sh --engine podman      build with podman (in Docker's image format, so that
#                                        SHELL and HEALTHCHECK are kept: podman's default OCI
#                                        format drops them)
#   docker/build.sh -- --no-cache ...    everything after -- goes to `docker build`
#
# Environment: IMAGE (default workbench), BASE_IMAGE (default: the Dockerfile's ARG),
# USER_UID/USER_GID (default: yours, so files in a bind-mounted /workspace are yours),
# ENGINE (docker or podman; --engine wins).
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-workbench}
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -n1)
BASE_IMAGE=${BASE_IMAGE:-$(sed -n 's/^ARG BASE_IMAGE=//p' docker/Dockerfile | head -n1)}
USER_UID=${USER_UID:-$(id -u)}
USER_GID=${USER_GID:-$(id -g)}
# The image's user must not be root: fall back to 1000 when built by root (CI, cloud shells).
if [ "$USER_UID" = 0 ]; then USER_UID=1000; fi
if [ "$USER_GID" = 0 ]; then USER_GID=1000; fi

ENGINE=${ENGINE:-docker}
pin_base=0
print_only=0
extra=()
while [ "$#" -gt 0 ]; do
    case "$1" in
        --pin-base) pin_base=1 ;;
        --print) print_only=1 ;;
        --engine) shift; ENGINE=${1:?--engine needs docker or podman} ;;
        --engine=*) ENGINE=${1#--engine=} ;;
        --) shift; extra=("$@"); break ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "build.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

if [ "$pin_base" = 1 ] && [ "${BASE_IMAGE#*@sha256:}" = "$BASE_IMAGE" ]; then
    "$ENGINE" pull "$BASE_IMAGE"
    BASE_IMAGE=$("$ENGINE" inspect --format '{{index .RepoDigests 0}}' "$BASE_IMAGE")
    echo "[build] base image pinned: $BASE_IMAGE"
fi

VCS_REF=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
BUILD_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
case "$ENGINE" in
    docker) engine_options=() ;;
    # podman 4.3 (buildah 1.28) takes a LABEL step from its cache even when the build
    # arguments in it changed, so the image would keep the first build's date and commit:
    # --label sets the two per-build labels on the final image, past the cache.
    podman) engine_options=(--format docker
                            --label "org.opencontainers.image.created=$BUILD_DATE"
                            --label "org.opencontainers.image.revision=$VCS_REF") ;;
    *) echo "build.sh: unknown engine $ENGINE (docker or podman)" >&2; exit 2 ;;
esac
cmd=("$ENGINE" build "${engine_options[@]}"
    -f docker/Dockerfile
    --build-arg "BASE_IMAGE=$BASE_IMAGE"
    --build-arg "WORKBENCH_VERSION=$VERSION"
    --build-arg "VCS_REF=$VCS_REF"
    --build-arg "BUILD_DATE=$BUILD_DATE"
    --build-arg "USER_UID=$USER_UID"
    --build-arg "USER_GID=$USER_GID"
    -t "$IMAGE:$VERSION" -t "$IMAGE:latest"
    "${extra[@]}"
    .)
echo "[build] ${cmd[*]}"
if [ "$print_only" = 1 ]; then exit 0; fi
# BuildKit reads docker/Dockerfile.dockerignore, which keeps .venv, .git and outputs out
# of the build context.
DOCKER_BUILDKIT=1 "${cmd[@]}"
echo "[build] done: $IMAGE:$VERSION. Start it with: $ENGINE compose -f docker/compose.yaml up -d"
