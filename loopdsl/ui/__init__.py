"""The local web UI (`loopdsl ui`) and the static run page (`loopdsl show RUN --html FILE`).

`views` and `pages` need only Jinja; `server` needs the optional `loopdsl[ui]` extra
(Starlette and uvicorn) and is imported only by `loopdsl ui`.
"""
