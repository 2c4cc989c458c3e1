"""``did_you_mean``, behind every "unknown name" error (tasks, models, modules, recipes, options)."""

from sampan.utils.names import did_you_mean


def test_did_you_mean_names_the_closest_choice_or_nothing():
    assert did_you_mean("sentimnt_analysis", ["ner", "sentiment_analysis"]) == "did you mean 'sentiment_analysis'? "
    assert did_you_mean("translation", ["ner", "sentiment_analysis"]) == ""  # nothing close: no guess
    assert did_you_mean(None, ["ner"]) == "" and did_you_mean(3, ["ner"]) == ""
    assert did_you_mean("x", []) == ""
