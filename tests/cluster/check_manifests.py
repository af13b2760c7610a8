"""Checks Kubernetes manifests offline, since no cluster runs here.

Each document must fit the typed models of Debian's python3-kubernetes
(a wrong type, a missing required field or an unknown key fails), every
`dray` command line in a container must use flags that `dray <command>
--help` lists, and every $(VARIABLE) it uses must be one of the container's
env entries (Kubernetes leaves any other as it is).

    check_manifests.py DRAY FILE...
"""
import re
import subprocess
import sys

import yaml
from kubernetes import client

MODELS = {
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("v1", "Secret"): "V1Secret",
    ("v1", "Service"): "V1Service",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("apps/v1", "StatefulSet"): "V1StatefulSet",
    ("batch/v1", "Job"): "V1Job",
}


def check_fields(data, type_name, where):
    """Fails on keys the model `type_name` does not have, at any depth."""
    if type_name.startswith("list["):
        for i, item in enumerate(data):
            check_fields(item, type_name[5:-1], f"{where}[{i}]")
        return
    if type_name.startswith("dict("):
        inner = type_name[type_name.index(",") + 1:-1].strip()
        for key, value in data.items():
            check_fields(value, inner, f"{where}.{key}")
        return
    model = getattr(client.models, type_name, None)
    if model is None:
        return  # str, int, object...
    if not isinstance(data, dict):
        raise ValueError(f"{where}: a {type_name} must be a mapping, not {data!r}")
    fields = {key: name for name, key in model.attribute_map.items()}
    for key, value in data.items():
        if key not in fields:
            raise ValueError(f"{where}: {type_name} has no field '{key}'")
        check_fields(value, model.openapi_types[fields[key]], f"{where}.{key}")


def check_variables(container, command, where):
    """Fails on a $(VARIABLE) in `command` that the container does not define."""
    defined = {entry["name"] for entry in container.get("env", [])}
    for arg in command:
        for name in re.findall(r"\$\((\w+)\)", arg):
            if name not in defined:
                raise ValueError(f"{where}: $({name}) in {arg} is not in the container's env")


def check_command(dray, command, where):
    """Fails on a dray subcommand or flag that the binary does not have."""
    shown = subprocess.run([dray, command[1], "--help"], capture_output=True, text=True)
    if shown.returncode != 0:
        raise ValueError(f"{where}: 'dray {command[1]}' does not exist")
    for arg in command[2:]:
        flag = arg.split("=")[0]
        if flag.startswith("--") and not re.search(rf"(^|[\s,]){re.escape(flag)}\b", shown.stdout, re.M):
            raise ValueError(f"{where}: 'dray {command[1]}' has no flag {flag}")


def main(dray, files):
    api = client.ApiClient()
    for path in files:
        with open(path) as f:
            documents = [d for d in yaml.safe_load_all(f) if d]
        for doc in documents:
            model = MODELS[(doc["apiVersion"], doc["kind"])]
            where = f"{path}: {doc['kind']} {doc['metadata']['name']}"
            check_fields(doc, model, where)
            api._ApiClient__deserialize(doc, model)  # types, required fields
            template = doc.get("spec", {}).get("template", {}).get("spec", {})
            for container in template.get("containers", []):
                command = container.get("command", []) + container.get("args", [])
                if command[:1] == ["dray"]:
                    check_command(dray, command, f"{where}, container {container['name']}")
                check_variables(container, command, f"{where}, container {container['name']}")
        print(f"{path}: {len(documents)} documents ok")


if __name__ == "__main__":
    try:
        main(sys.argv[1], sys.argv[2:])
    except (ValueError, KeyError, TypeError) as e:
        sys.exit(f"check_manifests: {e}")
