"""Images a page embeds: charts drawn with matplotlib and equations typeset by matplotlib's
mathtext, each a PNG returned as bytes (the HTML embeds it as a data URI, so a page is one file).

Drawn with the Agg backend and no timestamp in the PNG, so the same generator state gives the same
bytes. Chart labels are Chinese (cities, quarters, series names) drawn in the page's own font file
(matplotlib's fonts have no CJK glyphs), or years and Latin letters.
"""

from __future__ import annotations

import io

import numpy as np

# Formulas of the kind papers and textbooks print, in mathtext's LaTeX subset.
FORMULAS: tuple[str, ...] = (
    r"$E = mc^2$",
    r"$f(x) = \sum_{i=1}^{n} w_i x_i + b$",
    r"$\frac{\partial L}{\partial w} = \frac{1}{N}\sum_{i=1}^{N} (y_i - \hat{y}_i) x_i$",
    r"$\int_0^{\infty} e^{-x^2} dx = \frac{\sqrt{\pi}}{2}$",
    r"$\sigma(z) = \frac{1}{1 + e^{-z}}$",
    r"$P(A|B) = \frac{P(B|A)P(A)}{P(B)}$",
    r"$\mathrm{softmax}(z)_j = \frac{e^{z_j}}{\sum_k e^{z_k}}$",
    r"$a^2 + b^2 = c^2$",
    r"$\lim_{n \to \infty} \left(1 + \frac{1}{n}\right)^n = e$",
    r"$x = \frac{-b \pm \sqrt{b^2 - 4ac}}{2a}$",
    r"$\nabla \cdot \mathbf{E} = \frac{\rho}{\epsilon_0}$",
    r"$H(X) = -\sum_{x} p(x) \log p(x)$",
    r"$\mathbf{y} = W\mathbf{x} + \mathbf{b}$",
    r"$\bar{x} = \frac{1}{n}\sum_{i=1}^{n} x_i$",
    r"$s^2 = \frac{1}{n-1}\sum_{i=1}^{n}(x_i - \bar{x})^2$",
    r"$\cos^2\theta + \sin^2\theta = 1$",
)
CHART_KINDS = ("bar", "line", "scatter", "pie", "barh")
CATEGORY_LABELS = (("北京", "上海", "广州", "深圳", "杭州", "武汉", "成都", "南京", "西安"),
                   ("一季度", "二季度", "三季度", "四季度"), ("一月", "二月", "三月", "四月", "五月", "六月", "七月", "八月"),
                   ("农业", "工业", "服务业", "建筑业", "交通", "教育", "医疗"))
SERIES_LABELS = ("实验组", "对照组", "基线", "本文方法", "收入", "支出", "预测值", "实际值")


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    # No Software / timestamp metadata: the bytes depend only on what was drawn.
    fig.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def chart_png(rng: np.random.Generator, width_px: int, height_px: int, font_path: str | None = None,
              allowed: frozenset[str] | None = None) -> tuple[bytes, str]:
    """A seeded chart of ``width_px`` x ``height_px`` pixels; returns the PNG and the chart's kind.
    With ``font_path`` (a CJK font file) its labels may be Chinese, limited to ``allowed`` characters."""
    from matplotlib.figure import Figure  # a bare Figure: no pyplot state, no GUI backend
    from matplotlib.font_manager import FontProperties

    kind = CHART_KINDS[int(rng.integers(len(CHART_KINDS)))]
    dpi = 100
    fig = Figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi)
    ax = fig.add_subplot()
    n = int(rng.integers(4, 9))
    form = rng.random()
    cjk = font_path is not None and form < 0.6
    prop = FontProperties(fname=font_path, size=7) if cjk else FontProperties(size=7)
    if cjk:
        pool = CATEGORY_LABELS[int(rng.integers(len(CATEGORY_LABELS)))]
        pool = tuple(w for w in pool if allowed is None or set(w) <= allowed) or ("A", "B", "C", "D")
        n = min(n, len(pool))
        labels = list(pool[:n])
        series = [w for w in SERIES_LABELS if allowed is None or set(w) <= allowed] or ["S1", "S2", "S3"]
    else:
        labels = [str(2010 + i) for i in range(n)] if form < 0.8 else [chr(65 + i) for i in range(n)]
        series = [f"S{k + 1}" for k in range(3)]
    values = rng.uniform(5, 100, size=n).round(1)
    colors = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]
    if kind == "bar":
        ax.bar(labels, values, color=colors[int(rng.integers(len(colors)))])
    elif kind == "barh":
        ax.barh(labels, values, color=colors[int(rng.integers(len(colors)))])
    elif kind == "line":
        for k in range(int(rng.integers(1, 4))):
            ax.plot(labels, rng.uniform(5, 100, size=n).round(1), marker="o", color=colors[k],
                    label=series[k % len(series)])
        ax.legend(prop=prop)
    elif kind == "scatter":
        x = rng.normal(size=60)
        ax.scatter(x, 0.8 * x + rng.normal(scale=0.5, size=60), s=8, color=colors[int(rng.integers(len(colors)))])
    else:
        ax.pie(values[:5], labels=labels[:5], colors=colors[:5], textprops={"fontproperties": prop})
    ax.tick_params(labelsize=7)
    for label in (*ax.get_xticklabels(), *ax.get_yticklabels()):
        label.set_fontproperties(prop)
    fig.tight_layout(pad=0.4)
    return _png(fig), kind


def equation_png(formula: str, size_px: int) -> bytes:
    """``formula`` (mathtext) typeset at about ``size_px`` pixels, tightly cropped, on white."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(0.01, 0.01), dpi=100)
    fig.text(0, 0, formula, fontsize=size_px * 72 / 100)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight", pad_inches=0.02, facecolor="white",
                metadata={"Software": None})
    return buffer.getvalue()
