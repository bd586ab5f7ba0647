"""The README's kind section and docs/install-on-kind.md show exactly the commands that
`hyperplan dev kind up` and the kind tier run (hyperplan_dev.kind.README_STEPS)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hyperplan_dev.kind import README_STEPS, REMOVAL_STEPS

ROOT = Path(__file__).resolve().parents[2]


def _first_sh_block(text: str, heading: str) -> list[str]:
    section = text[text.index(heading):]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [l.strip() for l in block.splitlines() if l.strip() and not l.strip().startswith("#")]


def test_the_readme_kind_section_is_exactly_the_steps_that_are_run() -> None:
    readme = (ROOT / "README.md").read_text()
    assert _first_sh_block(readme, "## Install on a cluster (kind, with Docker)") == list(README_STEPS)


@pytest.mark.parametrize("step", README_STEPS)
def test_install_on_kind_shows_every_step(step: str) -> None:
    assert step in (ROOT / "docs" / "install-on-kind.md").read_text()


def test_kind_load_names_the_cluster_of_the_kind_config() -> None:
    import yaml
    name = yaml.safe_load((ROOT / "deploy" / "kind-config.yaml").read_text())["name"]
    load = next(s for s in README_STEPS if s.startswith("kind load"))
    assert load.endswith(f"--name {name}")


def test_the_examples_folder_holds_only_core_kinds() -> None:
    """`kubectl apply -f deploy/examples/` (not recursive) must not need CRDs besides ours."""
    import yaml
    kinds = {d["apiVersion"].split("/")[0] for f in (ROOT / "deploy" / "examples").glob("*.yaml")
             for d in yaml.safe_load_all(f.read_text()) if d}
    assert kinds == {"hyperplan.dev"}, kinds


def test_the_readme_removal_block_is_exactly_the_steps_the_kind_tier_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Install on a cluster (kind, with Docker)"):]
    blocks = [[l.strip() for l in b.splitlines() if l.strip() and not l.strip().startswith("#")]
              for b in re.findall(r"```sh\n(.*?)```", section, re.S)]
    assert list(REMOVAL_STEPS) in blocks


@pytest.mark.parametrize("step", REMOVAL_STEPS)
def test_install_on_kind_shows_every_removal_step(step: str) -> None:
    assert step in (ROOT / "docs" / "install-on-kind.md").read_text()
