"""Run one container of a rendered pod with podman, configured as the kubelet would run it: the pod's and the
container's securityContext (user, groups, read-only root, capabilities, no new privileges), env, volumes (emptyDirs
as tmpfs, ConfigMaps as read-only files), memory limit, command and args, ports (published on loopback), probes,
preStop hook and grace period. A field it cannot reproduce is refused, never dropped silently."""

from __future__ import annotations

import json
import resource
import shlex
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scorekeeper_operator.spec.quantity import quantity_bytes

# runc: crun refuses this machine's hybrid cgroup hierarchy. Explicit ulimits: podman asks for more open files than
# the machine allows, root here lacks CAP_SYS_RESOURCE to raise them, and podman caps its own nproc at 32768.
PODMAN = ["podman", "--runtime", "runc"]
MAX_NPROC = 32768

# Pod and container fields that change nothing for one container run by hand: scheduling, identity in a cluster,
# how status is reported. Everything else must be translated below or is refused.
IGNORED_POD_FIELDS = {"serviceAccountName", "automountServiceAccountToken", "enableServiceLinks", "nodeSelector",
                      "tolerations", "affinity", "priorityClassName", "topologySpreadConstraints"}
IGNORED_CONTAINER_FIELDS = {"name", "image", "imagePullPolicy", "terminationMessagePolicy", "startupProbe",
                            "readinessProbe", "livenessProbe", "lifecycle"}


def _ulimits() -> list[str]:
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], MAX_NPROC)
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]


def _security(pod: dict[str, Any], container: dict[str, Any]) -> list[str]:
    pod_ctx, ctx = pod.get("securityContext", {}), container.get("securityContext", {})
    assert set(pod_ctx) <= {"runAsNonRoot", "runAsUser", "runAsGroup", "fsGroup", "fsGroupChangePolicy",
                            "seccompProfile", "supplementalGroups"}, pod_ctx
    assert set(ctx) <= {"allowPrivilegeEscalation", "privileged", "readOnlyRootFilesystem", "runAsNonRoot",
                        "capabilities", "runAsUser", "runAsGroup"}, ctx
    assert pod_ctx.get("seccompProfile", {"type": "RuntimeDefault"}) == {"type": "RuntimeDefault"}  # podman's default
    assert not ctx.get("privileged"), "privileged containers are not reproduced"
    uid, gid = ctx.get("runAsUser", pod_ctx.get("runAsUser")), ctx.get("runAsGroup", pod_ctx.get("runAsGroup"))
    args = ["--security-opt", "no-new-privileges"] if ctx.get("allowPrivilegeEscalation") is False else []
    if uid is not None:
        args += ["--user", f"{uid}:{gid if gid is not None else uid}"]
    for group in [pod_ctx.get("fsGroup"), *pod_ctx.get("supplementalGroups", [])]:
        if group is not None:
            args += ["--group-add", str(group)]  # the kubelet adds fsGroup to every container's groups
    if ctx.get("readOnlyRootFilesystem"):
        args += ["--read-only", "--read-only-tmpfs=false"]  # podman would add writable /tmp, /run: Kubernetes does not
    caps = ctx.get("capabilities", {})
    args += [arg for cap in caps.get("drop", []) for arg in ("--cap-drop", cap.lower())]
    args += [arg for cap in caps.get("add", []) for arg in ("--cap-add", cap.lower())]
    return args


def _volumes(pod: dict[str, Any], container: dict[str, Any], configmaps: dict[str, dict[str, str]],
             workdir: Path) -> list[str]:
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    args: list[str] = []
    for mount in container.get("volumeMounts", []):
        assert set(mount) <= {"name", "mountPath", "readOnly"}, mount
        volume, path, read_only = volumes[mount["name"]], mount["mountPath"], bool(mount.get("readOnly"))
        if "emptyDir" in volume:
            size = volume["emptyDir"].get("sizeLimit")
            options = ["type=tmpfs", f"destination={path}", "tmpfs-mode=1777"]
            options += [f"tmpfs-size={quantity_bytes(size)}"] if size else []
            args += ["--mount", ",".join([*options, *(["ro=true"] if read_only else [])])]
        elif "configMap" in volume:
            assert set(volume["configMap"]) == {"name"}, volume  # items, modes: not rendered, so not reproduced
            source = workdir / mount["name"]
            source.mkdir(mode=0o755)
            for key, text in configmaps[volume["configMap"]["name"]].items():
                (source / key).write_text(text)
                (source / key).chmod(0o644)
            args += ["--mount", f"type=bind,source={source},destination={path},ro=true"]
        else:
            raise AssertionError(f"volume {volume} is not reproduced by this harness")
    return args


