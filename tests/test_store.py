"""attnbook.store, the results store of the experiment command lines, on a toy layout: rows written whole and
fsynced, damaged tails set aside, headers checked and upgraded, the lock, the configuration guard, sessions of
provenance (atomic, interrupted runs exit non-zero), merge, and the shared argument types.

The helpers at the end (``kill_after_rows``, ``cut_last_line``, ...) serve the experiment tests
(``tests/test_experiments_*.py``), which kill real command lines mid-way."""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from attnbook import provenance, store
from attnbook.store import Layout, ResultsStore, Session, StoreError, StoreLocked, merge

LAYOUT = Layout("toy", keys=("name", "seed"), columns=("name", "seed", "value", "late", "device"),
                added_columns=("late",), tables={"history": ("epoch", "loss", "name", "seed")},
                not_configuration=("threads", "seeds"))
CONFIG = {"size": 3, "lr": 0.001, "threads": 1, "seeds": [0, 1]}
CODE = str(Path(__file__).resolve().parents[1] / "code")


def row(name, seed=0, value=0.5):
    return {"name": name, "seed": seed, "value": value, "late": value * 2, "device": "CPU (1 threads, x86_64)"}


def history(name, seed=0, epochs=2):
    return [{"epoch": e, "loss": 1.0 / e, "name": name, "seed": seed} for e in range(1, epochs + 1)]


def fill(out, names, config=CONFIG):
    """A store with one run per name (seed 0), each with two history rows, and its sidecar (one session)."""
    with ResultsStore(out, LAYOUT, config) as s, Session(s, lambda wall: {"device": "cpu"}, cli=False):
        for name in names:
            s.append(row(name), {"history": history(name)})


def keys(out):
    return sorted(map(tuple, pd.read_csv(out)[["name", "seed"]].astype(str).values.tolist()))


# ------------------------------------------------------------------------------------------------- writing, resuming
def test_append_resume_and_frames(tmp_path):
    out = tmp_path / "r.csv"
    fill(out, ["a", "b"])
    with ResultsStore(out, LAYOUT, CONFIG) as s:
        assert s.n_runs == 2 and s.has({"name": "a", "seed": 0}) and not s.has({"name": "a", "seed": 1})
        assert s.done == {("a", "0"), ("b", "0")}
        s.append(row("a", seed=1), {"history": history("a", seed=1)})
        with pytest.raises(StoreError, match=r"the run \{'name': 'a', 'seed': '0'\} is stored already"):
            s.append(row("a"))
        pd.testing.assert_frame_equal(s.frame(), pd.read_csv(out))
        assert len(s.frame("history")) == 6
    stored = pd.read_csv(out)
    assert list(stored.columns) == list(LAYOUT.columns) and len(stored) == 3
    assert stored.value.tolist() == [0.5, 0.5, 0.5] and stored.device.iloc[0] == "CPU (1 threads, x86_64)"
    assert keys(out) == [("a", "0"), ("a", "1"), ("b", "0")]


def test_each_table_gets_one_write_then_fsync(tmp_path, monkeypatch):
    out = tmp_path / "r.csv"
    fill(out, ["a"])
    calls = []
    real_write, real_fsync = os.write, os.fsync
    monkeypatch.setattr(store.os, "write",
                        lambda fd, data: calls.append(("write", bytes(data))) or real_write(fd, data))
    monkeypatch.setattr(store.os, "fsync", lambda fd: calls.append(("fsync",)) or real_fsync(fd))
    with ResultsStore(out, LAYOUT, CONFIG) as s:
        calls.clear()
        s.append(row("b"), {"history": history("b")})
    writes = [c for c in calls if c[0] == "write"]
    assert [c[0] for c in calls[:4]] == ["write", "fsync", "write", "fsync"]     # side table first, then the row
    assert writes[0][1] == b"1,1.0,b,0\n2,0.5,b,0\n"                               # both history rows, one write
    assert writes[1][1] == b'b,0,0.5,1.0,"CPU (1 threads, x86_64)"\n'           # the whole row, one write


def test_bad_rows_are_refused_before_anything_is_written(tmp_path):
    out = tmp_path / "r.csv"
    with ResultsStore(out, LAYOUT, CONFIG) as s:
        with pytest.raises(StoreError, match=r"a run gave the columns \['accuracy'\], which its header lacks"):
            s.append({**row("a"), "accuracy": 1.0})
        with pytest.raises(StoreError, match="a value holds a line break"):
            s.append(row("a") | {"device": "two\nlines"})
        with pytest.raises(StoreError, match=r"a row carries the key \['b', '0'\], not its run's \['a', '0'\]"):
            s.append(row("a"), {"history": history("b")})
        with pytest.raises(StoreError, match=r"no side table 'curves'"):
            s.append(row("a"), {"curves": []})
    assert not out.exists() and not LAYOUT.table_path(out, "history").exists()


