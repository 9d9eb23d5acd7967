"""The fixed layout of a worker pod: its user, the writable paths, and every name the operator sets itself.

spec.pod may add volumes, mounts, env and labels, but never one of the names below: the operator's own settings
(security, caches, offline mode, the selector) must survive whatever a ScoringModel adds.
"""

from __future__ import annotations

from scorekeeper_operator.spec.worker_contract import API_KEY_DIR, CONFIG_DIR, MODEL_MOUNT

# The worker image's user (Dockerfile: useradd --uid 10001 --gid 10001); numeric so runAsNonRoot can verify it.
WORKER_UID = 10001
WORKER_GID = 10001

TMP_DIR = "/tmp"
# The root filesystem is read-only: HOME and every cache PyTorch, Triton, CUDA and Hugging Face write go here.
CACHE_DIR = "/var/cache/scorekeeper"
SHM_DIR = "/dev/shm"

TMP_SIZE_LIMIT = "1Gi"
CACHE_SIZE_LIMIT = "4Gi"  # Triton and TorchInductor kernels, CUDA's PTX JIT cache: tens to hundreds of MiB
SHM_SIZE_LIMIT = "1Gi"  # without a GPU, and the least with one
SHM_BYTES_PER_BATCH_TOKEN = 128 * 1024  # with a GPU: /dev/shm grows with scoring.maxBatchTokens (8192 → 1Gi)

# Environment of the worker container (besides what spec.pod.env adds): caches into CACHE_DIR, no downloads.
WORKER_ENV: dict[str, str] = {
    "HOME": CACHE_DIR,
    "TMPDIR": TMP_DIR,
    "XDG_CACHE_HOME": f"{CACHE_DIR}/xdg",
    "HF_HOME": f"{CACHE_DIR}/huggingface",
    "TRITON_CACHE_DIR": f"{CACHE_DIR}/triton",
    "TORCHINDUCTOR_CACHE_DIR": f"{CACHE_DIR}/inductor",
    "CUDA_CACHE_PATH": f"{CACHE_DIR}/nv",
    # The worker never downloads: weights come from a volume, the image, or the download init container.
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
# Set on the hf:// download init container (besides HOME/TMPDIR/HF_HOME above).
DOWNLOAD_ENV_NAMES = ("HF_REPO_ID", "HF_REVISION", "HF_FILE", "HF_TARGET", "HF_SIZE_LIMIT_BYTES", "HF_ENDPOINT",
                      "HF_TOKEN", "HF_HUB_DISABLE_TELEMETRY")
RESERVED_ENV = frozenset([*WORKER_ENV, *DOWNLOAD_ENV_NAMES])
# The worker reads SCOREKEEPER_<FLAG>; flags the operator renders would silently win over them, and the others are
# extraArgs' job, so spec.pod.env sets none.
WORKER_ENV_PREFIX = "SCOREKEEPER_"

# Volumes and mount paths of the operator's own; spec.pod.volumes / volumeMounts may not reuse them.
RESERVED_VOLUMES = frozenset({"config", "shm", "tmp", "cache", "model", "api-keys"})
RESERVED_MOUNT_PATHS = (MODEL_MOUNT, CONFIG_DIR, TMP_DIR, CACHE_DIR, SHM_DIR, API_KEY_DIR)

# Pod labels the operator sets (render.common_labels; a test keeps the two equal); the first two select the pods.
RESERVED_LABELS = frozenset({"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component",
                             "app.kubernetes.io/part-of", "app.kubernetes.io/managed-by"})
# Annotation keys under this prefix are the operator's (the config hash, the default image).
RESERVED_ANNOTATION_PREFIX = "scorekeeper.dev/"
# Annotations that choose a container's AppArmor or seccomp profile: only the profiles the restricted Pod Security
# level allows (runtime/default, localhost/<profile>), or a CR author could run the pods unconfined.
PROFILE_ANNOTATION_PREFIXES = ("container.apparmor.security.beta.kubernetes.io/",
                               "seccomp.security.alpha.kubernetes.io/",
                               "container.seccomp.security.alpha.kubernetes.io/")
DEFAULT_PROFILE, LOCAL_PROFILE_PREFIX = "runtime/default", "localhost/"

# The NVIDIA container runtime gives a container the GPUs and driver capabilities its NVIDIA_* variables name (the
# worker image, a CUDA base, says NVIDIA_VISIBLE_DEVICES=all). A container that requests no NVIDIA resource gets
# `void` (the pod's env wins over the image's and over envFrom); spec.pod.env sets no NVIDIA_* variable.
NVIDIA_ENV_PREFIX = "NVIDIA_"
NVIDIA_RESOURCE_PREFIX = "nvidia.com/"
NO_GPUS_ENV: dict[str, str] = {"NVIDIA_VISIBLE_DEVICES": "void"}
