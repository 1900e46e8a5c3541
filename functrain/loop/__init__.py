"""The loop: `fit`, `evaluate` and `predict`, the only place with side effects.

`api.py` is the public entry; `run.py` drives one run (`FitRun`) over the state adapter
(`fit_state.py`), its options (`options.py`) and duration (`horizon.py`); `events.py` is what
callbacks and loggers observe; `evaluation.py` runs evaluation and prediction; `preemption.py`
turns signals and stop requests into one agreed stop; `report.py` writes the run's last lines.

Example:
    >>> from functrain.loop import fit
    >>> state = fit(step, state, loader, duration="3ep")
"""

from .api import StepError, evaluate, fit, predict

__all__ = ["StepError", "evaluate", "fit", "predict"]
