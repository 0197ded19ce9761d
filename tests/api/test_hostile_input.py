"""Inputs a hostile or careless client sends: JSON types other than the field's, NUL characters
anywhere, values below physical bounds, names longer than a plan stores. Each is a 422 that names the
field (or where in the request), on SQLite and PostgreSQL, and nothing is stored."""

from __future__ import annotations

import typing
from typing import Annotated, Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from service.contracts.common import Strict, is_amount
from tests.api.helpers import assert_problem

CLUSTER = {"name": "ok", "gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8}
ONE_H100 = {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 1}


def estimate_body(**parts: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": {"preset": "gpt2"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 2, **parts.get("cluster", {})},
        "training": {"seq_len": 1024, "global_batch_size": 8, **parts.get("training", {})},
        "layout": {"dp": 2, **parts.get("layout", {})},
    }


@pytest.mark.parametrize(
    ("parts", "field", "words"),
    [
        (
            {"training": {"global_batch_size": "8"}},
            "training.global_batch_size",
            "expected an integer, got str '8'",
        ),
        ({"training": {"seq_len": True}}, "training.seq_len", "expected an integer, got bool True"),
        ({"layout": {"dp": "2"}}, "layout.dp", "expected an integer, got str '2'"),
        ({"training": {"seq_len": 4096.0}}, "training.seq_len", "expected an integer, got float 4096.0"),
        ({"layout": {"dp": 2.0}}, "layout.dp", "expected an integer, got float 2.0"),
        ({"cluster": {"gpus_per_node": 2.0}}, "cluster.gpus_per_node", "expected an integer, got float"),
        ({"layout": {"sequence_parallel": 1}}, "layout.sequence_parallel", "expected true or false, got 1"),
        (
            {"cluster": {"intra_node_bandwidth_bytes_per_s": "4e11"}},
            "cluster.intra_node_bandwidth_bytes_per_s",
            "expected a number, got str",
        ),
        (
            {"cluster": {"intra_node_bandwidth_gbps": "400"}},
            "cluster.intra_node_bandwidth_gbps",
            "intra_node_bandwidth_gbps: expected a number",
        ),
    ],
)
def test_json_types_other_than_the_fields_are_refused(
    client: TestClient, parts: dict[str, Any], field: str, words: str
) -> None:
    body = assert_problem(client.post("/v1/estimates", json=estimate_body(**parts)), 422)
    assert body["errors"][0]["field"] == field, body
    assert words in body["detail"], body["detail"]


def _strict_models() -> list[type[Strict]]:
    import service.contracts.capacity
    import service.contracts.plans  # noqa: F401  (with the others: every request body's model)

    found, todo = [], [Strict]
    while todo:
        for model in todo.pop().__subclasses__():
            found.append(model)
            todo.append(model)
    return found


def _integer_fields(model: type[Strict]) -> dict[str, Any]:
    """Each field that holds integers and no other scalar (through Optional, Annotated and lists),
    with 2.0 where it holds one (in a list where it holds a list)."""

    def kinds(annotation: Any) -> set[Any]:
        args = typing.get_args(annotation)
        if typing.get_origin(annotation) is Annotated:
            return kinds(args[0])
        if typing.get_origin(annotation) is list:
            return {list} | kinds(args[0])
        return set().union(*map(kinds, args)) if args else {annotation}

    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        held = kinds(field.annotation)
        if int in held and not held & {float, str, bool}:
            out[name] = [2.0] if list in held else 2.0
    return out


def test_every_integer_field_of_every_request_body_refuses_a_float() -> None:
    """Not only the ones above: each Strict model, each integer field, as JSON's 2.0; but for amounts
    (tokens, bytes: ``is_amount``), which take an integral float (1e12) and refuse a fractional one."""
    checked = 0
    for model in _strict_models():
        for name, value in _integer_fields(model).items():
            if is_amount(name):
                fractional = [2.5] if isinstance(value, list) else 2.5
                with pytest.raises(ValidationError):
                    model.model_validate({name: fractional})
                continue
            with pytest.raises(ValidationError) as refused:
                model.model_validate({name: value})
            mine = [e for e in refused.value.errors() if e["loc"][:1] == (name,)]
            assert mine and "expected an integer, got float" in mine[0]["msg"], (model, name, mine)
            checked += 1
    assert checked >= 30, checked  # seq_len, batch, degrees, layer counts, sizes, ...


def test_integers_still_fill_number_fields(client: TestClient) -> None:
    ok = client.post(
        "/v1/estimates", json=estimate_body(cluster={"intra_node_bandwidth_bytes_per_s": 400_000_000_000})
    )
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize(
    ("field", "value", "limit"),
    [
        ("inter_node_bandwidth_bytes_per_s", 5e-324, "1000000"),  # a denormal: step time would be Infinity
        ("intra_node_bandwidth_bytes_per_s", 1.0, "1000000"),
    ],
)
def test_hardware_below_physical_bounds_is_refused(
    client: TestClient, field: str, value: float, limit: str
) -> None:
    # two nodes with a valid network, then the field under test set below its bound
    two_nodes = {"num_nodes": 2, "gpus_per_node": 1, "inter_node_bandwidth_bytes_per_s": 5e10}
    body = estimate_body(cluster={**two_nodes, field: value})
    problem = assert_problem(client.post("/v1/estimates", json=body), 422)
    assert field in problem["detail"] and limit in problem["detail"].replace(".0", ""), problem["detail"]


def test_custom_gpu_with_a_denormal_peak_is_refused(client: TestClient) -> None:
    gpu = {
        "name": "tiny",
        "memory_bytes": 80 * 10**9,
        "peak_flops_per_s": {"fp32": 1e-300, "bf16": 1e-300},
        "hbm_bandwidth_bytes_per_s": 2e12,
        "intra_node_bandwidth_bytes_per_s": 4e11,
        "pcie_bandwidth_bytes_per_s": 6.4e10,
    }
    body = estimate_body()
    body["cluster"] = {"gpu": gpu, "num_nodes": 1, "gpus_per_node": 2}
    problem = assert_problem(client.post("/v1/estimates", json=body), 422)
    assert "peak_flops_per_s" in problem["detail"]


def test_nul_in_a_body_string_is_refused_and_nothing_is_stored(client: TestClient) -> None:
    for patch in ({"name": "a\u0000b"}, {"description": "x\u0000"}):
        problem = assert_problem(client.post("/v1/clusters", json={**CLUSTER, **patch}), 422)
        assert "NUL" in problem["detail"]
    hf = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "intermediate_size": 128, "vocab_size": 100, "_name_or_path": "a\u0000"}  # fmt: skip
    body = estimate_body()
    body["model"] = {"hf_config": hf}
    assert "hf_config._name_or_path" in assert_problem(client.post("/v1/estimates", json=body), 422)["detail"]
    assert client.get("/v1/clusters").json()["items"] == []


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "where"),
    [
        ("GET", "/v1/plans", {"params": {"cluster_id": "a\u0000b"}}, "query"),
        ("GET", "/v1/clusters/a%00b", {}, "path"),
        ("POST", "/v1/clusters", {"json": CLUSTER, "headers": {"Idempotency-Key": "a\u0000b"}}, "header"),
    ],
)
def test_nul_in_the_path_query_or_a_header_is_refused(
    client: TestClient, method: str, path: str, kwargs: dict[str, Any], where: str
) -> None:
    problem = assert_problem(client.request(method, path, **kwargs), 422)
    assert where in problem["detail"] and "NUL" in problem["detail"]
    assert client.get("/v1/clusters").json()["items"] == []


