#!/usr/bin/env python3
"""Generate docs/configuration.md from the code: the worker's real argparse parser and pydantic config, the CRD's
openAPIV3Schema and CEL rules, and the operator's spec → flag rendering (`scorekeeper_operator.spec.flags`).

    python scripts/gen_config_docs.py           # rewrite docs/configuration.md
    python scripts/gen_config_docs.py --check   # exit 1 if the committed file differs from what would be generated

The CRD → worker flag column is measured, not copied: for every spec field the script renders the worker config of a
minimal ScoringModel with and without that field changed and reports which flags moved. A new CRD field without a
sample value below makes the script fail, so the table cannot silently miss it.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
for source in (REPO / "worker", REPO / "operator"):  # importable without an installed package
    if str(source) not in sys.path:
        sys.path.insert(0, str(source))

import yaml  # noqa: E402
from pydantic_core import PydanticUndefined  # noqa: E402
from scorekeeper_operator.spec import flags as operator_flags  # noqa: E402
from scorekeeper_operator.spec import worker_contract  # noqa: E402
from scorekeeper_operator.spec.model import ScoringModel  # noqa: E402
from scorekeeper_worker import cli  # noqa: E402
from scorekeeper_worker.base.config import WorkerConfig  # noqa: E402

OUTPUT = REPO / "docs" / "configuration.md"
CRD = REPO / "crds" / "scoringmodel.yaml"
REGENERATE = "python scripts/gen_config_docs.py"

# The smallest valid ScoringModel; each spec field is changed on top of it to see which worker flags it drives.
BASE_SPEC: dict[str, Any] = {"model": {"uri": "pvc://models/base"}}
BASE_NAME = "example"
# Sample values for spec fields whose alternative value cannot be derived from the schema alone (free strings, maps).
# Booleans, enums, integers and integer arrays are derived; everything else must be listed here.
COMMIT = "0123456789abcdef0123456789abcdef01234567"  # an hf:// revision that needs no Hub to resolve
SAMPLES: dict[str, Any] = {
    "model.uri": "pvc://models/other/dir",
    "model.revision": COMMIT,
    "model.cache.claimName": "hub-cache",
    "model.downloadSizeLimit": "4Gi",
    "model.servedName": "ranker",
    "scoring.promptTemplate": "qwen3-reranker",
    "scoring.labelTokens": [" yes", " no"],
    "scoring.quantizationCertificate.minSpearman": 0.995,
    "scoring.quantizationCertificate.minSpeedup": 1.5,
    "scoring.quantizationCertificate.maxScoreDelta": 0.05,
    "scoring.quantizationCertificate.minTop10": 0.9,
    "scoring.decisions.template": "{input} Question: {question} Answer:",
    "model.tokenSecretRef.name": "hf-token",
    "model.tokenSecretRef.key": "hf",
    "compile.cacheDir": "/compile-cache",
    "resources.gpu.resourceName": "amd.com/gpu",
    "resources.cpu": "2",
    "resources.memory": "8Gi",
    "resources.shmSize": "2Gi",
    "scheduling.nodeSelector": {"pool": "gpu"},
    "scheduling.tolerations[].key": "dedicated",
    "scheduling.tolerations[].value": "ml",
    "scheduling.tolerations[].operator": "Equal",
    "scheduling.tolerations[].effect": "NoSchedule",
    "scheduling.tolerations[].tolerationSeconds": 60,
    "scheduling.affinity": {"nodeAffinity": {}},
    "scheduling.priorityClassName": "high",
    "image": "registry.example.com/scorekeeper-worker:custom",
    "extraArgs": ["--attention-backend", "sdpa"],
    "monitoring.interval": "15s",
    "monitoring.labels": {"release": "prometheus"},
    "autoscaling.prometheusAddress": "http://prometheus.monitoring.svc:9090",
    "autoscaling.prometheusQuery": "sum(scorekeeper_queue_depth)",
    "pod.serviceAccountName": "scorer",
    "pod.imagePullSecrets": [{"name": "regcred"}],
    "pod.env": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
    "pod.envFrom": [{"configMapRef": {"name": "scorer-env"}}],
    "pod.volumes": [{"name": "ca", "configMap": {"name": "corporate-ca"}}],
    "pod.volumeMounts": [{"name": "ca", "mountPath": "/etc/ssl/corporate", "readOnly": True}],
    "pod.labels": {"team": "search"},
    "pod.annotations": {"example.com/owner": "search"},
    "pod.runtimeClassName": "nvidia",
    "pod.topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                       "whenUnsatisfiable": "ScheduleAnyway"}],
    "networkPolicy.from": [{"namespaceSelector": {"matchLabels": {"team": "search"}}}],
    "networkPolicy.monitoringNamespace": "observability",
    "auth.apiKeySecretRef.name": "scorer-keys",
    "auth.apiKeySecretRef.key": "api-keys",
}
# Fields that are only valid together with another one (the CRD's CEL rules); set in both renders of the comparison.
_HF = {"model.uri": "hf://org/name", "model.revision": COMMIT}
_KEDA = {"autoscaling.provider": "KEDA", "autoscaling.prometheusAddress": "http://prometheus:9090"}
PREREQUISITES: dict[str, dict[str, Any]] = {
    "model.revision": {"model.uri": "hf://org/name"},
    "model.tokenSecretRef.name": _HF,
    "model.tokenSecretRef.key": {**_HF, "model.tokenSecretRef.name": "hf-token"},
    "model.cache.claimName": _HF,
    "model.downloadSizeLimit": _HF,
    "scoring.multiItem.delimiterTokenId": {"scoring.multiItem.enabled": True},
    "autoscaling.prometheusAddress": _KEDA,
    "autoscaling.prometheusQuery": _KEDA,
    "pod.volumeMounts": {"pod.volumes": SAMPLES["pod.volumes"]},
    "auth.apiKeySecretRef.key": {"auth.apiKeySecretRef.name": "scorer-keys"},
    **{f"scoring.quantizationCertificate.{name}": {"scoring.quantization": "int8"}
       for name in ("minSpearman", "maxScoreDelta", "minTop10", "minSpeedup")},
}
# Set together with the field itself (only in the changed render): values that field cannot go without.
COMPANIONS: dict[str, dict[str, Any]] = {
    "autoscaling.provider": {"autoscaling.prometheusAddress": "http://prometheus:9090"},
}


# ---------------------------------------------------------------------------------------------------------------------
# Markdown helpers


def code(value: Any) -> str:
    """A table-safe code span (a pipe inside a code span still splits a GFM table cell unless escaped)."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "))
    return "`" + text.replace("|", "\\|") + "`"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


