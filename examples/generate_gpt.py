"""Build a GPT from the zoo, save it, load it back, and generate with the KV cache.

    python examples/generate_gpt.py [--model gpt-tiny] [--max-new-tokens 16] [--out /tmp/gpt]

With an untrained model the tokens are random; `sampan demo` trains one on 三国演义 first.
"""

from __future__ import annotations

import argparse
import tempfile

import torch

import sampan


def main(argv=None) -> torch.Tensor:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt-tiny", help="a name from `sampan models` (default: gpt-tiny)")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--out", default=None, help="directory to save to (default: a temp dir)")
    args = parser.parse_args(argv)

    sampan.seed(0)
    model = sampan.models.create(args.model)
    print(f"{args.model}: {model.num_parameters():,} parameters")
    out = args.out or tempfile.mkdtemp(prefix="sampan-gpt-")
    model.save_pretrained(out)
    model = sampan.models.from_pretrained(out)
    prompt = torch.tensor([[1, 2, 3, 4]])
    tokens = model.generate(prompt, max_new_tokens=args.max_new_tokens, do_sample=True, top_k=50,
                            generator=torch.Generator().manual_seed(0))
    print("generated ids:", tokens[0].tolist())
    return tokens


if __name__ == "__main__":
    main()
