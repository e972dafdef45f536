"""One exact budget across child workflows: the root run owns the ledger tree.

A sub-loop or fan-out child runs as its own workflow, but the caps it shares with its
ancestors must hold as exactly as in one process. So the root workflow keeps a mirror
ledger for every child below it (chained to its own engine's ledger, as a child's ledger
is chained to its parent's locally), and a child asks the root before each step and each
model call: it signals `reserve{key, path, steps, reservations, settle}` and waits for the
root's answer with that key. The root's handler is a plain function, so the check and
the hold happen with no await between them; it dedupes by key (signals are delivered at
least once) and answers a repeated key with the answer it gave. Settlements ride on the
next request and on the child's result; a child that closes any way has whatever it still
held charged in full (it may have been paid).
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Mapping

from temporalio import workflow

from ...language.model import Budget
from ...runtime.budget import BudgetExceeded, Ledger, Reservation
from .wire import ANSWER_SIGNAL, RESERVE_SIGNAL

# Temporal ends a run at 10,000 received signals; past this many reservation requests
# the root refuses the rest (the child stops at the budget) rather than be terminated.
MAX_RESERVE_SIGNALS = 8_000


def caps_json(caps: Budget) -> dict[str, Any]:
    return {"tokens": caps.tokens, "cost_usd": caps.cost_usd, "steps": caps.steps, "wall_time": caps.wall_time}


def send_signal(workflow_id: str, name: str, arg: Any) -> None:
    """Fire and forget from a plain handler; a receiver that has closed meanwhile is no error."""

    async def send() -> None:
        try:
            await workflow.get_external_workflow_handle(workflow_id).signal(name, arg)
        except Exception:  # the child ended (its own close charges what it held)
            workflow.logger.info("signal %s to %s not delivered: it has closed", name, workflow_id)

    asyncio.get_running_loop().create_task(send())


class BudgetTree:
    """The root's side: mirror ledgers of its descendants and their open reservations."""

    def __init__(self, root_ledger: Callable[[], Ledger],
                 send: Callable[[str, str, Any], None] = send_signal):
        self.root_ledger, self.send = root_ledger, send
        self.mirrors: dict[str, Ledger] = {}
        self.held: dict[str, tuple[str, Ledger, Reservation]] = {}  # key -> (child id, mirror, hold)
        self.answers: dict[str, dict[str, Any]] = {}
        self.closed: set[str] = set()
        self.signals = 0

    def _mirror(self, path: list[Mapping[str, Any]]) -> Ledger:
        ledger = self.root_ledger()
        for node in path:
            mirror = self.mirrors.get(node["id"])
            if mirror is None:
                mirror = self.mirrors[node["id"]] = ledger.child(Budget(**node["caps"]), name=f"sub-loop {node['id']}")
            ledger = mirror
        return ledger

    def on_reserve(self, req: Mapping[str, Any]) -> None:
        """The `reserve` signal: decide and hold now, answer by signal."""
        key, sender = str(req["key"]), str(req["from"])
        if key not in self.answers:
            self.signals += 1
            self.settle(req.get("settle") or ())
            self.answers[key] = self._decide(req)
        self.send(sender, ANSWER_SIGNAL, self.answers[key])

    def _decide(self, req: Mapping[str, Any]) -> dict[str, Any]:
        key, sender = str(req["key"]), str(req["from"])
        if sender in self.closed or any(node["id"] in self.closed for node in req["path"]):
            return {"key": key, "ok": False, "which": "tokens", "message": f"sub-loop {sender} has already ended"}
        if self.signals > MAX_RESERVE_SIGNALS:
            return {"key": key, "ok": False, "which": "steps",
                    "message": f"budget exhausted: the run has taken {MAX_RESERVE_SIGNALS:,} reservation requests from "
                               "its sub-loops (Temporal ends a run at 10,000 signals); split the fan-out"}
        mirror = self._mirror(req["path"])
        taken: list[Reservation] = []
        steps = 0
        try:
            for _ in range(int(req.get("steps") or 0)):
                mirror.take_step()
                steps += 1
            for item in req.get("reservations") or ():
                taken.append(mirror.reserve(int(item["tokens"]), float(item["cost_usd"]), label=str(item["label"])))
        except BudgetExceeded as exc:  # undo this request's holds: a refusal changes nothing
            for r in taken:
                mirror.release(r)
            for ledger in _chain(mirror):
                ledger.steps -= steps
            return {"key": key, "ok": False, "which": exc.which, "message": exc.message}
        for item, r in zip(req.get("reservations") or (), taken):
            self.held[str(item["key"])] = (sender, mirror, r)
        # What the child and every ancestor have left now, for its `budget.remaining`.
        left = mirror.remaining()
        return {"key": key, "ok": True, "left": {k: left[k] for k in ("tokens", "cost_usd", "steps")}}

    def settle(self, settlements: Any) -> None:
        for item in settlements:
            entry = self.held.pop(str(item["key"]), None)
            if entry is not None:
                _, mirror, r = entry
                mirror.settle(r, int(item["tokens"]), float(item["cost_usd"]))

    def on_closed(self, child_id: str, settlements: Any = ()) -> None:
        """A child ended (any way): apply its last settlements, charge in full what it (or a
        descendant of it) still holds, and refuse its late requests."""
        self.settle(settlements)
        self.closed.add(child_id)
        prefix = child_id + "/"
        for key in [k for k, (owner, _, _) in self.held.items() if owner == child_id or owner.startswith(prefix)]:
            _, mirror, r = self.held.pop(key)
            mirror.charge_reservation(r)
        for gone in [c for c in self.mirrors if c == child_id or c.startswith(prefix)]:
            del self.mirrors[gone]


