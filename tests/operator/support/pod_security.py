"""The Pod Security Standards' "restricted" level, as written in the Kubernetes docs (concepts/security/pod-security-
standards) and implemented by the pod-security-admission checks (k8s.io/pod-security-admission/policy), for the
newest version of each control. `restricted_violations(pod_spec, pod_metadata)` lists every control a pod breaks.

Controls, restricted includes baseline ("Fields" are checked on the pod and on every container, init container and
ephemeral container):

 baseline  1 HostProcess          securityContext.windowsOptions.hostProcess unset or false
 baseline  2 Host Namespaces      hostNetwork, hostPID, hostIPC unset or false
 baseline  3 Privileged           securityContext.privileged unset or false
 baseline  4 Capabilities         capabilities.add only from the default set
 baseline  5 HostPath Volumes     no hostPath volume
 baseline  6 Host Ports           ports[*].hostPort unset or 0
 baseline  7 AppArmor             appArmorProfile.type unset, RuntimeDefault or Localhost; the beta annotations
                                  runtime/default or localhost/*
 baseline  8 SELinux              seLinuxOptions.type unset or a container type; .user and .role unset
 baseline  9 /proc Mount Type     procMount unset or Default
 baseline 10 Seccomp              seccompProfile.type not Unconfined
 baseline 11 Sysctls              only the namespaced safe set
 baseline 12 Probe/lifecycle host httpGet.host and tcpSocket.host unset in probes and lifecycle handlers (1.34)
 restricted 13 Volume Types       only configMap, csi, downwardAPI, emptyDir, ephemeral, persistentVolumeClaim,
                                  projected, secret
 restricted 14 Privilege Escalation  allowPrivilegeEscalation explicitly false on every container
 restricted 15 Running as Non-root   runAsNonRoot true on the pod, or on every container; never false
 restricted 16 Non-root user      runAsUser never 0
 restricted 17 Seccomp            RuntimeDefault or Localhost on the pod, or on every container
 restricted 18 Capabilities       every container drops ALL, adds at most NET_BIND_SERVICE

The seccomp annotations (`seccomp.security.alpha.kubernetes.io/pod`, `container.seccomp…/<name>`) are checked as the
profile's older versions check them (only runtime/default, docker/default or localhost/*): the fields replaced them,
but a CR author must not be able to set them either.

`hardening_violations` adds what this project asks beyond the profile: a read-only root filesystem on every
container and no service-account token. `gpu_exposure` checks that no container gets a GPU it did not request: the
worker image (a CUDA base) says NVIDIA_VISIBLE_DEVICES=all, which the NVIDIA container runtime honours, so every
container that requests no `nvidia.com/` resource must say `void`, and no container sets another NVIDIA_* variable.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
SECCOMP_ANNOTATIONS = ("seccomp.security.alpha.kubernetes.io/", "container.seccomp.security.alpha.kubernetes.io/")
RESTRICTED_VOLUME_SOURCES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                             "projected", "secret"}


def containers(pod: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from pod.get(key) or []


def _security(container: dict[str, Any]) -> dict[str, Any]:
    return container.get("securityContext") or {}


def _contexts(pod: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    yield "pod", pod.get("securityContext") or {}
    for container in containers(pod):
        yield container["name"], _security(container)


def _baseline(pod: dict[str, Any], metadata: dict[str, Any]) -> Iterator[str]:
    for owner, context in _contexts(pod):
        if (context.get("windowsOptions") or {}).get("hostProcess"):
            yield f"1 HostProcess: {owner}"
        if (context.get("appArmorProfile") or {}).get("type", "RuntimeDefault") not in ("RuntimeDefault", "Localhost"):
            yield f"7 AppArmor: {owner}"
        selinux = context.get("seLinuxOptions") or {}
        if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            yield f"8 SELinux: {owner}"
        if (context.get("seccompProfile") or {}).get("type") == "Unconfined":
            yield f"10 Seccomp Unconfined: {owner}"
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            yield f"2 Host Namespaces: {key}"
    for key, value in (metadata.get("annotations") or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") \
                and value != "runtime/default" and not value.startswith("localhost/"):
            yield f"7 AppArmor annotation: {key}"
        if key.startswith(SECCOMP_ANNOTATIONS) and value not in ("runtime/default", "docker/default") \
                and not value.startswith("localhost/"):
            yield f"10 Seccomp annotation: {key}"
    for sysctl in (pod.get("securityContext") or {}).get("sysctls") or []:
        if sysctl["name"] not in SAFE_SYSCTLS:
            yield f"11 Sysctls: {sysctl['name']}"
    for container in containers(pod):
        name, context = container["name"], _security(container)
        if context.get("privileged"):
            yield f"3 Privileged: {name}"
        if set((context.get("capabilities") or {}).get("add") or []) - BASELINE_CAPABILITIES:
            yield f"4 Capabilities beyond the default set: {name}"
        if any(port.get("hostPort") for port in container.get("ports") or []):
            yield f"6 Host Ports: {name}"
        if context.get("procMount", "Default") != "Default":
            yield f"9 /proc Mount Type: {name}"
        handlers = [container.get(p) or {} for p in ("livenessProbe", "readinessProbe", "startupProbe")]
        handlers += [(container.get("lifecycle") or {}).get(h) or {} for h in ("postStart", "preStop")]
        if any((h.get("httpGet") or {}).get("host") or (h.get("tcpSocket") or {}).get("host") for h in handlers):
            yield f"12 Probe or lifecycle host: {name}"
    for volume in pod.get("volumes") or []:
        if "hostPath" in volume:
            yield f"5 HostPath Volumes: {volume['name']}"


def _restricted(pod: dict[str, Any]) -> Iterator[str]:
    for volume in pod.get("volumes") or []:
        sources = set(volume) - {"name"}
        if not sources <= RESTRICTED_VOLUME_SOURCES:
            yield f"13 Volume Types: {volume['name']} uses {sorted(sources - RESTRICTED_VOLUME_SOURCES)}"
    pod_context = pod.get("securityContext") or {}
    pod_non_root = pod_context.get("runAsNonRoot")
    pod_seccomp = (pod_context.get("seccompProfile") or {}).get("type")
    if pod_non_root is False:
        yield "15 Running as Non-root: pod sets runAsNonRoot=false"
    for owner, context in _contexts(pod):
        if context.get("runAsUser") == 0:
            yield f"16 Running as Non-root user: {owner} runs as uid 0"
    for container in containers(pod):
        name, context = container["name"], _security(container)
        if context.get("allowPrivilegeEscalation") is not False:
            yield f"14 Privilege Escalation: {name} does not set allowPrivilegeEscalation=false"
        non_root = context.get("runAsNonRoot")
        if non_root is False or (non_root is None and pod_non_root is not True):
            yield f"15 Running as Non-root: {name}"
        seccomp = (context.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost") and not (seccomp is None and pod_seccomp in (
                "RuntimeDefault", "Localhost")):
            yield f"17 Seccomp: {name} has no RuntimeDefault/Localhost profile"
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            yield f"18 Capabilities: {name} does not drop ALL"
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            yield f"18 Capabilities: {name} adds {sorted(set(capabilities['add']) - {'NET_BIND_SERVICE'})}"


def restricted_violations(pod: dict[str, Any], metadata: dict[str, Any] | None = None) -> list[str]:
    return [*_baseline(pod, metadata or {}), *_restricted(pod)]


def hardening_violations(pod: dict[str, Any]) -> list[str]:
    found = [f"read-only root filesystem: {c['name']}" for c in containers(pod)
             if _security(c).get("readOnlyRootFilesystem") is not True]
    if pod.get("automountServiceAccountToken") is not False:
        found.append("the service-account token is mounted")
    return found


def gpu_exposure(pod: dict[str, Any]) -> list[str]:
    found = []
    for container in containers(pod):
        env = {e["name"]: e.get("value") for e in container.get("env") or []}
        resources = container.get("resources") or {}
        asks = any(name.startswith("nvidia.com/") for group in resources.values() for name in group)
        if not asks and env.get("NVIDIA_VISIBLE_DEVICES") != "void":
            found.append(f"{container['name']} requests no GPU but does not set NVIDIA_VISIBLE_DEVICES=void")
        if asks and "NVIDIA_VISIBLE_DEVICES" in env:
            found.append(f"{container['name']} sets NVIDIA_VISIBLE_DEVICES (the device plugin's)")
        if others := sorted(n for n in env if n.startswith("NVIDIA_") and n != "NVIDIA_VISIBLE_DEVICES"):
            found.append(f"{container['name']} sets {others}")
    return found
