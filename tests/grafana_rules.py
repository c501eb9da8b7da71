"""Evaluate a Grafana-managed alert rule the way Grafana does, against a real Prometheus.

    for each evaluation time t (the rule group's interval apart):
        every Prometheus query of the rule  ──▶ an instant query at t minus the end of its relative time range:
                                                one number per series (labels ──▶ value), a scalar has no labels
        no query returned a series          ──▶ NoData, mapped by the rule's `noDataState`
        a query failed                      ──▶ Error, mapped by the rule's `execErrState`
        the server-side expressions in order ──▶ reduce | threshold | math | classic_conditions
        the condition's value per series    ──▶ 0: Normal, anything else (NaN too): Alerting
    the state machine                       ──▶ Alerting, or Pending until it has held for the rule's `for`

The semantics follow Grafana 11's server-side expressions:
  reduce           last, mean, max, min, sum, count over a time series. mode "" (strict): a NaN or missing
                   value makes the result NaN; "dropNN": drop NaN, ±Inf and missing values (no value left: NaN,
                   count 0); "replaceNN": replace them with `replaceWithValue`. A number (an instant query's
                   result) passes through unchanged.
  threshold        gt, lt (one parameter), within_range, outside_range (two, exclusive bounds): 1 or 0 per
                   series; NaN passes none of them.
  math             `$A <op> number` and `number <op> $A` for >, <, >=, <=, ==, !=: 1 or 0 per series.
  classic          every condition reduces its query to one number per series, applies its evaluator, and
                   the conditions combine left to right with `and`/`or`; its result is one number, no labels.

Only instant queries are run (the rules here use nothing else); a series missing from a later evaluation is
resolved at once (Grafana waits two intervals). This is a test helper: it raises on anything it does not know.
"""

from __future__ import annotations

import json
import math
import operator
import re
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Labels = tuple[tuple[str, str], ...]
Values = dict[Labels, float]

OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    "<": operator.lt,
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}


class NoData(Exception):
    """No Prometheus query of the rule returned a series."""


