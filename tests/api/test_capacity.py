"""POST /v1/capacity: GPUs needed and time to train, per GPU type or per stored cluster."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.helpers import assert_problem

TRAINING = {"seq_len": 1024, "global_batch_size": 32, "tokens": 2 * 10**9}  # gpt2: 1,024 positions


def test_per_gpu_type_fewest_gpus_time_and_cost(client: TestClient) -> None:
    body: dict[str, Any] = {
        "model": {"preset": "llama-2-7b"},
        "training": TRAINING,
        "gpus": ["h100-sxm-80gb", "rtx-4090-24gb"],
        "max_nodes": 4,
        "gpu_hour_cost": {"h100-sxm-80gb": 2.5, "rtx-4090-24gb": 0.4},
        "constraints": {"frameworks": ["deepspeed"], "allow_offload": False},
    }
    response = client.post("/v1/capacity", json=body)
    assert response.status_code == 200, response.text
    options = {o["gpu"]: o for o in response.json()["options"]}
    h100 = options["h100-sxm-80gb"]
    assert h100["fits"] and h100["min_gpus"] >= 1
    # 16 bytes/param of states alone (108 GB) cannot sit on one 80 GiB card without sharding.
    assert h100["min_gpus"] >= 2
    # 2 x 10^9 tokens in steps of 32 x 1,024 tokens: 61,036 whole steps (61,035.2 rounded up)
    # the layout as an estimate answers it: its accumulation derived (it was null; batch review)
    layout = h100["layout"]
    assert layout["gradient_accumulation_steps"] * layout["micro_batch_size"] * layout["dp"] == 32
    assert h100["time_to_train_s"] == pytest.approx(61_036 * 32_768 / h100["tokens_per_s"], rel=1e-12)
    assert abs(h100["cost"] - h100["gpu_hours"] * 2.5) < 1e-9 * h100["cost"]
    assert (
        h100["layout"]["dp"] * h100["layout"]["tp"] * h100["layout"]["pp"] * h100["layout"]["cp"]
        == (h100["num_gpus"])
    )
    # Without offload, 24 GB cards need more of them than 80 GB cards, when they fit at all.
    rtx = options["rtx-4090-24gb"]
    assert not rtx["fits"] or rtx["min_gpus"] > h100["min_gpus"]


def test_stored_clusters_keep_their_ids(client: TestClient) -> None:
    ids = [
        client.post(
            "/v1/clusters", json={"name": n, "gpu": "a100-sxm-80gb", "num_nodes": 1, "gpus_per_node": g}
        ).json()["id"]
        for n, g in (("small", 2), ("full", 8))
    ]
    body = {"model": {"preset": "gpt2"}, "training": TRAINING, "cluster_ids": ids}
    response = client.post("/v1/capacity", json=body)
    assert response.status_code == 200, response.text
    options = response.json()["options"]
    assert {o["cluster_id"] for o in options} == set(ids)
    assert all(o["fits"] and o["gpu"] == "a100-sxm-80gb" for o in options)
    # a cluster named twice is one option, as a GPU named twice is
    twice = client.post("/v1/capacity", json=body | {"cluster_ids": [ids[0], ids[0], ids[1]]}).json()
    assert [o["cluster_id"] for o in twice["options"]] == [o["cluster_id"] for o in options]
    # the catalog's node size and node bound do not apply to stored clusters: refused, not ignored
    for field, value in (("max_nodes", 1), ("gpus_per_node", 4)):
        problem = assert_problem(client.post("/v1/capacity", json=body | {field: value}), 422)
        assert problem["errors"][0]["field"] == field and "stored cluster" in problem["errors"][0]["message"]


def test_bad_capacity_requests(client: TestClient) -> None:
    base = {"model": {"preset": "gpt2"}, "training": TRAINING}
    problem = assert_problem(client.post("/v1/capacity", json=base | {"gpus": ["h900"]}), 422)
    assert problem["errors"][0]["field"] == "gpus.0"
    problem = assert_problem(client.post("/v1/capacity", json=base | {"cluster_ids": ["missing"]}), 404)
    assert problem["errors"][0]["field"] == "cluster_ids.0"
    # an empty id is refused at the edge (it once reached ClusterRef inside the handler: a 500)
    for key in ("cluster_ids", "gpus"):
        problem = assert_problem(client.post("/v1/capacity", json=base | {key: [""]}), 422)
        assert problem["errors"][0]["field"] == f"{key}.0", problem
    assert_problem(client.post("/v1/capacity", json=base | {"gpus": ["l4-24gb"], "cluster_ids": ["x"]}), 422)
    assert_problem(client.post("/v1/capacity", json=base | {"gpu_hour_cost": -1.0}), 422)


def test_capacity_counts_gpus_that_hold_the_job_and_says_why_a_gpu_cannot(client: TestClient) -> None:
    body = {
        "model": {"preset": "llama-2-13b"},
        "training": TRAINING,
        "gpus": ["h100-sxm-80gb", "v100-sxm2-32gb"],
        "max_nodes": 4,
    }
    options = {o["gpu"]: o for o in client.post("/v1/capacity", json=body).json()["options"]}
    # No offload unless asked: 13B's 16 bytes/param of states (208 GB) need several 80 GB cards.
    h100 = options["h100-sxm-80gb"]
    assert h100["fits"] and h100["min_gpus"] >= 4
    assert h100["layout"]["offload_optimizer"] == "none" and h100["layout"]["offload_params"] == "none"
    # the precision left to the hardware: fp16 on Volta (the option says so)
    v100 = options["v100-sxm2-32gb"]
    assert "training.precision fp16" in v100["note"] and "training.attention sdpa" in v100["note"]
    # bf16 asked for: Volta cannot, and the option says why rather than "nothing fits"
    asked = body | {"training": TRAINING | {"precision": "bf16"}}
    options = {o["gpu"]: o for o in client.post("/v1/capacity", json=asked).json()["options"]}
    assert not options["v100-sxm2-32gb"]["fits"] and "bf16" in options["v100-sxm2-32gb"]["note"]


def test_non_finite_numbers_are_refused(client: TestClient) -> None:
    # JSON has no NaN or Infinity, but Python's parser accepts the tokens: a number must be finite
    body = (
        '{"model": {"preset": "gpt2"}, "training": {"seq_len": 1024, "global_batch_size": 64}, '
        '"gpus": ["a100-sxm-80gb"], "gpu_hour_cost": NaN}'
    )
    response = client.post("/v1/capacity", content=body, headers={"content-type": "application/json"})
    assert assert_problem(response, 422)["errors"][0]["field"].startswith("gpu_hour_cost")
    resolve = (
        '{"model": {"hf_config": {"model_type": "phi", "hidden_size": 64, "intermediate_size": 128, '
        '"num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100, '
        '"partial_rotary_factor": Infinity}}}'
    )
    response = client.post(
        "/v1/models/resolve", content=resolve, headers={"content-type": "application/json"}
    )
    assert "partial_rotary_factor" in assert_problem(response, 422)["errors"][0]["field"]


def test_a_family_price_prices_the_stored_clusters_parts_of_it(client: TestClient) -> None:
    """A review's case: with cluster_ids, {"h100": 2} was a 422 naming three H100 parts the request
    never wrote (the family was expanded to the catalog's parts, not the clusters')."""
    cid = client.post(
        "/v1/clusters", json={"name": "pod", "gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8}
    ).json()["id"]
    body = {
        "model": {"preset": "gpt2"},
        "training": TRAINING,
        "cluster_ids": [cid],
        "gpu_hour_cost": {"h100": 2},
    }
    response = client.post("/v1/capacity", json=body)
    assert response.status_code == 200, response.text
    (option,) = response.json()["options"]
    assert option["cost"] == option["gpu_hours"] * 2
    # a family none of the clusters' GPUs belongs to prices nothing: refused, naming the key
    problem = assert_problem(client.post("/v1/capacity", json=body | {"gpu_hour_cost": {"a100": 2}}), 422)
    assert problem["errors"][0]["field"] == "gpu_hour_cost.a100"


def test_a_stored_clusters_id_prices_that_cluster_alone(client: TestClient) -> None:
    """An on-demand and a reserved pool of one GPU type at their own rates: the cluster ids as price keys
    were a 422 ("no GPU type of the request is named ...": FinOps review). An id prices its cluster, a
    GPU type the clusters of it no id priced, and an option no key prices says it has no cost."""
    pool = {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8}
    on_demand = client.post("/v1/clusters", json=pool | {"name": "on-demand"}).json()["id"]
    reserved = client.post("/v1/clusters", json=pool | {"name": "reserved"}).json()["id"]
    other = client.post("/v1/clusters", json=pool | {"name": "other", "gpu": "h200-sxm-141gb"}).json()["id"]
    body = {"model": {"preset": "gpt2"}, "training": TRAINING, "cluster_ids": [on_demand, reserved, other],
            "gpu_hour_cost": {on_demand: 4.0, reserved: 2.0}}  # fmt: skip
    response = client.post("/v1/capacity", json=body)
    assert response.status_code == 200, response.text
    options = {o["cluster_id"]: o for o in response.json()["options"]}
    assert options[on_demand]["cost"] == pytest.approx(options[on_demand]["gpu_hours"] * 4.0)
    assert options[reserved]["cost"] == pytest.approx(options[reserved]["gpu_hours"] * 2.0)
    assert options[other]["cost"] is None and "no cost" in options[other]["note"]
    # an id beside its GPU type's price: the id's
    body["gpu_hour_cost"] = {"h100-sxm-80gb": 3.0, on_demand: 4.0}
    options = {o["cluster_id"]: o for o in client.post("/v1/capacity", json=body).json()["options"]}
    assert options[on_demand]["cost"] == pytest.approx(options[on_demand]["gpu_hours"] * 4.0)
    assert options[reserved]["cost"] == pytest.approx(options[reserved]["gpu_hours"] * 3.0)


def test_a_gpu_type_a_price_map_leaves_out_says_it_has_no_cost(client: TestClient) -> None:
    body = {"model": {"preset": "gpt2"}, "training": TRAINING, "gpus": ["h100-sxm-80gb", "a100-sxm-80gb"],
            "gpu_hour_cost": {"h100-sxm-80gb": 2}}  # fmt: skip
    options = {o["gpu"]: o for o in client.post("/v1/capacity", json=body).json()["options"]}
    assert options["h100-sxm-80gb"]["cost"] is not None and "no cost" not in options["h100-sxm-80gb"]["note"]
    assert options["a100-sxm-80gb"]["cost"] is None
    assert "gpu_hour_cost has no price for a100-sxm-80gb" in options["a100-sxm-80gb"]["note"]


def test_a_capacity_price_has_the_plans_upper_bound(client: TestClient) -> None:
    """A review's case: 1e300 was answered as is and 1.7e308 overflowed to a null cost; a plan refuses
    over 1e6 per GPU-hour, and so does capacity, as a scalar and per GPU."""
    base = {"model": {"preset": "gpt2"}, "training": TRAINING, "gpus": ["h100-sxm-80gb"]}
    for price in (1e300, {"h100-sxm-80gb": 1.7e308}, 1_000_001):
        problem = assert_problem(client.post("/v1/capacity", json=base | {"gpu_hour_cost": price}), 422)
        assert problem["errors"][0]["field"] == "gpu_hour_cost"
        assert "1,000,000" in problem["errors"][0]["message"]
    assert client.post("/v1/capacity", json=base | {"gpu_hour_cost": 1e6}).status_code == 200


def test_a_stored_clusters_option_is_calibrated_as_its_plans_and_estimates_are(client: TestClient) -> None:
    """After a run 15% slower than estimated on a stored cluster, its plans and estimates said 126,724
    tokens/s and capacity on the same cluster 145,733 (consistency review): capacity applies the same
    calibration and says so."""
    created = client.post(
        "/v1/clusters",
        json={"name": "calibrated pod", "gpu": "h100-sxm-80gb", "num_nodes": 2, "gpus_per_node": 8,
              "inter_node_bandwidth_bytes_per_s": 50e9},
    )  # fmt: skip
    assert created.status_code == 201, created.text
    cluster_id = created.json()["id"]
    training = {"seq_len": 8192, "global_batch_size": 128, "tokens": 1e11}
    body = {"model": {"preset": "llama-3.1-8b"}, "cluster": {"id": cluster_id}, "training": training,
            "constraints": {"frameworks": ["megatron"]}}  # fmt: skip
    plan = client.post("/v1/plans", json=body).json()
    step_s = plan["recommended"]["estimate"]["time"]["step_s"]
    ran = client.post(f"/v1/plans/{plan['id']}/runs", json={"step_s": 1.15 * step_s, "out_of_memory": False})
    assert ran.status_code == 201, ran.text
    sized = client.post(
        "/v1/capacity",
        json={"model": {"preset": "llama-3.1-8b"}, "training": training, "cluster_ids": [cluster_id],
              "constraints": {"frameworks": ["megatron"]}},
    )  # fmt: skip
    assert sized.status_code == 200, sized.text
    (option,) = sized.json()["options"]
    assert "calibrated by 1 run(s) on this cluster" in option["note"]
    estimated = client.post(
        "/v1/estimates",
        json={"model": {"preset": "llama-3.1-8b"}, "cluster": {"id": cluster_id}, "training": training,
              "layout": option["layout"]},
    ).json()  # fmt: skip
    assert estimated["calibration"]["runs"] == 1
    assert option["tokens_per_s"] == pytest.approx(estimated["time"]["tokens_per_s"], rel=1e-9)
    assert option["time_to_train_s"] == pytest.approx(estimated["time_to_train_s"], rel=1e-9)
    # the plan made again is calibrated; its rejected figures say they are the search's, before it
    again = client.post("/v1/plans", json=body).json()
    assert again["recommended"]["estimate"]["calibration"]["runs"] == 1
    figured = [r for r in again["rejected"] if r["per_gpu_bytes"] is not None or "tokens/s" in r["detail"]]
    assert figured and all("before the calibration from this hardware's runs" in r["detail"] for r in figured)
    assert not any("before the calibration" in r["detail"] for r in plan["rejected"])


def test_a_stored_clusters_option_past_the_card_under_its_runs_memory_factor_does_not_fit(
    client: TestClient,
) -> None:
    """After an out-of-memory run, capacity on the cluster said fits: true for the layout that ran out,
    beside a note that it needs more than the card (runs review)."""
    created = client.post(
        "/v1/clusters", json={"name": "oom pod", "gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8}
    )
    cluster_id = created.json()["id"]
    training = {"seq_len": 8192, "global_batch_size": 128}
    body = {"model": {"preset": "llama-3.1-8b"}, "cluster": {"id": cluster_id}, "training": training,
            "constraints": {"frameworks": ["megatron"]}}  # fmt: skip
    plan = client.post("/v1/plans", json=body).json()
    ran = client.post(f"/v1/plans/{plan['id']}/runs", json={"out_of_memory": True})
    assert ran.status_code == 201, ran.text
    sized = client.post(
        "/v1/capacity",
        json={"model": {"preset": "llama-3.1-8b"}, "training": training, "cluster_ids": [cluster_id],
              "constraints": {"frameworks": ["megatron"]}},
    ).json()  # fmt: skip
    (option,) = sized["options"]
    derived = ("gradient_accumulation_steps",)  # stored derived with the plan
    same = {k: v for k, v in option["layout"].items() if k not in derived}
    assert same == {k: v for k, v in plan["recommended"]["layout"].items() if k not in derived}
    assert option["fits"] is False and "so it does not fit" in option["note"]


# ---- inputs capacity would not use are refused; max_gpus bounds it (capacity-planner review, stop 44)

CAPPED = {"model": {"preset": "llama-3.1-70b"}, "training": {"seq_len": 4096, "global_batch_size": 256}}


@pytest.mark.parametrize(
    ("constraints", "field"),
    [
        ({"objective": "cost"}, "constraints.objective"),
        ({"objective": "throughput"}, "constraints.objective"),
        ({"top_k": 5}, "constraints.top_k"),
        ({"gpu_hour_cost": 3.0}, "constraints.gpu_hour_cost"),  # beside the request's gpu_hour_cost
    ],
)
def test_a_constraint_capacity_does_not_apply_is_refused(
    client: TestClient, constraints: dict[str, Any], field: str
) -> None:
    body = CAPPED | {"gpus": ["h100-sxm-80gb"], "gpu_hour_cost": 2.0, "constraints": constraints}
    response = client.post("/v1/capacity", json=body)
    assert_problem(response, 422)
    assert [e["field"] for e in response.json()["errors"]] == [field]


def test_fewest_gpus_is_the_objective_capacity_has(client: TestClient) -> None:
    body = CAPPED | {"gpus": ["h100-sxm-80gb"], "constraints": {"objective": "fewest_gpus"}}
    assert client.post("/v1/capacity", json=body).status_code == 200


def test_max_gpus_bounds_each_option(client: TestClient) -> None:
    # 70B with its 16 B/param of states needs more than one 80 GiB card: capped at 1 it does not fit,
    # and says the cap; uncapped it fits on more
    free = client.post("/v1/capacity", json=CAPPED | {"gpus": ["h100-sxm-80gb"]}).json()["options"][0]
    assert free["fits"] and free["min_gpus"] > 8
    capped_at = free["min_gpus"] // 2
    body = CAPPED | {"gpus": ["h100-sxm-80gb"], "constraints": {"max_gpus": capped_at}}
    (option,) = client.post("/v1/capacity", json=body).json()["options"]
    assert not option["fits"]
    assert "constraints.max_gpus" in option["note"]
    enough = CAPPED | {"gpus": ["h100-sxm-80gb"], "constraints": {"max_gpus": free["min_gpus"]}}
    (fits,) = client.post("/v1/capacity", json=enough).json()["options"]
    assert fits["fits"] and fits["min_gpus"] == free["min_gpus"]


def test_at_gpus_past_max_gpus_is_refused(client: TestClient) -> None:
    body = CAPPED | {"gpus": ["h100-sxm-80gb"], "at_gpus": 64, "constraints": {"max_gpus": 32}}
    response = client.post("/v1/capacity", json=body)
    assert_problem(response, 422)
    (error,) = response.json()["errors"]
    assert error["field"] == "at_gpus" and error["limit"] == {"le": 32}


def test_a_cap_between_the_ladders_steps_is_searched_up_to_itself(client: TestClient) -> None:
    """DeepSeek-V3 with max_gpus 168 answered "no layout fits up to 144 GPUs" where 160 fit (the climb
    steps 18 -> 24 nodes past 16): the cap's own whole nodes are a count of the climb. (Since
    Megatron's distributed optimizer runs precision-aware, DeepSeek-V3 fits on a step, 18 nodes; Llama
    3.1 405B on 40 GB A100s fits on 21, between the steps 18 and 24.)"""
    body = {
        "model": {"preset": "llama-3.1-405b"},
        "training": {"seq_len": 1024, "global_batch_size": 2048, "tokens": 10**12},
        "gpus": ["a100-sxm-40gb"],
    }
    (free,) = client.post("/v1/capacity", json=body).json()["options"]
    assert free["fits"] and 144 < free["min_gpus"] < 192
    capped = body | {"constraints": {"max_gpus": free["min_gpus"] + 4}}
    (option,) = client.post("/v1/capacity", json=capped).json()["options"]
    # (at most the free answer: the bisection between ladder steps takes a fit to hold for more nodes,
    # and 29 nodes, a prime, have fewer splits than 28; the cap's climb reaches 28)
    assert option["fits"] and option["min_gpus"] <= free["min_gpus"]


def test_a_cap_past_a_stored_clusters_gpus_adds_none(client: TestClient) -> None:
    cluster = client.post("/v1/clusters", json={"name": "two-nodes", "gpu": "h100-sxm-80gb", "num_nodes": 2})
    assert cluster.status_code == 201, cluster.text
    body = {
        "model": {"preset": "llama-3.1-405b"},
        "training": {"seq_len": 4096, "global_batch_size": 256},
        "cluster_ids": [cluster.json()["id"]],
        "constraints": {"max_gpus": 96},
    }
    (option,) = client.post("/v1/capacity", json=body).json()["options"]
    assert not option["fits"] and "16 GPUs" in option["note"]
    catalog = {k: v for k, v in body.items() if k != "cluster_ids"} | {
        "gpus": ["h100-sxm-80gb"],
        "max_nodes": 2,
    }
    (option,) = client.post("/v1/capacity", json=catalog).json()["options"]
    assert not option["fits"]


def test_offload_over_catalog_cards_is_refused_as_an_input_the_answer_cannot_use(client: TestClient) -> None:
    """A catalog card's nodes state no host RAM or NVMe: allow_offload true answered as if false."""
    body = {"model": {"preset": "gpt2"}, "training": TRAINING, "gpus": ["a100-sxm-80gb"]}
    problem = assert_problem(
        client.post("/v1/capacity", json=body | {"constraints": {"allow_offload": True}}), 422
    )
    assert [e["field"] for e in problem["errors"]] == ["constraints.allow_offload"]
    assert (
        client.post("/v1/capacity", json=body | {"constraints": {"allow_offload": False}}).status_code == 200
    )


