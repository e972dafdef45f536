"""One `llm` or `evaluate` attempt: messages, reservation, fallbacks, paid-response reuse.

Budget order of operations (the promise that budgets are hard caps):
reserve the worst case -> commit the reservation (the run's `pending` marker) ->
call -> replace the reservation with the reported usage and cost -> store the paid
response under its key. A run killed after the call but before the next commit finds
the stored response on resume and does not pay again.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ...language import bounded_json
from ..budget import Ledger, Reservation, cost_for, reservation_for
from ..run_state import checked_response
from ...language.prices import cost_changing_params
from ..gates import strip_code_fence
from ...language.model import EvaluateAction, LlmAction, Loop, ModelAlias, Price
from ...language.prices import max_input_tokens, model_price
from ..model_port import LlmRequest, LlmResponse, Provider, ProviderError
from ...language.templates import RenderError, Template
from ..errors import StepFailure
from ...language.compile import CompiledState

if TYPE_CHECKING:
    from ..engine import Engine


EVALUATOR_INSTRUCTIONS = (
    "You are an evaluator. Judge the work against the criteria. Reply with JSON only, exactly "
    'of the form {"verdict": "accept" | "reject", "feedback": "<what to change, or why it is fine>"}.'
)
# The evaluator's answer as a JSON Schema, sent as structured output where the model takes one.
EVALUATOR_SCHEMA = {
    "type": "object",
    "properties": {"verdict": {"type": "string", "enum": ["accept", "reject"]}, "feedback": {"type": "string"}},
    "required": ["verdict", "feedback"],
}
def parse_json_reply(text: str) -> Any:
    try:
        return bounded_json.loads(strip_code_fence(text))
    except json.JSONDecodeError as exc:
        raise StepFailure(
            "parse",
            f"the reply is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
            "reply with JSON only",
        ) from None
    except bounded_json.JsonLimitError as exc:
        raise StepFailure("parse", f"the reply is not usable JSON: {exc}; reply with plain, shallow JSON") from None


def request_key(run_id: str, state: str, visit: int, attempt: int, chain_index: int, model: str) -> str:
    """The key a paid response is stored under, so a resumed run reuses it.

    Only the call's position in the run (and the model asked) goes in, never the rendered
    messages: a prompt may read values that change across a crash (`budget.remaining`
    drops once the killed call is charged), and a key that moved would pay twice.
    """
    body = {"run": run_id, "state": state, "visit": visit, "attempt": attempt, "fallback": chain_index, "model": model}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def cache_key(request: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(request, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass
class CallContext:
    """What the engine gives one call: identity for keys and the ports to use."""

    run_id: str
    state: str
    visit: int
    attempt: int
    system_prefix: str  # skill text, when the state names a skill
    # More of the call's identity for its `pending` record (an agent's turn number).
    pending_extra: dict[str, Any] = field(default_factory=dict)


class LlmCaller:
    def __init__(
        self,
        loop: Loop,
        ledger: Ledger,
        provider: Callable[[], Provider],
        responses: Any,
        commit_pending: Callable[[dict[str, Any] | None], None],
        env: Mapping[str, str],
        use_cache: bool = False,
        redact: Callable[[Any], Any] = lambda value: value,
        count_asked: Callable[[str], None] = lambda state: None,
    ):
        self.loop = loop
        self.ledger = ledger
        self.provider = provider
        self.responses = responses
        self.commit_pending = commit_pending
        self.env = env
        self.use_cache = use_cache
        self.redact = redact  # paid responses are stored: a secret a model echoes stays off the disk
        self.count_asked = count_asked

    # ------------------------------------------------------------ messages
    def messages(self, action: LlmAction | EvaluateAction, prompt: str, system: str | None, skill_text: str) -> tuple[dict[str, str], ...]:
        parts: list[str] = []
        if skill_text:
            parts.append(skill_text.strip())
        if system:
            parts.append(system.strip())
        if isinstance(action, EvaluateAction):
            parts.append(EVALUATOR_INSTRUCTIONS)
            if action.criteria:
                parts.append("Criteria:\n" + "\n".join(f"- {c}" for c in action.criteria))
        elif action.output == "json":
            hint = "Reply with JSON only."
            if action.schema is not None:
                hint += " It must match this JSON Schema: " + json.dumps(action.schema, sort_keys=True)
            parts.append(hint)
        msgs: list[dict[str, str]] = []
        if parts:
            msgs.append({"role": "system", "content": "\n\n".join(parts)})
        msgs.append({"role": "user", "content": prompt})
        return tuple(msgs)

    def _chain(self, alias: ModelAlias) -> list[str]:
        return [alias.model, *alias.fallbacks]

    def _price(self, alias: ModelAlias, model: str) -> Price | None:
        if model == alias.model and alias.price is not None:
            return alias.price
        return model_price(model)

    def _api_key(self, alias: ModelAlias) -> str | None:
        if alias.api_key_env:
            return self.env.get(alias.api_key_env) or os.environ.get(alias.api_key_env)
        return None

    # ------------------------------------------------------------ the call
    async def call(self, action: LlmAction | EvaluateAction, messages: tuple[dict[str, str], ...], cc: CallContext) -> dict[str, Any]:
        alias = self.loop.models[action.model]
        max_tokens = action.max_tokens or alias.max_tokens
        if not max_tokens:
            raise StepFailure("budget", f"model '{alias.name}' has no max_tokens; set it on the call or the alias")
        costly = cost_changing_params(alias.params)
        if costly:  # lint's params-cost, again here for a loop that reached the engine unlinted
            shown = ", ".join(".".join(str(k) for k in path) for path in costly)
            raise StepFailure("budget", f"refusing to call model '{alias.name}': its params set {shown}, which would "
                              "change what the call costs beyond its reservation; use `max_tokens` and `budget:`")
        temperature = action.temperature if action.temperature is not None else alias.temperature
        schema = EVALUATOR_SCHEMA if isinstance(action, EvaluateAction) else (action.schema if action.output == "json" else None)
        chain = self._chain(alias)
        priced = [(m, self._price(alias, m)) for m in chain]
        last: ProviderError | None = None
        for index, model in enumerate(chain):
            request = LlmRequest(
                model=model,
                messages=messages,
                max_tokens=int(max_tokens),
                temperature=temperature,
                api_base=alias.api_base if index == 0 else None,
                api_key=self._api_key(alias) if index == 0 else None,
                timeout=alias.timeout,
                params=dict(alias.params) if index == 0 else {},
                # `_charge` prices the first model itself whenever it has a price.
                priced=index == 0 and priced[0][1] is not None,
                response_schema=schema,  # also as the provider's structured output where supported
            )
            canonical = request.canonical()
            key = request_key(cc.run_id, cc.state, cc.visit, cc.attempt, index, model)
            stored = checked_response(self.responses.get_response(key), "model_reply", cc.run_id)
            if stored is not None:  # paid before a crash: reuse, never pay twice
                return dict(stored, replayed=True, response_key=key)
            if self.use_cache:
                cached = checked_response(self.responses.get_cached(cache_key(canonical)), "model_reply", cc.run_id)
                if cached is not None:
                    hit = dict(cached, cost_usd=0.0, cached=True)
                    self.responses.put_response(key, hit)
                    return dict(hit, response_key=key)
            try:
                return dict(await self._paid_call(request, priced, key, canonical, cc), response_key=key)
            except ProviderError as exc:
                last = exc
                continue  # the next model of the fallback chain, within this attempt
        assert last is not None
        raise StepFailure(last.kind, last.message, retry_after=last.retry_after)

    def _charge(self, response: LlmResponse, request: LlmRequest, priced: list[tuple[str, Price | None]],
                reservation: Reservation, prompt_tokens: int, reserved_cost: float) -> tuple[dict[str, int], float]:
        """Settle the reservation with what the reply reports; (usage, cost_usd) as charged.

        A reply without believable usage is charged the whole reservation (the prompt as
        counted, `max_tokens` of completion), never 0.
        """
        if not response.usage_known:
            self.ledger.charge_reservation(reservation)
            return {"prompt_tokens": prompt_tokens, "completion_tokens": request.max_tokens}, reserved_cost
        price = dict(priced).get(request.model)
        cost_usd = response.cost_usd
        if price is not None and (cost_usd is None or request.model == priced[0][0]):
            cost_usd = cost_for(price, response.prompt_tokens, response.completion_tokens)
        if cost_usd is None:  # unknown cost is never $0: keep the reserved worst case
            cost_usd = reserved_cost
        self.ledger.settle(reservation, response.prompt_tokens + response.completion_tokens, cost_usd)
        return {"prompt_tokens": response.prompt_tokens, "completion_tokens": response.completion_tokens}, cost_usd

    def _settle_failed(self, reservation: Reservation, billed: bool, pending: dict[str, Any]) -> None:
        """A failed call charged its reservation (it may have been paid: timed out, dropped
        after sending, unreadable reply) or nothing (refused before any work), and so
        recorded at once: a kill during the retry's wait (a Retry-After may ask for minutes)
        had a resume charge a refused call its whole reservation."""
        if billed:
            self.ledger.charge_reservation(reservation)
        else:
            self.ledger.release(reservation)
        pending["settled"] = True
        self.commit_pending(pending)

    async def _paid_call(self, request: LlmRequest, priced: list[tuple[str, Price | None]], key: str, canonical: dict | None,
                         cc: CallContext, reserve_from: int = 0, keep_messages: bool = True) -> dict[str, Any]:
        """`reserve_from`: the first chain entry still in play (an agent's sticky fallback);
        the call is reserved at the dearest price from there on. `keep_messages`: store the
        request's messages beside the reply, for `show --transcript` (an agent's turns keep
        only their first request, the rest follows from the replies and tool results).
        `canonical`: the request's canonical form, made here when None and the cache needs it."""
        provider = self.provider()
        prompt_tokens = prompt_tokens_for(provider, request, cc.state)
        if request.tools:  # an agent's turn grows each turn: past the model's window it is not sent
            window = max_input_tokens(request.model)
            if window is not None and prompt_tokens > window:
                raise ProviderError("context_window", f"the conversation is {prompt_tokens:,} tokens, over "
                                    f"{request.model}'s input window of {window:,}; it was not sent", billed=False)
        try:
            tokens, cost = reservation_for(priced[reserve_from:], prompt_tokens, request.max_tokens)
        except ValueError as exc:
            raise StepFailure("budget", f"refusing to call {request.model}: {exc}") from None
        reservation = self.ledger.reserve(tokens, cost, label=f"{cc.state}#{cc.visit}.{cc.attempt}")
        self.count_asked(cc.state)
        pending = {"kind": "llm", "state": cc.state, "visit": cc.visit, "attempt": cc.attempt,
                   "key": key, "reserved": {"tokens": tokens, "cost_usd": cost}, "step_taken": True, **cc.pending_extra}
        self.commit_pending(pending)
        try:
            response: LlmResponse = await provider.complete(request, state=cc.state)
        except ProviderError as exc:
            self._settle_failed(reservation, exc.billed, pending)
            raise
        except asyncio.CancelledError:
            self.ledger.charge_reservation(reservation)
            raise
        except Exception:
            self.ledger.release(reservation)  # e.g. the reply script ran out: nothing was sent
            raise
        usage, cost_usd = self._charge(response, request, priced, reservation, prompt_tokens, cost)
        result = {
            "text": response.text,
            "usage": usage,
            "cost_usd": cost_usd,
            "model": response.model or request.model,
            **response.tool_fields(),
        }
        if not response.usage_known:
            result["usage_unknown"] = True  # charged the reservation: the reply's usage was missing or garbage
        kept = self.redact({**result, "messages": list(request.messages)} if keep_messages else result)
        self.responses.put_response(key, kept)
        # From here the ledger holds what the call cost, not its reservation: a commit made
        # before the state ends (a gate's command starting) must not let `resume` settle it again.
        pending["settled"] = True
        if self.use_cache:
            self.responses.put_cached(cache_key(canonical if canonical is not None else request.canonical()), kept)
        past = self.ledger.past_cap()
        if past is not None:  # the reply is kept and charged; nothing more runs on a spent budget
            raise past
        return {k: v for k, v in kept.items() if k != "messages"}