# ---------------------------------------------------------------------------------------------------------------------
# Worker flags


def serve_parser() -> argparse.ArgumentParser:
    parser = cli.build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices["serve"]
    raise RuntimeError("build_parser() has no `serve` command")


def _field_default(name: str) -> Any:
    field = WorkerConfig.model_fields[name]
    if field.is_required():
        return PydanticUndefined
    return str(field.default) if isinstance(field.default, Path) else field.default


def _default_text(name: str) -> str:
    default = _field_default(name)
    if default is PydanticUndefined:
        return "required"
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return code(str(default).lower())
    if isinstance(default, tuple):
        return code(",".join(str(v) for v in default))
    return code(getattr(default, "value", default))


def _bounds(name: str) -> list[str]:
    out = []
    for meta in WorkerConfig.model_fields[name].metadata:
        for attr, symbol in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if getattr(meta, attr, None) is not None:
                out.append(f"{symbol} {getattr(meta, attr)}")
    return out


def _values(action: argparse.Action) -> str:
    if action.choices:
        return " \\| ".join(code(c) for c in action.choices)
    if isinstance(action, argparse.BooleanOptionalAction):
        return "flag"
    kind = {int: "integer", float: "number", Path: "path"}.get(action.type, "string")  # type: ignore[arg-type]
    if action.dest == "cuda_graph_token_buckets":
        kind = "comma-separated integers"
    bounds = _bounds(action.dest) if action.dest in WorkerConfig.model_fields else []
    return ", ".join([kind, *bounds])


_DEFAULT_SUFFIX = re.compile(r"\s*\((?:default: .*; |required; )?env [A-Z0-9_]+\)$")


def _help(action: argparse.Action) -> str:
    return cell(_DEFAULT_SUFFIX.sub("", action.help or ""))


def flag_rows() -> list[list[str]]:
    rows = []
    for action in serve_parser()._actions:
        if not action.option_strings or action.dest == "help":
            continue
        flag = " / ".join(code(o) for o in action.option_strings)
        if action.dest in WorkerConfig.model_fields:
            env = code(cli.ENV_PREFIX + action.dest.upper())
            default = _default_text(action.dest)
            key = code(action.dest)
        else:  # --config: not a configuration value itself
            env, default, key = "—", "unset", "—"
        rows.append([flag, key, env, default, _values(action), _help(action)])
    return rows


