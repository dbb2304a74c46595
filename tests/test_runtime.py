"""attnbook.runtime, attnbook.provenance and attnbook.plotting."""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from attnbook import plotting, provenance, runtime  # noqa: E402


def test_mode_default_follows_cuda(monkeypatch):
    monkeypatch.delenv("ATTNBOOK_MODE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert runtime.get_mode() == "quick"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert runtime.get_mode() == "full"


@pytest.mark.parametrize("value,expected", [("quick", "quick"), ("FULL", "full"), (" full ", "full"), ("", "quick")])
def test_mode_from_environment(monkeypatch, value, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("ATTNBOOK_MODE", value)
    assert runtime.get_mode() == expected


def test_bad_mode_names_the_value(monkeypatch):
    monkeypatch.setenv("ATTNBOOK_MODE", "fast")
    with pytest.raises(ValueError, match=r"ATTNBOOK_MODE must be one of \('quick', 'full'\), got 'fast'"):
        runtime.get_mode()


def test_seed_everything_reproduces_draws():
    runtime.seed_everything(7)
    a = (torch.rand(3), np.random.rand(3))
    g = runtime.seed_everything(7)
    b = (torch.rand(3), np.random.rand(3))
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert torch.equal(torch.rand(2, generator=g), torch.rand(2, generator=torch.Generator().manual_seed(7)))
    with pytest.raises(ValueError, match="seed must be non-negative, got -1"):
        runtime.seed_everything(-1)


def test_glue_makes_numpy_and_torch_scalars_plain(monkeypatch):
    seen = {}
    import myst_nb

    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display=True: seen.__setitem__(name, value))
    assert runtime.glue("a", np.float64(0.25)) == 0.25
    runtime.glue("b", torch.tensor(3))
    assert type(seen["a"]) is float and type(seen["b"]) is int


def test_run_info_glues_mode_device_and_wall_time(monkeypatch):
    seen = {}
    import myst_nb

    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display=True: seen.__setitem__(name, value))
    monkeypatch.setenv("ATTNBOOK_MODE", "quick")
    run = runtime.RunInfo.start()
    wall = run.glue_end()
    assert seen["run_mode"] == "quick" and seen["run_device"].startswith("CPU")
    assert seen["run_wall_s"] == wall >= 0


def test_provenance_records_where_it_ran(tmp_path):
    record = provenance.provenance(wall_time_s=1.234, seeds=5)
    for key in ("device", "torch", "commit", "date_utc", "wall_time_s", "mode", "python"):
        assert key in record
    assert record["wall_time_s"] == 1.23 and record["seeds"] == 5 and record["torch"] == torch.__version__
    path = provenance.write_provenance(tmp_path / "sub" / "p.json", record)
    assert json.loads(path.read_text()) == record


def test_read_stored_searches_upwards_and_stays_offline(tmp_path, monkeypatch):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "r.csv").write_text("a,b\n1,2\n")
    (tmp_path / "chapters").mkdir()
    assert provenance.read_stored("r.csv", start=tmp_path / "chapters") == "a,b\n1,2\n"
    monkeypatch.chdir(tmp_path / "chapters")
    assert provenance.read_stored("r.csv") == "a,b\n1,2\n"

    import urllib.request

    def no_network(*args, **kwargs):
        raise AssertionError("read_stored went online outside Colab")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    assert provenance.read_stored("missing.csv") is None                 # not on Colab: no download
    asked = []
    monkeypatch.setattr(urllib.request, "urlopen",
                        lambda url, timeout: asked.append(url) or (_ for _ in ()).throw(OSError("offline")))
    assert provenance.read_stored("missing.csv", online=True) is None    # a failed download gives None
    assert asked == [_raw_url("missing.csv")]


def _raw_url(name):
    return ("https://raw.githubusercontent.com/attnbook/attention-masked-unmasked/main/results/" + name)


def test_repository_url_agrees_with_book_config():
    import yaml
    from pathlib import Path

    config = yaml.safe_load((Path(__file__).resolve().parents[1] / "_config.yml").read_text())
    assert provenance.REPOSITORY_URL == config["repository"]["url"]


def test_git_commit_outside_a_repository(tmp_path, monkeypatch):
    monkeypatch.delenv("ATTNBOOK_COMMIT", raising=False)
    assert provenance.git_commit(tmp_path) == "unknown"
    repo = Path(__file__).resolve().parent
    assert provenance.git_commit(repo) not in ("unknown", "abc123")
    monkeypatch.setenv("ATTNBOOK_COMMIT", "abc123")          # named by the command that sent the tree elsewhere
    assert provenance.git_commit(tmp_path) == provenance.git_commit(repo) == "abc123"


