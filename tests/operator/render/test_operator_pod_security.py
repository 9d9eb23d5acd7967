"""Every worker pod the operator can render meets the Pod Security "restricted" level (pod_security.py lists and
implements its controls) and this project's hardening beyond it, and gets no GPU it did not ask for; the checker
itself catches each violation."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import crd_tools
import pytest
from pod_security import gpu_exposure, hardening_violations, restricted_violations
from render_cases import POD_VARIANTS, model_from, pod_spec, render_all, sample_model, variant_spec
from test_operator_render import MATRIX, matrix_spec

Pod = dict[str, Any]


def _rendered_pods() -> list[tuple[str, Pod, dict[str, Any]]]:
    pods = []
    for doc in crd_tools.valid_samples():
        rendered = render_all(sample_model(doc))
        pods.append((f"sample-{doc['metadata']['name']}", pod_spec(rendered), _template_meta(rendered)))
    for variant in POD_VARIANTS:
        rendered = render_all(model_from(variant_spec(*variant)))
        pods.append(("-".join(map(str, variant)), pod_spec(rendered), _template_meta(rendered)))
    for case in MATRIX:
        rendered = render_all(model_from(matrix_spec(*case)))
        pods.append(("matrix-" + "-".join(map(str, case)), pod_spec(rendered), _template_meta(rendered)))
    return pods


def _template_meta(rendered: Any) -> dict[str, Any]:
    meta: dict[str, Any] = rendered.get("Deployment")["spec"]["template"]["metadata"]
    return meta


PODS = _rendered_pods()


def test_every_example_and_sample_is_checked() -> None:
    names = {name for name, _, _ in PODS}
    examples = [d["metadata"]["name"] for d in crd_tools.example_documents() if d["kind"] == "ScoringModel"]
    assert examples and {f"sample-{name}" for name in examples} <= names
    assert len(PODS) == len(crd_tools.valid_samples()) + len(POD_VARIANTS) + len(MATRIX)


@pytest.mark.parametrize(("name", "pod", "meta"), PODS, ids=[name for name, _, _ in PODS])
def test_worker_pod_meets_the_restricted_profile(name: str, pod: Pod, meta: dict[str, Any]) -> None:
    assert restricted_violations(pod, meta) == []
    assert hardening_violations(pod) == []


def test_the_examples_namespaces_enforce_the_restricted_profile() -> None:
    """The examples run in namespaces that would reject any pod breaking the profile."""
    namespaces = [d for d in crd_tools.example_documents() if d["kind"] == "Namespace"]
    assert namespaces
    for namespace in namespaces:
        assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


# -- negative controls: the checker finds each violation in an otherwise compliant pod ---------------------------------
def _worker(pod: Pod) -> dict[str, Any]:
    worker: dict[str, Any] = pod["containers"][0]
    return worker


def _init(pod: Pod) -> dict[str, Any]:
    init: dict[str, Any] = pod["initContainers"][0]
    return init


MUTATIONS: dict[str, tuple[str, Callable[[Pod], Any]]] = {
    "host-process": ("1 ", lambda p: _worker(p)["securityContext"].update(windowsOptions={"hostProcess": True})),
    "host-network": ("2 ", lambda p: p.update(hostNetwork=True)),
    "host-pid": ("2 ", lambda p: p.update(hostPID=True)),
    "privileged-init": ("3 ", lambda p: _init(p)["securityContext"].update(privileged=True)),
    "add-sys-admin": ("4 ", lambda p: _worker(p)["securityContext"]["capabilities"].update(add=["SYS_ADMIN"])),
    "host-path": ("5 ", lambda p: p["volumes"].append({"name": "h", "hostPath": {"path": "/"}})),
    "host-port": ("6 ", lambda p: _worker(p)["ports"][0].update(hostPort=8000)),
    "apparmor-unconfined": ("7 ", lambda p: p["securityContext"].update(appArmorProfile={"type": "Unconfined"})),
    "selinux-user": ("8 ", lambda p: _worker(p)["securityContext"].update(seLinuxOptions={"user": "root"})),
    "proc-mount": ("9 ", lambda p: _worker(p)["securityContext"].update(procMount="Unmasked")),
    "seccomp-unconfined": ("10 ", lambda p: _init(p)["securityContext"].update(
        seccompProfile={"type": "Unconfined"})),
    "sysctl": ("11 ", lambda p: p["securityContext"].update(sysctls=[{"name": "kernel.msgmax", "value": "1"}])),
    "probe-host": ("12 ", lambda p: _worker(p)["readinessProbe"]["httpGet"].update(host="10.0.0.1")),
    "nfs-volume": ("13 ", lambda p: p["volumes"].append({"name": "n", "nfs": {"server": "s", "path": "/"}})),
    "escalation-unset": ("14 ", lambda p: _init(p)["securityContext"].pop("allowPrivilegeEscalation")),
    "root-allowed": ("15 ", lambda p: (p["securityContext"].pop("runAsNonRoot"),
                                       _worker(p)["securityContext"].pop("runAsNonRoot"))),
    "uid-zero": ("16 ", lambda p: _worker(p)["securityContext"].update(runAsUser=0)),
    "no-seccomp": ("17 ", lambda p: p["securityContext"].pop("seccompProfile")),
    "keeps-capabilities": ("18 ", lambda p: _init(p)["securityContext"]["capabilities"].update(drop=[])),
}


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_the_checker_catches_each_control(mutation: str) -> None:
    control, mutate = MUTATIONS[mutation]
    hf = next(pod for name, pod, _ in PODS if name.startswith("hf-full-"))
    broken = copy.deepcopy(hf)
    mutate(broken)
    found = restricted_violations(broken)
    assert any(v.startswith(control) for v in found), found


def test_the_checker_catches_the_apparmor_annotation_and_the_hardening_gaps() -> None:
    _, pod, meta = PODS[0]
    annotated = {**meta, "annotations": {"container.apparmor.security.beta.kubernetes.io/worker": "unconfined"}}
    assert [v[:2] for v in restricted_violations(pod, annotated)] == ["7 "]
    writable, token = copy.deepcopy(pod), copy.deepcopy(pod)
    _worker(writable)["securityContext"]["readOnlyRootFilesystem"] = False
    token.pop("automountServiceAccountToken")
    assert hardening_violations(writable) == ["read-only root filesystem: worker"]
    assert hardening_violations(token) == ["the service-account token is mounted"]


def test_the_checker_catches_a_seccomp_annotation_and_a_gpu_not_asked_for() -> None:
    _, pod, meta = PODS[0]
    for key in ("seccomp.security.alpha.kubernetes.io/pod", "container.seccomp.security.alpha.kubernetes.io/worker"):
        annotated = {**meta, "annotations": {key: "unconfined"}}
        assert [v[:3] for v in restricted_violations(pod, annotated)] == ["10 "]
    assert gpu_exposure(pod) == []
    seen, named = copy.deepcopy(pod), copy.deepcopy(pod)
    _worker(seen)["env"] = [e for e in _worker(seen)["env"] if e["name"] != "NVIDIA_VISIBLE_DEVICES"]
    _worker(named)["env"].append({"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"})
    assert gpu_exposure(seen) == ["worker requests no GPU but does not set NVIDIA_VISIBLE_DEVICES=void"]
    assert gpu_exposure(named) == ["worker sets ['NVIDIA_DRIVER_CAPABILITIES']"]


@pytest.mark.parametrize(("name", "pod", "meta"), PODS, ids=[name for name, _, _ in PODS])
def test_no_worker_pod_gets_a_gpu_it_did_not_ask_for(name: str, pod: Pod, meta: dict[str, Any]) -> None:
    assert gpu_exposure(pod) == []


def test_all_controls_have_a_negative_control() -> None:
    assert {control.strip() for control, _ in MUTATIONS.values()} == {str(n) for n in range(1, 19)}
