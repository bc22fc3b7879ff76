"""`python -m storyrewrite.significance.compare A B`: any two systems' per-instance scores tested
again, from a collected folder's gzip files, give the p-values its significance.json holds."""
from __future__ import annotations

import gzip
import json

import pytest
import yaml
from helpers import ROOT

from storyrewrite.io import InputError
from storyrewrite.significance.compare import main

GRID = ROOT / "reports" / "grid"


def _cli_p_values(capsys, *argv, first_line: list | None = None) -> dict[str, tuple[float, float]]:
    main([str(a) for a in argv])
    lines = capsys.readouterr().out.splitlines()
    if first_line is not None:
        first_line.append(lines[0])
    # A p of k/n = 0 is printed as the bound 1/n (`< 0.0200` of 50 resamples): read back as 0.
    return {cells[0]: tuple(0.0 if cell.startswith("< ") else float(cell) for cell in cells[1:])
            for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines[3:] if line.startswith("|"))}


def test_the_collected_scores_give_the_collected_p_values_again(capsys):
    significance = json.loads((GRID / "significance.json").read_text())
    label = next(label for label in significance if label.startswith("DTO-Score") and "Delta" not in label)
    run = significance[label]["run"]
    params = yaml.safe_load((GRID / "params" / f"{run}.yaml").read_text())
    nll = next((GRID / "scores").glob("*/nll.jsonl.gz"))  # the NLL model of every run of one machine
    found = _cli_p_values(capsys, GRID / "scores" / run / "finetuned.jsonl.gz", nll,
                          "--n-resamples", params["significance"]["n_resamples"], "--seed", params["seed"])
    expected = significance[label]
    assert found == {column: (p, expected["story"][column]) for column, p in expected["instance"].items()}
    assert len(found) >= 9  # the overlap metrics in both forms and the coherence columns


