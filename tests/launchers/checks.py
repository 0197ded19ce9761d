"""Static checks of rendered artifacts: the rules the real tools enforce, and the mistakes they let
through silently (unknown DeepSpeed top-level keys, offload_param below stage 3, nested
Accelerate keys, Megatron's validate_args rules, the PyTorchJob CRD schema)."""

from __future__ import annotations

import json
import re
import shlex
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from service.estimator.model_states import megatron_fp8_params, megatron_grads_in_fp32
from service.estimator.types import Plan, Precision, Recompute, RecomputeModule
from service.launchers import Artifact

SCHEMAS = Path(__file__).resolve().parents[2] / "shared" / "reference" / "schemas"
SCHEMA_DIRS = (SCHEMAS, Path("/work/shared/reference/schemas"))

# Top-level keys runtime/config.py reads (it silently ignores any other).
DS_TOP_LEVEL = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
    "gradient_clipping", "steps_per_print", "wall_clock_breakdown", "bf16", "fp16", "optimizer",
    "zero_optimization", "activation_checkpointing", "tensor_parallel", "pipeline",
}  # fmt: skip

# accelerate/commands/config/config_args.py ClusterConfig + BaseConfig fields.
ACCELERATE_TOP_LEVEL = {
    "compute_environment", "distributed_type", "mixed_precision", "use_cpu", "debug",
    "num_processes", "machine_rank", "num_machines", "gpu_ids", "main_process_ip",
    "main_process_port", "rdzv_backend", "same_network", "main_training_function",
    "enable_cpu_affinity", "fp8_config", "deepspeed_config", "fsdp_config", "parallelism_config",
    "megatron_lm_config", "mpirun_config", "downcast_bf16", "dynamo_config",
}  # fmt: skip
# Nested keys as accelerate/commands/launch.py declares the CLI arguments.
ACCELERATE_NESTED = {
    # With deepspeed_config_file, DeepSpeedPlugin._deepspeed_config_checks refuses the inline
    # zero_stage / offload / accumulation / clipping / zero3_save_16bit_model keys (and a
    # top-level mixed_precision): only these launcher keys may sit beside it.
    "deepspeed_config": {
        "deepspeed_config_file", "zero3_init_flag", "deepspeed_multinode_launcher",
        "deepspeed_hostfile", "deepspeed_exclusion_filter", "deepspeed_inclusion_filter",
        "deepspeed_moe_layer_cls_names",
    },
    "fsdp_config": {
        "fsdp_version", "fsdp_reshard_after_forward", "fsdp_offload_params", "fsdp_auto_wrap_policy",
        "fsdp_state_dict_type", "fsdp_cpu_ram_efficient_loading", "fsdp_sync_module_states",
        "fsdp_activation_checkpointing", "fsdp_transformer_layer_cls_to_wrap",
    },
    "parallelism_config": {
        "parallelism_config_dp_replicate_size", "parallelism_config_dp_shard_size",
        "parallelism_config_tp_size", "parallelism_config_cp_size",
        # DeepSpeed's Ulysses (ALST): accelerate/commands/launch.py's sp arguments
        "parallelism_config_sp_size", "parallelism_config_sp_backend",
        "parallelism_config_sp_seq_length_is_variable", "parallelism_config_sp_attn_implementation",
    },
    "megatron_lm_config": {
        "megatron_lm_tp_degree", "megatron_lm_pp_degree", "megatron_lm_context_parallel_size",
        "megatron_lm_expert_model_parallel_size", "megatron_lm_expert_tensor_parallel_size",
        "megatron_lm_sequence_parallelism",
        "megatron_lm_use_distributed_optimizer", "megatron_lm_gradient_clipping",
        "megatron_lm_recompute_activations", "megatron_lm_num_micro_batches",
        "megatron_lm_recompute_granularity", "megatron_lm_recompute_method",
        "megatron_lm_recompute_num_layers",
    },
}  # fmt: skip

