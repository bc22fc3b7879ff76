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


LABELS = {"nll": "NLL", "cpo": "CPO", "score": "DTO-Score"}


def _run(name, objective, val_nll, bart, settings=None):
    data = _data(1e-5, bart, 0.01)
    data["params"]["params.yaml"]["data"]["objective"] = objective
    # What the train stage writes: the label from the objective registry and the objective's own settings.
    data["metrics"]["reports/train/finetuned/summary.json"] = {"data": {"best_val_nll": val_nll, "label": LABELS[objective],
                                                                         "settings": settings}}
    data["metrics"]["reports/train/nll/summary.json"] = {"data": {"label": "NLL"}}
    return {"rev": name, "name": name, "data": data}


def test_objectives_table_keeps_the_best_run_of_each_objective_by_validation_nll():
    from storyrewrite.report.collect import objectives_table

    runs = [
        _run("base", "nll", 1.50, -1.95),
        _run("cpo-a", "cpo", 1.60, -1.80, {"beta": 0.1, "lambda": 1.0}),
        _run("cpo-b", "cpo", 1.40, -1.90, {"beta": 2, "lambda": 0.5}),
        _run("dto", "score", 1.45, -1.70, {"tau": 1.0, "hard": False}),
    ]
    lines = objectives_table(experiments([{"rev": "c0", "name": "main", "data": None, "experiments": [{"revs": [r]} for r in runs]}])).splitlines()
    assert lines[2].startswith("| NLL | - | -2.000 |")
    assert lines[3].startswith("| NLL, continued | base: 1.5000 | -1.950\\* |")
    # Lower val NLL than cpo-a; the settings that vary across the CPO runs name the chosen one.
    assert lines[4].startswith("| CPO (beta=2, lambda=0.5) | cpo-b: 1.4000 | -1.900\\* |")
    assert lines[5].startswith("| DTO-Score | dto: 1.4500 | -1.700\\* |")  # one run: no settings vary
    assert len([line for line in lines if line.startswith("| ")]) == 5  # the header and four systems
