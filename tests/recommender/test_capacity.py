"""Capacity planning across GPU types and stored clusters."""

from __future__ import annotations

from service.catalog.efficiency import default_efficiency
from service.catalog.gpus import gpu
from service.catalog.models import model
from service.estimator.types import ClusterSpec, TrainingSpec
from service.recommender.capacity import capacity


def test_fewest_gpus_per_type_and_time_to_train() -> None:
    # Llama-3-8B, 4K tokens x 512: on 80 GB GPUs a couple of GPUs hold the states; on 24 GB, more
    training = TrainingSpec(seq_len=4096, global_batch_size=512, tokens=10**11)
    options = capacity(
        model("llama-3-8b").spec,
        training,
        default_efficiency(),
        gpus=[gpu("h100-sxm-80gb"), gpu("rtx-4090-24gb")],
    )
    by_gpu = {o.gpu: o for o in options}
    h100, rtx = by_gpu["h100-sxm-80gb"], by_gpu["rtx-4090-24gb"]
    assert h100.fits and rtx.fits and h100.min_gpus and rtx.min_gpus
    assert h100.min_gpus <= rtx.min_gpus
    assert h100.tokens_per_s and h100.time_to_train_s
    assert abs(h100.time_to_train_s - 1e11 / h100.tokens_per_s) < 1e-6
    assert h100.gpu_hours == h100.time_to_train_s * (h100.num_gpus or 0) / 3600
    assert options[0].time_to_train_s == min(o.time_to_train_s or float("inf") for o in options)


def test_stored_cluster_runs_at_its_size() -> None:
    training = TrainingSpec(seq_len=2048, global_batch_size=256, tokens=10**10)
    stored = ClusterSpec(
        gpu=gpu("a100-sxm-80gb"),
        num_nodes=2,
        gpus_per_node=8,
        intra_node_bandwidth_bytes_per_s=300e9,
        inter_node_bandwidth_bytes_per_s=25e9,
    )
    (option,) = capacity(model("llama-2-7b").spec, training, default_efficiency(), clusters=[stored])
    assert option.fits and option.min_gpus is not None and option.min_gpus <= 16
    assert option.num_gpus == 16  # time to train on the whole stored cluster
    assert option.time_to_train_s is not None and option.time_to_train_s > 0
