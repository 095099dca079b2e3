"""benchmarks/mining_scale.py: its tiny case end to end (generate, mine, recall, each
in a process of its own), and its refusal of an unknown case."""

import json

import pytest

from benchmarks import mining_scale


def test_the_tiny_case_mines_and_measures_recall_and_memory(tmp_path):
    output = tmp_path / "mining.json"
    # an earlier run's case: results merge into the file by case name
    output.write_text(json.dumps({"results": [{"case": "smoke", "mine": {}}]}))
    mining_scale.main([f"--output_json={output}", "--only=tiny",
                       f"--work_dir={tmp_path / 'work'}", "--timeout_s=120"])
    result = json.loads(output.read_text())
    smoke, case = result["results"]
    assert smoke == {"case": "smoke", "mine": {}}
    assert case["case"] == "tiny" and case["candidates"] == 4_000
    assert case["mine"]["pairs"] > 0 and case["mine"]["planted_pairs_mined"] > 0
    for process in ("generate", "mine", "recall"):
        assert 0 < case[process]["peak_rss_gib"] < 2, process
    recall = case["recall"]
    assert recall["sample"] == 200 and 0 < recall["recall_at_1"] <= 1
    # the planted near-duplicates are each other's exact nearest neighbours
    assert recall["exact_top1_is_planted"] == 1.0
    assert not (tmp_path / "work" / "tiny").exists()


def test_an_unknown_case_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        mining_scale.main([f"--output_json={tmp_path / 'r.json'}", "--only=huge"])
    assert "unknown cases ['huge']" in capsys.readouterr().err
