import re
import subprocess
import sys
from typing import get_args

import pytest
import yaml

from storyrewrite.io import InputError
from storyrewrite.llm.modes import MODES
from storyrewrite.objectives.registry import OBJECTIVES, SETTINGS
from storyrewrite.params import (LIGHTNING_ACCELERATORS, LIGHTNING_PRECISION_ALIASES, LIGHTNING_PRECISIONS, LIGHTNING_STRATEGIES,
                                 SECTIONS, DataConfig, DownloadConfig, ModelsConfig, Params, TrainConfig, build, load_yaml, overlay, with_overrides)
from storyrewrite.models.materialise import materialise
from storyrewrite.profiles import compiled_on_cpu, emulated_bf16, main

from helpers import ROOT


def _params(**changes) -> Params:
    return Params({**load_yaml(ROOT / "params.yaml"), **changes}, settings=SETTINGS)


def test_default_params_build_every_section():
    params = Params.load(ROOT / "params.yaml", settings=SETTINGS)
    params.check_all()
    assert params.task == "timetravel" and params.device == "auto"
    assert params.train_nll.batch_size == 2 and params.data.max_eval == 24
    assert params.download.bundled.files["timetravel/test.json"].path == "timetravel/test_data.json"
    assert params.llm.openai.model == "gpt-4o" and params.cpo.lambda_ == 1.0


def test_a_section_is_checked_only_when_read():
    # An invalid `dto` section does not concern a stage that never reads it (NLL training).
    params = _params(dto={"tau": -1.0, "hard": False})
    assert params.train_nll.lr == 3e-5
    with pytest.raises(InputError, match=r"^params: `dto\.tau` = -1\.0: Input should be greater than 0$"):
        params.dto


def test_unknown_key_names_key_and_valid_keys():
    with pytest.raises(InputError, match=r"^params: unknown key `data\.max_tran`; valid keys: val_fraction, max_train, max_eval$"):
        build(DataConfig, {"val_fraction": 0.1, "max_tran": 3}, "data")
    with pytest.raises(InputError, match=r"unknown key\(s\) `seeed` in .*; valid keys: seed, task,"):
        _params(seeed=1)


def test_the_objectives_sections_are_checked_where_the_objectives_are_known():
    """params.py knows no objective's section (the registry does: a new objective edits neither
    params.py nor the NLL stage's code). Without the registry's sections, a top-level mapping
    params.py does not know is an objective's, left unread; a scalar is a typo everywhere. With
    them (the train stage, `profiles check`), either is an error naming every valid key."""
    raw = load_yaml(ROOT / "params.yaml")
    assert {"dto", "cpo", "rl"} <= set(SETTINGS) <= set(raw)
    plain = Params({**raw, "unlisted": {"epsilon": 0.1}})
    assert plain.train_nll.lr == 3e-5
    with pytest.raises(InputError, match=r"^params: no section `dto`; valid: seed, task, .*, llm$"):
        plain.section("dto")
    with pytest.raises(InputError, match=r"`seeed` .*; valid keys: seed, .*, llm, or an objective's section \(a mapping\)$"):
        Params({**raw, "seeed": 1})
    with pytest.raises(InputError, match=r"unknown key\(s\) `unlisted` in params.yaml; valid keys: ") as caught:
        Params({**raw, "unlisted": {"epsilon": 0.1}}, settings=SETTINGS)
    valid = str(caught.value).split("valid keys: ")[1].split(", ")
    # every section, the objectives' after `train` as in params.yaml
    assert sorted(valid) == sorted([*SECTIONS, *SETTINGS]) and valid.index("train") + 1 == valid.index(next(iter(SETTINGS)))
    assert Params(raw, settings=SETTINGS).rl.samples == raw["rl"]["samples"]


def test_a_typo_in_a_nested_container_is_the_same_unknown_key_error():
    section = load_yaml(ROOT / "params.yaml")["download"]
    section["bundled"]["files"]["art/dev.jsonl"] = {"paht": "art/dev.jsonl", "sha256": "0" * 64}
    with pytest.raises(InputError) as caught:
        build(DownloadConfig, section, "download")
    assert str(caught.value) == "params: unknown key `download.bundled.files.art/dev.jsonl.paht`; valid keys: path, sha256"
    section = load_yaml(ROOT / "params.yaml")["download"]
    section["url"]["archives"]["art"]["member"] = {}
    with pytest.raises(InputError, match=r"^params: unknown key `download\.url\.archives\.art\.member`; valid keys: url, members, sha256$"):
        build(DownloadConfig, section, "download")


def test_wrong_type_names_key_and_type():
    with pytest.raises(InputError, match=r"^params: `data\.max_train` = 'ten': Input should be a valid integer"):
        build(DataConfig, {"val_fraction": 0.1, "max_train": "ten"}, "data")
    with pytest.raises(InputError, match=r"^params: `llm\.modes\[1\]` = \['rag'\]: Input should be a valid string$"):
        _params(llm={**load_yaml(ROOT / "params.yaml")["llm"], "modes": ["rag", ["rag"]]}).llm


