"""`python -m functrain.launch -n N script.py ...`: run a script on N processes (torchrun).

`cli.py` is the launcher and the per-rank worker wrapper; `status.py` holds the small records a
rank leaves for the launcher (its newest checkpoint, its exit code and stop signals).

Example:
    $ python -m functrain.launch -n 2 train.py --lr 3e-4
"""

from .cli import main

__all__ = ["main"]
