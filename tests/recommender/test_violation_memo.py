"""The search validates a layout once per sweep: ``_violation`` shares ``layout_violation``'s answer
between the jobs of equal memory inputs (other GPU types), keyed by the layout and the GPU count.
It must give exactly ``layout_violation``'s answer on every GPU, including one whose hardware cannot
run the job (its answer is then not shared)."""

from __future__ import annotations

import random

from service.catalog.models import model
from service.catalog.tuning import default_tuning
from service.estimator.job import make_job, shared_memory_memos
from service.estimator.types import Precision, TrainingSpec
from service.estimator.validate import layout_violation
from service.recommender import _violation
from tests.estimator.test_job import random_layout
from tests.recommender.helpers import cluster


def test_shared_answers_are_layout_violations_answers_on_every_gpu() -> None:
    spec = model("mixtral-8x7b").spec
    training = TrainingSpec(seq_len=4096, global_batch_size=64, precision=Precision.BF16)
    rng = random.Random(7)
    layouts = [x for _ in range(3000) if (x := random_layout(rng, spec, 16, training)) is not None][:300]
    wrong_world = [x for _ in range(3000) if (x := random_layout(rng, spec, 8, training)) is not None][:50]
    assert len(layouts) == 300 and len(wrong_world) == 50
    # v100: no bf16, a hardware violation every layout breaks; the others run it
    gpus = ("h100-sxm-80gb", "v100-sxm2-32gb", "a100-sxm-80gb", "l40s-48gb")
    invalid = 0
    with shared_memory_memos():
        for name in gpus:
            for nodes in (2, 1):  # 16 GPUs, then 8: the same layouts under another GPU count
                job = make_job(spec, cluster(name, nodes), training, default_tuning())
                for layout in (*layouts, *wrong_world):
                    expected = layout_violation(spec, job.cluster, layout, training)
                    got = _violation(job, layout)
                    assert (type(got), str(got)) == (type(expected), str(expected)), (name, nodes, layout)
                    invalid += expected is not None
    assert 0 < invalid < len(gpus) * 2 * 350  # both answers reached
