"""The core's readers of environment variables into checked values (trainer_plugins._variables)."""

from __future__ import annotations

import pytest

from trainer_plugins._variables import process_count_from_environment


def test_a_process_count_is_an_integer_of_at_least_one_and_the_default_only_when_unset(monkeypatch):
    monkeypatch.delenv("TEST_PROCESSES", raising=False)
    assert process_count_from_environment("TEST_PROCESSES", 4) == 4
    for text, count in (("3", 3), (" 2 ", 2), ("1", 1)):
        monkeypatch.setenv("TEST_PROCESSES", text)
        assert process_count_from_environment("TEST_PROCESSES", 4) == count
    for text in ("0", "two", "", "-1", "1.5"):
        monkeypatch.setenv("TEST_PROCESSES", text)
        with pytest.raises(
            ValueError, match=f"TEST_PROCESSES={text!r} is not a process count: valid are integers >= 1"
        ):
            process_count_from_environment("TEST_PROCESSES", 4)