@pytest.mark.parametrize("where", ["top", "constraints"])
def test_a_price_without_tokens_is_refused_wherever_it_is_given(client: TestClient, where: str) -> None:
    """A price prices the time to train, which needs training.tokens: given at the top level it was a
    422, in constraints it was ignored, the options' cost null and nothing said (cost review)."""
    body: dict[str, Any] = {
        "model": {"preset": "llama-3.1-8b"},
        "training": {"seq_len": 8192, "global_batch_size": 512},
        "gpus": ["h100-sxm-80gb"],
    }
    if where == "top":
        body["gpu_hour_cost"] = 2.5
    else:
        body["constraints"] = {"gpu_hour_cost": 2.5}
    problem = assert_problem(client.post("/v1/capacity", json=body), 422)
    field = "gpu_hour_cost" if where == "top" else "constraints.gpu_hour_cost"
    assert [e["field"] for e in problem["errors"]] == [field]
    assert "needs training.tokens" in problem["errors"][0]["message"]


def test_a_part_priced_twice_differently_names_both_keys(client: TestClient) -> None:
    """{"h100": 2.5, "h100-sxm-80gb": 3} was refused at "gpu_hour_cost.gpu_hour_cost", its words
    naming the second key as the other (cost review): the field is the key that priced it again, the
    words name both keys and prices."""
    body = {
        "model": {"preset": "llama-3.1-8b"},
        "training": {"seq_len": 8192, "global_batch_size": 512, "tokens": 10**12},
        "gpu_hour_cost": {"h100": 2.5, "h100-sxm-80gb": "3"},
    }
    problem = assert_problem(client.post("/v1/capacity", json=body), 422)
    (error,) = problem["errors"]
    assert error["field"] == "gpu_hour_cost.h100-sxm-80gb", error
    assert "'h100' at 2.5, 'h100-sxm-80gb' at 3" in error["message"], error


