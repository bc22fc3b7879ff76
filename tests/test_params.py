import pytest

from storyrewrite.data.prepare import DataConfig
from storyrewrite.io import InputError
from storyrewrite.params import build, experiment, load_params
from storyrewrite.training.config import TrainConfig

from conftest import ROOT


def test_default_params_build_every_section():
    params = load_params(ROOT / "params.yaml")
    assert experiment(params).task == "timetravel"
    assert build(TrainConfig, params["train_nll"], "train_nll").batch_size == 2
    assert build(DataConfig, params["data"], "data").max_eval == 24


def test_unknown_key_names_key_and_valid_keys():
    with pytest.raises(InputError, match=r"`data\.max_tran`.*valid keys: val_fraction, max_train, max_eval"):
        build(DataConfig, {"val_fraction": 0.1, "max_tran": 3}, "data")


def test_wrong_type_names_key_and_type():
    with pytest.raises(InputError, match=r"`data\.max_train` = 'ten' has the wrong type; expected int or null"):
        build(DataConfig, {"val_fraction": 0.1, "max_train": "ten"}, "data")


def test_invalid_choice_lists_valid_values():
    with pytest.raises(InputError, match=r"`task` = 'rocstories' is not valid; valid values: timetravel, timetravel_ablated, art"):
        experiment({"seed": 0, "task": "rocstories"})


def test_out_of_range_value():
    with pytest.raises(InputError, match=r"`data\.val_fraction` = 1.5 must be in \(0, 1\)"):
        build(DataConfig, {"val_fraction": 1.5}, "data")


def test_exponent_without_dot_reads_as_float():
    # PyYAML loads `5e-9` as a string; the paper's lr is written that way.
    params = load_params(ROOT / "params.yaml")
    section = dict(params["train_nll"], lr="5e-9")
    assert build(TrainConfig, section, "train_nll").lr == pytest.approx(5e-9)
