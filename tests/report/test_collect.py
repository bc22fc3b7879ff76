from storyrewrite.report.collect import experiments, table


def _data(lr, bart, p):
    return {
        "params": {"params.yaml": {"data": {"objective": "nll", "seed": 0, "train": {"lr": lr}}}},
        "metrics": {
            "reports/metrics/finetuned.json": {"data": {"bartscore": {"predictive": bart, "counterfactual": bart - 1},
                                                        "rougeL": {"predictive": 60.0}, "sacrebleu": {"predictive": 30.0}}},
            "reports/metrics/nll.json": {"data": {"bartscore": {"predictive": -2.0}}},
            "reports/significance.json": {"data": {"finetuned": {"bartscore/predictive": p}}},
        },
    }


def test_collects_commits_and_experiments_into_one_table():
    exp_show = [
        {"rev": "workspace", "name": None, "data": _data(1e-5, -1.9, 0.2), "experiments": None},
        {"rev": "abcdef1234", "name": "main", "data": _data(1e-5, -1.9, 0.2),
         "experiments": [{"name": "faster", "revs": [{"rev": "9876", "name": "faster", "data": _data(3e-5, -1.5, 0.01)}]}]},
    ]
    rows = experiments(exp_show)
    assert [r["name"] for r in rows] == ["workspace", "main", "faster"]
    text = table(rows).splitlines()
    assert text[0].startswith("| Experiment | objective | train.lr | BARTScore (M) |")
    assert text[4] == "| faster | nll | 3e-05 | -1.500\\* | 60.0 | 30.0 | -2.500 | n/a | n/a | -2.000 |"