def test_invalid_choice_lists_valid_values():
    with pytest.raises(InputError, match=r"^params: `task` = 'rocstories': Input should be 'timetravel', 'timetravel_ablated' or 'art'$"):
        _params(task="rocstories").task
    with pytest.raises(InputError, match=r"^params: `device` = 'gpu': valid values: auto, cpu, cuda, cuda:N$"):
        _params(device="gpu").device
    # A union of a boolean and a name (train.compile): the key itself, with every member's values.
    train = load_yaml(ROOT / "params.yaml")["train"]
    with pytest.raises(InputError, match=r"^params: `train\.compile` = 'max': valid values: true, false, 'reduce-overhead'$"):
        build(TrainConfig, {**train, "compile": "max"}, "train")
    assert build(TrainConfig, {**train, "compile": "reduce-overhead"}, "train").compile == "reduce-overhead"


def test_out_of_range_value():
    with pytest.raises(InputError, match=r"^params: `data\.val_fraction` = 1\.5: Input should be less than 1$"):
        build(DataConfig, {"val_fraction": 1.5}, "data")


def test_a_missing_key_and_a_budget_that_cannot_train_are_named():
    section = dict(load_yaml(ROOT / "params.yaml")["train_nll"])
    del section["lr"]
    with pytest.raises(InputError, match=r"^params: missing key `train_nll\.lr`$"):
        build(TrainConfig, section, "train_nll")
    section = dict(load_yaml(ROOT / "params.yaml")["train_nll"], max_steps=-1, max_epochs=0)
    with pytest.raises(InputError, match=r"^params: `train_nll\.max_epochs` = 0: must be >= 1 where max_steps is -1$"):
        build(TrainConfig, section, "train_nll")
    with pytest.raises(InputError, match=r"^params: `train_nll\.max_steps` = 0: must be -1 \(train for max_epochs\) or > 0$"):
        build(TrainConfig, dict(section, max_steps=0), "train_nll")


def _train(**changes) -> TrainConfig:
    return build(TrainConfig, dict(load_yaml(ROOT / "params.yaml")["train"], **changes), "train")


@pytest.mark.parametrize("key, value, valid", [
    ("precision", "bf16_mixed", "32-true, bf16-mixed, 16-mixed, "),
    ("accelerator", "gpus", "auto, cpu, cuda, gpu, mps, tpu"),
    ("strategy", "dpp", "auto, ddp, ddp_spawn, "),
    ("devices", "two", "auto, a count"),
    ("devices", 0, "auto, a count"),
    ("devices", [], "auto, a count"),
    ("devices", "0", "auto, a count"),
])
def test_a_lightning_setting_lightning_would_refuse_is_named_with_its_valid_values(key, value, valid):
    with pytest.raises(InputError, match=rf"^params: `train\.{key}` = {re.escape(repr(value))}: valid values: {re.escape(valid)}"):
        _train(**{key: value})


def test_a_validation_batch_limit_is_refused_where_lightning_would_refuse_it():
    from lightning.fabric.utilities.exceptions import MisconfigurationException
    from lightning.pytorch.trainer.setup import _determine_batch_limits

    for value in (None, 0, 1, 2, 0.0, 0.25, 1.0, 3.0, -1, -0.5, 1.5, 2.5, "all"):
        try:
            _determine_batch_limits(value, "limit_val_batches")
            lightning_takes = True
        except (MisconfigurationException, TypeError):  # (a str fails its comparisons)
            lightning_takes = False
        if lightning_takes:
            assert _train(limit_val_batches=value).limit_val_batches == value
        else:
            with pytest.raises(InputError, match=rf"^params: `train\.limit_val_batches` = {re.escape(repr(value))}: must be a share"):
                _train(limit_val_batches=value)
    # Lightning takes a bool as the number 0 or 1, which as a share means none or all: a YAML
    # `true` is a slip, and refused.
    with pytest.raises(InputError, match=r"^params: `train\.limit_val_batches` = True: must be a share"):
        _train(limit_val_batches=True)


def test_lightning_settings_it_takes_pass_and_a_precision_alias_becomes_its_name():
    # As Lightning reads the aliases: the name is what picks a step's autocast dtype (module.AUTOCAST_DTYPES).
    assert [_train(precision=alias).precision for alias in ("bf16", "16", 32, "64")] == ["bf16-mixed", "16-mixed", "32-true", "64-true"]
    assert [_train(devices=value).devices for value in ("auto", 2, -1, [0, 1], "0,1", "1,")] == ["auto", 2, -1, [0, 1], "0,1", "1,"]
    assert _train(accelerator="gpu", strategy="fsdp").strategy == "fsdp"


