"""spec.pod (the usual knobs of a real cluster) and spec.networkPolicy, typed and checked.

Kubernetes structures the API server validates in depth anyway (volume sources, valueFrom) pass through as given;
what is checked here is what keeps the operator's own pod settings intact: no volume type outside the Pod Security
"restricted" set, no reuse of the operator's volume names, mount paths, environment variables or selector labels.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import Field, model_validator

from scorekeeper_operator.spec import pod_layout
from scorekeeper_operator.spec.base import Spec

_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"  # DNS subdomain (Secrets, ServiceAccounts, RuntimeClasses)


class LocalObjectReference(Spec):
    name: str = Field(min_length=1, max_length=253, pattern=_NAME)


class LabelSelectorRequirement(Spec):
    key: str = Field(min_length=1, max_length=317)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[str, ...] = ()


class LabelSelector(Spec):
    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: tuple[LabelSelectorRequirement, ...] = ()


class EnvVar(Spec):
    name: str = Field(min_length=1, max_length=256, pattern=r"^[^=]+$")
    value: str | None = None
    value_from: dict[str, Any] | None = None  # secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef


class EnvFromReference(Spec):
    name: str = Field(min_length=1, max_length=253)
    optional: bool | None = None


class EnvFromSource(Spec):
    prefix: str | None = None
    config_map_ref: EnvFromReference | None = None
    secret_ref: EnvFromReference | None = None


class Volume(Spec):
    """One of the volume types the Pod Security "restricted" profile allows (hostPath, nfs, … are not)."""

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    config_map: dict[str, Any] | None = None
    secret: dict[str, Any] | None = None
    empty_dir: dict[str, Any] | None = None
    persistent_volume_claim: dict[str, Any] | None = None
    projected: dict[str, Any] | None = None
    downward_api: dict[str, Any] | None = Field(None, alias="downwardAPI")
    csi: dict[str, Any] | None = None
    ephemeral: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        sources = [name for name in type(self).model_fields if name != "name" and getattr(self, name) is not None]
        if len(sources) != 1:
            raise ValueError(f"pod.volumes {self.name!r} must have exactly one source, not {len(sources)}")
        return self


class VolumeMount(Spec):
    name: str = Field(min_length=1, max_length=63)
    mount_path: str = Field(min_length=2, max_length=1024, pattern=r"^/")
    read_only: bool | None = None
    sub_path: str | None = None


class TopologySpreadConstraint(Spec):
    max_skew: int = Field(ge=1)
    topology_key: str = Field(min_length=1, max_length=317)
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"]
    label_selector: LabelSelector | None = None  # None: the model's own pods (the operator fills in its selector)
    min_domains: int | None = Field(None, ge=1)
    match_label_keys: tuple[str, ...] = ()
    node_affinity_policy: Literal["Honor", "Ignore"] | None = None
    node_taints_policy: Literal["Honor", "Ignore"] | None = None


class PodOptions(Spec):
    service_account_name: str | None = Field(None, max_length=253, pattern=_NAME)
    image_pull_secrets: tuple[LocalObjectReference, ...] = Field((), max_length=16)
    env: tuple[EnvVar, ...] = Field((), max_length=64)
    env_from: tuple[EnvFromSource, ...] = Field((), max_length=16)
    volumes: tuple[Volume, ...] = Field((), max_length=32)
    volume_mounts: tuple[VolumeMount, ...] = Field((), max_length=32)
    labels: dict[str, str] = Field(default_factory=dict, max_length=32)
    annotations: dict[str, str] = Field(default_factory=dict, max_length=32)
    runtime_class_name: str | None = Field(None, max_length=253, pattern=_NAME)
    topology_spread_constraints: tuple[TopologySpreadConstraint, ...] = Field((), max_length=8)

    @model_validator(mode="after")
    def _keeps_operator_settings(self) -> Self:
        env = sorted(e.name for e in self.env
                     if e.name in pod_layout.RESERVED_ENV or e.name.startswith(pod_layout.WORKER_ENV_PREFIX))
        if env:
            raise ValueError(f"pod.env sets {env}: the operator sets these (SCOREKEEPER_* configure the worker:"
                             " use the spec fields or extraArgs)")
        if nvidia := sorted(e.name for e in self.env if e.name.startswith(pod_layout.NVIDIA_ENV_PREFIX)):
            raise ValueError(f"pod.env must not set NVIDIA_* variables ({', '.join(nvidia)}): the NVIDIA container"
                             " runtime would give the pod GPUs it did not request; ask for one with resources.gpu")
        volumes = [v.name for v in self.volumes]
        if clash := sorted(set(volumes) & pod_layout.RESERVED_VOLUMES):
            raise ValueError(f"pod.volumes uses the operator's volume names {clash}")
        if len(set(volumes)) != len(volumes):
            raise ValueError("pod.volumes names must be unique")
        for mount in self.volume_mounts:
            if mount.name not in volumes:
                raise ValueError(f"pod.volumeMounts {mount.mount_path!r} names no volume in pod.volumes")
            path = mount.mount_path.rstrip("/")
            if any(path == p or path.startswith(p + "/") or p.startswith(path + "/")
                   for p in pod_layout.RESERVED_MOUNT_PATHS):
                raise ValueError(f"pod.volumeMounts {mount.mount_path!r} overlaps a path the operator mounts"
                                 f" ({', '.join(pod_layout.RESERVED_MOUNT_PATHS)})")
        if labels := sorted(set(self.labels) & pod_layout.RESERVED_LABELS):
            raise ValueError(f"pod.labels may not set {labels}: the operator's selector and identity labels")
        if keys := sorted(k for k in self.annotations if k.startswith(pod_layout.RESERVED_ANNOTATION_PREFIX)):
            raise ValueError(f"pod.annotations may not set {keys} ({pod_layout.RESERVED_ANNOTATION_PREFIX}*"
                             " belongs to the operator)")
        if profiles := sorted(f"{k}: {v}" for k, v in self.annotations.items()
                              if k.startswith(pod_layout.PROFILE_ANNOTATION_PREFIXES)
                              and v != pod_layout.DEFAULT_PROFILE
                              and not v.startswith(pod_layout.LOCAL_PROFILE_PREFIX)):
            raise ValueError(f"pod.annotations may set AppArmor and seccomp profiles only to runtime/default or"
                             f" localhost/<profile> (the restricted Pod Security level), not {'; '.join(profiles)}")
        return self


class IpBlock(Spec):
    cidr: str = Field(min_length=1, max_length=64)
    except_: tuple[str, ...] = Field((), alias="except")


class NetworkPolicyPeer(Spec):
    pod_selector: LabelSelector | None = None
    namespace_selector: LabelSelector | None = None
    ip_block: IpBlock | None = None

    @model_validator(mode="after")
    def _not_empty(self) -> Self:
        if self.pod_selector is None and self.namespace_selector is None and self.ip_block is None:
            raise ValueError("networkPolicy.from entries need podSelector, namespaceSelector or ipBlock")
        if self.ip_block is not None and (self.pod_selector is not None or self.namespace_selector is not None):
            raise ValueError("networkPolicy.from: ipBlock cannot be combined with a selector in one entry")
        return self


class NetworkPolicy(Spec):
    enabled: bool = False
    # Empty: pods of the ScoringModel's own namespace only. Never "everyone" (what an empty `from` means upstream).
    from_: tuple[NetworkPolicyPeer, ...] = Field((), alias="from", max_length=32)
    monitoring_namespace: str = Field("monitoring", min_length=1, max_length=63,
                                      pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
