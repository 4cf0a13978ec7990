"""core.containerenv: the value handed to each runtime shows the program the value itself
(against test_render_support.apptainer_reads, the model of the real Apptainer's reading)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.test_render_support import apptainer_reads

from slurmjob_operator.config.slurm import RuntimeProfile
from slurmjob_operator.core.containerenv import STEP_EXPORT_NAMES, carried, step_export


@pytest.mark.parametrize(
    ("value", "handed"),
    [
        ("plain", "plain"),
        ("", ""),
        ("$(id)", "\\$(id)"),
        ("`id`", "\\`id\\`"),
        ("${HOME:-x}", "\\${HOME:-x}"),
        ("a\\b", "a\\\\b"),
        ("end\\", "end\\\\"),
        ('"quoted"', '"quoted"'),
        ("it's", "it's"),
        ("a\r\nb", "a\r\r\nb"),
        ("a\r\r\nb", "a\r\r\r\nb"),
        ("a\rb\nc", "a\rb\nc"),
    ],
)
def test_apptainer_escapes(value: str, handed: str) -> None:
    assert carried(RuntimeProfile.APPTAINER, value) == handed
    assert apptainer_reads(handed) == value


@given(st.text(alphabet=st.characters(blacklist_characters="\0"), max_size=40))
def test_apptainer_round_trip(value: str) -> None:
    assert apptainer_reads(carried(RuntimeProfile.APPTAINER, value)) == value


@given(st.text(alphabet=st.characters(blacklist_characters="\0"), max_size=40))
def test_pyxis_carries_values_verbatim(value: str) -> None:
    assert carried(RuntimeProfile.ENROOT_PYXIS, value) == value


def test_a_step_exports_the_operators_the_launchs_and_the_users_names_only() -> None:
    names = step_export(RuntimeProfile.ENROOT_PYXIS, ["EPOCHS", "HF_TOKEN"]).split(",")
    assert names[: len(STEP_EXPORT_NAMES)] == list(STEP_EXPORT_NAMES)
    assert names[len(STEP_EXPORT_NAMES) :] == ["EPOCHS", "HF_TOKEN"]
    assert "PATH" in names
    assert not [n for n in names if n.startswith(("SLURM_", "LD_", "HOME"))]
    # With Apptainer the user's variables travel under its prefix, as the script hands them.
    apptainer = step_export(RuntimeProfile.APPTAINER, ["EPOCHS"]).split(",")
    assert apptainer[-1] == "APPTAINERENV_EPOCHS"
    assert "EPOCHS" not in apptainer
