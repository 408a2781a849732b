"""Planner, cost model, tuner and the autotune database (see docs/architecture.md).

Three parts and the doors into them; each module belongs to one (`PARTS`), and
`tests/autotune/test_parts.py` holds them to it:

- plan: pure. The search, the speed model, the memory model, and the words that explain
  them: what comes in (a spec, a profile, calibration figures, measured records) decides
  what goes out. No engine, no database, no file of the user's (packaged assets only).
- store: `wisdom.db` and what keys it: the database itself, the fingerprints, which
  calibration applies to this machine, the qualities measured before.
- measure: the only code that loads engines (engine worker processes, llama-bench style runs,
  quality passes, the context audit), and the tuner that orders them within one budget.
- doors: what the rest of Hearthside calls. `optimize.py` is the one door for tuning, the
  calibration and planning a model (`hearthside tune`, `calibrate`, `plan`, the Optimize
  wizard); `load_settings.py` picks the settings a model loads with, `speed_meter.py` measures
  a loaded model against its speed limit.

Imports go doors → measure → store → plan, never back, and make no circle.
"""

PLAN = "plan"
STORE = "store"
MEASURE = "measure"
DOOR = "door"

PARTS: dict[str, str] = {
    # plan
    "backoff": PLAN,
    "busy": PLAN,
    "calibration_figures": PLAN,
    "cpu_costs": PLAN,
    "goals": PLAN,
    "machine": PLAN,
    "memory": PLAN,
    "planner": PLAN,
    "recipes": PLAN,
    "records": PLAN,
    "serving": PLAN,
    "speculative": PLAN,
    "speed_limit": PLAN,
    "variants": PLAN,
    # store
    "calibration": STORE,
    "family_quality": STORE,
    "fingerprint": STORE,
    "wisdom": STORE,
    # measure
    "capacity": MEASURE,
    "quality": MEASURE,
    "tune_budget": MEASURE,
    "tune_quality": MEASURE,
    "tune_types": MEASURE,
    "tune_wait": MEASURE,
    "tuner": MEASURE,
    "type_costs": MEASURE,
    # doors
    "load_settings": DOOR,
    "optimize": DOOR,
    "speed_meter": DOOR,
}
