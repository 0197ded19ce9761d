"""Kubernetes target: a Kubeflow Training Operator v1 PyTorchJob (kubeflow.org/v1) and its ConfigMap.

Schema: the CRD of kubeflow/training-operator release-1.9; the webhook additionally requires
exactly one Master, Workers >= 1 when present, a container named ``pytorch`` and a DNS-1035
name. The operator injects PET_NNODES / PET_NODE_RANK / PET_MASTER_ADDR / PET_MASTER_PORT /
PET_NPROC_PER_NODE, which torchrun reads, so the command names no addresses.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Sequence
from typing import Any

import yaml

from service.estimator.types import Framework, Plan
from service.launchers import deepspeed
from service.launchers.common import (
    YAML,
    Artifact,
    Raw,
    Target,
    comment_lines,
    dns_label,
    layout_summary,
    torchrun_words,
)
from service.launchers.job import entry

MANIFEST_NAME = "pytorchjob.yaml"
TARGET = Target.KUBERNETES
CONFIG_DIR = "/etc/trainplan/"  # the ConfigMap's mount point
# The extended resource each vendor's Kubernetes device plugin advertises (NVIDIA/k8s-device-plugin;
# ROCm/k8s-device-plugin: "amd.com/gpu"): an AMD node has no nvidia.com/gpu, so such pods never scheduled
GPU_RESOURCES = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu"}
IMAGE = "registry.example.com/trainplan/train:latest"  # placeholder: an image with the training code
SHM_BYTES = "64Gi"  # /dev/shm for dataloader workers and NCCL; the container default (64 MiB) is too small


def _swaps_to_nvme(plan: Plan) -> bool:
    """Whether the job runs DeepSpeed's NVMe offload (its ds_config's nvme_path)."""
    return plan.layout.framework is Framework.DEEPSPEED and deepspeed.uses_nvme(plan)


def _container(plan: Plan, command: list[str], env: list[tuple[str, str]], has_files: bool) -> dict[str, Any]:
    gpus = plan.cluster.gpus_per_node
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if has_files:
        mounts.append({"name": "trainplan-config", "mountPath": CONFIG_DIR.rstrip("/"), "readOnly": True})
    if _swaps_to_nvme(plan):
        mounts.append({"name": "local-nvme", "mountPath": deepspeed.NVME_PATH})
    container: dict[str, Any] = {
        "name": "pytorch",  # the operator finds the training container by this name
        "image": IMAGE,
        "command": command,
    }
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env]
    resource = GPU_RESOURCES.get(plan.cluster.gpu.vendor, GPU_RESOURCES["nvidia"])
    container["resources"] = {"limits": {resource: gpus}, "requests": {resource: gpus}}
    container["volumeMounts"] = mounts
    return container


def _replica(
    plan: Plan, replicas: int, container: dict[str, Any], name: str, has_files: bool
) -> dict[str, Any]:
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_BYTES}}
    ]
    if has_files:
        volumes.append({"name": "trainplan-config", "configMap": {"name": f"{name}-config"}})
    if _swaps_to_nvme(plan):
        # the node's NVMe, mounted at the same path on the host: DeepSpeed's swap files in the
        # container's writable layer were ephemeral storage the kubelet evicts for, on another disk
        # than the one timed (a platform review); Directory: a node without it does not start the pod
        path = {"path": deepspeed.NVME_PATH, "type": "Directory"}
        volumes.append({"name": "local-nvme", "hostPath": path})
    return {
        "replicas": replicas,
        "restartPolicy": "OnFailure",
        "template": {"spec": {"containers": [copy.deepcopy(container)], "volumes": volumes}},
    }


def manifests(plan: Plan, via: Target | None = None) -> list[dict[str, Any]]:
    """The ConfigMap (when the command reads config files) and the PyTorchJob, as plain dicts
    (``via``: ``job.entry``'s)."""
    job = entry(plan, TARGET, CONFIG_DIR, via)
    words = [*torchrun_words(plan, rendezvous="env"), *job.words]
    command = [w for w in words if not isinstance(w, Raw)]
    assert len(command) == len(words), "a Kubernetes command takes no shell expansions"
    # the training operator names each replica's Service and pod <job>-<master|worker>-<index>
    # (training-operator pkg/core/utils.go GenGeneralName), MASTER_ADDR the master's Service: each a
    # DNS-1035 label of at most 63 characters, which its webhook does not check of the job's name, so
    # a longer one never started (kubeflow/trainer#1101; a platform review)
    suffix = max(len("-master-0"), len(f"-worker-{max(0, plan.cluster.num_nodes - 2)}"))
    # the plan's own digest after the model's name: two plans of one model named the same PyTorchJob and
    # ConfigMap, so applying the second replaced the first's mounted files under its running pods
    # (injection review); the same plan renders the same name
    digest = _rendered_digest(plan, command, job.env, job.files)
    name = dns_label("trainplan-" + plan.model.name, 63 - suffix - len(digest) - 1) + "-" + digest
    has_files = bool(job.files)
    container = _container(plan, command, job.env, has_files)
    specs = {"Master": _replica(plan, 1, container, name, has_files)}
    if plan.cluster.num_nodes > 1:
        specs["Worker"] = _replica(plan, plan.cluster.num_nodes - 1, container, name, has_files)
    metadata = {
        "name": name,
        "annotations": {"trainplan/layout": layout_summary(plan), "trainplan/runs": str(job.via)},
    }
    pytorchjob: dict[str, Any] = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": metadata,
        "spec": {
            "nprocPerNode": str(plan.cluster.gpus_per_node),
            "runPolicy": {"cleanPodPolicy": "None"},
            "pytorchReplicaSpecs": specs,
        },
    }
    documents: list[dict[str, Any]] = []
    if has_files:
        documents.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"{name}-config"},
                "data": {f.name: f.content for f in job.files},
            }
        )
    documents.append(pytorchjob)
    return documents