def prompt_tokens_for(provider: Provider, request: LlmRequest, state: str) -> int:
    """The prompt's tokens to reserve for, tool definitions included when any are offered."""
    messages = list(request.messages)
    tools = {"tools": request.tools} if request.tools else {}
    reserve_for = getattr(provider, "prompt_tokens_to_reserve", None)
    if reserve_for is not None:
        return int(reserve_for(request.model, messages, state, **tools))
    return int(provider.count_tokens(request.model, messages, **tools))


def llm_result(action: LlmAction, reply: dict[str, Any]) -> dict[str, Any]:
    """Shape an llm reply into the state's result; json output is parsed and checked."""
    from ...language.user_schema import VALIDATION_TIMEOUT_S, InvalidSchema, SchemaTimeout, schema_errors

    result = {k: reply[k] for k in ("text", "usage", "cost_usd", "model")}
    result["json"] = None
    if action.output == "json":
        data = parse_json_reply(reply["text"])
        if action.schema is not None:
            try:
                problems = schema_errors(action.schema, data)
            except InvalidSchema as exc:
                raise StepFailure("parse", f"the state's `schema` is not a valid JSON Schema: {exc}", result=result) from None
            except SchemaTimeout as exc:
                raise StepFailure("parse", f"checking the JSON against the schema took over {VALIDATION_TIMEOUT_S:g}s: "
                                  f"its pattern {str(exc)[:80]!r} backtracks on this value; simplify the pattern",
                                  result=result) from None
            if problems:
                raise StepFailure("parse", "the JSON does not match the schema: " + "; ".join(problems[:5]), result=result)
        result["json"] = data
    return result