# Canonical Megatron-LM flags (megatron/training/arguments.py @d98e8a6); value-less ones marked.
MEGATRON_SWITCHES = {
    "--sequence-parallel", "--tp-comm-overlap", "--use-distributed-optimizer",
    "--overlap-grad-reduce", "--overlap-param-gather", "--optimizer-cpu-offload",
    "--use-precision-aware-optimizer", "--moe-grouped-gemm", "--overlap-moe-expert-parallel-comm",
    "--moe-shared-expert-gate",
    "--bf16", "--fp16", "--group-query-attention", "--swiglu", "--untie-embeddings-and-output-weights",
    "--disable-bias-linear", "--add-qkv-bias", "--mock-data", "--no-create-attention-mask-in-dataloader",
    "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
    "--multi-latent-attention", "--qk-layernorm", "--grad-reduce-in-bf16", "--fp8-param-gather",
    "--use-rope-scaling", "--no-yarn-correction-range-round-to-int", "--moe-router-pre-softmax",
    "--moe-router-enable-expert-bias",
}  # fmt: skip
MEGATRON_VALUED = {
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--expert-model-parallel-size", "--expert-tensor-parallel-size",
    "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
    "--pipeline-model-parallel-layout", "--attention-backend",
    "--optimizer", "--optimizer-offload-fraction", "--micro-batch-size", "--global-batch-size",
    "--train-iters",
    "--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--fp8-format",
    "--fp8-amax-history-len", "--fp8-amax-compute-algo", "--num-layers", "--hidden-size",
    "--ffn-hidden-size", "--num-attention-heads", "--num-query-groups", "--kv-channels",
    "--seq-length", "--max-position-embeddings", "--position-embedding-type", "--rotary-percent",
    "--normalization", "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
    "--moe-shared-expert-intermediate-size", "--tokenizer-type", "--vocab-size", "--lr", "--min-lr",
    "--lr-decay-style", "--clip-grad", "--weight-decay", "--adam-beta1", "--adam-beta2", "--adam-eps",
    "--log-interval", "--eval-interval", "--eval-iters",
    "--moe-layer-freq", "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim",
    "--v-head-dim", "--hidden-dropout", "--attention-dropout", "--moe-token-dispatcher-type",
    "--moe-flex-dispatcher-backend", "--mtp-num-layers",
    # the model's hyperparameters: arguments.py (_add_network_size_args, _add_mla_args, --rope-type) and
    # TransformerConfig's fields (layernorm_epsilon's --norm-epsilon, moe_router_*)
    "--rotary-base", "--rope-scaling-factor", "--rotary-seq-len-interpolation-factor", "--rope-type",
    "--rotary-scaling-factor", "--mscale", "--mscale-all-dim", "--yarn-original-max-position-embeddings",
    "--yarn-beta-fast", "--yarn-beta-slow", "--norm-epsilon", "--moe-router-score-function",
    "--moe-router-num-groups", "--moe-router-group-topk", "--moe-router-topk-scaling-factor",
}  # fmt: skip
# flags that take a list (nargs="*"), kept space-joined, and the values Megatron-Core allows
MEGATRON_LISTS = {
    "--recompute-modules": {
        "core_attn",
        "moe_act",
        "layernorm",
        "mla_up_proj",
        "mlp",
        "moe",
        "shared_experts",
    },
}
MEGATRON_FORBIDDEN = {"--batch-size", "--warmup", "--model-parallel-size", "--checkpoint-activations"}

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when built with it: 10x faster
HOSTFILE_LINE = re.compile(r"^(\S+)\s+slots=(\d+)$")
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def check_ds_config(config: dict[str, Any], ranks: int) -> None:
    """``ranks``: the world size of DeepSpeed's batch assertion (every rank without a pipeline,
    AutoTP's tensor-parallel peers included; the pipeline grid's data-parallel ranks with one)."""
    assert set(config) <= DS_TOP_LEVEL, set(config) - DS_TOP_LEVEL
    assert '"auto"' not in json.dumps(config), "raw DeepSpeed does not resolve 'auto'"
    micro, accum = config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]
    assert config["train_batch_size"] == micro * accum * ranks
    assert not (config.get("bf16", {}).get("enabled") and config.get("fp16", {}).get("enabled"))
    zero = config["zero_optimization"]
    stage = zero["stage"]
    if stage < 3:
        assert "offload_param" not in zero, "offload_param is silently ignored below stage 3"
        assert zero.get("offload_optimizer", {}).get("device") != "nvme"
        assert not any(k.startswith("stage3_") for k in zero)
    if stage == 0:
        assert "offload_optimizer" not in zero
    for block in ("offload_optimizer", "offload_param"):
        if zero.get(block, {}).get("device") == "nvme":
            assert zero[block]["nvme_path"]
    if "pipeline" in config:
        assert stage < 2, "ZeRO-2/3 are incompatible with pipeline parallelism"


