"""random:G - uniform verify lengths in [0, min(G, gamma)], independent of everything the drafter produced.

Test-only: lossless by construction (the choice never looks at draft values), so a distribution test can exercise
every ragged layout the worker can build.
"""

import torch

from .base import BatchContext, VerifyLengthPolicy


class RandomPolicy(VerifyLengthPolicy):
    name = "random"

    def __init__(self, gamma: int, max_len: int, seed: int = 0):
        super().__init__(gamma)
        self.max_len = min(max_len, gamma)
        self.generator = torch.Generator().manual_seed(seed)

    def choose(self, conf: torch.Tensor, ctx: BatchContext) -> torch.Tensor:
        return torch.randint(0, self.max_len + 1, (conf.shape[0],), generator=self.generator)