def test_a_model_name_longer_than_a_plan_stores_is_refused(client: TestClient) -> None:
    hf = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "intermediate_size": 128, "vocab_size": 100, "_name_or_path": "x" * 201}  # fmt: skip
    body = {
        "model": {"hf_config": hf},
        "cluster": ONE_H100,
        "training": {"seq_len": 128, "global_batch_size": 1},
    }
    problem = assert_problem(client.post("/v1/plans", json=body), 422)
    assert "_name_or_path" in problem["detail"] and "200" in problem["detail"]
    assert client.get("/v1/plans").json()["items"] == []
    # the request's model.name labels it instead
    named = client.post("/v1/plans", json={**body, "model": {"hf_config": hf, "name": "tiny"}})
    assert named.status_code == 201, named.text


def test_observed_runs_below_physical_bounds_are_refused(client: TestClient) -> None:
    body = {
        "model": {"preset": "gpt2"},
        "cluster": ONE_H100,
        "training": {"seq_len": 128, "global_batch_size": 1},
    }
    plan = client.post("/v1/plans", json=body).json()
    for field, value in (("step_s", 1e-300), ("tokens_per_s", 1e-9), ("peak_memory_bytes_per_gpu", 1)):
        response = client.post(f"/v1/plans/{plan['id']}/runs", json={field: value})
        assert field in assert_problem(response, 422)["detail"]