def check_accelerate(config: dict[str, Any], plan: Plan) -> None:
    assert set(config) <= ACCELERATE_TOP_LEVEL, set(config) - ACCELERATE_TOP_LEVEL
    for section, allowed in ACCELERATE_NESTED.items():
        assert set(config.get(section, {})) <= allowed, set(config.get(section, {})) - allowed
    assert config["num_processes"] == plan.cluster.world_size
    assert config["num_machines"] == plan.cluster.num_nodes
    if config["distributed_type"] == "DEEPSPEED":
        # Everything DeepSpeed runs (buckets, precision, ZeRO) comes from the shared ds_config.json.
        assert config["deepspeed_config"]["deepspeed_config_file"] == "ds_config.json"
        assert "mixed_precision" not in config, "refused beside deepspeed_config_file"
    else:
        assert config["mixed_precision"] in {"no", "fp16", "bf16", "fp8"}
    fsdp = config.get("fsdp_config", {})
    if fsdp:
        assert isinstance(fsdp["fsdp_reshard_after_forward"], bool)
        assert fsdp["fsdp_state_dict_type"] != "LOCAL_STATE_DICT"
        assert not fsdp["fsdp_cpu_ram_efficient_loading"] or fsdp["fsdp_sync_module_states"]
    if config["distributed_type"] == "MEGATRON_LM":
        # MegatronLMPlugin.set_training_args: global batch = dp x micro x num_micro_batches (default
        # 1), pipelined or not; the micro-batch itself comes from the training script's loader
        mlm = config["megatron_lm_config"]
        lo = plan.layout
        assert lo.dp * lo.micro_batch_size * mlm["megatron_lm_num_micro_batches"] == (
            plan.training.global_batch_size
        )
    if "parallelism_config" in config and config["distributed_type"] == "DEEPSPEED":
        # ALST: dp_replicate x dp_shard x sp = processes (parallelism_config.py), sp the layout's cp
        pc = config["parallelism_config"]
        assert pc["parallelism_config_sp_backend"] == "deepspeed" and pc["parallelism_config_sp_size"] > 1
        assert pc["parallelism_config_sp_size"] == plan.layout.cp
        product = pc["parallelism_config_dp_replicate_size"] * pc["parallelism_config_dp_shard_size"]
        assert product * pc["parallelism_config_sp_size"] == plan.cluster.world_size
        assert pc["parallelism_config_sp_attn_implementation"] in ("flash_attention_2", "sdpa")
    elif "parallelism_config" in config:
        assert fsdp.get("fsdp_version") == 2
        pc = config["parallelism_config"]
        product = 1
        for key in ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size"):
            product *= pc[f"parallelism_config_{key}"]
        assert product == plan.cluster.world_size


def megatron_flags(words: list[str]) -> dict[str, str | None]:
    flags: dict[str, str | None] = {}
    i = 0
    while i < len(words):
        flag = words[i]
        assert flag not in MEGATRON_FORBIDDEN, flag
        if flag in MEGATRON_SWITCHES:
            flags[flag] = None
            i += 1
        elif flag in MEGATRON_LISTS:
            assert flag not in flags, f"{flag} given twice"
            end = i + 1
            while end < len(words) and not words[end].startswith("--"):
                assert words[end] in MEGATRON_LISTS[flag], f"{flag}: {words[end]} is not a choice"
                end += 1
            flags[flag] = " ".join(words[i + 1 : end])
            i = end
        else:
            assert flag in MEGATRON_VALUED, f"not a canonical Megatron-LM flag: {flag}"
            assert flag not in flags, f"{flag} given twice"
            flags[flag] = words[i + 1]
            i += 2
    return flags


