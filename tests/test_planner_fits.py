"""The profile's modelled entries and other fits: read, applied, written back by calibrate, dropped once measured."""

from __future__ import annotations

import tomllib

import pytest

from h3flow.core.errors import ConfigError
from h3flow.planner.calibrate import _measured, to_toml
from h3flow.planner.profile import DEFAULT_PROFILE, load_profile, parse_profile


def test_the_shipped_profile_names_its_modelled_hd_decode_and_the_other_fits() -> None:
    profile = load_profile()
    assert set(profile.data.modelled) == {"gpu.RTX 3080 Ti.decode.hd"}
    assert set(profile.data.alternatives) == {"slow-hd-decode", "power-law-scaling"}
    slow = profile.variant("slow-hd-decode")
    assert slow.decode("RTX 3080 Ti", "hd", "t") == 75.5 and profile.decode("RTX 3080 Ti", "hd", "t") == 34.77
    assert slow.sample("T10", 4, "hd", "t").seconds == 235.34
    assert slow.data.alternatives == {}  # a variant has no variants of its own
    power = profile.variant("power-law-scaling")
    # through the same two listed degrees: equal there, different where modelled
    assert power.sample("T10", 8, "sd", "t").seconds == profile.sample("T10", 8, "sd", "t").seconds
    assert power.sample("T10", 2, "sd", "t").seconds == pytest.approx(102.71, abs=0.01)
    assert profile.sample("T10", 2, "sd", "t").seconds == pytest.approx(115.55, abs=0.01)
    assert "power law" in (power.sample("T10", 2, "sd", "t").modelled or "")


def test_measuring_an_entry_drops_it_from_modelled_and_every_fit_that_changes_it() -> None:
    raw = tomllib.loads(DEFAULT_PROFILE.read_text())
    _measured(raw, "gpu.RTX 3080 Ti.decode.hd")
    assert raw["modelled"] == {} and set(raw["alternatives"]) == {"power-law-scaling"}
    again = tomllib.loads(to_toml(raw, "calibrated"))
    assert again == raw
    assert set(parse_profile(again).data.alternatives) == {"power-law-scaling"}


def test_an_alternative_must_set_something() -> None:
    raw = tomllib.loads(DEFAULT_PROFILE.read_text())
    raw["alternatives"]["empty"] = {"why": "nothing", "set": {}}
    with pytest.raises(ConfigError, match=r"alternatives\.empty\.set"):
        parse_profile(raw)
