"""The deployment files: Kubernetes objects that fit together and GIE's InferencePool v1 shape, a
settings file steersman loads, and a Grafana dashboard that queries only metrics steersman
exports."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

from steersman.control.serve.metrics import Metrics
from steersman.control.serve.settings import load_settings

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "deploy" / "kubernetes" / "steersman.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "steersman.json"

# The InferencePool v1 spec as GIE's API reference gives it (inference.networking.k8s.io/v1):
# the fields steersman's manifest uses, with their types, ranges and the required ones.
_NAME = {"type": "string", "minLength": 1, "maxLength": 253}
_PORT = {"type": "object", "required": ["number"], "additionalProperties": False,
         "properties": {"number": {"type": "integer", "minimum": 1, "maximum": 65535}}}  # fmt: skip
INFERENCE_POOL = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "inference.networking.k8s.io/v1"},
        "kind": {"const": "InferencePool"},
        "spec": {
            "type": "object",
            "required": ["selector", "targetPorts", "endpointPickerRef"],
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object",
                    "required": ["matchLabels"],
                    "properties": {
                        "matchLabels": {
                            "type": "object",
                            "minProperties": 1,
                            "additionalProperties": {"type": "string"},
                        }
                    },
                },
                "targetPorts": {"type": "array", "minItems": 1, "maxItems": 1, "items": _PORT},
                "endpointPickerRef": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        "group": {"type": "string"},
                        "kind": {
                            "type": "string",
                            "pattern": "^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$",
                        },
                        "name": _NAME,
                        "port": _PORT,
                        "failureMode": {"enum": ["FailOpen", "FailClose"]},
                    },
                },
            },
        },
    },
}


@pytest.fixture(scope="module")
def objects() -> dict[str, dict]:
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    for doc in docs:
        assert {"apiVersion", "kind", "metadata"} <= set(doc), doc
        assert doc["metadata"]["name"] and doc["metadata"]["namespace"] == "llm"
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}


def test_the_inference_pool_has_gies_v1_shape_and_points_at_steersman(objects):
    pool = objects["InferencePool/vllm-pool"]
    jsonschema.validate(pool, INFERENCE_POOL)
    picker = pool["spec"]["endpointPickerRef"]
    service = objects[f"Service/{picker['name']}"]
    assert picker["port"]["number"] in [p["port"] for p in service["spec"]["ports"]]
    vllm = objects["StatefulSet/vllm"]["spec"]["template"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= vllm["metadata"]["labels"].items()
    container_ports = [p["containerPort"] for p in vllm["spec"]["containers"][0]["ports"]]
    assert pool["spec"]["targetPorts"][0]["number"] in container_ports


def test_the_picker_runs_the_settings_of_its_config_map(objects, tmp_path):
    deployment = objects["Deployment/steersman-epp"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][-1] == "epp"
    toml = objects["ConfigMap/steersman"]["data"]["steersman.toml"]
    config = tmp_path / "steersman.toml"
    config.write_text(toml)
    settings = load_settings(config, {"data_dir": str(tmp_path / "data")}, environ={})
    assert settings.epp.enabled and settings.epp.host == "0.0.0.0"
    grpc_ports = {p["containerPort"] for p in container["ports"]}
    assert settings.epp.port in grpc_ports and settings.gateway.port in grpc_ports
    assert container["readinessProbe"]["grpc"]["port"] == settings.epp.port
    stateful = objects["StatefulSet/vllm"]["spec"]
    names = [
        f"http://vllm-{k}.vllm.llm.svc.cluster.local:8000" for k in range(stateful["replicas"])
    ]
    assert [i.url for i in settings.instances] == names  # every vLLM pod, by its stable name
    assert "STEERSMAN_STORAGE__URL" in {e["name"] for e in container["env"]}
    assert tomllib.loads(toml)["epp"]["port"] == 9002


def _exported() -> set[str]:
    names = set()
    for family in Metrics().registry.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names |= {f"{family.name}_{s}" for s in ("bucket", "sum", "count")}
        else:
            names.add(family.name)
    return names


def test_every_grafana_panel_queries_a_metric_steersman_exports():
    dashboard = json.loads(DASHBOARD.read_text())
    exported = _exported()
    queried = set()
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = set(re.findall(r"\bsteersman_[a-z0-9_]+\b", target["expr"]))
            assert names, (panel["title"], target["expr"])
            assert names <= exported, (panel["title"], names - exported)
            queried |= names
    # The dashboard covers what an operator watches first.
    assert {
        "steersman_requests_total",
        "steersman_ttft_seconds_bucket",
        "steersman_mode",
    } <= queried
