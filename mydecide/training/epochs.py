"""Which micro-batch each process trains on, and how many updates the epochs make.

An :class:`EpochPlan` cuts each epoch's units into batches (:func:`~mydecide.training.batches.plan_batches`): the
batches of an update are a pure function of the seed, the epoch and the micro-batch number, so resuming replays
them. Epoch 0's plan is made up front (it sizes the schedule) and kept for the loop's first pass; later epochs are
planned as the loop reaches them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from mydecide.config import TrainRecipe
from mydecide.errors import UserError
from mydecide.records import Record
from mydecide.scoring.render import Renderer
from mydecide.training.batches import Unit, epoch_units, plan_batches


class EpochPlan:
    """The batches of ``records`` for process ``rank`` of ``world``."""

    def __init__(self, recipe: TrainRecipe, renderer: Renderer, records: Sequence[Record], world: int, rank: int):
        self.recipe, self.renderer, self.records = recipe, renderer, records
        self.world, self.rank = world, rank
        self.accum = recipe.optim.grad_accum
        self._epoch, self._batches = 0, self.plan(0)  # epoch 0's, kept for the first pass of the loop
        self.micro_per_epoch = len(self._batches) // world  # per process
        if self.micro_per_epoch == 0:
            raise UserError(f"{len(records)} training records make fewer batches than processes ({world})")
        self.total_updates = recipe.optim.max_steps or math.ceil(
            self.micro_per_epoch * recipe.optim.epochs / self.accum
        )

    def plan(self, epoch: int) -> list[list[Unit]]:
        """Every batch of epoch ``epoch`` (all processes'), options shuffled as the recipe says."""
        recipe = self.recipe
        units = epoch_units(
            self.renderer, self.records, recipe.seed, epoch, recipe.shuffle_options, recipe.task_weights
        )
        return plan_batches(units, recipe.optim.batch_size, recipe.seed, epoch)

    def units(self, micro: int) -> list[Unit]:
        """This process's units of micro-batch ``micro`` (update ``micro // accum``)."""
        epoch, j = divmod(micro, self.micro_per_epoch)
        if epoch != self._epoch:
            self._epoch, self._batches = epoch, self.plan(epoch)
        return self._batches[j * self.world + self.rank]

    def epoch(self, update: int) -> float:
        """How far training is after ``update`` updates, in epochs."""
        epoch, j = divmod(update * self.accum, self.micro_per_epoch)
        return epoch + j / self.micro_per_epoch

    def epoch_ends(self, update: int) -> bool:
        """Whether update ``update`` finished an epoch."""
        micro = update * self.accum
        return micro // self.micro_per_epoch != (micro - 1) // self.micro_per_epoch