def _chain(ledger: Ledger | None) -> list[Ledger]:
    chain: list[Ledger] = []
    while ledger is not None:
        chain.append(ledger)
        ledger = ledger.parent
    return chain


class RemoteLedger(Ledger):
    """A child workflow's own ledger. Its own caps are checked here; its ancestors' are the
    root's, asked by `hold()` (the engine awaits it after each step, the model port before
    each call). Settlements are kept until the next request or the child's result."""

    def __init__(self, caps: Budget, *, me: str, root: str, path: list[dict[str, Any]], name: str):
        super().__init__(caps, name=name)
        self.me, self.root, self.path = me, root, path
        self.unsent_steps = 0
        self.unsent: list[tuple[str, Reservation]] = []
        self.keys: dict[int, str] = {}  # id(reservation) -> key, while the root holds it
        self.settlements: list[dict[str, Any]] = []
        self.answers: dict[str, dict[str, Any]] = {}
        self.asked = 0
        self.reserved = 0
        # The root's view at the last answer (`left`) and this ledger's use then (`used_at`).
        self.left: dict[str, Any] | None = None
        self.used_at: tuple[int, float, int] = (0, 0.0, 0)

    def take_step(self) -> None:
        super().take_step()
        self.unsent_steps += 1

    def reserve(self, tokens: int, cost_usd: float, label: str = "") -> Reservation:
        r = super().reserve(tokens, cost_usd, label)
        self.reserved += 1
        self.unsent.append((f"{self.me}#r{self.reserved}", r))
        return r

    def settle(self, r: Reservation, tokens: int, cost_usd: float | None) -> None:
        super().settle(r, tokens, cost_usd)
        key = self.keys.pop(id(r), None)
        if key is not None:  # the root holds it: tell it what the call cost
            pico = r._pico if cost_usd is None else round(cost_usd * 10**12)
            self.settlements.append({"key": key, "tokens": tokens, "cost_usd": pico / 10**12})

    def absorb(self, spent: Mapping[str, Any]) -> None:
        """A finished sub-loop's spending, which the root already counted on this ledger's
        mirror: added here only, so `spent` and the state totals show it as locally."""
        self.tokens_spent += int(spent.get("tokens", 0) or 0)
        self._cost_spent_pico += int(spent.get("cost_picousd", round(float(spent.get("cost_usd", 0.0)) * 10**12)))
        self.steps += int(spent.get("steps", 0) or 0)

    def carry(self) -> dict[str, Any]:
        """What continue-as-new carries (at a state's entry: nothing unsent, nothing held)."""
        return {"settle": list(self.settlements), "asked": self.asked, "reserved": self.reserved,
                "left": self.left, "used_at": list(self.used_at)}

    def resume(self, ledger: Mapping[str, Any], carried: Mapping[str, Any]) -> None:
        """After continue-as-new: the spending the run recorded, and the requests' counters
        (keys stay unique across the run's executions)."""
        spent = Ledger.from_json(self.caps, ledger) if ledger else None
        if spent is not None:
            self.tokens_spent, self._cost_spent_pico, self.steps = spent.tokens_spent, spent._cost_spent_pico, spent.steps
        self.settlements = list(carried.get("settle") or [])
        self.asked, self.reserved = int(carried.get("asked") or 0), int(carried.get("reserved") or 0)
        self.left = carried.get("left")
        used = carried.get("used_at") or (0, 0.0, 0)
        self.used_at = (int(used[0]), float(used[1]), int(used[2]))

    def take_settlements(self) -> list[dict[str, Any]]:
        out, self.settlements = self.settlements, []
        return out

    async def hold(self, calls_model: bool = False) -> None:
        """Asks the root for what was taken here since the last request; BudgetExceeded if refused.
        The step of a state that calls a model rides on the call's reservation (one round
        trip, not two): nothing is done between the two but rendering the prompt."""
        if (not self.unsent_steps and not self.unsent) or (calls_model and not self.unsent):
            return
        self.asked += 1
        key = f"{self.me}#{self.asked}"
        steps, unsent = self.unsent_steps, self.unsent
        self.unsent_steps, self.unsent = 0, []
        req = {"key": key, "from": self.me, "path": self.path, "steps": steps, "settle": self.take_settlements(),
               "reservations": [{"key": k, "tokens": r.tokens, "cost_usd": r.cost_usd, "label": r.label}
                                for k, r in unsent]}
        await workflow.get_external_workflow_handle(self.root).signal(RESERVE_SIGNAL, req)
        await workflow.wait_condition(lambda: key in self.answers)
        answer = self.answers[key]
        if not answer["ok"]:
            self.steps -= steps  # the caller releases its reservation (it was never sent)
            raise BudgetExceeded(str(answer.get("which") or "tokens"), str(answer["message"]))
        for k, r in unsent:
            self.keys[id(r)] = k
        self.left, self.used_at = answer.get("left"), self._used()

    def _used(self) -> tuple[int, float, int]:
        return self.tokens_spent + self.tokens_reserved, self.cost_spent + self.cost_reserved, self.steps

    def remaining(self, elapsed_s: float | None = None) -> dict[str, Any]:
        """Its own caps' remainder, and the ancestors' as the root last said, less what this
        ledger took since (siblings' spending since then shows at the next answer)."""
        out = super().remaining(elapsed_s)
        if self.left is None:
            return out
        used = self._used()
        for i, kind in enumerate(("tokens", "cost_usd", "steps")):
            if self.left.get(kind) is not None:
                now = max(0, self.left[kind] - (used[i] - self.used_at[i]))
                out[kind] = now if out[kind] is None else min(out[kind], now)
        return out

    def on_answer(self, answer: Mapping[str, Any]) -> None:
        self.answers.setdefault(str(answer["key"]), dict(answer))