def test_the_lightning_values_are_lightnings_own():
    from lightning.fabric.plugins.precision.precision import (_PRECISION_INPUT_STR,
                                                              _PRECISION_INPUT_STR_ALIAS_CONVERSION)
    from lightning.pytorch.accelerators import AcceleratorRegistry
    from lightning.pytorch.strategies import StrategyRegistry

    assert set(LIGHTNING_PRECISIONS) == set(get_args(_PRECISION_INPUT_STR))
    assert LIGHTNING_PRECISION_ALIASES == _PRECISION_INPUT_STR_ALIAS_CONVERSION
    # "auto" and "gpu" are the Trainer's own words beside the registries' names.
    assert set(LIGHTNING_ACCELERATORS) == set(AcceleratorRegistry.available_accelerators()) | {"auto", "gpu"}
    assert set(LIGHTNING_STRATEGIES) == set(StrategyRegistry.available_strategies()) | {"auto"}


def test_a_bad_key_in_a_profile_stops_the_check_command_with_exit_2(tmp_path):
    (tmp_path / "bad.yaml").write_text("cpo:\n  beta: -2\n")
    result = subprocess.run([sys.executable, "-m", "storyrewrite.profiles", "check", str(tmp_path / "bad.yaml")],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.strip() == f"error: {tmp_path / 'bad.yaml'}:2: `cpo.beta` = -2: Input should be greater than 0"


def _check_errors(capsys, *argv: str) -> list[str]:
    """`profiles check ARGV`'s error lines; it must stop with exit status 2."""
    with pytest.raises(SystemExit) as stop:
        main(["check", *argv])
    assert stop.value.code == 2
    return capsys.readouterr().err.splitlines()


def test_the_check_names_the_file_and_line_that_set_a_bad_value(tmp_path, capsys):
    lines = (ROOT / "params.yaml").read_text().splitlines()
    beta = next(number for number, line in enumerate(lines, 1) if line.strip().startswith("beta:"))
    assert lines[beta - 2].startswith("cpo:")  # the beta of the cpo section, found by reading the file
    own = tmp_path / "params.yaml"
    own.write_text("\n".join(lines[:beta - 1] + ["  beta: -2"] + lines[beta:]) + "\n")
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text("cpo:\n  beta: -3\nllm:\n  modes: [rag, 3]\n")
    second.write_text("# the later profile wins\n\ncpo:\n  lambda: 1.0\n  beta: -4\n")

    def errors(*argv: str) -> list[str]:
        return _check_errors(capsys, *argv)

    greater = "Input should be greater than 0"
    # params.yaml's own line; profiles after --params too.
    assert errors("--params", str(own)) == [f"error: {own}:{beta}: `cpo.beta` = -2: {greater}"]
    # The last layer that sets the key, and a list item's own line.
    assert errors("--params", str(own), str(first), str(second)) == [
        f"error: {second}:5: `cpo.beta` = -4: {greater}", f"error: {first}:4: `llm.modes` has '3'; valid values: {', '.join(MODES)}"]
    # An override sets it: `-S` names it, not a file.
    assert errors(str(first), "-S", "cpo.beta=-5", "-S", "llm.modes=[rag,3]")[0] == f"error: -S: `cpo.beta` = -5: {greater}"
    # ... however DVC takes it: with the file's name, or as Hydra's forced add.
    assert errors(str(first), "-S", "params.yaml:cpo.beta=-6")[0] == f"error: -S: `cpo.beta` = -6: {greater}"
    assert errors(str(first), "-S", "++cpo.beta=-7")[0] == f"error: -S: `cpo.beta` = -7: {greater}"
    # A key params.yaml lacks: the profile's line that writes it.
    second.write_text("cpo:\n  beta: 1.0\n  betta: 2\n")
    assert errors(str(second))[0].startswith(f"error: {second}:3: unknown key `cpo.betta`; valid keys in `cpo`: ")


def test_two_keys_that_conflict_are_named_at_the_one_a_sweep_changes(tmp_path, capsys):
    # The leave-one-out baseline needs two samples: the error names `rl.samples` where it was set,
    # though `rl.baseline` is read after it.
    lines = (ROOT / "params.yaml").read_text().splitlines()
    samples = next(number for number, line in enumerate(lines, 1) if line.strip().startswith("samples:"))
    assert lines[samples - 2].startswith("rl:")
    needs = "the leave_one_out baseline needs >= 2 (or rl.baseline: greedy)"
    assert _check_errors(capsys, "-S", "rl.samples=1") == [f"error: -S: `rl.samples` = 1: {needs}"]
    own = tmp_path / "params.yaml"
    own.write_text("\n".join(lines[:samples - 1] + ["  samples: 1"] + lines[samples:]) + "\n")
    assert _check_errors(capsys, "--params", str(own)) == [f"error: {own}:{samples}: `rl.samples` = 1: {needs}"]
    assert _check_errors(capsys, "--params", str(own), "-S", "rl.baseline=leave_one_out") == [
        f"error: {own}:{samples}: `rl.samples` = 1: {needs}"]
    main(["check", "--params", str(own), "-S", "rl.baseline=greedy"])  # the self-critical baseline needs one
    assert capsys.readouterr().err == ""


def test_the_check_names_a_bad_registry_name_beside_a_bad_value(capsys):
    # One check names every error: the names the registries look up too, where another section fails.
    def errors(*overrides: str) -> list[str]:
        return _check_errors(capsys, *(word for override in overrides for word in ("-S", override)))

    objective = f"error: -S: `objective` = 'dto' is not valid; valid values: {', '.join(OBJECTIVES)}"
    assert errors("cpo.beta=-1", "objective=dto", "llm.modes=[rag,zero]") == [
        "error: -S: `cpo.beta` = -1: Input should be greater than 0", objective,
        f"error: -S: `llm.modes` has 'zero'; valid values: {', '.join(MODES)}"]
    # A section that does not validate is named once, and the look-ups that read it left out.
    assert errors("llm.modes=rag", "objective=dto") == ["error: -S: `llm.modes` = 'rag': Input should be a valid list", objective]
    assert errors("task=arts", "objective=dto") == [
        "error: -S: `task` = 'arts': Input should be 'timetravel', 'timetravel_ablated' or 'art'"]


def test_the_check_refuses_a_significance_baseline_that_is_no_system_of_the_run(capsys):
    # Before, such a sweep trained, generated and scored, then stopped at its significance stage.
    def errors(*overrides: str) -> list[str]:
        return _check_errors(capsys, *(word for override in overrides for word in ("-S", override)))

    for baseline in ("finetuned", "copy_original"):
        main(["check", "-S", f"significance.baseline={baseline}"])
        assert capsys.readouterr().err == ""
    assert errors("significance.baseline=llm_rag", "llm.modes=[zero_shot]") == [
        "error: -S: `significance.baseline` = 'llm_rag' is not a system of this run; "
        "systems: nll, finetuned, llm_zero_shot, copy_reference, copy_original"]
    assert errors("significance.baseline=copy_original", "task=art", "llm.modes=[]") == [  # ART has no original ending
        "error: -S: `significance.baseline` = 'copy_original' is not a system of this run; systems: nll, finetuned, copy_reference"]


def test_the_check_refuses_a_prompt_template_that_is_not_there(capsys):
    # Before, the check passed it, and each LLM stage ended in a FileNotFoundError traceback.
    def errors(*overrides: str) -> list[str]:
        return _check_errors(capsys, *(word for override in overrides for word in ("-S", override)))

    assert errors("llm.templates.timetravel=prompts/missing.txt") == [
        "error: -S: `llm.templates.timetravel` = prompts/missing.txt: no such file"]
    main(["check", "-S", "llm.templates.art=prompts/missing.txt"])  # another task's template: not read
    main(["check", "-S", "llm.templates.timetravel=prompts/missing.txt", "-S", "llm.modes=[]"])  # no LLM stage
    assert capsys.readouterr().err == ""


def test_a_number_boolean_or_null_given_as_a_name_gets_the_valid_names(capsys):
    # YAML and -S read `1`, `true` and `null` as such: a name's check still lists the valid ones.
    def errors(*overrides: str) -> list[str]:
        return _check_errors(capsys, *(word for override in overrides for word in ("-S", override)))

    assert errors("objective=1") == [f"error: -S: `objective` = '1' is not valid; valid values: {', '.join(OBJECTIVES)}"]
    assert errors("objective=null") == [f"error: -S: `objective` = 'null' is not valid; valid values: {', '.join(OBJECTIVES)}"]
    assert errors("llm.modes=[rag,true]") == [f"error: -S: `llm.modes` has 'true'; valid values: {', '.join(MODES)}"]
    assert errors("train.accelerator=1") == ["error: -S: `train.accelerator` = 1: valid values: auto, cpu, cuda, gpu, mps, tpu"]
    # A list is no name: the type error, as before.
    assert errors("objective=[score]") == ["error: -S: `objective` = ['score']: Input should be a valid string"]


def test_the_check_refuses_a_bundled_or_tiny_model_that_cannot_play_its_role(tmp_path, capsys):
    # Before, these passed the check and stopped a sweep's every experiment at its models stage.
    profile = tmp_path / "models.yaml"
    profile.write_text("models:\n  generator: tiny:llama\n  scorer: tiny:llama\n  judge: tiny:bart\n")
    assert _check_errors(capsys, str(profile), "-S", "models.embedder=tiny:lama", "-S", "models.nli=tiny:roberta") == [
        f"error: {profile}:4: `models.judge` = 'tiny:bart' is a bart model, not a causal LM; CF-PMI scores the ending as a "
        "continuation of the story (e.g. bundled:smollm2-135m-instruct, openai-community/gpt2-large)",
        "error: -S: `models.embedder` = 'tiny:lama': unknown tiny model `tiny:lama`; valid: tiny:bart, tiny:llama, tiny:roberta, "
        "tiny:roberta-nli",
        "error: -S: `models.nli` = 'tiny:roberta' is a roberta model, not a sequence classifier; EntScore needs an NLI "
        "classifier (e.g. FacebookAI/roberta-large-mnli)"]
    # The generator and the scorer of two vocabularies, one experiment of a sweep; a hub name is left to its stage.
    assert _check_errors(capsys, str(profile), "-S", "models.judge=null", "-S", "models.scorer=choice(tiny:bart,some-org/some-model)") == [
        "error: -S: `models.generator` (tiny:llama, 8449 tokens) and `models.scorer` (tiny:bart, 8454 tokens) do not share a "
        "vocabulary; pick a scorer of the generator's family (paper: facebook/bart-large-cnn for both) "
        "(experiment -S models.judge=null -S models.scorer=tiny\\:bart)"]


def test_the_check_refuses_a_model_directory_where_its_models_stage_would(tmp_path, capsys, tiny_model_dirs):
    # A local directory is read (config and tokenizer, no weights); each line is the stage's own error.
    bart, llama, nowhere = (str(path) for path in (tiny_model_dirs["bart"], tiny_model_dirs["llama"], tmp_path / "nowhere"))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "config.json").write_text("{}")

    def stage_error(roles: tuple[str, ...], **specs: str) -> str:
        config = ModelsConfig(**{"generator": "tiny:llama", "scorer": "tiny:llama", **specs}, max_input_tokens=32, max_output_tokens=16)
        with pytest.raises(InputError) as caught:
            materialise(config, tmp_path / "stage", seed=0, roles=roles)
        capsys.readouterr()  # (its progress bars)
        return f"error: {caught.value}".replace("error: params: ", "error: -S: ", 1)  # each spec set by -S here

    def check(**specs: str) -> list[str]:
        return _check_errors(capsys, *(word for role, spec in specs.items() for word in ("-S", f"models.{role}={spec}")))

    cases = [
        (("generator", "scorer"), dict(generator=nowhere, scorer="tiny:llama")),  # no such directory
        (("generator", "scorer"), dict(generator=str(tmp_path), scorer="tiny:llama")),  # a directory without a model
        (("generator", "scorer"), dict(generator=str(foreign), scorer="tiny:llama")),  # a config.json not a model's
        (("generator", "scorer"), dict(generator="no/such/model", scorer="tiny:llama")),  # relative, and no hub name
        (("generator", "scorer"), dict(generator="no such model", scorer="tiny:llama")),  # no hub name either
        (("generator", "scorer"), dict(generator=str(foreign / "config.json"), scorer="tiny:llama")),  # a file
        (("judge",), dict(judge=bart)),  # not a causal LM
        (("embedder",), dict(embedder=llama)),  # a decoder-only LM, not an encoder
        (("generator", "scorer"), dict(generator=bart, scorer=llama)),  # two vocabularies, both read here
        (("generator", "scorer"), dict(generator=llama, scorer="tiny:bart")),  # ... one of them catalogued
    ]
    for roles, specs in cases:
        expected = stage_error(roles, **specs)
        others = {} if "generator" in specs else {"generator": "tiny:llama", "scorer": "tiny:llama"}
        assert check(**others, **specs) == [expected], specs
    # The reasons, in words of the directory rather than of the hub name transformers took it for.
    assert "cannot be loaded (no such directory)" in stage_error(("generator", "scorer"), generator=nowhere)
    assert f"cannot be loaded ({tmp_path} has no config.json)" in stage_error(("generator", "scorer"), generator=str(tmp_path))
    assert f"cannot be loaded ({foreign / 'config.json'} is a file, not a model directory)" in stage_error(
        ("generator", "scorer"), generator=str(foreign / "config.json"))
    # Directories that can play their roles pass, as at their stage.
    assert main(["check", "-S", f"models.generator={llama}", "-S", f"models.scorer={llama}", "-S", f"models.judge={llama}"]) is None


