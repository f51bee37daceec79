"""A ComfyUI API graph, checked before anything runs: every refusal names the node and the input.

`check(prompt, catalog)` returns the validated graph (`Graph`: each node's class, its literal
values parsed and bounded, its links) or raises `Invalid` carrying ComfyUI's answer shape
(`{"error": {...}, "node_errors": {id: {"errors": [...], "class_type": ...}}}`). Checked: the body's
shape and size, known classes (any other is refused by name), required inputs, link targets and
their output types, values against the node's bounds and choice lists, cycles, and that there is
an output node. `order(graph)` gives the nodes the outputs need, dependencies first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipelines.schema.fields import decimal, whole

from . import nodes as _core  # noqa: F401  (the node classes register in NODES on import)
from . import nodes_more as _more  # noqa: F401
from . import nodes_tooling as _tooling  # noqa: F401
from . import nodes_video as _video  # noqa: F401
from .registry import LINKED, NODES, Catalog, In, NodeType

MAX_NODES = 1000


class Invalid(Exception):
    """The graph is refused: `body` is ComfyUI's 400 answer."""

    def __init__(self, message: str, node_errors: dict[str, Any] | None = None, kind: str = "prompt_outputs_failed_validation"):
        super().__init__(message)
        self.body = {
            "error": {"type": kind, "message": message, "details": "", "extra_info": {}},
            "node_errors": node_errors or {},
        }


@dataclass(frozen=True)
class Node:
    id: str
    type: NodeType
    values: dict[str, Any]  # literal inputs, parsed
    links: dict[str, tuple[str, int]]  # input -> (node id, output index)


@dataclass
class Graph:
    nodes: dict[str, Node]
    raw: dict[str, Any]  # as sent (written into the PNGs as ComfyUI's `prompt`)
    outputs: list[str] = field(default_factory=list)


def check(prompt: Any, catalog: Catalog) -> Graph:
    if not isinstance(prompt, dict) or not prompt:
        raise Invalid("the prompt must be a non-empty object of nodes", kind="invalid_prompt")
    if len(prompt) > MAX_NODES:
        raise Invalid(f"the prompt has {len(prompt)} nodes; at most {MAX_NODES} are accepted", kind="invalid_prompt")
    _classes(prompt)
    outputs = [str(k) for k, raw in prompt.items() if NODES[raw["class_type"]].output_node]
    if not outputs:
        raise Invalid("Prompt has no outputs", kind="prompt_no_outputs")
    errors: dict[str, Any] = {}
    nodes: dict[str, Node] = {}
    for node_id in _reachable(prompt, outputs):  # as ComfyUI: a node no output needs is not checked (nor run)
        raw = prompt[node_id]
        found, problems = _node(node_id, raw, prompt, catalog)
        if problems:
            errors[node_id] = {"errors": problems, "dependent_outputs": [], "class_type": raw["class_type"]}
        else:
            nodes[node_id] = found
    if errors:
        raise Invalid("Prompt outputs failed validation", errors)
    graph = Graph(nodes, prompt, outputs)
    order(graph)  # refuses cycles
    return graph


def _classes(prompt: dict[str, Any]) -> None:
    """Every node an object with a class we serve; else the first unknown one named."""
    for node_id, raw in prompt.items():
        if not isinstance(raw, dict) or not isinstance(raw.get("class_type"), str):
            raise Invalid(f"node {node_id} has no class_type", kind="invalid_prompt")
        kind = NODES.get(raw["class_type"])
        if kind is None or kind.refused:
            why = kind.refused if kind else "not a node class this server runs (see /object_info)"
            message = f"Cannot execute because node {node_id} ({str(raw['class_type'])[:80]}) is refused: {why}"
            errors = {str(node_id): {"errors": [_error("invalid_node", message, "class_type")], "class_type": raw["class_type"]}}
            raise Invalid(message, errors, kind="invalid_prompt")
        if not isinstance(raw.get("inputs", {}), dict):
            raise Invalid(f"node {node_id}'s inputs must be an object", kind="invalid_prompt")


def _reachable(prompt: dict[str, Any], outputs: list[str]) -> list[str]:
    """The node ids the outputs read, directly or through links ([id, index] values naming a node)."""
    seen: list[str] = []
    stack = list(outputs)
    while stack:
        node_id = stack.pop()
        if node_id in seen:
            continue
        seen.append(node_id)
        for value in (prompt[node_id].get("inputs") or {}).values():
            if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str | int) and str(value[0]) in prompt:
                stack.append(str(value[0]))
    return seen


def _error(kind: str, message: str, name: str, value: Any = None) -> dict[str, Any]:
    extra = {"input_name": name} | ({"received_value": value} if value is not None else {})
    return {"type": kind, "message": message, "details": f"{name}: {message}", "extra_info": extra}