def test_method_not_allowed_names_every_method_and_health_answers_head(client: TestClient) -> None:
    response = client.put("/v1/clusters")
    assert_problem(response, 405)
    assert response.headers["allow"] == "GET, HEAD, POST"
    assert client.head("/healthz").status_code == 200
    assert client.head("/readyz").status_code == 200


def test_amounts_take_json_floats_that_are_integers(client: TestClient) -> None:
    """A Python scheduler's json.dumps(15e12) sends "15000000000000.0": a token budget or a size in
    bytes written so is that integer, echoed as one; 4096.0 for seq_len is still refused above."""
    body = {
        "model": {"preset": "llama-3.2-1b"},
        "cluster": {
            "gpu": "h100-sxm-80gb",
            "num_nodes": 1,
            "gpus_per_node": 8,
            "cpu_memory_bytes_per_node": 2e12,
        },
        "training": {"seq_len": 2048, "global_batch_size": 64, "tokens": 15e12},
    }
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 201, response.text
    request = response.json()["request"]
    assert request["training"]["tokens"] == 15 * 10**12 and isinstance(request["training"]["tokens"], int)
    assert request["cluster"]["cpu_memory_bytes_per_node"] == 2 * 10**12
    refused = client.post("/v1/plans", json=body | {"training": {**body["training"], "tokens": 1.5}})
    assert refused.status_code == 422
    # past the bound, the bound is what the answer names: 1e30 tokens was "expected an integer"
    huge = client.post("/v1/plans", json=body | {"training": {**body["training"], "tokens": 1e30}})
    assert huge.status_code == 422
    (error,) = huge.json()["errors"]
    assert error["field"] == "training.tokens" and "10000000000000000" in error["message"], error


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/clusters", {"name": "x", "gpu": "h100-sxm-80gb", "num_gpus": 12}, "num_gpus"),
        (
            "/v1/estimates",
            {"model": {"preset": "gpt2"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 12},
             "training": {"seq_len": 1024, "global_batch_size": 8}},
            "cluster.num_gpus",
        ),
        (
            "/v1/capacity",
            {"model": {"preset": "gpt2"}, "training": {"seq_len": 1024, "global_batch_size": 8},
             "gpus": ["l4-24gb"], "cluster_ids": ["x"]},
            "cluster_ids",
        ),
    ],
)  # fmt: skip
def test_two_fields_that_contradict_name_one_of_them_not_the_body(
    client: TestClient, path: str, body: dict[str, Any], field: str
) -> None:
    """api.md: the errors name each offending field; a model validator's refusal named "body"."""
    response = client.post(path, json=body)
    assert response.status_code == 422, response.text
    assert [e["field"] for e in response.json()["errors"]] == [field]


@pytest.mark.parametrize(
    ("targets", "says"),
    [([], "name at least one module"), (["q_proj", "v_proj", "q_proj"], "q_proj named more than once")],
)
def test_lora_targets_name_each_module_once(client: TestClient, targets: list[str], says: str) -> None:
    """[] was taken as all-linear (21M adapters on an 8B) and ["q_proj", "q_proj"] counted q_proj's
    adapters twice: both are a 422 naming training.lora_targets."""
    body = {
        "model": {"preset": "llama-3.1-8b"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 1},
        "training": {"seq_len": 1024, "global_batch_size": 8, "method": "lora", "lora_targets": targets},
        "layout": {"framework": "fsdp", "zero_stage": 0},
    }
    problem = assert_problem(client.post("/v1/estimates", json=body), 422)
    (error,) = problem["errors"]
    assert error["field"] == "training.lora_targets" and says in error["message"], error


TINY_LLAMA = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 100,
}


