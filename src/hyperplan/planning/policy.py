"""Policy profiles: the rules of the capacity market, as plain data.

The `sagemaker` profile holds the rules of SageMaker Training Plans. The `demo`
profile holds the same rules with a day read as a minute, so that a demo or an
end-to-end test sees real transitions in real time. Code never asks which
profile it runs under; it only reads the fields.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import datetime, time, timedelta, timezone
from types import MappingProxyType
from typing import Mapping

from hyperplan.api.vocabulary import HYPERPOD_CLUSTER, TRAINING_JOB

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_ONE_DAY = timedelta(days=1)


@dataclass(frozen=True)
class Policy:
    """The rules that offerings and plan schedules follow.

    Durations are whole multiples of `day`. Candidate start times lie on a grid
    of step `slot`, anchored at `end_time_of_day` UTC (midnight UTC when that is
    None); since `slot` divides `day`, every block boundary lies on the grid.
    """

    name: str
    allowed_instance_counts: tuple[int, ...]
    day: timedelta
    min_duration_days: int
    max_duration_days: int
    max_start_ahead: timedelta
    earliest_start_after_search: timedelta
    min_purchase_lead: timedelta
    end_time_of_day: time | None
    termination_lead: Mapping[str, timedelta] = field(hash=False)
    slot: timedelta
    # How long before a block's termination time the workloads on its nodes are asked to
    # checkpoint (pod annotation, node condition, Event); the drain still starts at the
    # termination time. See docs/checkpoint.md.
    checkpoint_lead: timedelta = timedelta(minutes=10)
    # How long the pods of a failed node that is dead (Ready not True) get to leave through the
    # Eviction API before they are marked Failed (DisruptionTarget) and deleted (planning.health).
    dead_node_eviction_timeout: timedelta = timedelta(seconds=10)

    def __post_init__(self) -> None:
        # Freeze the mapping so that a shared profile cannot be edited in place.
        object.__setattr__(self, "termination_lead", MappingProxyType(dict(self.termination_lead)))
        problems = []
        if not self.allowed_instance_counts or min(self.allowed_instance_counts) < 1:
            problems.append("allowed_instance_counts must be positive")
        if self.day <= timedelta(0) or self.slot <= timedelta(0):
            problems.append("day and slot must be positive")
        elif self.day % self.slot:
            problems.append("slot must divide day, so that block ends stay on the start grid")
        if not 1 <= self.min_duration_days <= self.max_duration_days:
            problems.append("need 1 <= min_duration_days <= max_duration_days")
        if self.checkpoint_lead < timedelta(0):
            problems.append("checkpoint_lead must not be negative")
        if self.dead_node_eviction_timeout < timedelta(0):
            problems.append("dead_node_eviction_timeout must not be negative")
        if self.end_time_of_day is not None:
            if self.end_time_of_day.tzinfo is not None:
                problems.append("end_time_of_day is read as UTC and must be naive")
            if self.day != _ONE_DAY or self.slot != _ONE_DAY:
                # Blocks of whole days that end at a fixed time of day also start at it.
                problems.append("end_time_of_day needs day == slot == 1 day")
        if problems:
            raise ValueError(f"policy {self.name!r}: " + "; ".join(problems))

    @property
    def min_duration(self) -> timedelta:
        return self.day * self.min_duration_days

    @property
    def max_duration(self) -> timedelta:
        return self.day * self.max_duration_days

    def whole_days(self, duration: timedelta) -> int | None:
        """`duration` in policy days, or None when it is not a whole number of them."""
        if duration % self.day:
            return None
        return duration // self.day

    def align_up(self, moment: datetime) -> datetime:
        """The first start-grid point at or after `moment`."""
        anchor = _EPOCH
        if self.end_time_of_day is not None:
            anchor = datetime.combine(_EPOCH.date(), self.end_time_of_day, tzinfo=timezone.utc)
        steps = -((anchor - moment) // self.slot)  # ceiling division
        return anchor + steps * self.slot

    def termination_time(self, end: datetime, target: str) -> datetime:
        """When instances of a block serving `target` are stopped, ahead of the block's end."""
        try:
            lead = self.termination_lead[target]
        except KeyError:
            raise ValueError(
                f"unknown target resource {target!r}; expected one of {sorted(self.termination_lead)}"
            ) from None
        return end - lead


