"""`python -m scorekeeper_worker.hub_download`: the hf:// init container of a worker pod (the operator renders it).

Downloads one commit of a Hugging Face Hub repository, and only the files a scoring model needs, into HF_TARGET
(`/models/<org>/<name>/<commit>`): the config and tokenizer files, sentence-transformers module files, and the
`.safetensors` weights, or just the one `.gguf` file HF_FILE names. Never `.bin`/`.pt`/`.onnx`/`.h5` copies of the
same weights, READMEs or images. The target counts as complete once it holds COMPLETE_MARKER: a cache PVC that has it
is reused without a single request, and an interrupted download leaves a `.partial-*` directory, never a
half-filled target. Several pods filling one cache at once each download into their own partial directory; the
first rename wins and the others discard theirs.

Environment: HF_REPO_ID, HF_REVISION (a 40-hex commit), HF_TARGET, HF_FILE, HF_SIZE_LIMIT_BYTES, HF_ENDPOINT,
HF_TOKEN, HF_HUB_OFFLINE (air-gapped: check the cache, never download). A failure exits 1 after writing one
paragraph to the container's termination message, which the operator shows in the ScoringModel's status.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

COMPLETE_MARKER = ".scorekeeper-complete"
TERMINATION_LOG = Path("/dev/termination-log")
# Files a model directory needs, at the repository root or in a sentence-transformers module directory (1_Pooling/).
NEEDED = ("*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja", "*.safetensors")
_MODULE_DIR = re.compile(r"^[0-9]+_[A-Za-z]\w*$")


class DownloadError(Exception):
    """What went wrong, in one paragraph a user can act on."""


def select_files(files: list[str], gguf: str | None = None) -> list[str]:
    """The files of a repository that the worker loads, sorted. Pure; raises DownloadError when there are none."""
    if gguf is not None:
        if gguf not in files:
            raise DownloadError(f"the repository has no file {gguf!r} (its .gguf files:"
                                f" {sorted(f for f in files if f.endswith('.gguf')) or 'none'})")
        return [gguf]
    chosen = []
    for name in files:
        *dirs, base = name.split("/")
        in_place = not dirs or (len(dirs) == 1 and _MODULE_DIR.match(dirs[0]))
        if in_place and any(fnmatch.fnmatch(base, pattern) for pattern in NEEDED):
            chosen.append(name)
    if not any(name.endswith(".safetensors") for name in chosen):
        ggufs = sorted(f for f in files if f.endswith(".gguf"))
        hint = f"; it has GGUF files: name one as hf://<org>/<name>/{ggufs[0]}" if ggufs else \
            "; convert the weights to safetensors, or serve them from a pvc:// volume"
        raise DownloadError(f"the repository has no .safetensors weights{hint}")
    if "config.json" not in chosen:
        raise DownloadError("the repository has no config.json at its root: not a transformers model directory")
    return sorted(chosen)


def is_complete(target: Path) -> bool:
    return (target / COMPLETE_MARKER).is_file()


def download(repo: str, commit: str, target: Path, *, gguf: str | None = None, size_limit: int | None = None,
             endpoint: str | None = None, token: str | None = None) -> list[str]:
    """Fill `target` with the needed files of `repo` at `commit`; returns the file names."""
    from huggingface_hub import HfApi, hf_hub_download

    siblings = HfApi(endpoint=endpoint, token=token).model_info(repo, revision=commit, files_metadata=True).siblings
    sizes = {s.rfilename: s.size or 0 for s in siblings or []}
    files = select_files(list(sizes), gguf)
    total = sum(sizes[name] for name in files)
    if size_limit is not None and total > size_limit:
        raise DownloadError(f"the files needed ({len(files)}, {total / 2**30:.2f} GiB) exceed model.downloadSizeLimit"
                            f" ({size_limit / 2**30:.2f} GiB): raise the limit, or use a model.cache PVC")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        for name in files:
            hf_hub_download(repo, name, revision=commit, local_dir=partial, endpoint=endpoint, token=token)
        shutil.rmtree(partial / ".cache", ignore_errors=True)  # huggingface_hub's bookkeeping for local_dir
        (partial / COMPLETE_MARKER).write_text(json.dumps({"repo": repo, "commit": commit, "files": files}) + "\n")
        for path in [partial, *partial.rglob("*")]:  # readable by any user of a shared cache
            path.chmod(0o755 if path.is_dir() else 0o644)
        try:
            os.rename(partial, target)
        except OSError:
            if not is_complete(target):  # not another pod that finished first
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return files


def _unwritable(directory: Path) -> OSError | None:
    """Why the download cannot write where it puts its files, before it asks the Hub for anything."""
    existing = directory
    while not existing.exists() and existing != existing.parent:  # created later, by the download itself
        existing = existing.parent
    try:
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as error:
        return error
    return None


def _fail(message: str) -> int:
    print(f"hub_download: {message}", file=sys.stderr)
    if TERMINATION_LOG.is_file():  # the kubelet creates it in a pod; elsewhere stderr is enough
        TERMINATION_LOG.write_text(message)
    return 1


def main(environ: dict[str, str] | None = None) -> int:
    env = dict(os.environ if environ is None else environ)
    repo, commit, target = env["HF_REPO_ID"], env["HF_REVISION"], Path(env["HF_TARGET"])
    where = f"{repo}@{commit}"
    if is_complete(target):
        print(f"hub_download: {where} is already in {target}")
        return 0
    if env.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes"}:
        return _fail(f"{where} is not in the model cache ({target} has no {COMPLETE_MARKER}) and this operator does"
                     " not download (air-gapped): copy the snapshot into the cache PVC first (docs/deploy.md)")
    unwritable = _unwritable(target.parent)
    if unwritable is not None:
        return _fail(f"{target.parent} is not writable by uid {os.getuid()} gid {os.getgid()} (supplementary groups"
                     f" {os.getgroups()}): {unwritable}. Most CSI drivers do not apply fsGroup to ReadWriteMany"
                     " volumes: give the volume to uid/gid 10001 through its StorageClass (examples/reranker-gpu.yaml"
                     " shows how for NFS, EFS and Azure Files), or annotate the PersistentVolume with"
                     " pv.beta.kubernetes.io/gid for a group-writable export")
    limit = env.get("HF_SIZE_LIMIT_BYTES")
    try:
        files = download(repo, commit, target, gguf=env.get("HF_FILE") or None,
                         size_limit=int(limit) if limit else None, endpoint=env.get("HF_ENDPOINT") or None,
                         token=env.get("HF_TOKEN") or None)
    except DownloadError as error:
        return _fail(f"{where}: {error}")
    except Exception as error:  # the Hub's and the network's errors, named as they are
        return _fail(f"downloading {where} from {env.get('HF_ENDPOINT', 'the Hub')} failed:"
                     f" {type(error).__name__}: {error}")
    print(f"hub_download: {where}: {len(files)} files in {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