def test_a_price_sent_as_a_string_is_the_same_price_as_the_number(client: TestClient) -> None:
    """{"h100": 2.5, "h100-sxm-80gb": "2.5"} was refused as pricing one part twice "differently: at
    2.5, at 2.5" (review of this stop): the prices are compared as the numbers they become."""
    body = {
        "model": {"preset": "llama-3.1-8b"},
        "training": {"seq_len": 8192, "global_batch_size": 512, "tokens": 10**12},
        "gpus": ["h100-sxm-80gb"],
        "gpu_hour_cost": {"h100": 2.5, "h100-sxm-80gb": "2.5"},
    }
    response = client.post("/v1/capacity", json=body)
    assert response.status_code == 200, response.text


def test_at_gpus_past_the_default_nodes_is_timed_as_asked(client: TestClient) -> None:
    """at_gpus 16,384 with max_nodes left out was timed on the default 1,024 nodes' 8,192 GPUs, a note
    saying so (cost review): left out, max_nodes grows to hold at_gpus; stated, it still bounds it."""
    body: dict[str, Any] = {
        "model": {"preset": "llama-3.1-8b"},
        "training": {"seq_len": 8192, "global_batch_size": 16384},
        "gpus": ["h100-sxm-80gb"],
        "at_gpus": 16384,
    }
    (option,) = client.post("/v1/capacity", json=body).json()["options"]
    assert option["num_gpus"] == 16384, option
    (bounded,) = client.post("/v1/capacity", json=body | {"max_nodes": 1024}).json()["options"]
    assert bounded["num_gpus"] == 8192 and "timed on those" in bounded["note"], bounded