def duration_seconds(text: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([smhd])", text))


def instant_query(prometheus: str, expr: str, at: float) -> Values:
    """An instant query at `at`: labels (without __name__) ──▶ value; a scalar answers one unlabelled value."""
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
    with urllib.request.urlopen(url, timeout=10) as response:
        answer = json.loads(response.read())
    assert answer["status"] == "success", (expr, answer)
    data = answer["data"]
    if data["resultType"] == "scalar":
        return {(): float(data["result"][1])}
    assert data["resultType"] == "vector", f"{expr}: an instant query answered {data['resultType']}"
    return {
        tuple(sorted((k, v) for k, v in r["metric"].items() if k != "__name__")): float(r["value"][1])
        for r in data["result"]
    }


def reduce(values: Sequence[float | None], reducer: str, mode: str = "", replacement: float = 0.0) -> float:
    """Grafana's reduce of one time series."""
    if mode == "dropNN":
        kept = [v for v in values if v is not None and math.isfinite(v)]
    elif mode == "replaceNN":
        kept = [v if v is not None and math.isfinite(v) else replacement for v in values]
    else:
        if any(v is None or math.isnan(v) for v in values):
            return math.nan
        kept = [v for v in values if v is not None]
    if reducer == "count":
        return float(len(kept))
    if not kept:
        return math.nan
    functions: dict[str, Callable[[list[float]], float]] = {
        "last": lambda xs: xs[-1],
        "mean": lambda xs: sum(xs) / len(xs),
        "max": max,
        "min": min,
        "sum": sum,
    }
    return float(functions[reducer](kept))


def threshold(value: float, kind: str, params: Sequence[float]) -> bool:
    """Grafana's threshold evaluator; NaN passes none."""
    if math.isnan(value):
        return False
    if kind == "gt":
        return value > params[0]
    if kind == "lt":
        return value < params[0]
    low, high = params[0], params[1]
    if kind == "within_range":
        return low < value < high
    if kind == "outside_range":
        return value < low or value > high
    raise ValueError(f"unknown threshold {kind!r}")


def math_expression(expression: str, results: dict[str, Values]) -> Values:
    """`$A > 0` or `0 < $A`: 1 or 0 for each series of A."""
    number = r"(-?[0-9.]+(?:e-?[0-9]+)?)"
    ops = "|".join(re.escape(op) for op in sorted(OPS, key=len, reverse=True))
    left = re.fullmatch(rf"\s*\$\{{?(\w+)\}}?\s*({ops})\s*{number}\s*", expression)
    right = re.fullmatch(rf"\s*{number}\s*({ops})\s*\$\{{?(\w+)\}}?\s*", expression)
    if left:
        ref, op, const = left.group(1), left.group(2), float(left.group(3))
        return {k: float(OPS[op](v, const)) for k, v in results[ref].items()}
    if right:
        const, op, ref = float(right.group(1)), right.group(2), right.group(3)
        return {k: float(OPS[op](const, v)) for k, v in results[ref].items()}
    raise ValueError(f"math expression {expression!r} is beyond this helper")


def expression(model: dict[str, Any], results: dict[str, Values]) -> Values:
    kind = model["type"]
    if kind == "reduce":
        # an instant query answers numbers, not time series: Grafana's reduce passes a number through unchanged
        # (`reduce` above is what it does to a time series)
        return dict(results[model["expression"]])
    if kind == "threshold":
        evaluator = model["conditions"][0]["evaluator"]
        return {
            k: float(threshold(v, evaluator["type"], evaluator["params"]))
            for k, v in results[model["expression"]].items()
        }
    if kind == "math":
        return math_expression(model["expression"], results)
    if kind == "classic_conditions":
        verdict: bool | None = None
        for condition in model["conditions"]:
            series = results[condition["query"]["params"][0]].values()
            evaluator = condition["evaluator"]
            met = any(
                threshold(reduce([v], condition["reducer"]["type"]), evaluator["type"], evaluator["params"])
                for v in series
            )
            joiner = condition.get("operator", {}).get("type", "and")
            verdict = met if verdict is None else (verdict and met if joiner == "and" else verdict or met)
        return {(): float(bool(verdict))}
    raise ValueError(f"expression type {kind!r} is beyond this helper")


def evaluate_once(rule: dict[str, Any], prometheus: str, at: float) -> Values:
    """The condition's value per series at `at`; raises NoData when no query returned a series."""
    results: dict[str, Values] = {}
    for query in rule["data"]:
        if query["datasourceUid"] == "__expr__":
            results[query["refId"]] = expression(query["model"], results)
        else:
            assert query["model"].get("instant"), f"{rule['title']}: only instant queries are evaluated here"
            end = query["relativeTimeRange"]["to"]
            results[query["refId"]] = instant_query(prometheus, query["model"]["expr"], at - end)
    queried = [q["refId"] for q in rule["data"] if q["datasourceUid"] != "__expr__"]
    if not any(results[ref] for ref in queried):
        raise NoData
    return results[rule["condition"]]


@dataclass
class Instance:
    state: str = "Normal"
    since: float = 0.0


def evaluate(rule: dict[str, Any], prometheus: str, times: Sequence[float]) -> dict[Labels, str]:
    """The state of every alert instance after evaluating the rule at each of `times` in turn."""
    hold = duration_seconds(rule.get("for", "0s"))
    instances: dict[Labels, Instance] = {}
    for at in times:
        try:
            verdicts = {k: "Alerting" if v != 0 else "Normal" for k, v in evaluate_once(rule, prometheus, at).items()}
        except NoData:
            verdicts = {(("alertstate", "NoData"),): _mapped(rule["noDataState"])}
        seen = set(verdicts)
        for labels, verdict in verdicts.items():
            instance = instances.setdefault(labels, Instance())
            if verdict == "Alerting":
                if instance.state == "Normal":
                    instance.state, instance.since = "Pending", at
                if instance.state == "Pending" and at - instance.since >= hold:
                    instance.state = "Alerting"
            else:
                instance.state, instance.since = verdict, at
        for labels in set(instances) - seen:
            instances[labels] = Instance("Normal", at)
    return {labels: i.state for labels, i in instances.items()}


def _mapped(no_data_state: str) -> str:
    return {"OK": "Normal", "Alerting": "Alerting", "NoData": "NoData"}[no_data_state]


def verdict(states: dict[Labels, str]) -> str:
    """One word for the rule: Alerting if any instance alerts, else Pending, NoData, or Normal."""
    for state in ("Alerting", "Pending", "NoData"):
        if state in states.values():
            return state
    return "Normal"