def config_example() -> str:
    values: dict[str, Any] = {}
    for name in WorkerConfig.model_fields:
        default = _field_default(name)
        if default is PydanticUndefined:
            default = "/models/my-model"
        elif isinstance(default, tuple):
            default = list(default)
        elif default is not None:
            default = getattr(default, "value", default)
        values[name] = default
    return yaml.safe_dump(values, sort_keys=False).rstrip()


def check_parser_matches_config() -> None:
    """Every config field has a flag and vice versa (`--config` aside): the table would otherwise be incomplete."""
    dests = {a.dest for a in serve_parser()._actions if a.option_strings and a.dest not in ("help", "config")}
    fields = set(WorkerConfig.model_fields)
    if dests != fields:
        raise SystemExit(f"worker flags and WorkerConfig fields differ: flags only {sorted(dests - fields)}, "
                         f"fields only {sorted(fields - dests)}")


# ---------------------------------------------------------------------------------------------------------------------
# CRD


def load_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    return version["schema"]["openAPIV3Schema"]


def walk(node: dict[str, Any], path: str, required: bool = False) -> list[tuple[str, dict[str, Any], bool]]:
    """(dotted path, schema node, required) for the node and every property below it; array items as `[]`."""
    out = [(path, node, required)] if path else []
    needed = set(node.get("required", []))
    for name, child in node.get("properties", {}).items():
        out += walk(child, f"{path}.{name}" if path else name, name in needed)
    if node.get("type") == "array" and "items" in node and node["items"].get("properties"):
        out += [(p, n, r) for p, n, r in walk(node["items"], f"{path}[]") if p != f"{path}[]"]
    return out


