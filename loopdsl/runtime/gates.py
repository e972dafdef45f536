"""Deterministic gates: the checks that run before and after a state's action.

A gate passes or fails with a message; the message of a failure becomes the model's
`feedback` on the next attempt, so it says what was checked, what went wrong and where,
and it is redacted like everything else the engine shows or stores.
"""
from __future__ import annotations

import difflib
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, Sequence


from ..language import templates
from ..language.user_schema import VALIDATION_TIMEOUT_S, InvalidSchema, SchemaTimeout, schema_errors
from ..language.model import BUILTIN_GATES, Gate
from .redaction import Redactor, find_secrets
from .shell import CwdOutsideWorkspace, ShellResult, confined_cwd

# The part of a failing command's output that goes into the message (and so into feedback).
OUTPUT_TAIL_BYTES = 2048
_MAX_SCHEMA_ERRORS = 5
# The info string (```python) ends at a newline; a one-line fence (```{"a": 1}```) has none.
_FENCE = re.compile(r"\A\s*```(?:[^\n`]*\n)?(?P<body>.*?)\n?[ \t]*```\s*\Z", re.DOTALL)
_TEMPLATE_ERRORS: tuple[type[BaseException], ...] = tuple(
    getattr(templates, name) for name in ("RenderError", "TemplateError") if hasattr(templates, name)
)


@dataclass
class GateOutcome:
    name: str
    passed: bool
    message: str
    duration_s: float
    kind: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "passed": self.passed, "message": self.message,
            "duration_s": self.duration_s, "kind": self.kind,
        }


class _GateFailed(Exception):
    """Raised inside a check to fail the gate with `message`."""


def strip_code_fence(text: str) -> str:
    """The body of one code fence surrounding the whole text (```lang ... ```), else the text.

    Used for every model reply that must parse: `output: json`, evaluator verdicts and the
    `python_syntax` gate."""
    match = _FENCE.match(text)
    return match.group("body") if match else text


def _tail(text: str, limit: int = OUTPUT_TAIL_BYTES) -> str:
    encoded = text.encode("utf-8")
    if len(encoded) <= limit:
        return text.rstrip("\n")
    return "[...]" + encoded[-limit:].decode("utf-8", errors="ignore").rstrip("\n")


def _error_text(exc: BaseException) -> str:
    text = str(getattr(exc, "message", None) or exc)
    hint = getattr(exc, "hint", "")
    return f"{text} ({hint})" if hint and hint not in text else text


