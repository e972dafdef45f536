"""The engine and what it runs (budget, retry, gates, actions); it reaches the outside only through `ports`. Imports `lint` and `language`."""