def test_a_qlora_capacity_that_data_parallelism_bounds_says_so(client: TestClient) -> None:
    """QLoRA splits no weight over tp, pp or ep, and no target runs it with context parallelism: a
    70B QLoRA at 8K on RTX 4090s was searched up to 8,192 GPUs (763 layouts) and said only "no layout
    fits up to 8192 GPUs" (an infeasible-jobs review): the climb stops at the global batch and says
    why, with what would change it."""
    body = {
        "model": {"preset": "llama-3.1-70b"},
        "training": {"seq_len": 8192, "global_batch_size": 64, "method": "qlora"},
        "gpus": ["rtx-4090-24gb"],
    }
    response = client.post("/v1/capacity", json=body)
    assert response.status_code == 200, response.text
    (option,) = response.json()["options"]
    assert option["fits"] is False and "on up to 64 GPUs, the most this job uses" in option["note"], option
    assert "no target runs it with context parallelism" in option["note"] and option["evaluations"] < 100


def test_a_qlora_job_fsdp1_cannot_shard_says_the_rule_in_capacity_and_a_plan_says_qlora_not_launchers(
    client: TestClient,
) -> None:
    """Capacity of a QLoRA Qwen3-30B-A3B on FSDP alone advised a larger batch, where FSDP1 shards none
    of its layouts (the rule, which a plan said); and a QLoRA plan that asked for no launcher was told
    "the requested launchers run data parallelism only" (a review of this stop's commits)."""
    body = {
        "model": {"preset": "qwen3-30b-a3b"},
        "training": {"seq_len": 4096, "global_batch_size": 8, "method": "qlora"},
        "gpus": ["l4-24gb"],
        "constraints": {"frameworks": ["fsdp"]},
    }
    (option,) = client.post("/v1/capacity", json=body).json()["options"]
    assert "huggingface/peft#3080" in option["note"] and "on up to 8 GPUs" in option["note"], option
    plan = client.post(
        "/v1/plans",
        json={
            "model": {"preset": "llama-3.1-70b"},
            "cluster": {"gpu": "l4-24gb", "num_nodes": 1, "gpus_per_node": 8},
            "training": {"seq_len": 8192, "global_batch_size": 4, "method": "qlora"},
        },
    ).json()
    reasons = " ".join(s["reason"] for s in plan["suggestions_skipped"])
    assert "requested launchers" not in reasons and "qlora splits no weight" in reasons, reasons


def test_capacity_says_what_the_config_states_that_no_figure_reads(client: TestClient) -> None:
    """A quantized-checkpoints review: an fp8 checkpoint's estimate warns that it is planned dequantized;
    POST /v1/capacity and `trainplan capacity` said nothing of it."""
    config = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
              "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
              "vocab_size": 128256,
              "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}  # fmt: skip
    training = {"seq_len": 4096, "global_batch_size": 64, "method": "lora"}
    answer = client.post(
        "/v1/capacity", json={"model": {"hf_config": config}, "training": training, "gpus": ["h100-sxm-80gb"]}
    )
    assert answer.status_code == 200, answer.text
    estimate = client.post(
        "/v1/estimates",
        json={"model": {"hf_config": config}, "training": training, "layout": {"dp": 8},
              "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8}},
    )  # fmt: skip
    (said,) = [w for w in estimate.json()["warnings"] if w.startswith("quantization_config fp8")]
    assert said in answer.json()["warnings"]