def evaluate_result(reply: dict[str, Any]) -> dict[str, Any]:
    data = parse_json_reply(reply["text"])
    _each_key_once(reply["text"])
    verdict = data.get("verdict") if isinstance(data, dict) else None
    if verdict not in ("accept", "reject"):
        raise StepFailure(
            "parse",
            'the evaluator must reply {"verdict": "accept"|"reject", "feedback": "..."}; '
            f"got verdict {verdict!r}",
        )
    feedback = data.get("feedback", "")
    return {
        "verdict": verdict,
        "feedback": feedback if isinstance(feedback, str) else json.dumps(feedback),
        "usage": reply["usage"],
        "cost_usd": reply["cost_usd"],
        "model": reply["model"],
        "text": reply["text"],
    }


def _each_key_once(text: str) -> None:
    """A verdict named twice (`{"verdict": "reject", ..., "verdict": "accept"}`) reads one way
    to a person and the other to a parser: the reply is refused, not taken by its last key."""
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in items]
        twice = next((key for key in keys if keys.count(key) > 1), None)
        if twice is not None:
            raise StepFailure("parse", f"the evaluator's reply names {twice!r} twice; reply with each key once")
        return dict(items)

    json.loads(strip_code_fence(text), object_pairs_hook=pairs)  # already checked as bounded JSON


