"""What the worker refuses before it listens or loads any weights, and which later load errors are refusals.

In order: a device the machine does not have, a model path that holds no model or an architecture outside the support
matrix (from its files: model/loader.refuse_early), a port that cannot be listened on. Each is a StartupRefused that
the command line prints as one line with its own exit status (cli.py). What can only fail once weights load (a head
missing from the checkpoint, the self-check, the int8 certificate, memory) fails in the loading thread; the errors
listed in REFUSALS are then logged as one line too, and anything else with its traceback: that is a bug.
"""

from __future__ import annotations

import torch

from scorekeeper_worker.api.listeners import Listeners
from scorekeeper_worker.api.termination import failure_reason
from scorekeeper_worker.base.config import Device, WorkerConfig
from scorekeeper_worker.base.errors import DeviceUnavailable, ModelRefused
from scorekeeper_worker.engine.runner.int8_trunk import Int8Unavailable
from scorekeeper_worker.model.loader import refuse_early
from scorekeeper_worker.serving.startup.quantization import CertificateFailed
from scorekeeper_worker.serving.startup.selfcheck import SelfCheckFailed

# Errors a load raises about the model or the machine rather than about the worker's code: ValueError (an unsupported
# architecture, a template, weights that do not fit: model/support.py, model/loader.py), OSError (missing or unreadable
# files), a failed self-check or certificate, int8 kernels missing, and the device out of memory.
REFUSALS: tuple[type[BaseException], ...] = (ValueError, OSError, SelfCheckFailed, CertificateFailed, Int8Unavailable,
                                             torch.OutOfMemoryError)


def check_device(device: Device) -> None:
    """--device cuda needs a CUDA device that torch can use; said before any weights load, with what to check."""
    if device != Device.CUDA or torch.cuda.is_available():
        return
    if torch.version.cuda is None:
        why = f"this torch ({torch.__version__}) is built without CUDA: install a CUDA build of torch"
    else:
        why = (f"torch (CUDA {torch.version.cuda}) finds no usable GPU: check the driver (nvidia-smi), "
               "CUDA_VISIBLE_DEVICES and, on Kubernetes, the container's nvidia.com/gpu request")
    raise DeviceUnavailable(f"--device cuda: {why}; or serve on --device cpu")


def preflight(config: WorkerConfig) -> Listeners:
    """The listening sockets, once nothing known before serving refuses this configuration."""
    check_device(config.device)
    try:
        refuse_early(config.model)
    except (ValueError, OSError) as error:  # ModelNotFound, UnsupportedModel, an unreadable config.json
        raise ModelRefused(failure_reason(config.model, error)) from None
    return Listeners.bind(config)
