"""Which micro-batch each process trains on, and how many updates the epochs make.

An :class:`EpochPlan` cuts each epoch's units into batches (:func:`~mydecide.training.batches.plan_batches`) in
its two phases: options in their given order first (``shuffle_start``), then the recipe's shuffling and rotations
(:class:`~mydecide.training.batches.OrderSchedule`). Epoch 0's plans are made up front (they size the schedule)
and kept for the loop's first pass; later epochs are planned as the loop reaches them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from mydecide.config import TrainRecipe
from mydecide.errors import UserError
from mydecide.records import Record
from mydecide.scoring.render import Renderer
from mydecide.training.batches import OrderSchedule, Unit, epoch_units, plan_batches


class EpochPlan:
    """The batches of ``records`` for process ``rank`` of ``world``; ``log`` (the main process's) hears when the
    options start to be shuffled."""

    def __init__(
        self,
        recipe: TrainRecipe,
        renderer: Renderer,
        records: Sequence[Record],
        world: int,
        rank: int,
        log: Callable[[str], None] | None = None,
    ):
        self.recipe, self.renderer, self.records = recipe, renderer, records
        self.world, self.rank, self.log = world, rank, log
        self.accum = recipe.optim.grad_accum
        # epoch 0's plans, kept for the first pass of the loop; the ordered one only when there is an ordered phase
        self._plans = {(phase, 0): self.plan(0, phase) for phase in ((0, 1) if recipe.shuffle_start else (1,))}
        shuffled_per_epoch = len(self._plans[(1, 0)]) // world
        ordered = len(self._plans[(0, 0)]) // world if (0, 0) in self._plans else shuffled_per_epoch
        per_epoch = (ordered, shuffled_per_epoch)
        if min(per_epoch) == 0:
            raise UserError(f"{len(records)} training records make fewer batches than processes ({world})")
        self.micro_per_epoch = per_epoch[1]
        self.total_updates = recipe.optim.max_steps or math.ceil(
            self.micro_per_epoch * recipe.optim.epochs / self.accum
        )
        self.schedule = OrderSchedule(round(recipe.shuffle_start * self.total_updates) * self.accum, per_epoch)
        self._cached: tuple[int, int] = (-1, -1)
        self._batches: list[list[Any]] = []

    def plan(self, epoch: int, phase: int) -> list[list[Any]]:
        """Phase 0: every option in its given order; phase 1: the recipe's shuffling and rotations."""
        recipe = self.recipe
        if phase == 0:
            units = epoch_units(
                self.renderer, self.records, recipe.seed, epoch, False, task_weights=recipe.task_weights
            )
        else:
            units = epoch_units(
                self.renderer,
                self.records,
                recipe.seed,
                epoch,
                recipe.shuffle_options,
                recipe.shuffle_fraction,
                recipe.orders_per_record,
                recipe.task_weights,
            )
        return plan_batches(units, recipe.optim.batch_size, recipe.seed, epoch)

    def units(self, micro: int) -> list[Unit]:
        """This process's units of micro-batch ``micro`` (update ``micro // accum``)."""
        phase, epoch, j = self.schedule.locate(micro)
        if (phase, epoch) != self._cached:
            if phase == 1 and self._cached[0] == 0 and self.log is not None:
                update = micro // self.accum
                self.log(f"update {update}: options shuffled from now on (shuffle_start {self.recipe.shuffle_start})")
            self._batches = self._plans.pop((phase, epoch), []) or self.plan(epoch, phase)
            self._cached = (phase, epoch)
        return self._batches[j * self.world + self.rank]

    def epoch(self, update: int) -> float:
        """How far training is after ``update`` updates, in epochs."""
        return self.schedule.epoch_float(update * self.accum)

    def epoch_ends(self, update: int) -> bool:
        """Whether update ``update`` finished an epoch."""
        return self.schedule.locate(update * self.accum)[1] != self.schedule.locate(update * self.accum - 1)[1]