SAGEMAKER = Policy(
    name="sagemaker",
    allowed_instance_counts=(1, 2, 4, 8, 16, 32, 64),
    day=timedelta(days=1),
    min_duration_days=1,
    max_duration_days=182,
    max_start_ahead=timedelta(days=56),
    earliest_start_after_search=timedelta(minutes=30),
    min_purchase_lead=timedelta(minutes=5),
    end_time_of_day=time(11, 30),
    termination_lead={TRAINING_JOB: timedelta(minutes=30), HYPERPOD_CLUSTER: timedelta(minutes=60)},
    # Blocks are whole days ending at 11:30 UTC, so they also start at 11:30 UTC:
    # a finer grid would only produce starts that the end alignment forbids.
    slot=timedelta(days=1),
    checkpoint_lead=timedelta(minutes=10),
    # A replaced node's pods are forced out after a minute without Ready: long enough that a
    # kubelet restart is not mistaken for a dead node, short enough to free the job's slot.
    dead_node_eviction_timeout=timedelta(seconds=60),
)

DEMO = Policy(
    name="demo",
    allowed_instance_counts=(1, 2, 4, 8, 16, 32, 64),
    day=timedelta(minutes=1),
    min_duration_days=1,
    max_duration_days=182,
    max_start_ahead=timedelta(minutes=56),
    # Not zero: an offering must leave time to buy it (min_purchase_lead), and an
    # offering starting 5 s after the search would fail the purchase about as often
    # as not. 10 s leaves 5 s to buy, as sagemaker's 30 min leave 25 min.
    earliest_start_after_search=timedelta(seconds=10),
    min_purchase_lead=timedelta(seconds=5),
    end_time_of_day=None,
    termination_lead={TRAINING_JOB: timedelta(seconds=10), HYPERPOD_CLUSTER: timedelta(seconds=20)},
    slot=timedelta(seconds=5),
    checkpoint_lead=timedelta(seconds=5),
    dead_node_eviction_timeout=timedelta(seconds=3),
)

POLICIES: dict[str, Policy] = {policy.name: policy for policy in (SAGEMAKER, DEMO)}


def get_policy(name: str, checkpoint_lead: timedelta | None = None) -> Policy:
    """The policy profile called `name` (with its checkpoint lead replaced, when given)."""
    try:
        policy = POLICIES[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown policy profile {name!r}; expected one of: {', '.join(sorted(POLICIES))}"
        ) from None
    return policy if checkpoint_lead is None else replace(policy, checkpoint_lead=checkpoint_lead)


_DURATION = re.compile(r"(?:(?P<d>\d+)d)?(?:(?P<h>\d+)h)?(?:(?P<m>\d+)m)?(?:(?P<s>\d+)s)?")


def parse_duration(text: str) -> timedelta:
    """Parse "48h", "2d", "90m", "1h30m", "30s" (units d, h, m, s, largest first, each once)."""
    if not isinstance(text, str):
        raise ValueError(f"duration must be a string like '48h' or '2d', got {text!r}")
    match = _DURATION.fullmatch(text.strip())
    if match is None or not any(match.groupdict().values()):
        raise ValueError(
            f"invalid duration {text!r}: use whole numbers with units d, h, m, s, "
            "largest unit first, e.g. '48h', '2d', '1h30m'"
        )
    parts = {unit: int(value or 0) for unit, value in match.groupdict().items()}
    return timedelta(days=parts["d"], hours=parts["h"], minutes=parts["m"], seconds=parts["s"])


def format_duration(duration: timedelta) -> str:
    """The inverse of parse_duration for whole seconds: timedelta(hours=36) -> "1d12h"."""
    seconds = int(duration.total_seconds())
    if seconds <= 0:
        return "0s" if seconds == 0 else "-" + format_duration(-duration)
    text = ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        amount, seconds = divmod(seconds, size)
        if amount:
            text += f"{amount}{unit}"
    return text
