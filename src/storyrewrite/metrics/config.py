"""`score` and `significance` sections of params.yaml."""
from __future__ import annotations

from dataclasses import dataclass

from storyrewrite.params import choices, positive


@dataclass(frozen=True)
class ScoreConfig:
    batch_size: int  # LM scorer pairs per forward pass
    dtype: str = choices("float32", "bfloat16", "float16", default="float32")

    def check(self, where: str) -> None:
        positive(where, batch_size=self.batch_size)


@dataclass(frozen=True)
class SignificanceConfig:
    baseline: str  # the system every other one is tested against
    n_resamples: int
    alpha: float  # the level marked in the report
    unit: str = choices("instance", "story", default="instance")  # what the bootstrap resamples

    def check(self, where: str) -> None:
        positive(where, n_resamples=self.n_resamples, alpha=self.alpha)
