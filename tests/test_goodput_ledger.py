"""The goodput ledger's parts that need no device: the clock, the accounts across attempts, the record, the command.

The clock runs on a fake ``time.monotonic`` and a fake compile reader, so every figure is exact.
"""

from __future__ import annotations

import json
import os

import pytest

from trainer_plugins import _cli
from trainer_plugins._goodput_clock import BucketClock, process_start
from trainer_plugins._goodput_ledger import BUCKETS, Attempt, LedgerFormatError, RunLedger, goodput_table_lines, resumed
from trainer_plugins._goodput_record import (
    STAMP,
    NoLedgerError,
    StampWriter,
    read_ledger,
    read_stamp,
    record_folder,
    write_record,
)


class FakeTime:
    def __init__(self) -> None:
        self.now, self.compiled = 100.0, 0.0

    def advance(self, seconds: float, compiling: float = 0.0) -> None:
        self.now += seconds
        self.compiled += compiling


@pytest.fixture
def fake(monkeypatch) -> FakeTime:
    fake = FakeTime()
    monkeypatch.setattr("trainer_plugins._goodput_clock.time.monotonic", lambda: fake.now)
    return fake


def new_clock(fake: FakeTime, started: float = 100.0) -> BucketClock:
    return BucketClock(dict.fromkeys(BUCKETS, 0.0), lambda: fake.compiled, started)


def test_the_clock_charges_each_second_to_one_bucket_and_compile_seconds_to_compilation(fake):
    clock = new_clock(fake, started=90.0)  # the process started 10 s before the clock was made
    fake.advance(2, compiling=1)
    clock.set_base("productive")  # 12 s of start-up, 1 of it compiling
    fake.advance(3, compiling=0.5)
    assert clock.begin("data", "fetch")
    fake.advance(1)
    assert clock.end("fetch")
    assert clock.begin("validation", "val")
    fake.advance(1)
    assert not clock.begin("data", "val-fetch")  # a batch fetched in validation stays validation
    fake.advance(1)
    assert not clock.end("val-fetch")
    assert clock.begin("checkpoint_save", "save")  # a save in validation is checkpoint time
    fake.advance(4, compiling=5)  # more compile seconds than the interval lasted: capped at 4
    assert clock.end("save")
    fake.advance(1)
    assert clock.end("val")
    clock.charge()
    assert clock.seconds == {
        **dict.fromkeys(BUCKETS, 0.0),
        "startup": 11.0,
        "compilation": 5.5,
        "productive": 2.5,
        "data": 1.0,
        "validation": 3.0,
    }
    assert sum(clock.seconds.values()) == fake.now - 90.0


def test_an_interrupted_loop_leaves_its_intervals_and_the_rest_is_teardown(fake):
    clock = new_clock(fake)
    clock.set_base("productive")
    clock.begin("validation", "val")
    fake.advance(2)
    clock.reset("teardown")
    fake.advance(3)
    assert not clock.end("val")  # its end never comes: nothing changes
    clock.charge()
    assert (clock.seconds["validation"], clock.seconds["teardown"], clock.current) == (2.0, 3.0, "teardown")


def test_rebinding_the_clock_carries_what_was_charged(fake):
    clock = new_clock(fake)
    fake.advance(2)
    seconds = dict.fromkeys(BUCKETS, 0.0)
    clock.rebind(seconds)
    fake.advance(1)
    clock.charge()
    assert clock.seconds is seconds and seconds["startup"] == 3.0


def test_the_process_start_is_before_now():
    import time

    started = process_start()
    assert started is not None and started <= time.monotonic()
    assert process_start(2**22 + 12345) is None  # no such process


def attempt(number: int, first: int, last: int, productive: float, **seconds: float) -> Attempt:
    account = dict.fromkeys(BUCKETS, 0.0) | {"productive": productive} | seconds
    return Attempt(number, first_step=first, last_step=last, seconds=account)


def test_a_resume_moves_the_steps_after_its_checkpoint_to_lost_and_adds_up():
    # attempt 1 saved at step 6 (productive 6.0 then), reached step 9 (productive 9.5) and was killed
    snapshot = RunLedger("r", [attempt(1, 0, 6, 6.0, startup=2.0)])
    record = RunLedger("r", [attempt(1, 0, 9, 9.5, startup=2.0)])
    ledger = resumed(snapshot, record, 6, "/ckpt")
    first, second = ledger.attempts
    assert (first.lost_steps, first.lost_s) == (3, 3.5)
    assert (second.number, second.first_step, second.resumed_from) == (2, 6, "/ckpt")
    second.last_step, second.seconds["productive"], second.seconds["startup"] = 16, 10.0, 1.0
    totals = ledger.totals()
    assert (ledger.steps, ledger.lost_steps) == (16, 3)  # 6 + 10: every step once
    assert (totals["productive"], totals["lost"], totals["wall"]) == (16.0, 3.5, 22.5)
    assert sum(v for k, v in totals.items() if k != "wall") == totals["wall"]
    # attempt 2 is killed at step 12 without a checkpoint; attempt 3 resumes from attempt 1's step 6 again
    record = RunLedger.from_dict(json.loads(json.dumps(ledger.as_dict())))
    record.attempts[1].last_step, record.attempts[1].seconds["productive"] = 12, 6.0
    third = resumed(snapshot, record, 6, "/ckpt")
    assert [(a.lost_steps, a.lost_s) for a in third.attempts] == [(3, 3.5), (6, 6.0), (0, 0.0)]


