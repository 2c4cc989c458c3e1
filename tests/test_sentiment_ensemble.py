"""The sentiment ensemble (issue 39): the numpy n-gram scorer against scikit-learn, its files, the dev
weight search, the shipped ensemble through Taskflow, and the hand-written hard review set.

Cost (measured on this 2-core machine): 15 s for the file, the shipped model's export into a
fresh cache included (the n-gram, weight and hard-set tests alone ~4 s).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sampan.hub.sentiment_ensemble import NgramEnsembleConfig, card_metrics, pick_weight
from sampan.text.ngram_classifier import VOCAB_FILE, WEIGHTS_FILE, NgramClassifier, nb_log_ratios

HARD_SET = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "hard_reviews.jsonl"


@pytest.fixture(scope="module")
def reviews():
    from sampan.finetune.data import load_task_data

    return load_task_data("sentiment_analysis")


@pytest.fixture(scope="module")
def fitted(reviews):
    """scikit-learn's char 1-3-gram TF-IDF + logistic regression on 200 training reviews."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    train = reviews.train[:200]
    vectorizer = TfidfVectorizer(analyzer="char", ngram_range=(1, 3), sublinear_tf=True)
    features = vectorizer.fit_transform([ex.text for ex in train])
    classifier = LogisticRegression(max_iter=2000, C=4.0).fit(features, [ex.label for ex in train])
    return vectorizer, classifier


def _probe_texts(reviews) -> list[str]:
    # Held-out reviews, plus what the analyzer treats specially: case, runs of whitespace, a
    # single character, text with no n-gram in the vocabulary, and the empty string.
    return [ex.text for ex in reviews.test[:150]] + ["ABC 好  用\t\t吗", "好", "☃☃☃", "", "Very GOOD 非常好"]


def test_numpy_scorer_equals_sklearn(reviews, fitted):
    vectorizer, classifier = fitted
    model = NgramClassifier.from_sklearn(vectorizer, classifier)
    texts = _probe_texts(reviews)
    expected = classifier.predict_proba(vectorizer.transform(texts))[:, 1]
    np.testing.assert_allclose(model.predict_proba(texts), expected, rtol=0, atol=1e-9)
    assert model.classes == tuple(classifier.classes_)
    assert model.predict_proba(["☃☃☃"])[0] == pytest.approx(1 / (1 + np.exp(-classifier.intercept_[0])), abs=1e-12)


def test_nb_scaled_columns_fold_into_the_coefficients(reviews, fitted):
    """NBSVM: the regression fitted on columns scaled by the naive-Bayes log-count ratios is the
    same numpy model with the scales folded into its coefficients."""
    from scipy.sparse import diags
    from sklearn.linear_model import LogisticRegression

    vectorizer, _ = fitted
    train = reviews.train[:200]
    features = vectorizer.transform([ex.text for ex in train])
    labels = np.array([ex.label for ex in train])
    scale = nb_log_ratios(features, labels == "positive")
    classifier = LogisticRegression(max_iter=2000, C=4.0).fit(features @ diags(scale), labels)
    model = NgramClassifier.from_sklearn(vectorizer, classifier, feature_scale=scale)
    texts = _probe_texts(reviews)
    expected = classifier.predict_proba(vectorizer.transform(texts) @ diags(scale))[:, 1]
    np.testing.assert_allclose(model.predict_proba(texts), expected, rtol=0, atol=1e-9)


def test_saved_files_load_back_without_pickle(reviews, fitted, tmp_path):
    vectorizer, classifier = fitted
    model = NgramClassifier.from_sklearn(vectorizer, classifier)
    texts = _probe_texts(reviews)
    model.save(tmp_path / "exact", dtype="float64")
    exact = NgramClassifier.load(tmp_path / "exact")
    np.testing.assert_allclose(exact.predict_proba(texts), model.predict_proba(texts), rtol=0, atol=1e-12)
    model.save(tmp_path / "store")  # the store's fp16
    meta = json.loads((tmp_path / "store" / VOCAB_FILE).read_text(encoding="utf-8"))
    assert meta["vocabulary"] == model.vocabulary and meta["classes"] == list(model.classes)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "store" / WEIGHTS_FILE), framework="np") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F16"}
    stored = NgramClassifier.load(tmp_path / "store")
    # fp16 keeps about three significant digits of each weight: the probabilities move by < 1e-2
    np.testing.assert_allclose(stored.predict_proba(texts), model.predict_proba(texts), atol=1e-2)


def test_damaged_or_unsupported_models_are_refused(fitted, tmp_path):
    from sklearn.feature_extraction.text import TfidfVectorizer

    vectorizer, classifier = fitted
    with pytest.raises(ValueError, match="one idf and one coefficient per vocabulary entry"):
        NgramClassifier(vocabulary=["a", "b"], idf=np.ones(2), coef=np.ones(3), intercept=0.0, classes=("n", "p"))
    with pytest.raises(ValueError, match="differs in"):
        NgramClassifier.from_sklearn(TfidfVectorizer(analyzer="word"), classifier)
    with pytest.raises(FileNotFoundError, match="ngram.json"):
        NgramClassifier.load(tmp_path)


