"""The committed CRD YAML is exactly what the pydantic models generate."""

from pathlib import Path

import pytest

from hyperplan.api import crds

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("kind", crds.KINDS, ids=lambda k: k.name)
@pytest.mark.parametrize("folder", ["crds", "charts/hyperplan/crds"])
def test_committed_crd_matches_models(kind: crds.Kind, folder: str) -> None:
    committed = (ROOT / folder / crds.file_name(kind)).read_text()
    assert committed == crds.render(kind), f"{folder}/{crds.file_name(kind)} is stale: run `make crds`"


@pytest.mark.parametrize("kind", crds.KINDS, ids=lambda k: k.name)
def test_schema_is_structural(kind: crds.Kind) -> None:
    """No leftovers of pydantic's JSON schema that the API server would refuse."""
    text = crds.render(kind)
    for word in ("$ref", "anyOf", "$defs", "title:", "const:"):
        assert word not in text
