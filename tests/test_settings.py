"""The H3FLOW_* settings: one model, documented in one table, read at use, bad values are one line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from h3flow.config.settings import Settings, settings
from h3flow.core.errors import ConfigError

DOC = Path(__file__).resolve().parents[1] / "docs" / "settings.md"


def test_every_setting_is_in_the_table_and_nothing_else() -> None:
    documented = set(re.findall(r"^\| `(H3FLOW_[A-Z_]+)` \|", DOC.read_text(), flags=re.M))
    assert documented == {f"H3FLOW_{name.upper()}" for name in Settings.model_fields}


def test_settings_are_read_when_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3FLOW_SILENCE_S", "45")
    assert settings().silence_s == 45.0
    monkeypatch.delenv("H3FLOW_SILENCE_S")
    assert settings().silence_s == 75.0


def test_a_bad_value_is_one_line_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3FLOW_DECODER_GONE_S", "soon")
    with pytest.raises(ConfigError) as caught:
        settings()
    assert "decoder_gone_s" in str(caught.value) and "\n" not in str(caught.value)