def test_the_weight_is_the_dev_accuracy_argmax():
    gold = np.array([True, True, False, False, True])
    ernie = np.array([0.9, 0.4, 0.2, 0.6, 0.9])  # wrong on rows 1 and 3
    ngram = np.array([0.6, 0.8, 0.45, 0.3, 0.3])  # wrong on row 4
    weight, accuracy = pick_weight(ernie, ngram, gold, steps=4)
    assert accuracy == 1.0 and weight == 0.5  # only the even mix gets all five right
    assert pick_weight(ernie, ernie, gold, steps=4)[1] == 0.6
    with pytest.raises(ValueError, match="max_features must be >= 0"):
        NgramEnsembleConfig(max_features=-1)


def test_the_card_headline_is_the_ensembles_accuracy():
    """What `sampan hub list` shows as the model's accuracy is what Taskflow answers with; the
    fine-tune's own test figures stay as ernie_test_*."""
    fine_tune = {"test_accuracy": 0.83, "test_loss": 0.43, "test_examples": 3480, "trainable_parameters": 7}
    parts = {"test_accuracy": 0.856, "test_examples": 3480, "ernie_test_accuracy": 0.83, "ngram_test_accuracy": 0.845}
    card = card_metrics(fine_tune, parts)
    assert card == {"test_accuracy": 0.856, "test_examples": 3480, "ernie_test_accuracy": 0.83,
                    "ernie_test_loss": 0.43, "ngram_test_accuracy": 0.845, "trainable_parameters": 7}
    assert card_metrics(card, parts) == card  # attaching again changes nothing


def test_hard_review_set_is_well_formed_and_unseen(reviews):
    rows = [json.loads(line) for line in HARD_SET.read_text(encoding="utf-8").splitlines()]
    assert len(rows) >= 150
    assert all(set(r) == {"text", "label", "domain", "kind"} for r in rows)
    assert {r["label"] for r in rows} == {"positive", "negative"}
    texts = [r["text"] for r in rows]
    assert all(t.strip() == t and t for t in texts)
    assert len(set(texts)) == len(texts)
    seen = {ex.text for ex in reviews.train + reviews.dev + reviews.test}
    assert not set(texts) & seen
    assert {r["kind"] for r in rows} >= {"negation", "double_negation", "contrast", "sarcasm", "short"}


@pytest.fixture(scope="module")
def flow(tmp_path_factory):
    from sampan.taskflow import Taskflow

    with pytest.MonkeyPatch.context() as mp:  # a fresh export cache, as a user's first call has
        mp.setenv("SAMPAN_HOME", str(tmp_path_factory.mktemp("sampan-home")))
        yield Taskflow("sentiment_analysis")


def test_shipped_ensemble_keeps_the_schema_and_averages_its_parts(flow):
    texts = ["这家餐厅的服务非常棒", "质量太差了，用了两天就坏了", "一般般吧，没有想象中好，但也不算差"]
    out = flow(texts)
    assert [sorted(r) for r in out] == [["label", "score", "text"]] * 3
    assert [r["text"] for r in out] == texts
    assert all(r["label"] in ("positive", "negative") and 0.5 <= r["score"] <= 1.0 for r in out)
    task = flow.task
    assert task.ngram is not None and 0.0 < task.ngram_weight < 1.0
    parts = task.components(texts)
    mixed = (1 - task.ngram_weight) * parts["ernie"] + task.ngram_weight * parts["ngram"]
    np.testing.assert_allclose([r["score"] for r in out], mixed.max(axis=1), atol=5e-5)
    assert [task.labels[i] for i in mixed.argmax(axis=1)] == [r["label"] for r in out]


def test_shipped_ensemble_gets_the_obvious_reviews_right(flow):
    positive = ["这家餐厅的服务非常棒", "物流很快，包装完好，很满意"]
    negative = ["质量太差了，用了两天就坏了", "客服态度恶劣，再也不买了", "房间又脏又吵，非常失望"]
    out = flow(positive + negative)
    assert [r["label"] for r in out] == ["positive"] * 2 + ["negative"] * 3, out


def test_the_attach_command_uses_the_recipes_ngram_settings():
    """``python -m sampan.hub.sentiment_ensemble DIR`` builds with NgramEnsembleConfig's defaults: they
    must be the sentiment recipe's, or a model attached that way differs from a recipe build."""
    from sampan.hub.recipes import SentimentRecipe
    from sampan.hub.sentiment_ensemble import NgramEnsembleConfig

    assert SentimentRecipe().ngram == NgramEnsembleConfig()
