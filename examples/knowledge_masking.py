"""Show ERNIE's three masking levels on a sentence, and the spans behind them.

    python examples/knowledge_masking.py [--text "李彦宏是百度公司创始人，..."] [--seed 0] [--samples 3]

jieba finds the words (phrase level), LAC and jieba's name lexicon find the people, places and
organisations (entity level); the masker then hides whole units within a 15% budget. The
tokenizer here is trained on the sentence itself plus a slice of People's Daily.
"""

from __future__ import annotations

import argparse

import numpy as np

from sampan.text import ChineseTokenizer, Document, KnowledgeMasker, load_corpus
from sampan.text.build import encode_documents
from sampan.text.spans import tool_spans
from sampan.text.tokenizer import MASK_ID

TEXT = "李彦宏是百度公司创始人，他出生于山西阳泉，毕业于北京大学信息管理专业，后来一帆风顺。"


def main(argv=None) -> dict[str, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", default=TEXT, help="the sentence to mask")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--samples", type=int, default=3, help="masked versions per level (default: 3)")
    args = parser.parse_args(argv)

    words, entities = tool_spans(args.text)
    print("words   :", " / ".join(args.text[s:e] for s, e in words))
    print("entities:", ", ".join(f"{args.text[s:e]} ({label})" for s, e, label in entities))
    texts = [args.text] + [d.text for d in load_corpus("news", "train")[:200]]
    tok = ChineseTokenizer.train(texts, vocab_size=3000, min_frequency=1)
    ids, flags, _ = encode_documents([Document("example-1", args.text)], tok, seq_len=len(args.text) + 8)
    masker = KnowledgeMasker(tok.vocab_size, MASK_ID)
    rng = np.random.default_rng(args.seed)

    def show(row: np.ndarray) -> str:
        text = tok.decode(row, skip_special_tokens=False)
        for special in ("[CLS]", "[SEP]", "[PAD]", " "):
            text = text.replace(special, "")
        return text.replace("[MASK]", "□")

    shown: dict[str, list[str]] = {"original": [show(ids[0])]}
    for level in ("char", "phrase", "entity"):
        shown[level] = []
        for _ in range(args.samples):
            masked, labels = masker.mask(ids.astype(np.int64), flags, level, rng)
            text = show(masked[0])
            hidden = tok.decode(labels[0][labels[0] >= 0])
            shown[level].append(text)
            print(f"{level:7s} {text}   (predict: {hidden})")
    return shown


if __name__ == "__main__":
    main()