@pytest.mark.parametrize("factor", [1e7, 1e305])
@pytest.mark.parametrize("path", ["/v1/plans", "/v1/estimates", "/v1/models/resolve"])
def test_a_config_past_the_explicit_forms_limits_is_a_422_naming_its_key(
    client: TestClient, factor: float, path: str
) -> None:
    """A config.json's rope_scaling factor of 1e305 was a 500 (its context overflowed an int), and 1e7
    resolved to an architecture the service then refused as model.architecture: a config is held to
    the explicit form's limits, the key named (hostile review)."""
    config = {**TINY_LLAMA, "rope_scaling": {"rope_type": "linear", "factor": factor}}
    body: dict[str, Any] = {"model": {"hf_config": config}}
    if path != "/v1/models/resolve":
        body |= {"cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 1}}
        body |= {"training": {"seq_len": 128, "global_batch_size": 1}}
    problem = assert_problem(client.post(path, json=body), 422)
    assert [e["field"] for e in problem["errors"]] == ["model.hf_config.rope_scaling.factor"], problem
    assert "1000000" in problem["detail"]


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"gpu_hour_cost": {f"h100-sxm-{i}gb": 1.0 for i in range(5_000)}}, "gpu_hour_cost"),
        ({"gpus": [f"x{i}" for i in range(10_000)]}, "gpus"),
        ({"gpu_hour_cost": {"h" * 100_000: 1.0}}, "gpu_hour_cost"),
    ],
)
def test_capacity_counts_its_names_before_reading_them(
    client: TestClient, extra: dict[str, Any], field: str
) -> None:
    """40,000 price keys (under the body limit) held the event loop for a minute, /healthz with it,
    each name resolved against the catalog before the count was checked; 10,000 GPU names six seconds
    (hostile review). Counted first: refused at once, the limit named, the answer short."""
    body = {"model": {"preset": "gpt2"}, "training": {"seq_len": 1024, "global_batch_size": 8, "tokens": 1e9}}
    response = client.post("/v1/capacity", json=body | extra)
    problem = assert_problem(response, 422)
    assert [e["field"] for e in problem["errors"]] == [field], problem
    assert len(response.content) < 2_000


def test_an_unknown_gpu_name_of_any_length_is_refused_unread_and_shown_by_its_start(
    client: TestClient,
) -> None:
    """A 750 KB GPU name was matched word by word against the catalog and echoed whole, twice."""
    from service.catalog.errors import UnknownCatalogEntry
    from service.catalog.gpus import gpu as catalog_gpu

    with pytest.raises(UnknownCatalogEntry) as refused:
        catalog_gpu("z" * 750_000)
    assert refused.value.candidates == () and len(refused.value.message) < 5_000
    body = {
        "model": {"preset": "gpt2"},
        "cluster": {"gpu": "z" * 200_000, "gpus_per_node": 1},
        "training": {"seq_len": 1024, "global_batch_size": 8},
    }
    response = client.post("/v1/estimates", json=body)
    assert_problem(response, 422)
    assert len(response.content) < 10_000


def test_a_config_past_the_limits_names_the_configs_own_key(client: TestClient) -> None:
    """The limit check named the explicit form's fields (norm_eps for rms_norm_eps, rope_scaling for a
    wrapper's text_config.rope_scaling): the config's key where it has one, else the config itself
    (change review)."""
    llama = TINY_LLAMA
    eps = assert_problem(
        client.post("/v1/models/resolve", json={"model": {"hf_config": {**llama, "rms_norm_eps": 2.0}}}), 422
    )
    assert [e["field"] for e in eps["errors"]] == ["model.hf_config"] and "norm_eps" in eps["detail"]
    gemma3 = {
        "model_type": "gemma3",
        "text_config": {
            "model_type": "gemma3_text",
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "intermediate_size": 128,
            "vocab_size": 100,
            "rope_scaling": {"rope_type": "linear", "factor": 2e6},
        },
    }
    # a top-level key of that name the wrapper's reader does not take is not the one named
    gemma3 = {**gemma3, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    wrapped = assert_problem(client.post("/v1/models/resolve", json={"model": {"hf_config": gemma3}}), 422)
    assert [e["field"] for e in wrapped["errors"]] == ["model.hf_config.text_config.rope_scaling.factor"], (
        wrapped
    )


@pytest.mark.parametrize("seq_len", [5_000_000, 20_000_000])
def test_a_bound_past_the_documented_maximum_says_that_maximum(client: TestClient, seq_len: int) -> None:
    """seq_len 20,000,000 was refused at "less than or equal to 10000000" (a looser first check), 5,000,000
    at the 4,194,304 the schema documents: one bound, the documented one, with its reason (a surfaces
    review)."""
    body = {
        "model": {"preset": "llama-2-7b"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": seq_len, "global_batch_size": 8},
        "layout": {},
    }
    problem = assert_problem(client.post("/v1/estimates", json=body), 422)
    error = problem["errors"][0]
    assert error["field"] == "training.seq_len" and error["limit"] == {"le": 4_194_304}, error
    assert "the largest published" in error["message"]