def render_or_fail(template: Template, context: Mapping[str, Any], what: str) -> str:
    try:
        return template.render(context)
    except RenderError as exc:
        raise StepFailure("parse", f"{what}: {exc}") from None


async def run_llm_state(engine: "Engine", cs: CompiledState, ctx: dict[str, Any], visit: int, attempt: int) -> dict[str, Any]:
    action = cs.state.action
    assert isinstance(action, (LlmAction, EvaluateAction)) and cs.prompt is not None
    prompt = render_or_fail(cs.prompt, ctx, f"rendering the prompt of '{cs.state.name}'")
    system = render_or_fail(cs.system, ctx, "rendering the system text") if cs.system else None
    skill_text = engine.ports.skills.get(action.skill, "") if isinstance(action, LlmAction) and action.skill else ""
    messages = engine.llm.messages(action, prompt, system, skill_text)
    before = (engine.ledger.tokens_spent, engine.ledger.cost_spent)
    try:
        reply = await engine.llm.call(action, messages, CallContext(engine.run.run_id, cs.state.name, visit, attempt, skill_text))
    except StepFailure as failure:
        # A call that failed may still have been charged (a timeout, a dropped connection):
        # it is listed beside the paid calls so that `show` adds up to `spent`.
        tokens, cost = engine.ledger.tokens_spent - before[0], engine.ledger.cost_spent - before[1]
        if tokens > 0 or cost > 0:
            engine.emit("llm", state=cs.state.name, attempt=attempt, model=engine.loop.models[action.model].model,
                      failed=failure.kind, charged={"tokens": tokens, "cost_usd": cost}, usage=None,
                      cost_usd=cost, spent=engine.ledger.spent())
        raise
    engine.emit("llm", state=cs.state.name, attempt=attempt, model=reply.get("model"), usage=reply.get("usage"),
              cost_usd=reply.get("cost_usd"), replayed=bool(reply.get("replayed")), cached=bool(reply.get("cached")),
              spent=engine.ledger.spent(), key=reply.get("response_key"))
    if isinstance(action, EvaluateAction):
        return evaluate_result(reply)
    return llm_result(action, reply)