def test_check_all_reports_every_invalid_section_a_line_each():
    raw = load_yaml(ROOT / "params.yaml")
    params = _params(task="ar", cpo=dict(raw["cpo"], beta=-2), llm=dict(raw["llm"], modes="rag"))
    with pytest.raises(InputError) as error:
        params.check_all()
    assert str(error.value).split("\nerror: ") == [
        "params: `task` = 'ar': Input should be 'timetravel', 'timetravel_ablated' or 'art'",
        "params: `cpo.beta` = -2: Input should be greater than 0",
        "params: `llm.modes` = 'rag': Input should be a valid list"]
    # The command prints them as it prints one: `error: ` before each.
    result = subprocess.run([sys.executable, "-m", "storyrewrite.profiles", "check", "--params", "/dev/stdin"],
                            input=yaml.safe_dump(params.raw), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.splitlines() == ["error: " + line for line in str(error.value).split("\nerror: ")]


def test_exponent_without_dot_reads_as_float():
    # PyYAML loads `5e-9` as a string; the paper's lr is written that way.
    section = dict(load_yaml(ROOT / "params.yaml")["train_nll"], lr="5e-9")
    assert build(TrainConfig, section, "train_nll").lr == pytest.approx(5e-9)


def test_profiles_compose_and_every_section_stays_valid():
    base = load_yaml(ROOT / "params.yaml")
    gpu, paper = load_yaml(ROOT / "params" / "gpu.yaml"), load_yaml(ROOT / "params" / "paper.yaml")
    smoke, fp32 = load_yaml(ROOT / "params" / "smoke.yaml"), load_yaml(ROOT / "params" / "fp32.yaml")
    for layers in ([gpu], [paper], [gpu, paper], [gpu, smoke], [gpu, smoke, fp32], [paper, fp32]):
        merged = base
        for layer in layers:
            merged = overlay(merged, layer)
        Params(merged, settings=SETTINGS).check_all()
    both = Params(overlay(overlay(base, gpu), paper))
    # The paper's models and token budgets, the GPU profile's precision and data.
    assert both.models.generator == "facebook/bart-large-cnn" and both.models.max_input_tokens == 1024
    assert both.train_nll.precision == "bf16-mixed" and both.data.max_train is None
    # The rehearsal: the GPU profile's precision, a few instances and steps, no data-loading
    # workers on the CPU (tests/training covers them).
    rehearsal = Params(overlay(overlay(base, gpu), smoke))
    assert rehearsal.train.precision == "bf16-mixed" and rehearsal.train.num_workers == 0
    assert rehearsal.data.max_train == 24 and rehearsal.train_nll.max_steps == 4
    # On a CPU without bf16 instructions: the same rehearsal, float32 throughout.
    in_fp32 = Params(overlay(overlay(overlay(base, gpu), smoke), fp32), settings=SETTINGS)
    assert (in_fp32.train_nll.precision, in_fp32.train.precision, in_fp32.rl.sample_dtype, in_fp32.generate.dtype,
            in_fp32.score.dtype, in_fp32.llm.local_dtype) == ("32-true", "32-true", "float32", "float32", "float32", "float32")
    # A profile under it that scores in bf16 scores in float32 again.
    assert Params(overlay(overlay(base, {"score": {"dtype": "bfloat16"}}), fp32)).score.dtype == "float32"
    assert in_fp32.data.max_train == 24 and in_fp32.train.max_steps == 4 and in_fp32.generate.batch_size == 8
    result = subprocess.run([sys.executable, "-m", "storyrewrite.profiles", "overrides", "params/gpu.yaml", "params/paper.yaml"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "-S models.generator=facebook/bart-large-cnn" in result.stdout and "-S data.max_train=null" in result.stdout


def test_a_profile_may_not_invent_keys(tmp_path):
    base = load_yaml(ROOT / "params.yaml")
    with pytest.raises(InputError, match=r"^profile: unknown key `train\.lr_schedule`; valid keys in `train`: "
                                         + ", ".join(base["train"]) + "$"):
        overlay(base, {"train": {"lr_schedule": "cosine"}})
    # The command names the profile's file and line, and the top-level keys for a section that does not exist.
    profile = tmp_path / "mine.yaml"
    profile.write_text("trian:\n  lr: 0.1\n")
    result = subprocess.run([sys.executable, "-m", "storyrewrite.profiles", "check", "params/gpu.yaml", str(profile)],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {profile}:1: unknown key `trian`; valid keys: {', '.join(base)}"


def test_dvc_overrides_are_checked_as_the_experiment_reads_them_each_experiment_of_a_sweep(capsys, shipped_objectives):
    base = load_yaml(ROOT / "params.yaml")
    # DVC's own parsing: YAML-like values, a list, a sweep expanded as `--queue` expands it.
    experiments = with_overrides(base, ["train.lr=2e-5", "llm.modes=[rag,zero_shot]", "objective=choice(score,delta)",
                                        "cpo.beta=range(1,3)"])
    assert [label for label, _ in experiments] == [
        f"-S train.lr=2e-05 -S llm.modes=[rag,zero_shot] -S objective={o} -S cpo.beta={b}"
        for o in ("score", "delta") for b in (1, 2)]
    assert [(raw["objective"], raw["cpo"]["beta"]) for _, raw in experiments] == [
        ("score", 1), ("score", 2), ("delta", 1), ("delta", 2)]
    # DVC writes 2e-05 (YAML 1.2), which PyYAML reads as a string: the section's type reads it as the number.
    assert all(Params(raw).train.lr == 2e-5 and raw["llm"]["modes"] == ["rag", "zero_shot"] for _, raw in experiments)
    # Everything else as params.yaml has it.
    assert {k: v for k, v in experiments[0][1].items() if k not in ("train", "llm", "objective", "cpo")} == {
        k: v for k, v in base.items() if k not in ("train", "llm", "objective", "cpo")}
    assert with_overrides(base, []) == [("", base)]
    # A key params.yaml lacks: the keys valid there, as a profile's is refused.
    with pytest.raises(InputError, match=r"^-S train\.max_step=5: unknown key `train\.max_step`; valid keys in `train`: "
                                         + ", ".join(base["train"]) + "$"):
        with_overrides(base, ["train.max_step=5"])
    with pytest.raises(InputError, match=r"^-S: only params\.yaml's keys are checked, not other\.yaml's$"):
        with_overrides(base, ["other.yaml:a=1"])
    # A value DVC's grammar cannot read (a model directory's `~`): the character, and the value quoted,
    # which DVC then reads as the text written.
    with pytest.raises(InputError) as caught:
        with_overrides(base, ["objective=score", "models.generator=~/my_models/bart#2"])
    assert str(caught.value) == (
        "-S models.generator=~/my_models/bart#2: not an override DVC's -S can read (Hydra's override grammar: no token starts "
        "at `~`; https://hydra.cc/docs/advanced/override_grammar/basic); quote the value: -S \"models.generator='~/my_models/bart#2'\"")
    [(_, quoted)] = with_overrides(base, ["models.generator='~/my_models/bart#2'"])
    assert quoted["models"]["generator"] == "~/my_models/bart#2"
    with pytest.raises(InputError, match=r"^-S llm\.modes=\[rag: not an override .*basic\)$"):  # the grammar's own syntax: no quotes
        with_overrides(base, ["llm.modes=[rag"])

    # The command: the names the registries hold, in every experiment of a sweep, each error naming it.
    errors = _check_errors(capsys, "-S", "objective=choice(score,delta)", "-S", "task=choice(timetravel,art)", "-S", "llm.modes=[rag,zero]")
    mode = "error: -S: `llm.modes` has 'zero'; valid values: zero_shot, one_shot_random, one_shot_fixed, rag"
    art = ("error: -S: `objective` = 'delta' needs the original ending, which task 'art' does not have; "
           "objectives for this task: nll, score, rloo")
    label = "(experiment -S objective={} -S task={} -S llm.modes=[rag,zero])".format
    assert errors == [
        f"{mode} {label('score', 'timetravel')}", f"{mode} {label('score', 'art')}",
        f"{mode} {label('delta', 'timetravel')}", f"{art} {label('delta', 'art')}", f"{mode} {label('delta', 'art')}"]
    main(["check", "params/gpu.yaml", "-S", "objective=choice(score,delta,score_delta)"])
    assert capsys.readouterr().out == ("ok: params.yaml + params/gpu.yaml -S objective=choice(score,delta,score_delta) "
                                       "(3 experiments)\n")
    main(["overrides", "params/gpu.yaml", "-S", "objective=delta", "-S", "llm.modes=[rag]"])
    assert capsys.readouterr().out.rstrip("\n").endswith("-S train.batch_size=16 -S train.val_batch_size=64 -S train.max_steps=300 "
        "-S train.val_check_interval=100 -S train.checkpoint_every_n_steps=100 -S train.precision=bf16-mixed "
        "-S train.num_workers=4 -S generate.batch_size=512 -S generate.dtype=bfloat16 -S score.batch_size=64 "
        "-S llm.local_batch_size=256 -S llm.local_dtype=bfloat16 -S rl.cache=static -S rl.early_stop=false "
        "-S rl.sample_dtype=bfloat16 -S objective=delta -S llm.modes=[rag]")


def test_the_printed_overrides_split_by_the_shell_give_the_profile(tmp_path, capsys):
    # `dvc exp run $(python -m storyrewrite.profiles overrides P)`: the shell splits the output at
    # spaces and never unquotes it. Those words, applied by DVC's functions, are the profile.
    base = load_yaml(ROOT / "params.yaml")
    profile = {"llm": {"modes": ["zero_shot", "rag"], "max_new_tokens": 12}, "train": {"lr": 1.0e-5, "seed": None},
               "models": {"generator": "tiny:llama", "scorer": "tiny:llama"}}
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(profile))
    main(["overrides", str(tmp_path / "mine.yaml")])
    words = capsys.readouterr().out.split()
    assert words[::2] == ["-S"] * (len(words) // 2) and "llm.modes=[zero_shot,rag]" in words
    [(_, applied)] = with_overrides(base, words[1::2])
    assert Params(applied).llm == Params(overlay(base, profile)).llm
    assert Params(applied).train == Params(overlay(base, profile)).train and applied["models"]["generator"] == "tiny:llama"
    # A value with a space would be split: refused, naming it.
    (tmp_path / "spaced.yaml").write_text(yaml.safe_dump({"llm": {"openai": {"model": "my model"}}}))
    with pytest.raises(SystemExit) as stop:
        main(["overrides", str(tmp_path / "spaced.yaml")])
    assert stop.value.code == 2 and capsys.readouterr().err.startswith(
        "error: overrides: `llm.openai.model=my model` has a space or a quote")


def test_params_yaml_named_as_a_profile_changes_nothing(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    main(["overrides", "params/gpu.yaml"])
    alone = capsys.readouterr().out
    main(["overrides", "params.yaml", "params/gpu.yaml", "./params.yaml"])
    assert capsys.readouterr().out == alone and "-S train.batch_size=16 " in alone
    main(["overrides", "params.yaml"])
    assert capsys.readouterr().out == "\n"
    main(["check", "params.yaml", "params/gpu.yaml", "--elsewhere"])
    assert capsys.readouterr().out == "ok: params.yaml + params/gpu.yaml\n"


def test_bf16_on_a_cpu_without_bf16_instructions_is_named_before_a_comparison_queues_it(monkeypatch, capsys):
    base = load_yaml(ROOT / "params.yaml")
    rehearsal = overlay(overlay(base, load_yaml(ROOT / "params/gpu.yaml")), load_yaml(ROOT / "params/smoke.yaml"))
    every = ["train_nll.precision=bf16-mixed", "train.precision=bf16-mixed", "generate.dtype=bfloat16", "llm.local_dtype=bfloat16"]

    def gpu() -> bool:
        return True

    def no_gpu() -> bool:
        return False

    assert emulated_bf16(rehearsal, False, no_gpu) == every
    # RLOO's sampling copy, in an RLOO run alone (no other objective reads it).
    assert emulated_bf16({**rehearsal, "objective": "rloo"}, False, no_gpu) == [*every[:2], "rl.sample_dtype=bfloat16", *every[2:]]
    # Not where the CPU has bf16 instructions or is not known, where a GPU takes the run, or in
    # float32 (params.yaml, fp32.yaml).
    assert emulated_bf16(rehearsal, True, no_gpu) == [] and emulated_bf16(rehearsal, None, no_gpu) == []
    assert emulated_bf16(rehearsal, False, gpu) == []
    assert emulated_bf16({**rehearsal, "device": "cuda:0"}, False, no_gpu) == every[:2]  # training: its `accelerator`
    assert emulated_bf16(overlay(rehearsal, load_yaml(ROOT / "params/fp32.yaml")), False, no_gpu) == []
    assert emulated_bf16(base, False, no_gpu) == []
    # Each stage where it runs: `device` places generation, scoring and the LLM baselines, a
    # training section's Lightning `accelerator` its training, on the CPU GPU or not.
    cpu_device = overlay(rehearsal, {"device": "cpu", "score": {"dtype": "bfloat16"}})
    assert emulated_bf16(cpu_device, False, gpu) == ["generate.dtype=bfloat16", "score.dtype=bfloat16", "llm.local_dtype=bfloat16"]
    one = overlay(base, {"train": {"accelerator": "cpu", "precision": "bf16-true"}})
    assert emulated_bf16(one, False, gpu) == ["train.precision=bf16-true"]
    assert emulated_bf16(overlay(one, {"train": {"accelerator": "gpu"}}), False, no_gpu) == []
    # The command warns on stderr and still passes the check; each setting named once over a sweep.
    monkeypatch.setattr("storyrewrite.profiles.cpu_has_bf16", lambda: False)
    monkeypatch.setattr("storyrewrite.profiles.cuda_available", gpu)
    main(["check", "params/gpu.yaml", "-S", "device=cpu", "-S", "train.accelerator=cpu",
          "-S", "train.precision=choice(32-true,bf16-true)"])
    out, err = capsys.readouterr()
    assert out.startswith("ok: ")
    assert err.startswith("warning: generate.dtype=bfloat16 llm.local_dtype=bfloat16 "
                          "train.precision=bf16-true would run on this machine's CPU") and "params/fp32.yaml" in err
    # Not for a run on another machine (offline/job.sh's check of a GPU job, made before it is packed).
    main(["check", "--elsewhere", "params/gpu.yaml", "-S", "device=cpu", "-S", "train.accelerator=cpu"])
    out, err = capsys.readouterr()
    assert out.startswith("ok: ") and err == ""


def test_a_seed_outside_what_numpy_and_lightning_take_stops_the_check(capsys):
    # Lightning's seed_everything refuses a seed outside 0 … 2**32 − 1 and numpy's bootstrap a
    # negative one, with a ValueError: such a seed would have failed in train_nll, after prepare
    # had drawn its splits with it.
    import lightning as L
    import numpy as np

    for bad in (-1, 2**32):
        with pytest.raises(ValueError):
            L.seed_everything(bad, verbose=False)
    with pytest.raises(ValueError):
        np.random.default_rng(-1)
    assert _check_errors(capsys, "-S", "seed=-1", "-S", "train.seed=4294967296") == [
        "error: -S: `seed` = -1: Input should be greater than or equal to 0",
        "error: -S: `train.seed` = 4294967296: Input should be less than or equal to 4294967295"]
    main(["check", "-S", "seed=4294967295", "-S", "train_nll.seed=0"])
    assert capsys.readouterr().out.startswith("ok: params.yaml -S seed=4294967295")


def test_compiling_on_a_cpu_is_named_before_the_run(monkeypatch, capsys):
    base = load_yaml(ROOT / "params.yaml")
    compiled = overlay(base, {"train": {"compile": True}, "train_nll": {"compile": "reduce-overhead"}})
    assert compiled_on_cpu(compiled, lambda: False) == ["train_nll.compile=reduce-overhead", "train.compile=true"]
    assert compiled_on_cpu(compiled, lambda: True) == []  # `auto` takes the GPU
    assert compiled_on_cpu(overlay(compiled, {"train": {"accelerator": "cpu"}}), lambda: True) == ["train.compile=true"]
    assert compiled_on_cpu(base, lambda: False) == []
    monkeypatch.setattr("storyrewrite.profiles.cuda_available", lambda: False)
    monkeypatch.chdir(ROOT)
    main(["check", "-S", "train.compile=choice(true,false)"])
    err = capsys.readouterr().err
    assert "warning: train.compile=true would compile on this machine's CPU: torch.compile is for a GPU" in err
    main(["check", "-S", "train.compile=true", "--elsewhere"])
    assert "compile" not in capsys.readouterr().err