def test_a_resume_without_a_record_of_the_run_takes_the_checkpoints_ledger():
    snapshot = RunLedger("r", [attempt(1, 0, 6, 6.0)])
    other = RunLedger("another run", [attempt(1, 0, 50, 50.0)])
    for record in (None, other):
        ledger = resumed(snapshot, record, 6, None)
        assert ledger.run == "r" and [a.number for a in ledger.attempts] == [1, 2]
        assert ledger.lost_steps == 0


def test_the_ledger_round_trips_and_a_bad_one_is_named():
    ledger = RunLedger("r", [attempt(1, 0, 4, 1.5, startup=3.0)])
    ledger.current.ended = "finished"
    assert RunLedger.from_dict(json.loads(json.dumps(ledger.as_dict()))) == ledger
    with pytest.raises(LedgerFormatError, match="not a goodput ledger of format 1"):
        RunLedger.from_dict({"format": 99})
    broken = ledger.as_dict()
    del broken["attempts"][0]["seconds"]["data"]
    with pytest.raises(LedgerFormatError, match="buckets"):
        RunLedger.from_dict(broken)


def test_the_table_has_one_line_a_bucket_with_its_share():
    ledger = RunLedger("r", [attempt(1, 0, 8, 6.0, startup=3.0, compilation=1.0)])
    ledger.current.ended, ledger.current.lost_steps, ledger.current.lost_s = "interrupted (SIGTERMException)", 1, 1.0
    lines = goodput_table_lines(ledger)
    assert lines[0] == "Goodput 50.0% over 10.0 s wall time: 7 productive steps, 1 attempt (1 interrupted)"
    assert lines[1].split() == ["start-up", "3.0", "s", "30.0%"]
    assert lines[4].split() == ["productive", "steps", "5.0", "s", "50.0%"]
    assert lines[-1].split() == ["lost", "(steps", "redone)", "1.0", "s", "10.0%", "(1", "step)"]
    assert len(lines) == len(BUCKETS) + 2


def test_the_record_is_replaced_whole_and_a_failed_write_leaves_the_previous_one(tmp_path, monkeypatch):
    folder = record_folder(str(tmp_path))
    first = RunLedger("r", [attempt(1, 0, 4, 1.0)])
    write_record(folder, first)
    assert os.listdir(folder) == ["ledger.json"]

    def interrupted(*args, **kwargs):
        args[1].write('{"format": 1, "run": "half')  # what a write cut short leaves
        raise OSError("disk full")

    monkeypatch.setattr("trainer_plugins._goodput_record.json.dump", interrupted)
    with pytest.raises(OSError, match="disk full"):
        write_record(folder, RunLedger("r", [attempt(1, 0, 8, 2.0)]))
    assert os.listdir(folder) == ["ledger.json"]  # no temporary file left
    assert read_ledger(str(tmp_path)) == first


def test_a_torn_stamp_slot_is_rejected_and_the_slot_before_is_read(tmp_path):
    folder = record_folder(str(tmp_path))
    writer = StampWriter(folder)
    run = "ab" * 16
    for step in (1, 2, 3):
        writer.write(run, 2, step, dict.fromkeys(BUCKETS, float(step)))
    writer.close()
    assert read_stamp(folder) == (run, 2, 3, dict.fromkeys(BUCKETS, 3.0))
    path = os.path.join(folder, STAMP)
    data = bytearray(open(path, "rb").read())
    newest = 128 * (3 % 2)
    data[newest + 40] ^= 0xFF  # a byte of step 3's slot torn
    open(path, "wb").write(bytes(data))
    assert read_stamp(folder) == (run, 2, 2, dict.fromkeys(BUCKETS, 2.0))
    data[128 * (2 % 2) + 8] ^= 0xFF  # and step 2's
    open(path, "wb").write(bytes(data))
    assert read_stamp(folder) is None


def test_the_record_takes_in_a_newer_stamp_of_its_last_attempt_only(tmp_path):
    folder = record_folder(str(tmp_path))
    run = "cd" * 16
    write_record(folder, RunLedger(run, [attempt(1, 0, 4, 1.0)]))
    writer = StampWriter(folder)
    writer.write(run, 1, 7, dict.fromkeys(BUCKETS, 0.5))  # 4 s in all, more than the record's 1 s
    assert read_ledger(str(tmp_path)).current.last_step == 7
    writer.write(run, 2, 9, dict.fromkeys(BUCKETS, 0.5))  # another attempt's stamp: not this record's
    assert read_ledger(str(tmp_path)).current.last_step == 4
    writer.write("ef" * 16, 1, 9, dict.fromkeys(BUCKETS, 0.5))  # another run's
    assert read_ledger(str(tmp_path)).current.last_step == 4
    writer.close()


def test_the_command_says_clearly_when_a_directory_has_no_ledger(tmp_path, capsys):
    assert _cli.main(["goodput", str(tmp_path)]) == 1
    error = capsys.readouterr().err
    assert error.startswith(f"trainer-plugins: error: no goodput ledger in {tmp_path}: ")
    assert str(tmp_path / "goodput" / "ledger.json") in error
    (tmp_path / "goodput").mkdir()
    (tmp_path / "goodput" / "ledger.json").write_text("{not json")
    assert _cli.main(["goodput", "--json", str(tmp_path)]) == 1
    assert "cannot be read as a goodput ledger" in capsys.readouterr().err
    with pytest.raises(NoLedgerError):
        read_ledger(str(tmp_path / "elsewhere"))