class GateRunner:
    """Runs gates for one run. Compiled templates, expressions and validators are cached
    per gate object in this runner (a loop's gates live as long as the run)."""

    def __init__(
        self,
        named: Mapping[str, Gate],
        *,
        run_shell: Callable[..., Awaitable[ShellResult]],
        base_env: Mapping[str, str],
        cwd: Path,
        redactor: Redactor,
        secret_values: Sequence[str],
        input_facts: templates.InputFacts = templates.NO_FACTS,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self._named = dict(named)
        self._run_shell = run_shell
        self._base_env = dict(base_env)
        self._cwd = Path(cwd)
        self._redactor = redactor
        self._secret_values = tuple(v for v in secret_values if v)
        self._input_facts = input_facts
        self._monotonic = monotonic  # the run's clock: gate durations are on it too
        # (id(owner), role) -> (owner, compiled). Holding the owner keeps its id unique.
        self._compiled: dict[tuple[int, str], tuple[object, Any]] = {}

    # ------------------------------------------------------------ public

    async def run(
        self, gates: Sequence[Gate], context: Mapping[str, Any], result: Mapping[str, Any] | None
    ) -> list[GateOutcome]:
        """Run `gates` in order, stopping after the first failure; the outcomes so far.
        `result` is the current attempt's result (None for `before` gates)."""
        outcomes: list[GateOutcome] = []
        for gate in gates:
            outcome = await self.run_one(gate, context, result)
            outcomes.append(outcome)
            if not outcome.passed:
                break
        return outcomes

    async def run_one(
        self, gate: Gate, context: Mapping[str, Any], result: Mapping[str, Any] | None
    ) -> GateOutcome:
        started = self._monotonic()
        label = gate.label
        kind: str = gate.kind
        try:
            target = self._resolve(gate)
            kind = target.kind
            if target.kind == "shell":
                await self._check_shell(target, gate, label, context)
            elif target.kind == "expr":
                self._check_expr(target, label, context)
            elif target.kind == "json_schema":
                self._check_json_schema(target, label, result)
            elif target.kind == "builtin":
                self._check_builtin(target, label, context, result)
            else:  # pragma: no cover - _resolve only returns concrete kinds
                raise _GateFailed(f"gate '{label}' has an unknown kind '{target.kind}'")
        except _GateFailed as failure:
            return self._outcome(label, False, str(failure), started, kind)
        except _TEMPLATE_ERRORS as exc:
            return self._outcome(label, False, f"{kind} gate '{label}': {_error_text(exc)}", started, kind)
        return self._outcome(label, True, "passed", started, kind)

    # ------------------------------------------------------------ helpers

    def _outcome(self, name: str, passed: bool, message: str, started: float, kind: str) -> GateOutcome:
        return GateOutcome(
            name=name, passed=passed, message=self._redactor(message),
            duration_s=self._monotonic() - started, kind=kind,
        )

    def _cached(self, owner: object, role: str, build: Callable[[], Any]) -> Any:
        key = (id(owner), role)
        hit = self._compiled.get(key)
        if hit is not None and hit[0] is owner:
            return hit[1]
        compiled = build()
        self._compiled[key] = (owner, compiled)
        return compiled

    def _template(self, owner: object, role: str, source: str) -> Any:
        return self._cached(owner, role, lambda: templates.compile_template(source))

    def _resolve(self, gate: Gate) -> Gate:
        """Follow `ref` gates to a concrete gate, refusing unknown names and cycles."""
        seen: list[str] = []
        current = gate
        while current.kind == "ref":
            name = str(current.ref)
            if name in seen:
                chain = " -> ".join([*seen, name])
                raise _GateFailed(f"gate reference cycle: {chain}; make one of these gates a real check")
            seen.append(name)
            target = self._named.get(name)
            if target is None:
                raise _GateFailed(self._unknown_ref_message(name))
            current = target
        return current

    def _unknown_ref_message(self, name: str) -> str:
        message = f"unknown gate '{name}'"
        close = difflib.get_close_matches(name, list(self._named), n=1)
        if close:
            message += f"; did you mean '{close[0]}'?"
        elif self._named:
            message += f"; named gates are: {', '.join(sorted(self._named))}"
        else:
            message += "; no named gates are defined (add it under top-level `gates:`)"
        return message

    # ------------------------------------------------------------ shell

    async def _check_shell(self, gate: Gate, outer: Gate, label: str, context: Mapping[str, Any]) -> None:
        spec = gate.shell
        assert spec is not None
        env = dict(self._base_env)
        script: str | None = None
        argv: list[str] | None = None
        if spec.cmd is not None:
            source = spec.cmd
            facts = self._input_facts.with_env(spec.env)
            command = self._cached(spec, "cmd", lambda: templates.compile_shell(source, facts))
            # prepare() also carries values too big for one environment variable.
            script, placeholders = command.prepare(context)
            env.update(placeholders)
        else:
            self._cached(spec, "argv", lambda: templates.check_argv(spec.argv or ()))
            argv = [
                self._template(spec, f"argv{i}", arg).render(context) for i, arg in enumerate(spec.argv or ())
            ]
            if not argv:
                raise _GateFailed(f"shell gate '{label}' has an empty argv: name a program to run")
        self._cached(spec, "env", lambda: templates.check_env(spec.env))
        for key, value in spec.env.items():
            env[key] = self._template(spec, f"env:{key}", value).render(context)
        cwd = self._cwd
        if spec.cwd:
            try:
                cwd = confined_cwd(self._cwd, self._template(spec, "cwd", spec.cwd).render(context))
            except CwdOutsideWorkspace as exc:
                raise _GateFailed(f"shell gate '{label}': {exc}") from None
        # A timeout on the reference (`{ref: x, timeout: 10s}`) overrides the named gate's.
        timeout = _first_set(outer.timeout, gate.timeout, spec.timeout)
        outcome = await self._run_shell(
            script=script, argv=argv, cwd=cwd, env=env, timeout=timeout, redact=self._redactor
        )
        if outcome.timed_out:
            raise _GateFailed(
                f"shell gate '{label}' timed out after {_seconds(timeout)} and was stopped"
                + _output_section(outcome)
            )
        if outcome.exit_code not in spec.ok_exit:
            expected = ", ".join(str(c) for c in spec.ok_exit)
            raise _GateFailed(
                f"shell gate '{label}' failed: exit code {outcome.exit_code} (passes on {expected})"
                + _output_section(outcome)
            )

    # ------------------------------------------------------------ expr

    def _check_expr(self, gate: Gate, label: str, context: Mapping[str, Any]) -> None:
        expression = self._cached(gate, "expr", lambda: templates.compile_expression(str(gate.expr)))
        value = expression(context)
        if not value:
            raise _GateFailed(f"expr gate '{label}' is false: {gate.expr} (got {_short(value)})")

    # ------------------------------------------------------------ json_schema

    def _check_json_schema(self, gate: Gate, label: str, result: Mapping[str, Any] | None) -> None:
        if result is None:
            raise _GateFailed(
                f"json_schema gate '{label}' checks the action's result, which does not exist yet; "
                "move it to `after` gates"
            )
        document = result.get("json")
        if document is None:
            raise _GateFailed(
                f"json_schema gate '{label}': the result has no JSON (json is null); "
                "answer with a JSON document (use `output: json` on the llm state)"
            )

        try:
            problems = schema_errors(gate.schema or {}, document)
        except InvalidSchema as exc:
            raise _GateFailed(f"json_schema gate '{label}' has an invalid schema: {exc}") from None
        except SchemaTimeout as exc:
            raise _GateFailed(
                f"json_schema gate '{label}' gave up after {VALIDATION_TIMEOUT_S:g}s: its pattern "
                f"{str(exc)[:80]!r} backtracks on this value; simplify the pattern") from None
        if problems:
            lines = problems[:_MAX_SCHEMA_ERRORS]
            more = len(problems) - _MAX_SCHEMA_ERRORS
            if more > 0:
                lines.append(f"... and {more} more")
            raise _GateFailed(
                f"json_schema gate '{label}': the JSON does not match the schema:\n" + "\n".join(lines)
            )

    # ------------------------------------------------------------ built-ins

    def _check_builtin(
        self, gate: Gate, label: str, context: Mapping[str, Any], result: Mapping[str, Any] | None
    ) -> None:
        name = str(gate.builtin)
        if name not in BUILTIN_GATES:
            raise _GateFailed(f"unknown built-in gate '{name}'; built-ins are: {', '.join(BUILTIN_GATES)}")
        text = self._builtin_text(gate, label, context, result)
        if name == "python_syntax":
            _check_python_syntax(text, label)
        else:
            found = find_secrets(text, self._secret_values)
            if found:
                raise _GateFailed(
                    f"no_secrets gate '{label}' found possible secrets: " + "; ".join(found)
                    + ". Remove them and read credentials from the environment instead."
                )

    def _builtin_text(
        self, gate: Gate, label: str, context: Mapping[str, Any], result: Mapping[str, Any] | None
    ) -> str:
        if gate.value is not None:
            return self._template(gate, "value", str(gate.value)).render(context)
        if result is None:
            raise _GateFailed(
                f"{gate.builtin} gate '{label}' has nothing to check in `before` gates: give it a "
                "`value` template naming the text, e.g. value: \"{{ some_state.stdout }}\""
            )
        text = result.get("text")
        if isinstance(text, str):
            return strip_code_fence(text)
        stdout = result.get("stdout")
        if isinstance(stdout, str):
            return stdout
        raise _GateFailed(
            f"{gate.builtin} gate '{label}': the result has no `text` or `stdout` to check; "
            "give the gate a `value` template"
        )


def _check_python_syntax(text: str, label: str) -> None:
    try:
        compile(text, f"<{label}>", "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f"line {exc.lineno}" + (f", column {exc.offset}" if exc.offset else "")
        source_line = (exc.text or "").rstrip("\n")
        detail = f"\n    {source_line.strip()}" if source_line.strip() else ""
        raise _GateFailed(f"python_syntax gate '{label}': {where}: {exc.msg}{detail}") from None
    except ValueError as exc:  # e.g. source code containing NUL bytes
        raise _GateFailed(f"python_syntax gate '{label}': {exc}") from None


def _output_section(result: ShellResult) -> str:
    parts: list[str] = []
    for stream, text in (("stderr", result.stderr), ("stdout", result.stdout)):
        if text.strip():
            parts.append(f"\n--- {stream} (last {OUTPUT_TAIL_BYTES} bytes) ---\n{_tail(text)}")
    return "".join(parts) if parts else "\n(no output)"


def _seconds(value: float | None) -> str:
    return "?" if value is None else f"{value:g}s"


def _first_set(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = ["OUTPUT_TAIL_BYTES", "GateOutcome", "GateRunner", "strip_code_fence"]