def test_attention_heatmap_labels_axes_with_tokens():
    ax = plotting.attention_heatmap(torch.tensor([[0.5, 0.5, 0.0]]), ["a", "b", "<pad>"], ["q"])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "<pad>"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["q"]
    plt.close("all")


def test_attention_heatmap_errors():
    with pytest.raises(ValueError, match=r"weights must be 2-D \(n_queries, n_keys\), got shape \(3,\)"):
        plotting.attention_heatmap(np.zeros(3))
    with pytest.raises(ValueError, match=r"2 x_labels for 3 keys \(weights shape \(1, 3\)\)"):
        plotting.attention_heatmap(np.zeros((1, 3)), ["a", "b"])
    with pytest.raises(ValueError, match=r"2 y_labels for 1 queries"):
        plotting.attention_heatmap(np.zeros((1, 3)), None, ["a", "b"])


def test_book_style_applies():
    import pandas as pd

    with pd.option_context("display.max_colwidth", 50, "display.max_columns", 20), matplotlib.rc_context():
        plotting.use_book_style()
        assert matplotlib.rcParams["axes.spines.top"] is False
        text = repr(pd.DataFrame({"config": ["x" * 120]}))  # what a notebook shows
        assert "x" * 120 in text and "..." not in text
        assert "..." not in repr(pd.DataFrame([range(30)]))


def test_progress_bar_writes_to_stdout_without_ipywidgets(capsys, monkeypatch):
    import importlib.util as iu

    real = iu.find_spec
    monkeypatch.setattr(iu, "find_spec", lambda name, *a: None if name == "ipywidgets" else real(name, *a))
    assert sum(runtime.progress(range(5), desc="demo")) == 10
    captured = capsys.readouterr()
    assert "demo" in captured.out and "5/5" in captured.out and captured.err == ""


def test_print_estimate(capsys):
    runtime.print_estimate(40, "training")
    runtime.print_estimate(600)
    runtime.print_estimate(None, "full mode")
    out = capsys.readouterr().out
    assert "Estimated run time of training: about 40 s" in out
    assert "Estimated run time of the next cell: about 10 min" in out
    assert "Run time of full mode: not yet measured on this kind of machine" in out


def test_run_tasks_in_process_and_in_workers():
    """``run_tasks`` gives the same results in this process and in two joblib workers: in the order of the
    arguments by default, in any order with ``ordered=False``; in process it is lazy (nothing runs before asked)."""
    arguments = [(base, 3) for base in range(6)]
    expected = [base ** 3 for base in range(6)]
    calls = []
    lazy = runtime.run_tasks(lambda *args: calls.append(args) or pow(*args), arguments)
    assert calls == []
    assert list(lazy) == expected and len(calls) == 6
    assert list(runtime.run_tasks(pow, arguments, workers=2)) == expected
    assert sorted(runtime.run_tasks(pow, arguments, workers=2, ordered=False)) == expected


def test_describe_device_counts_threads_in_words(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert runtime.describe_device("cpu").startswith("CPU (1 thread, ")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    assert runtime.describe_device("cpu").startswith("CPU (4 threads, ")


@pytest.mark.parametrize("n, expected", [(0, "0 seeds"), (1, "1 seed"), (2, "2 seeds"), (np.int64(1), "1 seed")])
def test_plural(n, expected):
    assert runtime.plural(n, "seed") == expected


def test_plural_irregular_and_errors():
    assert runtime.plural(2, "child", "children") == "2 children" and runtime.plural(1, "child", "children") == "1 child"
    for bad in (1.0, "2", True, np.bool_(True)):
        with pytest.raises(TypeError, match="n must be an integer count"):
            runtime.plural(bad, "seed")
    with pytest.raises(ValueError, match="n must be a count >= 0, got -1"):
        runtime.plural(-1, "seed")


def test_device_label_mends_the_old_spelling_only():
    assert runtime.device_label("CPU (1 threads, x86_64)") == "CPU (1 thread, x86_64)"
    assert runtime.device_label("CPU (11 threads, x86_64)") == "CPU (11 threads, x86_64)"
    assert runtime.device_label("NVIDIA H100 80GB HBM3") == "NVIDIA H100 80GB HBM3"
    assert runtime.device_label(None) == "None"


def test_listing():
    assert runtime.listing([3]) == "3"
    assert runtime.listing(["a", "b"]) == "a and b"
    assert runtime.listing(x for x in (0, 1, 2)) == "0, 1 and 2"
    assert runtime.listing(["x", "y"], "or") == "x or y"
    with pytest.raises(ValueError, match="items is empty"):
        runtime.listing([])