def _node(node_id: str, raw: dict[str, Any], prompt: dict[str, Any], catalog: Catalog) -> tuple[Node | None, list]:
    kind = NODES[raw["class_type"]]
    given = raw.get("inputs") or {}
    values: dict[str, Any] = {}
    links: dict[str, tuple[str, int]] = {}
    problems: list[dict[str, Any]] = []
    for name, declared in kind.inputs.items():
        if name not in given:  # required, as in ComfyUI: a default is what a client shows, not what it may leave out
            if declared.optional:
                values[name] = declared.default
            else:
                problems.append(_error("required_input_missing", "Required input is missing", name))
            continue
        value = given[name]
        if isinstance(value, list):
            problem = _link(name, value, declared, prompt)
            if problem:
                problems.append(problem)
            else:
                links[name] = (str(value[0]), value[1])
        elif declared.linked:
            problems.append(_error("required_input_missing", f"needs a link to a {declared.type} output", name))
        else:
            try:
                values[name] = parse(declared, value, catalog)
            except (ValueError, OverflowError) as exc:
                problems.append(_error("value_not_valid", str(exc), name, _short(value)))
    if not problems and kind.check is not None:
        seen = values | dict.fromkeys(links, LINKED)  # a check may ask whether an input is linked (a start image)
        problems = [_error("value_not_valid", message, name, values.get(name)) for name, message in kind.check(catalog, seen)]
    return Node(node_id, kind, values, links), problems


def _link(name: str, value: list, declared: In, prompt: dict[str, Any]) -> dict[str, Any] | None:
    if len(value) != 2 or not isinstance(value[1], int) or isinstance(value[1], bool):
        return _error("bad_linked_input", "a link is [node id, output index]", name)
    source = prompt.get(str(value[0]))
    if source is None:
        return _error("bad_linked_input", f"links to node {str(value[0])[:40]}, which is not in the prompt", name)
    outputs = NODES[source["class_type"]].outputs
    if not 0 <= value[1] < len(outputs):
        return _error("bad_linked_input", f"node {value[0]} has no output {value[1]}", name)
    if not declared.linked or outputs[value[1]] != declared.type:
        wanted = declared.type if declared.linked else f"a {declared.type} value"
        message = f"Return type mismatch between linked nodes: needs {wanted}, node {value[0]} gives {outputs[value[1]]}"
        return _error("return_type_mismatch", message, name)
    return None


def parse(declared: In, value: Any, catalog: Catalog) -> Any:
    """A literal input by its declaration; ValueError saying what is wrong."""
    if declared.type == "COMBO":
        choices = declared.choices(catalog) if declared.choices else ()
        if not isinstance(value, str) or value not in choices:
            listed = ", ".join(choices[:20]) or "nothing on this server"
            raise ValueError(f"Value not in list: {_short(value)} is not one of: {listed}")
        return value
    if declared.type == "STRING":
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ValueError("must be a string")
        if len(str(value)) > declared.max_chars:
            raise ValueError(f"longer than {declared.max_chars} characters")
        return str(value)
    if declared.type == "BOOLEAN":
        if not isinstance(value, bool):
            raise ValueError("must be true or false")
        return value
    number = whole(value) if declared.type == "INT" else decimal(value)
    if declared.low is not None and number < declared.low:
        raise ValueError(f"Value {number} smaller than min of {declared.low:g}")
    if declared.high is not None and number > declared.high:
        raise ValueError(f"Value {number} bigger than max of {declared.high:g}")
    return number


def _short(value: Any) -> Any:
    text = str(value)
    return value if len(text) <= 80 else text[:80] + "…"


def order(graph: Graph) -> list[str]:
    """The nodes the outputs need, each after what it reads (Kahn's order); Invalid on a cycle."""
    needed: set[str] = set()
    stack = list(graph.outputs)
    while stack:
        node_id = stack.pop()
        if node_id not in needed:
            needed.add(node_id)
            stack.extend(source for source, _ in graph.nodes[node_id].links.values())
    waiting = {n: {s for s, _ in graph.nodes[n].links.values()} for n in needed}
    done: list[str] = []
    ready = sorted((n for n, deps in waiting.items() if not deps), key=_key)
    while ready:
        current = ready.pop(0)
        done.append(current)
        for n, deps in waiting.items():
            if current in deps:
                deps.discard(current)
                if not deps:
                    ready.append(n)
    if len(done) < len(needed):
        stuck = sorted(set(needed) - set(done), key=_key)
        errors = {n: {"errors": [_error("dependency_cycle", "the node depends on itself through its links", "links")],
                      "class_type": graph.nodes[n].type.name} for n in stuck}  # fmt: skip
        raise Invalid(f"Prompt has a dependency cycle through nodes {', '.join(stuck[:10])}", errors)
    return done


def _key(node_id: str) -> tuple[int, str]:
    return (int(node_id), "") if node_id.isascii() and node_id.isdigit() else (1 << 62, node_id)
