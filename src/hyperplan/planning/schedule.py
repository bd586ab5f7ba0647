"""Where a purchased plan stands at `now`: which block runs, what comes next, and when to wake up.

Pure: the plan's blocks, its target and `now` in, a PlanSchedule out. The
handler decides Pending and Failed; this module only covers a bought plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Sequence

from hyperplan.planning.policy import Policy

SCHEDULED = "Scheduled"
ACTIVE = "Active"
EXPIRED = "Expired"


@dataclass(frozen=True)
class BlockState:
    """What the clock says of one of the plan's blocks at ``now``; the block itself (its times,
    pool and counts) is the caller's, at ``index`` in the list it passed in."""

    index: int  # position in the plan's block list
    termination_time: datetime  # end - termination lead of the target; instances stop from then on
    status: str  # Scheduled | Active | Expired
    draining: bool = False  # Active, but past termination_time: no instance may run

    @property
    def usable(self) -> bool:
        """Whether instances of this block may run now."""
        return self.status == ACTIVE and not self.draining


@dataclass(frozen=True)
class PlanSchedule:
    phase: str  # Scheduled | Active | Expired
    blocks: tuple[BlockState, ...]
    active_block: int | None  # index of the running block
    current_or_next_block: int | None  # the block whose counts the plan reports
    next_transition_time: datetime | None  # nearest future start, termination time or end

    @property
    def usable_block(self) -> int | None:
        """Index of the block whose instances may run now (active and not yet draining)."""
        if self.active_block is None:
            return None
        for state in self.blocks:
            if state.index == self.active_block and state.usable:
                return state.index
        return None


def plan_block_schedule(
    blocks: Sequence[tuple[datetime, datetime]], target: str, policy: Policy, now: datetime
) -> PlanSchedule:
    """The state of a bought plan with `blocks` (start, end) serving `target` at `now`.

    A block is Active for start <= now < end and Expired from its end on. Its
    instances are stopped from its termination time (end minus the target's
    termination lead, never before its start). `next_transition_time` is the
    nearest of all these boundaries strictly after `now`: the moment the
    handler must look again.
    """
    if not blocks:
        raise ValueError("a purchased plan has at least one block")
    states = []
    for index, (start, end) in enumerate(blocks):
        if end <= start:
            raise ValueError(f"block {index} ends ({end.isoformat()}) before it starts ({start.isoformat()})")
        termination = max(start, policy.termination_time(end, target))
        if now < start:
            status = SCHEDULED
        elif now < end:
            status = ACTIVE
        else:
            status = EXPIRED
        states.append(
            BlockState(
                index=index,
                termination_time=termination,
                status=status,
                draining=status == ACTIVE and now >= termination,
            )
        )

    # Blocks of one plan do not overlap; order by time in case the caller's list is not.
    by_time = sorted(states, key=lambda state: blocks[state.index][0])
    active = next((state.index for state in by_time if state.status == ACTIVE), None)
    upcoming = next((state.index for state in by_time if state.status == SCHEDULED), None)
    if active is not None:
        phase = ACTIVE
    elif upcoming is not None:
        phase = SCHEDULED
    else:
        phase = EXPIRED

    boundaries = [
        moment
        for (start, end), state in zip(blocks, states)
        for moment in (start, state.termination_time, end)
        if moment > now
    ]
    return PlanSchedule(
        phase=phase,
        blocks=tuple(states),
        active_block=active,
        current_or_next_block=active if active is not None else upcoming,
        next_transition_time=min(boundaries, default=None),
    )