def test_a_store_needs_a_csv_name(tmp_path):
    with pytest.raises(StoreError, match=r"--out must name a \.csv file .* got '.*r\.json'"):
        ResultsStore(tmp_path / "r.json", LAYOUT, CONFIG)
    assert store.sidecar_path(tmp_path / "r.csv") == tmp_path / "r.json"
    assert store.lock_path(tmp_path / "r.csv") == tmp_path / "r.csv.lock"


def test_layout_errors():
    with pytest.raises(ValueError, match=r"Layout table 'h' lack the key columns \['seed'\]"):
        Layout("x", keys=("name", "seed"), columns=("name", "seed"), tables={"h": ("name",)})
    with pytest.raises(ValueError, match=r"added_columns \['z'\] are not columns"):
        Layout("x", keys=("name",), columns=("name",), added_columns=("z",))
    with pytest.raises(ValueError, match="name a column twice"):
        Layout("x", keys=("name",), columns=("name", "name"))
    assert Layout.from_json(LAYOUT.to_json()) == LAYOUT


# ------------------------------------------------------------------------------------------------- damaged tails
DAMAGES = {
    "half row": b"c,0,0.5,1.",                                                      # no newline: a cut write
    "half row, then a row on the same line": b'c,0,0.5,1.d,0,0.5,1.0,"CPU"\n',     # what the old code then did
    "too few fields": b"c,0,0.5\n",
    "unclosed quote": b'c,0,0.5,1.0,"CPU (1 thr\n',
    "not UTF-8": b"c,0,0.5,1.0,\xff\xfe\n",
    "blank line": b"\n",
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_tail_is_set_aside_and_its_run_redone(tmp_path, capsys, damage):
    out = tmp_path / "r.csv"
    fill(out, ["a", "b"])
    good = out.read_bytes()
    with open(out, "ab") as f:
        f.write(DAMAGES[damage])
    with ResultsStore(out, LAYOUT, CONFIG) as s:
        assert s.done == {("a", "0"), ("b", "0")}
        s.append(row("c"), {"history": history("c")})
    err = capsys.readouterr().err
    assert "set aside a damaged last line" in err and "its run will run again" in err and err.count("\n") == 1
    (aside,) = tmp_path.glob("r.csv.damaged-*")
    assert aside.read_bytes() == DAMAGES[damage]
    assert out.read_bytes().startswith(good) and keys(out) == [("a", "0"), ("b", "0"), ("c", "0")]


def test_a_cut_header_is_set_aside(tmp_path, capsys):
    out = tmp_path / "r.csv"
    out.write_bytes(b"name,se")
    (tmp_path / "r.json").write_text(json.dumps({"config": CONFIG}))
    with ResultsStore(out, LAYOUT, CONFIG) as s:
        assert s.n_runs == 0
        s.append(row("a"))
    assert "set aside" in capsys.readouterr().err and keys(out) == [("a", "0")]


def test_a_damaged_side_table_tail_is_set_aside_too(tmp_path):
    out = tmp_path / "r.csv"
    fill(out, ["a"])
    side = LAYOUT.table_path(out, "history")
    with open(side, "ab") as f:
        f.write(b"1,0.3,b")
    with ResultsStore(out, LAYOUT, CONFIG) as s:
        s.append(row("b"), {"history": history("b")})
    assert len(list(tmp_path.glob("r_history.csv.damaged-*"))) == 1
    assert pd.read_csv(side).groupby("name").size().to_dict() == {"a": 2, "b": 2}


def test_a_damaged_line_inside_the_file_is_refused(tmp_path):
    out = tmp_path / "r.csv"
    fill(out, ["a"])
    good = out.read_text()
    text = good.splitlines(keepends=True)
    out.write_text(text[0] + "x,0\n" + "".join(text[1:]))
    with pytest.raises(StoreError, match=r"r\.csv, line 2: damaged .* more lines after it: not a cut write"):
        ResultsStore(out, LAYOUT, CONFIG).open()
    out.write_text(good)
    ResultsStore(out, LAYOUT, CONFIG).open().close()   # the failed open left the lock free
    with pytest.raises(StoreError, match=r"first line is not a CSV header"):
        out.write_text('"name\nx\n')
        ResultsStore(out, LAYOUT, CONFIG).open()


def test_rows_of_runs_that_did_not_finish_are_dropped_from_side_tables(tmp_path, capsys):
    """Killed between a run's side rows and its row: the side rows go, the run runs again, none is doubled."""
    out = tmp_path / "r.csv"
    fill(out, ["a"])
    side = LAYOUT.table_path(out, "history")
    pd.DataFrame(history("b")).to_csv(side, mode="a", header=False, index=False)
    with ResultsStore(out, LAYOUT, CONFIG) as s:
        assert len(s.frame("history")) == 2
        s.append(row("b"), {"history": history("b")})
    assert "dropped 2 rows of runs that did not finish" in capsys.readouterr().err
    assert pd.read_csv(side).groupby("name").size().to_dict() == {"a": 2, "b": 2}


# ------------------------------------------------------------------------------------------------- header
def test_a_header_that_does_not_match_is_refused(tmp_path):
    out = tmp_path / "r.csv"
    pd.DataFrame({"name": ["a"], "seed": [0], "accuracy": [0.5]}).to_csv(out, index=False)
    with pytest.raises(StoreError, match=r"header that does not match .* missing \['value', 'late', 'device'\], "
                                         r"unknown \['accuracy'\]; write to another --out"):
        ResultsStore(out, LAYOUT, CONFIG).open()


def test_a_header_in_another_order_is_kept(tmp_path):
    """Columns are matched by name: a file written in another order keeps its order, and new rows follow it."""
    out = tmp_path / "r.csv"
    fill(out, ["a"])
    frame = pd.read_csv(out)
    frame[list(reversed(frame.columns))].to_csv(out, index=False)
    with ResultsStore(out, LAYOUT, CONFIG) as s:
        s.append(row("b", value=0.25))
    stored = pd.read_csv(out)
    assert list(stored.columns) == list(reversed(LAYOUT.columns)) and stored.value.tolist() == [0.5, 0.25]


def test_a_file_without_an_added_column_is_upgraded_value_for_value(tmp_path, capsys):
    out = tmp_path / "r.csv"
    fill(out, ["a", "b"])
    old = pd.read_csv(out, dtype=str, keep_default_na=False).drop(columns=["late"])
    old.to_csv(out, index=False)
    with ResultsStore(out, LAYOUT, CONFIG) as s:
        s.append(row("c"))
    assert "added the columns ['late'] (empty for its 2 stored runs)" in capsys.readouterr().err
    new = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert list(new.columns) == list(LAYOUT.columns)
    assert new.late.tolist() == ["", "", "1.0"]
    pd.testing.assert_frame_equal(new.drop(columns=["late"]).iloc[:2], old)          # every stored value, as text


# ------------------------------------------------------------------------------------------------- lock
def test_a_second_writer_is_refused(tmp_path):
    out = tmp_path / "r.csv"
    first = ResultsStore(out, LAYOUT, CONFIG).open()
    with pytest.raises(StoreLocked, match=r"another process is writing to .*r\.csv \(it holds r\.csv\.lock\); "
                                          "wait until it ends, or write to another --out"):
        ResultsStore(out, LAYOUT, CONFIG).open()
    first.close()
    ResultsStore(out, LAYOUT, CONFIG).open().close()


def test_a_second_process_is_refused(tmp_path):
    """The lock holds across processes: a child process holds it while this one tries."""
    out = tmp_path / "r.csv"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time, filelock; lock = filelock.FileLock(sys.argv[1]); "
                               "lock.acquire(); print('held', flush=True); time.sleep(60)", str(out) + ".lock"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(StoreLocked, match="another process is writing"):
            ResultsStore(out, LAYOUT, CONFIG).open()
    finally:
        holder.kill()
        holder.wait()
    ResultsStore(out, LAYOUT, CONFIG).open().close()


# ------------------------------------------------------------------------------------------------- configuration
def test_another_configuration_is_refused_and_other_settings_are_not(tmp_path):
    out = tmp_path / "r.csv"
    fill(out, ["a"])
    with pytest.raises(StoreError, match=r"holds runs made with another configuration \(differs in \['lr', 'size'\]\)"):
        ResultsStore(out, LAYOUT, {**CONFIG, "size": 4, "lr": 0.01}).open()
    with pytest.raises(StoreError, match=r"differs in \['new'\]"):
        ResultsStore(out, LAYOUT, {**CONFIG, "new": 1}).open()
    ResultsStore(out, LAYOUT, {**CONFIG, "threads": 8, "seeds": [0, 1, 2, 3]}).open().close()


def test_a_setting_added_later_counts_as_its_legacy_value(tmp_path):
    """A record written before a setting existed resumes with the setting at its legacy value, and only then."""
    from dataclasses import replace

    out = tmp_path / "r.csv"
    fill(out, ["a"])                                     # CONFIG has no "tokenizer"
    later = replace(LAYOUT, legacy_config={"tokenizer": "v1"})
    with ResultsStore(out, later, {**CONFIG, "tokenizer": "v1"}) as s:
        assert s.n_runs == 1
    with pytest.raises(StoreError, match=r"differs in \['tokenizer'\]"):
        ResultsStore(out, later, {**CONFIG, "tokenizer": "v2"}).open()
    with pytest.raises(StoreError, match=r"differs in \['tokenizer'\]"):
        ResultsStore(out, LAYOUT, {**CONFIG, "tokenizer": "v1"}).open()   # no legacy value declared
    assert Layout.from_json(later.to_json()) == later


def test_runs_without_their_record_are_refused(tmp_path):
    out = tmp_path / "r.csv"
    fill(out, ["a"])
    record = json.loads((tmp_path / "r.json").read_text())
    (tmp_path / "r.json").unlink()
    with pytest.raises(StoreError, match=r"holds 1 finished runs but their provenance record r\.json is missing, so "
                                         r"the configuration that made them cannot be checked; restore it"):
        ResultsStore(out, LAYOUT, CONFIG).open()
    (tmp_path / "r.json").write_text(json.dumps({k: v for k, v in record.items() if k != "config"}))
    with pytest.raises(StoreError, match=r"r\.json records no configuration"):
        ResultsStore(out, LAYOUT, CONFIG).open()
    (tmp_path / "r.json").write_text("{")
    with pytest.raises(StoreError, match=r"r\.json is not valid JSON"):
        ResultsStore(out, LAYOUT, CONFIG).open()
    (tmp_path / "r.json").unlink()
    out.write_text(",".join(LAYOUT.columns) + "\n")     # a header alone: nothing to check, nothing refused
    ResultsStore(out, LAYOUT, CONFIG).open().close()


def test_config_differences():
    assert store.config_differences({"a": (1, 2), "b": 1}, {"a": [1, 2], "b": 1}) == []
    assert store.config_differences({"a": 1, "t": 1}, {"a": 2, "t": 2, "u": None}, ignore=["t"]) == ["a", "u"]


# ------------------------------------------------------------------------------------------------- sessions
def _session(s, **kwargs):
    return Session(s, lambda wall: {"device": "cpu", "date_utc": "2026-01-01T00:00:00+00:00", "wall": wall}, **kwargs)


def test_sessions_are_recorded_one_per_invocation(tmp_path):
    out = tmp_path / "r.csv"
    meta = tmp_path / "r.json"
    seen = []
    with ResultsStore(out, LAYOUT, CONFIG) as s, _session(s, cli=False, workers=2) as session:
        seen.append(json.loads(meta.read_text()))                     # written before the first run
        s.append(row("a"))
        session.checkpoint()
        seen.append(json.loads(meta.read_text()))
    assert [m["sessions"][-1]["status"] for m in seen] == ["running", "running"]
    assert [m["n_runs"] for m in seen] == [0, 1] and seen[0]["config"] == CONFIG
    assert seen[0]["store"] == LAYOUT.to_json()
    with ResultsStore(out, LAYOUT, CONFIG) as s, _session(s, cli=False):
        pass
    record = json.loads(meta.read_text())
    first, second = record["sessions"]
    assert first["status"] == "finished" and first["interrupted"] is False and first["workers"] == 2
    assert first["runs_added"] == 1 and second["runs_added"] == 0
    assert record["total_wall_time_s"] == pytest.approx(first["wall_time_s"] + second["wall_time_s"], abs=0.02)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_session_left_running_by_a_killed_process_is_recorded_as_killed(tmp_path):
    out, meta = tmp_path / "r.csv", tmp_path / "r.json"
    with ResultsStore(out, LAYOUT, CONFIG) as s, _session(s, cli=False):
        s.append(row("a"))
    record = json.loads(meta.read_text())
    record["sessions"].append(dict(record["sessions"][0], status="running", interrupted=True))  # as a SIGKILL leaves
    meta.write_text(json.dumps(record))
    with ResultsStore(out, LAYOUT, CONFIG) as s, _session(s, cli=False):
        pass
    statuses = [x["status"] for x in json.loads(meta.read_text())["sessions"]]
    assert statuses == ["finished", "killed", "finished"]


def test_an_interrupted_command_line_exits_130_or_143_after_recording_it(tmp_path):
    out = tmp_path / "r.csv"
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as exit_info:
        with ResultsStore(out, LAYOUT, CONFIG) as s, _session(s):
            s.append(row("a"))
            raise KeyboardInterrupt
    assert exit_info.value.code == 130
    with pytest.raises(SystemExit) as exit_info:
        with ResultsStore(out, LAYOUT, CONFIG) as s, _session(s):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)                              # the handler interrupts this
    assert exit_info.value.code == 143
    assert signal.getsignal(signal.SIGTERM) is handler              # restored
    record = json.loads((tmp_path / "r.json").read_text())
    assert [s["status"] for s in record["sessions"]] == ["interrupted", "interrupted"]
    assert record["n_runs"] == 1 and record["sessions"][0]["runs_added"] == 1
    ResultsStore(out, LAYOUT, CONFIG).open().close()               # the lock was given back