def _rendered_digest(
    plan: Plan, command: list[str], env: Sequence[tuple[str, str]], files: Sequence[Artifact]
) -> str:
    """Six hex digits of what the job runs: its command, environment and mounted files, the cluster's
    shape and the layout as its summary writes it. Two plans that render anything differently (a LoRA
    rank, a token budget, an optimizer) name their objects apart (a digest of the batch and shape alone
    gave two LoRA ranks one ConfigMap; change review); the same plan names them alike in any process."""
    c = plan.cluster
    said = [layout_summary(plan), f"{c.gpu.name}|{c.num_nodes}x{c.gpus_per_node}", *command]
    said += [f"{key}={value}" for key, value in env]
    said += [f"{f.name}\n{f.content}" for f in files]
    return hashlib.sha256("\0".join(said).encode()).hexdigest()[:6]


class _Dumper(yaml.SafeDumper):
    """Safe YAML, with multi-line strings (the ConfigMap's files) as literal blocks, and quoted where a
    YAML 1.2 or kubectl's reader would take the text for another type (``_NOT_TEXT``)."""


# What a plain scalar reads as other than a string in YAML 1.2's core schema or go-yaml v2 (kubectl's,
# through sigs.k8s.io/yaml: resolve.go's float pattern needs no dot): numbers (1e-08, 0x1F, .inf),
# booleans (y, yes, on, true, any case) and nulls. PyYAML (YAML 1.1) left "1e-08" bare, which kubectl
# read as a number in a container's command, a []string: the manifest was refused (injection review).
_NOT_TEXT = re.compile(
    r"[-+]?(\.[0-9]+|[0-9][0-9_]*(\.[0-9_]*)?)([eE][-+]?[0-9]+)?|[-+]?\.(inf|nan)|0[xob][0-9a-f_]+"
    r"|y|n|yes|no|on|off|true|false|null|~|",
    re.IGNORECASE,
)


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else ("'" if _NOT_TEXT.fullmatch(value) else None)
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render(plan: Plan, via: Target | None = None) -> list[Artifact]:
    duties = entry(
        plan, TARGET, CONFIG_DIR, via
    ).duties  # what the training script must do, as the target says
    header = "\n".join(comment_lines(layout_summary(plan) + duties)) + "\n"
    text = header + yaml.dump_all(manifests(plan, via), Dumper=_Dumper, sort_keys=False, width=120)
    return [Artifact(name=MANIFEST_NAME, target=TARGET, media_type=YAML, content=text)]
