"""A plan's counts from its block's nodes: one formula for ``availableInstanceCount``.

The plan's status (planning.plans) and its per-UltraServer reports (planning.placement) used to
compute what is available two ways, and disagreed when a spare was unhealthy: the plan took the
unhealthy spare off twice (once as unhealthy, once as a configured spare). Both now use
``counts.available_instances``. Also ``current_block``: which block the counts are of, at ``now``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import pytest

from hyperplan.api.models import TrainingPlanSpec, TrainingPlanStatus
from hyperplan.planning import counts
from hyperplan.planning import naming
from hyperplan.planning import placement
from hyperplan.planning.blocks import Block
from hyperplan.planning.plans import block_usage, current_block, decide_plan
from hyperplan.planning.policy import DEMO

UTC = timezone.utc
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
X72 = "ml.u-p6e-gb200x72"
BLOCK = Block(id="rc-abc-0", pool="gb", availability_zone="az1", instance_type=placement.ULTRASERVER_INSTANCE_TYPE,
              instance_count=36, start=T0, end=T0 + timedelta(minutes=30), ultra_server_type=X72)
US0, US1 = (u.id for u in placement.ultraservers_for_block(BLOCK.id, X72, 36, 1))
SPEC = TrainingPlanSpec(ultra_server_type=X72, ultra_server_count=2, target_resource="hyperpod-cluster",
                        duration="30m")


def nodes(active0: int, active1: int, spare0: bool | None, spare1: bool | None) -> list[counts.ObservedNode]:
    """Active nodes on each UltraServer (healthy, Ready) and each one's spare (healthy: True,
    unhealthy: False, absent: None)."""
    out = [counts.ObservedNode(f"a0-{i}", "g", naming.ROLE_ACTIVE, US0, True, True, False) for i in range(active0)]
    out += [counts.ObservedNode(f"a1-{i}", "g", naming.ROLE_ACTIVE, US1, True, True, False) for i in range(active1)]
    for us, spare in ((US0, spare0), (US1, spare1)):
        if spare is not None:
            out.append(counts.ObservedNode(f"s-{us}", "g", naming.ROLE_SPARE, us, spare, spare, not spare))
    return out


@dataclass(frozen=True)
class Case:
    id: str
    nodes: list[counts.ObservedNode]
    available: int
    unhealthy: int
    available_spares: int


CASES = [
    Case("no-nodes", nodes(0, 0, None, None), available=34, unhealthy=0, available_spares=0),
    Case("healthy-spares", nodes(17, 3, True, True), available=14, unhealthy=0, available_spares=2),
    # The unhealthy spare stands in for its configured spare: counted once, not twice.
    Case("one-unhealthy-spare", nodes(17, 3, True, False), available=14, unhealthy=1, available_spares=1),
    Case("both-spares-unhealthy", nodes(17, 3, False, False), available=14, unhealthy=2, available_spares=0),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_plan_and_its_ultraservers_count_available_instances_alike(case: Case):
    usage = block_usage(BLOCK, 1, case.nodes)
    status = decide_plan(SPEC, 1, TrainingPlanStatus(), [BLOCK], [], DEMO, T0 + timedelta(minutes=1), usage).status

    assert status.available_instance_count == case.available
    assert sum(u.available_instance_count for u in status.ultra_servers) == case.available
    assert status.unhealthy_instance_count == case.unhealthy
    assert status.available_spare_instance_count == case.available_spares
    assert status.total_instance_count == 36


def test_current_block_is_the_running_one_else_the_next_else_none():
    later = Block(id="rc-abc-1", pool="gb", availability_zone="az1", instance_type=BLOCK.instance_type,
                  instance_count=36, start=T0 + timedelta(hours=1), end=T0 + timedelta(hours=2),
                  ultra_server_type=X72)
    blocks = [later, BLOCK]  # in any order

    assert current_block(blocks, "hyperpod-cluster", DEMO, T0 - timedelta(minutes=5)) == BLOCK
    assert current_block(blocks, "hyperpod-cluster", DEMO, T0 + timedelta(minutes=1)) == BLOCK
    assert current_block(blocks, "hyperpod-cluster", DEMO, T0 + timedelta(minutes=45)) == later
    assert current_block(blocks, "hyperpod-cluster", DEMO, T0 + timedelta(hours=3)) is None