def test_from_python_an_interruption_stays_a_keyboard_interrupt_and_a_failure_is_recorded(tmp_path):
    out = tmp_path / "r.csv"
    with pytest.raises(KeyboardInterrupt):
        with ResultsStore(out, LAYOUT, CONFIG) as s, _session(s, cli=False):
            raise KeyboardInterrupt
    with pytest.raises(RuntimeError, match="out of memory"):
        with ResultsStore(out, LAYOUT, CONFIG) as s, _session(s, cli=False):
            raise RuntimeError("out of memory")
    sessions = json.loads((tmp_path / "r.json").read_text())["sessions"]
    assert [s["status"] for s in sessions] == ["interrupted", "failed"]
    assert sessions[1]["error"] == "RuntimeError: out of memory"


def test_a_record_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """A failure while the record is written (here: the rename) leaves the previous record and no temporary file."""
    out = tmp_path / "r.csv"
    fill(out, ["a"])
    before = (tmp_path / "r.json").read_text()

    def broken(*args):
        raise OSError("disk full")

    monkeypatch.setattr(provenance.os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        with ResultsStore(out, LAYOUT, CONFIG) as s, _session(s, cli=False):
            pass
    assert (tmp_path / "r.json").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.csv", "r.csv.lock", "r.json", "r_history.csv"]


def test_write_provenance_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "p.json"
    provenance.write_provenance(path, {"a": 1})
    renames = []
    real_replace = os.replace
    monkeypatch.setattr(provenance.os, "replace", lambda a, b: renames.append((Path(a), Path(b))) or real_replace(a, b))
    provenance.write_provenance(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    ((temporary, target),) = renames
    assert target == path and temporary.parent == path.parent and not temporary.exists()

    def broken(*args):
        raise OSError("disk full")

    monkeypatch.setattr(provenance.os, "fsync", broken)
    with pytest.raises(OSError, match="disk full"):
        provenance.write_provenance(path, {"a": 3})
    assert json.loads(path.read_text()) == {"a": 2} and [p.name for p in tmp_path.iterdir()] == ["p.json"]


# ------------------------------------------------------------------------------------------------- merge
def test_merge_adds_new_runs_skips_stored_ones_and_keeps_provenance(tmp_path, capsys):
    src, dst = tmp_path / "gpu.csv", tmp_path / "main.csv"
    fill(src, ["a", "b", "c"], config={**CONFIG, "threads": 4})
    fill(dst, ["b", "d"])
    report = store.main(["merge", str(src), str(dst)])
    assert report == {"added": 2, "skipped": 1, "sessions": 1}
    printed = capsys.readouterr().out
    assert "merged 2 runs from" in printed and "skipped 1 already there" in printed
    assert keys(dst) == [("a", "0"), ("b", "0"), ("c", "0"), ("d", "0")]
    side = pd.read_csv(LAYOUT.table_path(dst, "history"))
    assert side.groupby("name").size().to_dict() == {"a": 2, "b": 2, "c": 2, "d": 2}
    record = json.loads((tmp_path / "main.json").read_text())
    assert len(record["sessions"]) == 2 and record["sessions"][1]["merged_from"] == str(src.resolve())
    assert "merged_from" not in record["sessions"][0] and record["n_runs"] == 4
    assert record["merges"][0]["runs_added"] == 2 and record["merges"][0]["runs_skipped"] == 1
    assert record["config"]["threads"] == 1                                   # the destination's
    again = merge(src, dst)                                                   # repeating it changes nothing
    assert again == {"added": 0, "skipped": 3, "sessions": 0} and len(pd.read_csv(dst)) == 4
    assert len(json.loads((tmp_path / "main.json").read_text())["sessions"]) == 2


def test_merge_into_a_new_store_and_into_an_older_header(tmp_path):
    src, dst = tmp_path / "gpu.csv", tmp_path / "new.csv"
    fill(src, ["a"])
    assert merge(src, dst) == {"added": 1, "skipped": 0, "sessions": 1}
    assert pd.read_csv(dst).equals(pd.read_csv(src))
    assert json.loads((tmp_path / "new.json").read_text())["config"] == CONFIG
    old = tmp_path / "old.csv"
    fill(old, ["z"])
    pd.read_csv(old).drop(columns=["late"]).to_csv(old, index=False)          # written before "late" existed
    merge(src, old)
    stored = pd.read_csv(old)
    assert list(stored.columns) == list(LAYOUT.columns) and stored.late.isna().tolist() == [True, False]


def test_merge_refuses_what_does_not_belong_together(tmp_path):
    src, dst = tmp_path / "gpu.csv", tmp_path / "main.csv"
    fill(src, ["a"], config={**CONFIG, "size": 5})
    fill(dst, ["b"])
    with pytest.raises(StoreError, match=r"another configuration \(differs in \['size'\]\)"):
        merge(src, dst)
    with pytest.raises(StoreError, match="are the same store"):
        merge(dst, dst)
    with pytest.raises(StoreError, match="does not exist"):
        merge(tmp_path / "none.csv", dst)
    with pytest.raises(StoreError, match=r"--out must name a \.csv file"):
        merge(src, tmp_path / "main.json")
    (tmp_path / "gpu.json").unlink()
    with pytest.raises(StoreError, match=r"gpu\.csv has no provenance record gpu\.json"):
        merge(src, dst)
    fill(tmp_path / "other.csv", ["a"])
    with ResultsStore(dst, LAYOUT, CONFIG):
        with pytest.raises(StoreLocked, match="another process is writing to"):
            merge(tmp_path / "other.csv", dst)
    with pytest.raises(SystemExit):
        store.main(["merge", str(src), str(dst)])


def test_merge_needs_a_layout(tmp_path):
    src, dst = tmp_path / "a.csv", tmp_path / "b.csv"
    fill(src, ["a"])
    record = json.loads((tmp_path / "a.json").read_text())
    del record["store"]
    (tmp_path / "a.json").write_text(json.dumps(record))
    with pytest.raises(StoreError, match="records the store's layout"):
        merge(src, dst)


# ------------------------------------------------------------------------------------------------- argument types
@pytest.mark.parametrize("text", ["0", "-1", "1.5", "two", "01"])
def test_positive_int_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError, match=f"must be an integer >= 1, got '{text}'"):
        store.positive_int(text)


def test_argument_types():
    assert store.positive_int("3") == 3 and store.device_arg("cpu") == "cpu"
    assert store.csv_path("x/r.csv") == Path("x/r.csv")
    with pytest.raises(argparse.ArgumentTypeError, match=r"must name a \.csv file .*got 'r\.json'"):
        store.csv_path("r.json")
    with pytest.raises(argparse.ArgumentTypeError, match="'gpu' is not a torch device"):
        store.device_arg("gpu")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_device_arg_refuses_cuda_without_cuda():
    with pytest.raises(argparse.ArgumentTypeError, match="'cuda': CUDA is not available on this machine"):
        store.device_arg("cuda")


# ------------------------------------------------------------------------------------------------- helpers for the
# experiment tests: a real command line in a subprocess, killed between two runs.
DRIVER = """
import importlib, sys
module = importlib.import_module(sys.argv[1])
cls = getattr(module, sys.argv[2])
tiny = eval(sys.argv[3], {cls.__name__: cls})
cls.quick = classmethod(lambda c: tiny)
import torch
torch.set_num_threads(1)
module.main(sys.argv[4:])
"""


def data_lines(path) -> int:
    """Complete data lines (after the header) of a CSV file, 0 if there is none."""
    path = Path(path)
    return max(path.read_bytes().count(b"\n") - 1, 0) if path.exists() else 0


def start_cli(module: str, config, argv: list[str], **kwargs) -> subprocess.Popen:
    """``module.main(argv)`` in a subprocess, with ``quick()`` of ``config``'s class returning ``config``."""
    env = {**os.environ, "PYTHONPATH": CODE + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-c", DRIVER, module, type(config).__name__, repr(config), *argv],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kwargs)


def kill_after_rows(module: str, config, argv: list[str], out, rows: int, sig=signal.SIGKILL,
                    timeout: float = 300) -> tuple[int, bytes]:
    """Run the command line in a subprocess, send it ``sig`` as soon as ``out`` holds ``rows`` complete rows
    (between two runs, or during the next one), and return its exit status and the bytes of ``out`` at that moment.
    Fails if the command ends on its own first."""
    process = start_cli(module, config, argv)
    deadline = time.monotonic() + timeout
    try:
        while data_lines(out) < rows:
            if process.poll() is not None:
                pytest.fail(f"the command ended before {rows} rows: {process.stderr.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {rows} rows in {timeout} s")
            time.sleep(0.01)
        process.send_signal(sig)
        snapshot = Path(out).read_bytes()
        code = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return code, snapshot


def cut_last_line(path, keep: float = 0.5) -> bytes:
    """Cut the last line of ``path`` to ``keep`` of its length (a write cut by a crash); return the cut line."""
    path = Path(path)
    data = path.read_bytes()
    start = data.rstrip(b"\n").rfind(b"\n") + 1
    line = data[start:]
    path.write_bytes(data[:start] + line[: int(len(line) * keep)])
    return line


def check_resumed(out, before: bytes, keys: list[str], expected: int) -> pd.DataFrame:
    """After a resume: every complete row from before is still there, byte for byte and first; every run is there
    once; the file is readable."""
    data = Path(out).read_bytes()
    complete = before[: before.rfind(b"\n") + 1]
    assert data.startswith(complete), "finished runs were changed or lost"
    frame = pd.read_csv(out)
    assert len(frame) == expected and not frame.duplicated(keys).any(), frame[keys]
    return frame


# ------------------------------------------------------------------------------------------------- twins on devices
KIND = Layout("toy", keys=("name", "seed"), columns=("name", "seed", "value", "late", "device"),
              added_columns=("late",), tables={"history": ("epoch", "loss", "name", "seed", "device")},
              not_configuration=("threads", "seeds"), kind_column="device")
GPU = "NVIDIA H100 80GB HBM3"


def test_device_kind():
    assert [store.device_kind(d) for d in ("CPU (1 threads, x86_64)", "cpu", " cpu ", GPU, "cuda:0", "", None,
                                           float("nan"))] == ["cpu", "cpu", "cpu", "gpu", "gpu", "cpu", "cpu", "cpu"]


def test_kind_column_makes_twins_on_another_kind_of_device_other_runs(tmp_path):
    out = tmp_path / "r.csv"
    with ResultsStore(out, KIND, CONFIG, device="cpu") as s, Session(s, lambda wall: {}, cli=False):
        s.append(row("a"), {"history": [{**h, "device": "cpu"} for h in history("a")]})
        assert s.has({"name": "a", "seed": 0}) and not s.has({"name": "a", "seed": 0, "device": "cuda:0"})
        s.append({**row("a"), "device": GPU}, {"history": [{**h, "device": GPU} for h in history("a")]})
        with pytest.raises(StoreError, match=r"\{'name': 'a', 'seed': '0', 'device kind': 'gpu'\} is stored"):
            s.append({**row("a"), "device": "cuda:1"})
        with pytest.raises(StoreError, match=r"the key \['b', '0', 'cpu'\], not its run's \['b', '0', 'gpu'\]"):
            s.append({**row("b"), "device": GPU}, {"history": [{**h, "device": "cpu"} for h in history("b")]})
        assert s.done == {("a", "0", "cpu"), ("a", "0", "gpu")}
    with ResultsStore(out, KIND, CONFIG) as s:                     # reopened: both kept, no device given
        assert s.n_runs == 2 and len(s.frame("history")) == 4
        with pytest.raises(StoreError, match="is identified by its 'device' too"):
            s.has({"name": "a", "seed": 0})
    with pytest.raises(ValueError, match="lack the kind_column 'device'"):
        Layout("toy", keys=("name",), columns=("name", "device"), tables={"h": ("name",)}, kind_column="device")
    assert Layout.from_json(KIND.to_json()) == KIND
    assert Layout.from_json({**LAYOUT.to_json(), "kind_column": None}) == LAYOUT
    legacy = LAYOUT.to_json()
    del legacy["kind_column"]                                      # sidecars written before kind_column existed
    assert Layout.from_json(legacy).kind_column is None


def test_merge_keeps_gpu_twins_of_stored_cpu_runs(tmp_path):
    """A GPU run of a (name, seed) that the destination holds from a CPU is added, not skipped as a copy, also when
    the destination's sidecar still records the older layout without a kind column."""
    src, dst = tmp_path / "gpu.csv", tmp_path / "main.csv"
    fill(dst, ["a", "b"])                                          # CPU runs, written with the older layout
    record = json.loads((tmp_path / "main.json").read_text())
    assert record["store"]["kind_column"] is None
    with ResultsStore(src, KIND, CONFIG, device="cuda") as s, Session(s, lambda wall: {"device": GPU}, cli=False):
        for name in ("a", "c"):
            s.append({**row(name), "device": GPU}, {"history": [{**h, "device": GPU} for h in history(name)]})
        s.append(row("b"), {"history": [{**h, "device": "cpu"} for h in history("b")]})   # a CPU twin: skipped
    pd.read_csv(LAYOUT.table_path(dst, "history")).assign(device="cpu").to_csv(LAYOUT.table_path(dst, "history"),
                                                                                index=False)
    assert merge(src, dst) == {"added": 2, "skipped": 1, "sessions": 1}
    stored = pd.read_csv(dst)
    assert sorted(zip(stored.name, stored.device.map(store.device_kind))) == [
        ("a", "cpu"), ("a", "gpu"), ("b", "cpu"), ("c", "gpu")]
    assert json.loads((tmp_path / "main.json").read_text())["store"]["kind_column"] == "device"
    assert merge(src, dst)["added"] == 0                          # repeating it changes nothing


def test_merge_uses_the_experiments_current_layout(tmp_path):
    """Two sidecars written before the masking layout named its kind column: the merge takes the layout from
    attnbook.experiments.masking, so a GPU twin of a CPU run is still added."""
    from attnbook.experiments import masking

    assert store._current_layout("masking") is masking.LAYOUT and store._current_layout("toy") is None
    assert store._current_layout("../x") is None
    old = Layout(**{**{f: getattr(masking.LAYOUT, f) for f in ("experiment", "keys", "columns", "added_columns",
                                                               "not_configuration", "legacy_config")}})
    cfg = {"max_len": 7, **masking.LEGACY_CONFIG}
    base = {"pooling": "attention", "masking": "none", "rnn_input": "packed", "batching": "random",
            "precision": "fp32", "seed": 0, "test_accuracy": 0.8}
    src, dst = tmp_path / "gpu.csv", tmp_path / "main.csv"
    for out, device in ((dst, "CPU (1 threads, x86_64)"), (src, GPU)):
        with ResultsStore(out, old, cfg) as s, Session(s, lambda wall: {}, cli=False):
            s.append({**base, "device": device})
    shell = tmp_path / "shell.csv"                 # the shell command too (python -m runs a __main__ copy of it)
    for suffix in (".csv", ".json"):
        (tmp_path / f"shell{suffix}").write_bytes((tmp_path / f"main{suffix}").read_bytes())
    done = subprocess.run([sys.executable, "-m", "attnbook.store", "merge", str(src), str(shell)], text=True,
                          capture_output=True, env={**os.environ, "PYTHONPATH": CODE})
    assert "merged 1 runs" in done.stdout and len(pd.read_csv(shell)) == 2, done.stderr
    assert merge(src, dst)["added"] == 1 and len(pd.read_csv(dst)) == 2


def test_collect_runs_appends_each_run_and_returns_stored_and_new_sorted(tmp_path):
    out = tmp_path / "r.csv"
    seen = []
    with ResultsStore(out, LAYOUT, CONFIG) as s:
        s.append(row("b", 0))                                        # stored before the call
        frame = store.collect_runs(row, [("c", 1), ("a", 2)], 2, store=s, keys=["name"],
                                   show_progress=False, on_run=lambda f: seen.append(len(f)))
        assert s.n_runs == 3
    assert list(frame["name"]) == ["a", "b", "c"] and seen == [2, 3]
    assert len(pd.read_csv(out)) == 3
    alone = store.collect_runs(row, [("x", 0)], 1, show_progress=False)
    assert list(alone["name"]) == ["x"]


def _with_history(name, seed):
    return row(name, seed), {"history": history(name, seed)}


def test_collect_runs_stores_side_tables_with_their_runs_and_returns_them(tmp_path):
    out = tmp_path / "r.csv"
    with ResultsStore(out, LAYOUT, CONFIG) as s:
        s.append(row("b"), {"history": history("b")})                # stored before the call
        frame, tables = store.collect_runs(_with_history, [("c", 1), ("a", 2)], 2, store=s, keys=["name"],
                                           show_progress=False, tables=["history"])
    assert list(frame["name"]) == ["a", "b", "c"] and list(tables) == ["history"]
    assert tables["history"][["name", "seed"]].values.tolist() == [["b", 0]] * 2 + [["c", 1]] * 2 + [["a", 2]] * 2
    assert tables["history"].equals(pd.read_csv(tmp_path / "r_history.csv"))
    frame, tables = store.collect_runs(_with_history, [("x", 0), ("y", 1)], 2, show_progress=False,
                                       tables=["history"])
    assert list(frame["name"]) == ["x", "y"] and tables["history"]["name"].tolist() == ["x", "x", "y", "y"]
    frame, tables = store.collect_runs(_with_history, [], 0, show_progress=False, tables=["history"])
    assert frame.empty and tables["history"].empty


def test_read_tables_reads_the_main_table_its_side_tables_and_provenance(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    assert store.read_tables("x", ("steps",), start=tmp_path) is None
    pd.DataFrame({"init": ["200.0", "xavier"], "seed": [0, 1]}).to_csv(results / "x.csv", index=False)
    assert store.read_tables("x", ("steps",), start=tmp_path) is None                 # no provenance yet
    (results / "x.json").write_text(json.dumps({"config": {"lr": 0.1, "seeds": 3}}))
    read = store.read_tables("x", ("steps", "groups"), start=tmp_path / "sub", dtype={"init": str})
    assert read.runs["init"].tolist() == ["200.0", "xavier"] and read.tables == {}
    pd.DataFrame({"init": ["200.0"], "step": [30]}).to_csv(results / "x_steps.csv", index=False)
    read = store.read_tables("x", ("steps",), start=tmp_path, dtype={"init": str})
    assert list(read.tables) == ["steps"] and read.tables["steps"]["init"].tolist() == ["200.0"]
    layout = store.Layout("x", keys=("seed",), columns=("init", "seed"), not_configuration=("seeds",))
    assert read.differences({"lr": 0.1, "seeds": 5}, layout) == []
    assert read.differences({"lr": 0.2, "seeds": 3}, layout) == ["lr"]
