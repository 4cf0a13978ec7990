"""core.containerenv: the value handed to each runtime shows the program the value itself
(against test_render_support.apptainer_reads, the model of the real Apptainer's reading)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.test_render_support import apptainer_reads

from slurmjob_operator.config.slurm import RuntimeProfile
from slurmjob_operator.core.containerenv import carried


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