def test_plain_score_files_and_bad_input(tmp_path, capsys):
    rows = [{"id": f"s{i // 3}:{i % 3}", "story_id": f"s{i // 3}", "bartscore": -2.0 + 0.01 * i} for i in range(12)]
    better = [{**row, "bartscore": row["bartscore"] + 0.5} for row in rows]
    for name, data in (("a.jsonl", better), ("b.jsonl", rows)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in data))
    # Higher on every instance: p = 0 both ways of resampling; the other way round, 1.
    assert _cli_p_values(capsys, tmp_path / "a.jsonl", tmp_path / "b.jsonl", "--n-resamples", 50) == {"bartscore/predictive": (0.0, 0.0)}
    assert _cli_p_values(capsys, tmp_path / "b.jsonl", tmp_path / "a.jsonl", "--n-resamples", 50) == {"bartscore/predictive": (1.0, 1.0)}
    # Printed as the bound that no resample reached, said under the table; a p of 1 as it is.
    main([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--n-resamples", "50"])
    assert capsys.readouterr().out.splitlines()[3:] == [
        "| bartscore/predictive | < 0.0200 | < 0.0200 |",
        "< 0.0200: not one of the 50 resamples went against H1 (the bootstrap's k/n is 0)."]
    main([str(tmp_path / "b.jsonl"), str(tmp_path / "a.jsonl"), "--n-resamples", "3000"])
    assert capsys.readouterr().out.splitlines()[3:] == ["| bartscore/predictive | 1.0000 | 1.0000 |"]
    # Rows that name their predictions: the count of shared ones, which are ties.
    named = [{**row, "prediction_digest": f"{i % 4:012x}"} for i, row in enumerate(rows)]
    half = [{**row, "bartscore": row["bartscore"] + 0.5 * (i % 2), "prediction_digest": f"{i % 4 + 4 * (i % 2):012x}"}
            for i, row in enumerate(rows)]
    for name, data in (("named.jsonl", named), ("half.jsonl", half)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in data))
    first = []
    assert _cli_p_values(capsys, tmp_path / "half.jsonl", tmp_path / "named.jsonl", "--n-resamples", 50, first_line=first) == {
        "bartscore/predictive": (0.0, 0.0)}
    assert first[0].endswith("seed 0; the same prediction on 6 of 12 instances (ties)")
    _cli_p_values(capsys, tmp_path / "half.jsonl", tmp_path / "b.jsonl", "--n-resamples", 50, first_line=first)
    assert first[1].endswith("seed 0")  # b.jsonl names none
    # Rows whose BARTScore two different scorers gave: not tested, and said so; ROUGE-L, no
    # model's, is tested; the same scorer in both files, or a file that names none: tested.
    scored = [{**row, "rougeL": 40.0 + i} for i, row in enumerate(better)]
    for name, data, scorer in (("x.jsonl", scored, "tiny:llama (float32)"), ("y.jsonl", rows, "other/lm (bfloat16)"),
                               ("z.jsonl", rows, "tiny:llama (float32)")):
        (tmp_path / name).write_text("".join(json.dumps({"rougeL": 40.0, **r, "scored_by": {"bartscore": scorer}}) + "\n" for r in data))
    main([str(tmp_path / "x.jsonl"), str(tmp_path / "y.jsonl"), "--n-resamples", "50"])
    out = capsys.readouterr().out.splitlines()
    assert [line.split("|")[1].strip() for line in out[3:] if line.startswith("|")] == ["rougeL/predictive"]
    assert out[-1] == "not tested: bartscore/predictive: scored by tiny:llama (float32) in the first file, by other/lm (bfloat16) in the second"
    assert set(_cli_p_values(capsys, tmp_path / "x.jsonl", tmp_path / "z.jsonl", "--n-resamples", 50)) == {"bartscore/predictive", "rougeL/predictive"}
    assert set(_cli_p_values(capsys, tmp_path / "x.jsonl", tmp_path / "b.jsonl", "--n-resamples", 50)) == {"bartscore/predictive"}
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "part.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:5] + rows[:1] + [{**rows[0], "id": "t0:0"}]))
    (tmp_path / "torn.jsonl.gz").write_bytes(gzip.compress(b'{"id": 1}\n')[:-4])
    (tmp_path / "bare").mkdir()
    for argv, message in (([tmp_path / "none.jsonl", tmp_path / "b.jsonl"], r"none.jsonl: no such file"),
                          # a folder: one of its score files named as an example, or none there said so
                          ([tmp_path, tmp_path / "b.jsonl"], rf"^{tmp_path}: a folder; name one system's score file, "
                                                             rf"e.g. {tmp_path / 'a.jsonl'} \(10 in it\)$"),
                          ([tmp_path / "b.jsonl", tmp_path / "bare"], r"bare: a folder; name one system's score file "
                                                                      r"\(.jsonl or .jsonl.gz\): it holds none$"),
                          ([tmp_path / "empty.jsonl", tmp_path / "b.jsonl"], r"empty.jsonl: no scores"),
                          ([tmp_path / "torn.jsonl.gz", tmp_path / "b.jsonl"], r"torn.jsonl.gz: not a whole gzip file"),
                          ([tmp_path / "a.jsonl", tmp_path / "b.jsonl", "--n-resamples", 0], r"--n-resamples must be a whole number >= 1"),
                          ([tmp_path / "a.jsonl", tmp_path / "b.jsonl", "--seed", -1], r"--seed must be a whole number from 0 to 4294967295, got -1$"),
                          # both files named, with what each holds: 6 ids (one twice) of 7 rows against 12, 5 in both
                          ([tmp_path / "part.jsonl", tmp_path / "b.jsonl"],
                           r"scores of `\S*part.jsonl` and `\S*b.jsonl` cover different instances: 6 and 12 instance ids, "
                           r"5 in both; `\S*part.jsonl` repeats 1 id\(s\)$")):
        with pytest.raises(InputError, match=message):
            main([str(a) for a in argv])


def test_a_shared_systems_file_asked_for_in_another_runs_folder_is_pointed_to():
    # The collected folder keeps the NLL model's scores in one run's folder; asked for beside
    # another run's `finetuned`, the error names where it is (every such file, one per machine).
    holders = sorted(str(path) for path in (GRID / "scores").glob("*/nll.jsonl.gz"))
    run = next(path.parent for path in (GRID / "scores").glob("*/finetuned.jsonl.gz") if not (path.parent / "nll.jsonl.gz").exists())
    with pytest.raises(InputError, match=rf"^{run / 'nll.jsonl.gz'}: no such file; nll.jsonl.gz is in {', '.join(holders)}$"):
        main([str(run / "finetuned.jsonl.gz"), str(run / "nll.jsonl.gz")])