def megatron_split(f: dict[str, str | None], layers: int, pp: int) -> list[int]:
    """Decoder layers per pipeline rank as Megatron-Core builds them (transformer_block.py
    get_num_layers_to_build), after the checks arguments.py and TransformerConfig make."""
    vpp_flags = ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank")
    assert sum(flag in f for flag in (*vpp_flags, "--pipeline-model-parallel-layout")) <= 1
    embedding = int("--account-for-embedding-in-pipeline-split" in f)
    loss = int("--account-for-loss-in-pipeline-split" in f)
    if "--pipeline-model-parallel-layout" in f:
        assert not (embedding or loss), "the layout excludes the account-for flags"
        text = str(f["--pipeline-model-parallel-layout"])
        text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text.replace(",", ""))
        stages = text.split("|")
        assert len(stages) % pp == 0 and text.startswith("E") and text.endswith("L")
        assert text.count("E") == 1 and text.count("L") == 1 and set(text) <= {"E", "t", "m", "L", "|"}
        # the MTP layers: as many as --mtp-num-layers, in the last stage before the loss
        assert "m" not in text or stages[-1].endswith("m" * text.count("m") + "L")
        assert text.count("m") == int(str(f.get("--mtp-num-layers") or 0))
        return [sum(stage.count("t") for stage in stages[rank::pp]) for rank in range(pp)]
    units = layers + embedding + loss
    assert units % pp == 0, "Number of layers should be divisible by the pipeline-model-parallel size"
    vpp = 1
    if "--num-layers-per-virtual-pipeline-stage" in f:
        assert not (embedding or loss) and pp > 1
        k = int(str(f["--num-layers-per-virtual-pipeline-stage"]))
        assert (units // pp) % k == 0
        vpp = units // pp // k
        assert vpp > 1
    if "--num-virtual-stages-per-pipeline-rank" in f:
        vpp = int(str(f["--num-virtual-stages-per-pipeline-rank"]))
        assert pp > 1 and vpp > 1 and (units // pp) % vpp == 0
    per_rank = [units // pp] * pp
    per_rank[0] -= embedding
    per_rank[-1] -= loss
    return per_rank


def check_megatron(words: list[str], plan: Plan, env: dict[str, str]) -> None:
    """The rules megatron/training/arguments.py validate_args and TransformerConfig enforce."""
    f = megatron_flags(words)

    def num(name: str, default: int = 1) -> int:
        value = f.get(name)
        return default if value is None else int(value)

    world = plan.cluster.world_size
    tp, pp, cp = (
        num("--tensor-model-parallel-size"),
        num("--pipeline-model-parallel-size"),
        num("--context-parallel-size"),
    )
    assert world % (tp * pp * cp) == 0
    dp = world // (tp * pp * cp)
    mbs, gbs = num("--micro-batch-size"), num("--global-batch-size")
    assert gbs % (mbs * dp) == 0 and gbs // (mbs * dp) >= 1
    layers, heads = num("--num-layers"), num("--num-attention-heads")
    per_rank = megatron_split(f, layers, pp)
    assert sum(per_rank) == layers
    assert heads % tp == 0
    groups = num("--num-query-groups") if "--group-query-attention" in f else heads
    assert groups % tp == 0 or tp % groups == 0
    if "--kv-channels" not in f:
        assert num("--hidden-size") % heads == 0
    seq = num("--seq-length")
    assert num("--max-position-embeddings") >= seq
    if cp > 1:
        assert seq % (2 * cp) == 0
    if "--sequence-parallel" in f:
        assert tp > 1, "Megatron drops --sequence-parallel silently at tp=1"
    if "--tp-comm-overlap" in f:
        assert "--sequence-parallel" in f and tp > 1, "--tp-comm-overlap requires sequence parallelism"
    if tp > 1 or cp > 1:
        assert env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1"
    granularity = f.get("--recompute-granularity")
    # exactly the policy the estimate is of
    lo = plan.layout
    assert (
        granularity
        == {Recompute.NONE: None, Recompute.SELECTIVE: "selective", Recompute.FULL: "full"}[lo.recompute]
    )
    if granularity == "full":
        assert 1 <= num("--recompute-num-layers") <= max(per_rank)
        if lo.recompute_num_layers is None:  # every layer keeps its input only
            assert (f.get("--recompute-method"), num("--recompute-num-layers")) == ("uniform", 1)
        else:  # the first N layers of each (virtual) stage
            assert (f.get("--recompute-method"), num("--recompute-num-layers")) == (
                "block",
                lo.recompute_num_layers,
            )
    else:
        assert "--recompute-method" not in f and "--recompute-num-layers" not in f
    modules = (f.get("--recompute-modules") or "core_attn").split()  # TransformerConfig's default
    if granularity == "selective":
        assert modules == [m.value for m in (lo.recompute_modules or (RecomputeModule.CORE_ATTN,))]
        # TransformerConfig.__post_init__
        assert "moe_act" not in modules or "--moe-grouped-gemm" in f
        assert "mla_up_proj" not in modules or "--multi-latent-attention" in f
    else:
        assert "--recompute-modules" not in f
    if "--overlap-moe-expert-parallel-comm" in f:  # TransformerConfig.__post_init__
        assert num("--expert-model-parallel-size") > 1
        assert f.get("--moe-token-dispatcher-type") in ("alltoall", "flex")
        assert granularity != "full" and "moe" not in modules
        vpp = ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank")
        chunks = str(f.get("--pipeline-model-parallel-layout") or "").count("|") + 1
        assert pp == 1 or any(flag in f for flag in vpp) or chunks > pp
    assert ("--overlap-moe-expert-parallel-comm" in f) == lo.moe_a2a_overlap
    # the dispatcher the estimate is timed with; flex with the backend of tuning.toml [moe_dispatch]
    if "--moe-token-dispatcher-type" in f:
        assert f["--moe-token-dispatcher-type"] == lo.moe_dispatcher.value
    assert f.get("--moe-flex-dispatcher-backend") == (
        "hybridep" if lo.moe_dispatcher.value == "flex" else None
    )
    # token drop padded to capacity (MoEAlltoAllTokenDispatcher's drop-and-pad mode needs the factor)
    assert ("--moe-pad-expert-input-to-capacity" in f) == (lo.moe_capacity_factor is not None)
    if "--moe-expert-capacity-factor" in f:
        assert float(str(f["--moe-expert-capacity-factor"])) == lo.moe_capacity_factor
    if "--mtp-num-layers" in f:  # validate_args: MTP with rope or no position embedding only
        assert f.get("--position-embedding-type") in ("rope", "none")
        assert int(str(f["--mtp-num-layers"])) == plan.training.mtp_num_layers
    if "--overlap-param-gather" in f:
        assert "--use-distributed-optimizer" in f and "--overlap-grad-reduce" in f
    if "--optimizer-cpu-offload" in f:
        assert "--use-distributed-optimizer" in f
    # validate_args: --fp8-param-gather only with the distributed optimizer (fp8 training here)
    assert ("--fp8-param-gather" in f) == megatron_fp8_params(lo, plan.training.precision)
    if "--fp8-param-gather" in f:
        assert "--use-distributed-optimizer" in f and "--fp8-format" in f
    mixed = plan.training.precision in (Precision.BF16, Precision.FP8)
    assert ("--grad-reduce-in-bf16" in f) == (mixed and not megatron_grads_in_fp32(lo))
    assert not ("--fp16" in f and "--bf16" in f)
    if "--expert-model-parallel-size" in f:
        assert num("--num-experts", 0) % num("--expert-model-parallel-size") == 0
    check_megatron_model_hparams(f)
    # parallel_state: the expert grid etp x ep x expert-dp covers a stage's tp x cp x dp ranks
    etp, ep = num("--expert-tensor-parallel-size", tp), num("--expert-model-parallel-size")
    assert (tp * cp * dp) % (etp * ep) == 0
    assert (etp, ep) == (lo.expert_tp, lo.ep)


# the hyperparameter flags arguments.py parses with type=int and type=float
MEGATRON_INTS = (
    "--rotary-base",
    "--rotary-seq-len-interpolation-factor",
    "--yarn-original-max-position-embeddings",
    "--moe-router-num-groups",
    "--moe-router-group-topk",
)
MEGATRON_FLOATS = (
    "--norm-epsilon",
    "--rope-scaling-factor",
    "--rotary-scaling-factor",
    "--mscale",
    "--mscale-all-dim",
    "--yarn-beta-fast",
    "--yarn-beta-slow",
    "--moe-router-topk-scaling-factor",
)


def check_megatron_model_hparams(f: dict[str, str | None]) -> None:
    """The types arguments.py parses the model's hyperparameters with, and the rules
    core_transformer_config_from_args and TransformerConfig.__post_init__ enforce on them."""
    for flag in MEGATRON_INTS:
        if flag in f:
            int(str(f[flag]))
    for flag in MEGATRON_FLOATS:
        if flag in f:
            float(str(f[flag]))
    assert f.get("--position-embedding-type", "learned_absolute") in ("learned_absolute", "rope", "yarn")
    if "--rope-type" in f:  # "Common attention only support rope_type='rope'"
        assert f["--rope-type"] in ("rope", "yarn")
        assert "--multi-latent-attention" in f or f["--rope-type"] == "rope"
    score = f.get("--moe-router-score-function", "softmax")
    assert score in ("softmax", "sigmoid", "sqrtsoftplus")
    if "--moe-router-enable-expert-bias" in f:
        assert score in ("sigmoid", "sqrtsoftplus")
    if f.get("--moe-router-topk") == "1" and score == "softmax":
        assert "--moe-router-pre-softmax" in f, "Please use --moe-router-pre-softmax when topk is 1."
    if "--moe-router-group-topk" in f:
        groups = int(str(f["--moe-router-num-groups"]))
        assert int(str(f["--num-experts"])) % groups == 0
        assert int(str(f["--moe-router-group-topk"])) <= groups


def check_hostfile(text: str, plan: Plan) -> None:
    hosts = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = HOSTFILE_LINE.match(line)
        assert match, f"bad hostfile entry {line!r}"
        assert int(match[2]) == plan.cluster.gpus_per_node
        hosts.append(match[1])
    assert len(hosts) == len(set(hosts)) == plan.cluster.num_nodes


@cache
def pytorchjob_validator() -> jsonschema.protocols.Validator:
    schema = pytorchjob_spec_schema()
    validator: jsonschema.protocols.Validator = jsonschema.validators.validator_for(schema)(schema)
    return validator


@cache
def pytorchjob_spec_schema() -> dict[str, Any]:
    for directory in SCHEMA_DIRS:
        path = directory / "kubeflow.org_pytorchjobs.yaml"
        if path.exists():
            crd = yaml.safe_load(path.read_text())
            (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
            schema: dict[str, Any] = v1["schema"]["openAPIV3Schema"]["properties"]["spec"]
            return schema
    raise FileNotFoundError("kubeflow.org_pytorchjobs.yaml")


def check_pytorchjob(text: str, plan: Plan) -> None:
    documents = list(yaml.load_all(text, Loader=LOADER))
    (job,) = [d for d in documents if d["kind"] == "PyTorchJob"]
    assert job["apiVersion"] == "kubeflow.org/v1"
    pytorchjob_validator().validate(job["spec"])
    assert DNS_1035.match(job["metadata"]["name"]) and len(job["metadata"]["name"]) <= 63
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert set(specs) <= {"Master", "Worker"} and specs["Master"]["replicas"] == 1
    assert 1 + specs.get("Worker", {}).get("replicas", 0) == plan.cluster.num_nodes
    for spec in specs.values():
        containers = spec["template"]["spec"]["containers"]
        assert any(c["name"] == "pytorch" and c["image"] for c in containers)
        volumes = {v["name"] for v in spec["template"]["spec"].get("volumes", [])}
        for container in containers:
            assert container["resources"]["limits"]["nvidia.com/gpu"] == plan.cluster.gpus_per_node
            assert {m["name"] for m in container.get("volumeMounts", [])} <= volumes
            assert not any(e["name"].startswith("PET_") for e in container.get("env", []))
    assert job["spec"]["nprocPerNode"] == str(plan.cluster.gpus_per_node)
    for config_map in (d for d in documents if d["kind"] == "ConfigMap"):
        assert DNS_1035.match(config_map["metadata"]["name"])
        for name, content in config_map["data"].items():
            if name.endswith(".json"):
                json.loads(content)


def shell_command_words(text: str, program: str) -> list[str]:
    """The words of the command line in a script that starts with `program` (after srun)."""
    joined = text.replace("\\\n", " ")
    for line in joined.splitlines():
        if line.startswith("#") or program not in line:
            continue
        words = shlex.split(line, posix=True)
        if program in words:
            return words[words.index(program) :]
    raise AssertionError(f"no {program} command")


def check_artifact(artifact: Artifact, plan: Plan) -> None:
    """Every static check that applies to one artifact, chosen by its name."""
    name, text = artifact.name, artifact.content
    if name.endswith(".json"):
        data = json.loads(text)
        if name == "ds_config.json":
            lo = plan.layout
            # DeepSpeed's batch world: the pipeline grid's dp; under Ulysses (ALST's mpu) world / sp;
            # else every rank
            check_ds_config(data, lo.dp if lo.pp > 1 else plan.cluster.world_size // lo.cp)
        if name == "training_args.json":
            assert not ("fsdp" in data and "deepspeed" in data)
            assert data.get("dataloader_num_workers", 0) > 0 or "dataloader_prefetch_factor" not in data
            assert not (data.get("bf16") and data.get("fp16"))
    elif name == "accelerate_config.yaml":
        check_accelerate(yaml.load(text, Loader=LOADER), plan)
    elif name == "pytorchjob.yaml":
        check_pytorchjob(text, plan)
    elif name == "hostfile":
        check_hostfile(text, plan)
    elif name == "megatron_launch.sh":
        words = shell_command_words(text, "pretrain_gpt.py")[1:]
        env = dict(re.findall(r"^export (\w+)=(\S+)$", text, re.M))
        check_megatron(words, plan, env)
    if artifact.media_type == "text/x-shellscript":
        assert text.startswith("#!")
        assert "layout" in text.splitlines()[1] or any(
            "trainplan layout" in x for x in text.splitlines()[:12]
        )
