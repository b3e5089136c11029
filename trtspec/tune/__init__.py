"""Tuning: the drafting setting that is fastest on this machine (`trtspec tune`), from acceptance replayed offline
over calibration prompts (`replay`, the Medusa / EAGLE tree searches) and a model of a step's time (`step_time`), and
the go / no-go for speculation at a temperature and concurrency (`trtspec advise`)."""
