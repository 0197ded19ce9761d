"""The training setup every estimate, plan and capacity request carries."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from service.api.schemas.common import Strict
from service.estimator.types import ALL_LINEAR, Attention, Method, Optimizer, Precision, TrainingSpec


class TrainingIn(Strict):
    seq_len: int = Field(ge=1, le=10_000_000)
    global_batch_size: int = Field(ge=1, le=100_000_000, description="sequences per optimizer step")
    precision: Precision = Precision.BF16
    optimizer: Optimizer = Optimizer.ADAMW
    method: Method = Method.FULL
    lora_rank: int = Field(default=16, ge=1, le=65_536)
    lora_targets: list[str] | Literal["all-linear"] = Field(default="all-linear", max_length=64)
    attention: Attention = Attention.FLASH
    tokens: int | None = Field(default=None, gt=0, le=10**16, description="total tokens, for time to train")

    def to_domain(self) -> TrainingSpec:
        targets = ALL_LINEAR if self.lora_targets == "all-linear" else tuple(self.lora_targets)
        return TrainingSpec(
            seq_len=self.seq_len,
            global_batch_size=self.global_batch_size,
            precision=self.precision,
            optimizer=self.optimizer,
            method=self.method,
            lora_rank=self.lora_rank,
            lora_targets=targets,
            attention=self.attention,
            tokens=self.tokens,
        )
