"""A character n-gram TF-IDF + logistic-regression text classifier, scored in numpy from JSON + safetensors.

It is scikit-learn's ``TfidfVectorizer(analyzer="char", ngram_range=(lo, hi), sublinear_tf=True)``
followed by a binary ``LogisticRegression``, re-implemented at inference in a few lines so that a
shipped model needs neither scikit-learn nor pickle: the vocabulary (and the settings that shape it)
lives in ``ngram.json``, the per-n-gram idf and coefficients in ``ngram.safetensors``. scikit-learn is
only used to fit it (``from_sklearn``; ``sampan hub build ernie-tiny-sentiment``), and a test holds the
scores equal to scikit-learn's probabilities to 1e-9.

The steps, as scikit-learn does them: lowercase; runs of two or more whitespace characters become one
space; every character n-gram for n in ``ngram_range``; counts of the n-grams in the vocabulary
(others dropped); ``1 + ln(count)``; times the n-gram's idf; divided by the vector's L2 norm; dot
the coefficients, plus the intercept; the logistic function gives the second class's probability.
A regression fitted on NBSVM-scaled columns (``nb_log_ratios``) is the same model with each
coefficient times its column's scale, so it needs nothing more at inference.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

VOCAB_FILE = "ngram.json"
WEIGHTS_FILE = "ngram.safetensors"
FORMAT = 1
# scikit-learn's _VectorizerMixin._white_spaces: two or more whitespace characters -> one space.
_WHITE_SPACES = re.compile(r"\s\s+")


@dataclass
class NgramClassifier:
    """A fitted binary char n-gram TF-IDF + logistic-regression model.

    Fields:
        vocabulary: the n-grams kept, in feature order.
        idf: each n-gram's inverse document frequency (float64, ``len(vocabulary)``).
        coef: the logistic regression's coefficient per n-gram (float64, ``len(vocabulary)``).
        intercept: the logistic regression's intercept.
        classes: the two class names; ``predict_proba`` is the probability of ``classes[1]``.
        ngram_range: the smallest and largest n-gram length.
        lowercase: lowercase the text first (scikit-learn's default).
    """

    vocabulary: list[str]
    idf: np.ndarray
    coef: np.ndarray
    intercept: float
    classes: tuple[str, str]
    ngram_range: tuple[int, int] = (1, 3)
    lowercase: bool = True

    def __post_init__(self) -> None:
        self.idf = np.asarray(self.idf, dtype=np.float64)
        self.coef = np.asarray(self.coef, dtype=np.float64)
        n = len(self.vocabulary)
        if self.idf.shape != (n,) or self.coef.shape != (n,):
            raise ValueError(f"an n-gram model needs one idf and one coefficient per vocabulary entry: {n} n-grams, "
                             f"idf {self.idf.shape}, coef {self.coef.shape}; the files are damaged or mismatched")
        if len(self.classes) != 2:
            raise ValueError(f"the n-gram model is binary, got classes {self.classes!r}")
        lo, hi = self.ngram_range
        if not 1 <= lo <= hi:
            raise ValueError(f"ngram_range must be (lo, hi) with 1 <= lo <= hi, got {self.ngram_range!r}")
        self._index = {gram: i for i, gram in enumerate(self.vocabulary)}
        if len(self._index) != n:
            raise ValueError("the n-gram vocabulary repeats an entry; the files are damaged")

    def ngrams(self, text: str) -> list[str]:
        """The character n-grams of ``text``, as scikit-learn's char analyzer makes them."""
        if self.lowercase:
            text = text.lower()
        text = _WHITE_SPACES.sub(" ", text)
        lo, hi = self.ngram_range
        return [text[i: i + n] for n in range(lo, min(hi, len(text)) + 1) for i in range(len(text) - n + 1)]

    def decision_function(self, texts: Sequence[str]) -> np.ndarray:
        """The logistic regression's score (log-odds of ``classes[1]``) for each text."""
        out = np.empty(len(texts), dtype=np.float64)
        for row, text in enumerate(texts):
            counts = Counter(self._index[g] for g in self.ngrams(text) if g in self._index)
            if not counts:  # no known n-gram: an all-zero vector, the intercept alone
                out[row] = self.intercept
                continue
            idx = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
            tf = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
            weights = (np.log(tf) + 1.0) * self.idf[idx]
            out[row] = float(weights @ self.coef[idx]) / math.sqrt(float(weights @ weights)) + self.intercept
        return out

    def predict_proba(self, texts: Sequence[str]) -> np.ndarray:
        """The probability of ``classes[1]`` for each text (shape ``(len(texts),)``)."""
        return 1.0 / (1.0 + np.exp(-self.decision_function(texts)))

    # -- from scikit-learn, to and from disk ----------------------------------------------------------
    @classmethod
    def from_sklearn(cls, vectorizer: Any, classifier: Any, feature_scale: np.ndarray | None = None) -> NgramClassifier:
        """The model of a fitted ``TfidfVectorizer`` (char analyzer, sublinear tf, smooth idf, l2
        norm) and a binary ``LogisticRegression`` fitted on its output, each column first multiplied
        by ``feature_scale`` when given (NBSVM's naive-Bayes log-count ratios, ``nb_log_ratios``):
        a per-column scale after the norm folds into the coefficients exactly."""
        settings = vectorizer.get_params()
        expected = {"analyzer": "char", "sublinear_tf": True, "norm": "l2", "use_idf": True, "binary": False,
                    "strip_accents": None, "preprocessor": None, "tokenizer": None}
        wrong = {k: settings[k] for k, v in expected.items() if settings[k] != v}
        if wrong:
            raise ValueError(f"NgramClassifier re-implements TfidfVectorizer with {expected}; this one differs in "
                             f"{wrong}")
        if len(classifier.classes_) != 2:
            raise ValueError(f"NgramClassifier is binary; the classifier has classes {list(classifier.classes_)}")
        vocabulary = [""] * len(vectorizer.vocabulary_)
        for gram, i in vectorizer.vocabulary_.items():
            vocabulary[i] = gram
        coef = np.asarray(classifier.coef_[0], dtype=np.float64)
        if feature_scale is not None:
            coef = coef * np.asarray(feature_scale, dtype=np.float64)
        return cls(vocabulary=vocabulary, idf=vectorizer.idf_, coef=coef,
                   intercept=float(classifier.intercept_[0]), classes=tuple(str(c) for c in classifier.classes_),
                   ngram_range=tuple(settings["ngram_range"]), lowercase=bool(settings["lowercase"]))

    def save(self, directory: str | Path, dtype: str = "float16") -> None:
        """Write ``ngram.json`` and ``ngram.safetensors`` into ``directory`` (atomically, each).
        ``dtype``: of the stored idf and coefficients (the model store keeps fp16)."""
        from safetensors.numpy import save

        from sampan.utils.atomic import atomic_write

        directory = Path(directory)
        meta = {"format": FORMAT, "kind": "char_tfidf_logistic_regression", "classes": list(self.classes),
                "ngram_range": list(self.ngram_range), "lowercase": self.lowercase, "sublinear_tf": True,
                "norm": "l2", "intercept": self.intercept, "vocabulary": self.vocabulary}
        tensors = {"idf": self.idf.astype(dtype), "coef": self.coef.astype(dtype)}
        atomic_write(directory / WEIGHTS_FILE, save(tensors))
        atomic_write(directory / VOCAB_FILE, json.dumps(meta, ensure_ascii=False, separators=(",", ":")) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> NgramClassifier:
        """The model saved by ``save`` in ``directory`` (no pickle: JSON and safetensors)."""
        from safetensors.numpy import load_file

        directory = Path(directory)
        vocab_path, weights_path = directory / VOCAB_FILE, directory / WEIGHTS_FILE
        for path in (vocab_path, weights_path):
            if not path.is_file():
                raise FileNotFoundError(f"{path} is missing: an n-gram model is {VOCAB_FILE} + {WEIGHTS_FILE}; "
                                        "rebuild it with `sampan hub build ernie-tiny-sentiment`")
        meta = json.loads(vocab_path.read_text(encoding="utf-8"))
        if meta.get("format") != FORMAT:
            raise ValueError(f"{vocab_path} has format {meta.get('format')!r}; this sampan reads format {FORMAT}")
        tensors = load_file(str(weights_path))
        return cls(vocabulary=meta["vocabulary"], idf=tensors["idf"], coef=tensors["coef"],
                   intercept=float(meta["intercept"]), classes=tuple(meta["classes"]),
                   ngram_range=tuple(meta["ngram_range"]), lowercase=bool(meta["lowercase"]))


def nb_log_ratios(features: Any, positive: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    """NBSVM's per-feature scale (Wang and Manning, 2012): the log ratio of how often each feature
    occurs (present or not, smoothed by ``alpha``) in the positive vs the other training rows.
    ``features``: the (sparse) training matrix; ``positive``: a boolean per row."""
    present = (features > 0).astype(np.float64)
    positive = np.asarray(positive, dtype=bool)
    p = np.asarray(present[positive].sum(axis=0)).ravel() + alpha
    q = np.asarray(present[~positive].sum(axis=0)).ravel() + alpha
    return np.log((p / p.sum()) / (q / q.sum()))


__all__ = ["VOCAB_FILE", "WEIGHTS_FILE", "NgramClassifier", "nb_log_ratios"]