def _type(node: dict[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "int or string"
    if "type" not in node and "pattern" in node and "minimum" in node:
        return "string or number"  # a quantity, quoted or not
    kind = node.get("type", "any")
    if kind == "array":
        return f"array of {node.get('items', {}).get('type', 'any')}"
    if kind == "object" and "additionalProperties" in node:
        return f"map of {node['additionalProperties'].get('type', 'any')}"
    if kind == "object" and node.get("x-kubernetes-preserve-unknown-fields"):
        return "object (free-form)"
    return kind


def _constraints(node: dict[str, Any], required: bool) -> str:
    parts = ["required"] if required else []
    if "enum" in node:
        parts.append(" \\| ".join(code(v) for v in node["enum"]))
    for key, label in (("minimum", "≥"), ("maximum", "≤"), ("minLength", "length ≥"), ("maxLength", "length ≤"),
                       ("minItems", "items ≥"), ("maxItems", "items ≤"), ("maxProperties", "keys ≤")):
        if key in node:
            exclusive = node.get(f"exclusive{key.capitalize()}") is True  # OpenAPI 3.0: a flag on the bound
            parts.append(f"{ {'≥': '>', '≤': '<'}[label] if exclusive else label} {node[key]}")
    items = node.get("items", {})
    if node.get("type") == "array" and ("minimum" in items or "maximum" in items):
        parts.append(f"each {items.get('minimum', '…')}–{items.get('maximum', '…')}")
    if "pattern" in node:
        parts.append("pattern " + code(node["pattern"]))
    return ", ".join(parts)


def _default_cell(node: dict[str, Any]) -> str:
    if "default" not in node or node["default"] == {}:
        return ""
    default = node["default"]
    return code(default if isinstance(default, str) and default else json.dumps(default, separators=(", ", ": ")))


def spec_nodes() -> list[tuple[str, dict[str, Any], bool]]:
    return walk(load_schema()["properties"]["spec"], "")


def cel_rows() -> list[list[str]]:
    schema = load_schema()
    rows = [["the whole object", code(rule["rule"]), cell(rule["message"])]
            for rule in schema.get("x-kubernetes-validations", [])]
    rows += [[code("spec"), code(rule["rule"]), cell(rule["message"])]
             for rule in schema["properties"]["spec"].get("x-kubernetes-validations", [])]
    for path, node, _ in walk(schema["properties"]["spec"], ""):
        for rule in node.get("x-kubernetes-validations", []):
            rows.append([code(path), code(rule["rule"]), cell(rule["message"])])
    return rows


# ---------------------------------------------------------------------------------------------------------------------
# CRD field → worker flag, measured through the operator's own rendering


def _set(spec: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    node = spec
    for part in parts[:-1]:
        if part.endswith("[]"):
            raise ValueError(path)
        node = node.setdefault(part, {})
    if parts[-1].endswith("[]"):
        raise ValueError(path)
    node[parts[-1]] = value


def _alternative(path: str, node: dict[str, Any]) -> Any:
    """A valid value different from the default (None: the field has none, e.g. a one-value enum)."""
    if path in SAMPLES:
        return SAMPLES[path]
    default = node.get("default")
    if "enum" in node:
        others = [v for v in node["enum"] if v != default]
        return others[0] if others else None
    kind = node.get("type")
    if kind == "boolean":
        return not default if default is not None else True
    if kind == "integer":
        value = default + 1 if default is not None else node.get("minimum", 0) + 1
        return value if value <= node.get("maximum", value) else default - 1
    if kind == "array" and node.get("items", {}).get("type") == "integer":
        return list(default[:1]) if default and len(default) > 1 else [node["items"].get("minimum", 1)]
    raise SystemExit(f"{CRD.name}: no sample value for spec.{path}; add one to SAMPLES in {Path(__file__).name}")


def _render(spec: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    # An hf:// branch is rendered once the operator has resolved it (status.model); ffff… stands for that commit.
    resolved = {"model": {**spec["model"], "resolvedRevision": "f" * 40}}
    model = ScoringModel.from_body({"metadata": {"name": BASE_NAME, "namespace": "ml"}, "spec": spec,
                                    "status": resolved})
    return operator_flags.worker_config(model), operator_flags.worker_args(model)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _rendered(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return _flag(name) if value else _flag("no_" + name)
    if isinstance(value, list):
        return f"{_flag(name)} {','.join(str(v) for v in value)}"
    return f"{_flag(name)} {value}"


def flag_mapping() -> tuple[dict[str, tuple[str, str]], set[str]]:
    """spec path → (worker flags it drives, example); and the worker-config keys no spec field moves."""
    base_config, _ = _render(BASE_SPEC)
    option_strings = {o for a in serve_parser()._actions for o in a.option_strings}
    moved: set[str] = set()
    mapping: dict[str, tuple[str, str]] = {}
    for path, node, required in spec_nodes():
        if (node.get("type") == "object" and "properties" in node) or "[]" in path:
            continue  # sections (their fields are rows of their own) and list items (set as a whole below)
        if node.get("type") == "array" and node.get("items", {}).get("type") == "object" and path not in SAMPLES:
            value: Any = [{k.split("[].")[1]: v for k, v in SAMPLES.items() if k.startswith(path + "[].")}]
        else:
            value = _alternative(path, node)
        if value is None:
            mapping[path] = ("—", "only one allowed value")
            continue
        spec = copy.deepcopy(BASE_SPEC)
        for other, other_value in PREREQUISITES.get(path, {}).items():
            _set(spec, other, other_value)
        before_config, before_args = _render(spec)
        _set(spec, path, value)
        for other, other_value in COMPANIONS.get(path, {}).items():
            _set(spec, other, other_value)
        after_config, after_args = _render(spec)
        changed = [k for k in after_config if before_config.get(k) != after_config[k]]
        moved.update(changed)
        for name in changed:
            for flag in (_flag(name), _flag("no_" + name)) if isinstance(after_config[name], bool) else (_flag(name),):
                if flag not in option_strings:
                    raise SystemExit(f"the operator renders {flag}, which `scorekeeper-worker serve` does not accept")
        shown = json.dumps(value) if not isinstance(value, str) else value
        if changed:
            flags_text = ", ".join(code(_flag(n)) + (f" / {code(_flag('no_' + n))}" if isinstance(after_config[n], bool)
                                                     else "") for n in changed)
            example = f"{code(shown)} → " + ", ".join(code(_rendered(n, after_config[n])) for n in changed)
            if not required:  # what leaving the field out renders
                unset = [code(_rendered(n, before_config[n])) for n in changed if n in before_config]
                example += f" (unset: {', '.join(unset) or 'not rendered'})"
        elif after_args != before_args:  # not a config value but still on the command line: extraArgs
            added = [a for a in after_args if a not in before_args]
            flags_text = "verbatim, before the rendered flags"
            example = f"{code(shown)} → " + code(" ".join(added))
        else:
            flags_text, example = "—", ""
        mapping[path] = (flags_text, example)
    return mapping, set(base_config) - moved


# ---------------------------------------------------------------------------------------------------------------------
# The page


def render() -> str:
    check_parser_matches_config()
    # The CLI module's docstring states the sources and their precedence; its first sentence is just a title.
    intro_cli = " ".join((cli.__doc__ or "").split()).split(". ", 1)[-1]
    lines = [
        "# Configuration reference",
        "",
        f"<!-- GENERATED by {REGENERATE}: do not edit by hand. tests/docs/test_docs.py fails when this file is stale. "
        "-->",
        "",
        "Two layers: the flags of `scorekeeper-worker serve` (one worker process, one model), and the `ScoringModel`",
        "custom resource, which the operator turns into those flags. Everything on this page is generated from the",
        "code: the worker's `build_parser()` and `WorkerConfig`, `crds/scoringmodel.yaml`, and the operator's",
        "`flags.worker_config()`. For what the settings mean in practice see [operations.md](operations.md); for the",
        "operator's other effects (probes, resources, autoscaling) see [operator.md](operator.md).",
        "",
        "## Worker flags",
        "",
        f"{intro_cli} `scorekeeper-worker serve --help` prints the same list.",
        "",
        *table(["flag", "config key", "environment variable", "default", "values", "meaning"], flag_rows()),
        "",
        "Environment variables are read for every config key; booleans are true for `1`, `true` or `yes` (any case)",
        "and false for anything else. `cuda_graph_token_buckets` takes a comma-separated string there and on the",
        "command line, a list in the config file. Invalid values (out of bounds, unknown keys in the file, buckets",
        "not strictly increasing or above `cuda_graph_max_tokens`) stop the worker at start-up with an error that",
        "names the setting.",
        "",
        "### Config file",
        "",
        "`--config FILE` takes YAML (or JSON) whose keys are the config keys above (`-` or `_`); every key is",
        "optional except `model`. All defaults, as a file:",
        "",
        "```yaml",
        config_example(),
        "```",
        "",
    ]
    mapping, fixed = flag_mapping()
    rows = []
    for path, node, required in spec_nodes():
        if node.get("type") == "object" and "properties" in node and not (required or node.get("description")):
            continue  # a plain section: its fields are the rows
        default = _default_cell(node)
        flag, example = mapping.get(path, ("", ""))
        rows.append([code(path), _type(node), default, _constraints(node, required),
                     cell(node.get("description", "")), flag, example])
    reserved = set(worker_contract.RESERVED_FLAGS)
    free = [o for a in serve_parser()._actions for o in a.option_strings
            if a.dest != "help" and o not in reserved]
    lines += [
        "## ScoringModel spec",
        "",
        "`apiVersion: scorekeeper.dev/v1alpha1`, `kind: ScoringModel` (short name `sm`). Every field of `spec`, from",
        "the CRD's `openAPIV3Schema`. Objects default to `{}`, so their fields' defaults apply when a section is",
        "left out. The worker-flag column is measured: each field is changed on a minimal ScoringModel",
        f"(`spec: {json.dumps(BASE_SPEC)}`, name `{BASE_NAME}`) and the flags of the rendered worker config that",
        "moved are listed, with the rendered result. `—` means the field shapes the Deployment, Service, HPA or",
        "ServiceMonitor instead (see [operator.md](operator.md#spec-reference)).",
        "",
        *table(["field", "type", "default", "constraints", "description", "worker flag", "example"], rows),
        "",
        "Always rendered, whatever the spec: `--config " + worker_contract.CONFIG_PATH + "` (the ConfigMap holding the",
        "same values as a file) and " + ", ".join(code(_rendered(k, _render(BASE_SPEC)[0][k])) for k in sorted(fixed))
        + ". Worker flags the operator never renders, and which `spec.extraArgs` may therefore set: "
        + ", ".join(code(f) for f in free) + ".",
        "",
        "### Validation rules (CEL)",
        "",
        "`x-kubernetes-validations` in the CRD: `kubectl apply` of an object that breaks one fails with the message.",
        "",
        *table(["where", "rule", "message"], cel_rows()),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/configuration.md is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUTPUT.read_text() if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT.relative_to(REPO)} is stale; regenerate it with: {REGENERATE}", file=sys.stderr)
            return 1
        print(f"{OUTPUT.relative_to(REPO)} is up to date")
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
