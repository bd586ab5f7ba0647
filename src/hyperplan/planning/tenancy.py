"""Who may use what: label selectors between the kinds owned by different people.

A TrainingPlan's ``spec.instanceGroupSelector`` says which InstanceGroups may bind it, and a
CapacityPool's ``spec.trainingPlanSelector`` which TrainingPlans may buy from it (docs/security.md,
"Trust model"). Both are metav1 LabelSelectors over the other object's ``metadata.labels``, with
Kubernetes' meaning: every ``matchLabels`` pair and every ``matchExpressions`` requirement must
hold; an empty selector matches every object. An absent selector also matches every object here
(not nothing, as for a null LabelSelector in the core API), so an object that never set one keeps
working as before tenancy existed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

IN, NOT_IN, EXISTS, DOES_NOT_EXIST = "In", "NotIn", "Exists", "DoesNotExist"
OPERATORS = (IN, NOT_IN, EXISTS, DOES_NOT_EXIST)
REASON_NOT_ALLOWED = "NotAllowed"


@dataclass(frozen=True)
class Requirement:
    """One ``matchExpressions`` entry."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def holds(self, labels: Mapping[str, str]) -> bool:
        if self.operator == IN:
            return self.key in labels and labels[self.key] in self.values
        if self.operator == NOT_IN:
            return self.key not in labels or labels[self.key] not in self.values
        if self.operator == EXISTS:
            return self.key in labels
        if self.operator == DOES_NOT_EXIST:
            return self.key not in labels
        return False  # an operator the API server would have refused: match nothing rather than all


@dataclass(frozen=True)
class Selector:
    """A label selector, hashable (it rides on pool snapshots the cache keeps)."""

    match_labels: tuple[tuple[str, str], ...] = ()
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return (all(labels.get(key) == value for key, value in self.match_labels)
                and all(r.holds(labels) for r in self.requirements))

    def describe(self) -> str:
        """The selector as ``kubectl get -l`` writes one (``team=a,tier in (x,y),!gone``)."""
        parts = [f"{k}={v}" for k, v in self.match_labels]
        for r in self.requirements:
            if r.operator == IN:
                parts.append(f"{r.key} in ({','.join(r.values)})")
            elif r.operator == NOT_IN:
                parts.append(f"{r.key} notin ({','.join(r.values)})")
            elif r.operator == EXISTS:
                parts.append(r.key)
            else:
                parts.append(f"!{r.key}")
        return ",".join(parts) or "(everything)"


def selector_of(wire: Mapping[str, Any] | None) -> Selector | None:
    """The selector written as a metav1 LabelSelector on the wire (camelCase), None when absent."""
    if wire is None:
        return None
    expressions = tuple(
        Requirement(str(e.get("key", "")), str(e.get("operator", "")), tuple(str(v) for v in e.get("values") or ()))
        for e in wire.get("matchExpressions") or ())
    return Selector(tuple(sorted((str(k), str(v)) for k, v in (wire.get("matchLabels") or {}).items())), expressions)


def allows(selector: Selector | None, labels: Mapping[str, str] | None) -> bool:
    """Whether an object with ``labels`` is let through by ``selector`` (absent: everything is)."""
    return selector is None or selector.matches(labels)


def not_allowed_message(owner: str, selector: Selector, subject: str) -> str:
    return f"{owner} allows only {subject} matching {selector.describe()}"


def pools_for_plan(pools: Iterable[Any], plan_labels: Mapping[str, str] | None) -> list[Any]:
    """The pool snapshots a plan with ``plan_labels`` may buy from (each has ``plan_selector``)."""
    return [p for p in pools if allows(p.plan_selector, plan_labels)]
