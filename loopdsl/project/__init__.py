"""Project tools: `init`, `test`, `audit`, `cost` and `schedule`.

Each module does one job and returns values; `loopdsl/cli/` (one module per command) turns them into
commands. None of these modules imports LiteLLM: prices are read as data
(`loopdsl.language.prices`), and only `test` (and `audit`, which runs the tests) executes loops,
where the scripted provider imports it on the first model call.
"""
