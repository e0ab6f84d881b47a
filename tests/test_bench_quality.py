"""``ddctl bench quality`` over several seeds: rows are means with their spread, targets judge the means."""

from __future__ import annotations

from typing import Any

import pytest

from ddctl.bench import quality


def fake_run(name: str, tokens: int, preset: str | None = None, seed: int = 0) -> dict[str, Any]:
    base = {"dp_m4": 3.0, "decoupled_m4": 3.3}[name]
    return {"val_bpb": base + 0.1 * seed, "bytes_per_token": 100.0 if name == "decoupled_m4" else 12_000.0, "preset": preset}


def test_seeds_average_into_one_row_with_each_value_and_the_spread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quality, "run_one", fake_run)
    result = quality.run_quality(1000, ["dp_m4", "decoupled_m4"], preset="micro", seeds=[0, 1, 2])
    row = result["runs"]["decoupled_m4"]
    assert row["val_bpb"] == pytest.approx(3.4) and row["val_bpb_stdev"] == pytest.approx(0.1)
    assert row["val_bpb_by_seed"] == pytest.approx({"0": 3.3, "1": 3.4, "2": 3.5})
    assert row["preset"] == "micro" and result["seeds"] == [0, 1, 2]
    assert result["targets"]["m4_val_bpb_over_dp"] == pytest.approx(3.4 / 3.1)
    assert result["targets"]["dp_bytes_per_token_over_m4"] == pytest.approx(120.0)


def test_one_seed_keeps_the_row_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quality, "run_one", fake_run)
    row = quality.run_quality(1000, ["dp_m4"])["runs"]["dp_m4"]
    assert row["val_bpb"] == 3.0 and "val_bpb_stdev" not in row and "val_bpb_by_seed" not in row


def test_a_run_its_preset_cannot_make_is_reported_and_the_others_still_run(monkeypatch: pytest.MonkeyPatch) -> None:
    def layer_on_micro(name: str, tokens: int, preset: str | None = None, seed: int = 0) -> dict[str, Any]:
        if name == "dp_m4":
            raise quality.ConfigError("layer fragmentation needs fragments <= 4 (layer groups), got 6")
        return fake_run(name, tokens, preset, seed)

    monkeypatch.setattr(quality, "run_one", layer_on_micro)
    result = quality.run_quality(1000, ["dp_m4", "decoupled_m4"], seeds=[0, 1])
    assert set(result["runs"]) == {"decoupled_m4"} and result["runs"]["decoupled_m4"]["val_bpb"] == pytest.approx(3.35)
    assert result["failed"] == {
        "dp_m4@0": "ConfigError: layer fragmentation needs fragments <= 4 (layer groups), got 6",
        "dp_m4@1": "ConfigError: layer fragmentation needs fragments <= 4 (layer groups), got 6",
    }


def test_the_h_arms_change_only_the_period_and_the_fragments_that_fill_it() -> None:
    base, h12, h48 = (quality.RUNS[name](1_000_000) for name in ("decoupled_m4", "h12", "h48"))
    assert (base.sync.inner_steps, base.sync.fragments) == (24, 24)
    assert (h12.sync.inner_steps, h12.sync.fragments, h12.syncer.inner_steps) == (12, 12, 12)
    assert (h48.sync.inner_steps, h48.sync.fragments, h48.syncer.inner_steps) == (48, 24, 48)
    assert h12.syncer.outer == base.syncer.outer and h48.inner == base.inner and h48.budget == base.budget
