"""Tuning: the drafting setting that is fastest on this machine (`trtspec tune`), from acceptance replayed offline
over calibration prompts (`replay`, the Medusa / EAGLE tree searches) and a model of a step's time (`step_time`), and
the go / no-go for speculation at a temperature and concurrency (`trtspec advise`), and the draft length per batch
size (`trtspec advise --schedule`)."""

from trtspec.lazy import lazy_exports

__getattr__, __all__ = lazy_exports(__name__, {
    "TuneOptions": "trtspec.tune.tuner", "run_tune": "trtspec.tune.tuner", "format_tune": "trtspec.tune.tuner",
    "AdviseOptions": "trtspec.tune.advise", "run_advise": "trtspec.tune.advise", "format_advice": "trtspec.tune.advise",
    "ScheduleOptions": "trtspec.tune.draft_schedule", "measure_schedule": "trtspec.tune.draft_schedule",
    "format_schedule": "trtspec.tune.draft_schedule",
})