def _env(container: dict[str, Any]) -> list[str]:
    assert "envFrom" not in container
    for var in container.get("env", []):
        assert set(var) == {"name", "value"}, f"{var}: only literal values are reproduced"
    return [arg for var in container.get("env", []) for arg in ("--env", f"{var['name']}={var['value']}")]


def run_args(pod: dict[str, Any], container: dict[str, Any], configmaps: dict[str, dict[str, str]],
             workdir: Path) -> list[str]:
    """`podman run` options and trailing arguments for `container` of the pod spec `pod`."""
    assert set(pod) - IGNORED_POD_FIELDS <= {"securityContext", "containers", "volumes",
                                             "terminationGracePeriodSeconds"}, sorted(pod)
    assert set(container) - IGNORED_CONTAINER_FIELDS <= {"command", "args", "env", "ports", "resources",
                                                         "volumeMounts", "securityContext", "workingDir"}
    args = [*_ulimits(), "--pull", "never", "--image-volume", "ignore", "--no-healthcheck"]
    args += _security(pod, container) + _volumes(pod, container, configmaps, workdir) + _env(container)
    limits = container.get("resources", {}).get("limits", {})
    assert set(limits) <= {"memory", "cpu"}, limits
    if "memory" in limits:
        args += ["--memory", str(quantity_bytes(limits["memory"]))]
    if "cpu" in limits:
        args += ["--cpus", str(limits["cpu"])]
    for port in container.get("ports", []):
        args += ["--publish", f"127.0.0.1::{port['containerPort']}/{port.get('protocol', 'TCP').lower()}"]
    if "workingDir" in container:
        args += ["--workdir", container["workingDir"]]
    if "command" in container:
        args += ["--entrypoint", json.dumps(container["command"])]
    return [*args, container["image"], *container.get("args", [])]


@dataclass
class PodContainer:
    """A running container of a rendered pod."""

    name: str
    pod: dict[str, Any]
    container: dict[str, Any]

    @classmethod
    def start(cls, pod: dict[str, Any], container: dict[str, Any], configmaps: dict[str, dict[str, str]],
              workdir: Path) -> PodContainer:
        name = f"scorekeeper-smoke-{uuid.uuid4().hex[:8]}"
        command = [*PODMAN, "run", "--detach", "--name", name, *run_args(pod, container, configmaps, workdir)]
        started = subprocess.run(command, capture_output=True, text=True)
        assert started.returncode == 0, f"{shlex.join(command)}\n{started.stderr}"
        return cls(name, pod, container)

    def podman(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout)

    def address(self, port_name: str) -> str:
        """host:port on loopback where the container's named port is published."""
        port = next(p for p in self.container["ports"] if p["name"] == port_name)
        published = self.podman("port", self.name, f"{port['containerPort']}/tcp").stdout.split()
        assert published, f"port {port_name} is not published"
        return published[0]

    def get(self, port_name: str, path: str, timeout: float = 10) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://{self.address(port_name)}{path}", timeout=timeout) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def probe(self, kind: str) -> int:
        """HTTP status of the rendered probe `kind` (startupProbe, readinessProbe, livenessProbe)."""
        probe = self.container[kind]
        return self.get(probe["httpGet"]["port"], probe["httpGet"]["path"], timeout=probe["timeoutSeconds"])[0]

    def exec(self, *command: str) -> subprocess.CompletedProcess[str]:
        return self.podman("exec", self.name, *command)

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = json.loads(self.podman("inspect", "--format", "{{json .State}}", self.name).stdout)
        return state

    def logs(self) -> str:
        done = self.podman("logs", self.name)
        return done.stdout + done.stderr

    def wait(self, timeout: float) -> int | None:
        """The exit status, or None if the process still runs after `timeout` seconds."""
        try:
            return int(self.podman("wait", self.name, timeout=timeout).stdout.strip())
        except subprocess.TimeoutExpired:
            return None

    def terminate(self) -> int:
        """What the kubelet does to stop the pod: the preStop hook, SIGTERM, then at most the grace period before it
        would send SIGKILL. The exit status; AssertionError if the process outlives the grace period."""
        deadline = time.monotonic() + self.pod.get("terminationGracePeriodSeconds", 30)  # the hook counts too
        hook = self.container.get("lifecycle", {}).get("preStop", {})
        if hook:
            done = self.exec(*hook["exec"]["command"])
            assert done.returncode == 0, f"preStop hook failed: {done.stderr}"
        self.podman("kill", "--signal", "TERM", self.name)
        status = self.wait(deadline - time.monotonic())
        assert status is not None, "still running at the end of the grace period: the kubelet would SIGKILL it"
        return status

    def remove(self) -> None:
        self.podman("rm", "--force", "--time", "0", self.name)
