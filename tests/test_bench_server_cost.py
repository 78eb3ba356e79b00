"""bench/server_cost.py's arithmetic (no model): the steady window and the probe's sums."""

from __future__ import annotations

import pytest

from bench.server_cost import Arrivals, Probe


def test_the_window_runs_from_the_last_first_token_to_the_first_last_one() -> None:
    arrivals = Arrivals(
        [
            [(1.0, 1), (1.01, 1), (1.02, 1), (1.03, 1), (1.04, 1)],
            [(1.015, 1), (1.025, 1), (1.035, 1)],  # starts late, ends early
        ]
    )
    assert arrivals.span() == (1.015, 1.035)
    # inside (1.015, 1.035]: 1.02 and 1.03 of the first, 1.025 and 1.035 of the second
    assert arrivals.per_row_ms() == pytest.approx(20 / 4)


def test_the_probe_sums_only_the_steps_and_hand_offs_inside_the_window() -> None:
    probe = Probe()
    # (end, step s, decode s, sample s, rows)
    probe.steps = [(0.5, 0.2, 0.15, 0.01, 8), (1.0, 0.010, 0.008, 0.001, 2),
                   (1.1, 0.010, 0.007, 0.001, 2), (9.0, 1.0, 1.0, 0.0, 1)]  # fmt: skip
    probe.delivers = [(1.0, 0.0004), (1.1, 0.0002), (9.0, 5.0)]
    got = probe.window(0.9, 1.1)
    assert got["step_ms"] == pytest.approx(20 / 4)
    assert got["decode_ms"] == pytest.approx(15 / 4)
    assert got["sample_ms"] == pytest.approx(2 / 4)
    assert got["outside_ms"] == pytest.approx(3 / 4, abs=1e-3)
    assert got["handoff_ms"] == pytest.approx(0.6 / 4)


def test_a_wrapped_method_is_timed_into_its_step() -> None:
    class Engine:
        def step(self) -> None:
            self.decode()
            self.sample()
            self.sample()

        def decode(self) -> int:
            return 0

        def sample(self) -> int:
            return 1

    probe = Probe()
    probe.wrap(Engine, "step", "step")
    probe.wrap(Engine, "decode", "decode_s")
    probe.wrap(Engine, "sample", "sample_s")
    Engine().step()
    Engine().step()
    assert [s[4] for s in probe.steps] == [2, 2]  # two sampled rows a step
    assert all(s[1] >= s[2] + s[3] for s in probe.steps)  # a step holds its parts
    assert probe.decode_s == probe.sample_s == 0.0  # reset at each step's end
