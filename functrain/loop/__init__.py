"""The loop: `fit`, `evaluate` and `predict`, the only place with side effects.

`api.py` is the public entry; `run.py` drives one run (`FitRun`) over the state adapter
(`state_adapter.py`: one `TrainState`, or a `FitState` of several from `fit_state.py`), its
options (`options.py`) and duration (`horizon.py`); `fit_metrics.py` holds
its train metrics and evaluation sets; `events.py` is what callbacks and loggers observe
(`saved_state.py`: their state in a checkpoint); `evaluation.py` runs evaluation and prediction;
`preemption.py` turns signals and stop requests into one agreed stop, which `agreement.py` takes
with the other ranks off the hot path; `report.py` writes the run's last lines.

Example:
    >>> from functrain.loop import fit
    >>> state = fit(step, state, loader, duration="3ep")
"""

from .api import StepError, fit
from .evaluation import evaluate, predict

__all__ = ["StepError", "evaluate", "fit", "predict"]
