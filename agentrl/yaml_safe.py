"""YAML that cannot blow up: aliases are counted at each use before anything is built."""

from __future__ import annotations

from typing import Any

import yaml

MAX_YAML_NODES = 100_000
"""The most nodes a YAML config file or override may expand to, its aliases counted at each use
(a "billion laughs" of 9 levels of 10 aliases, under 600 bytes, expands to over 10^9)."""


def _expanded_nodes(node: yaml.Node, memo: dict[int, int]) -> int:
    """How many nodes `node` stands for with every alias expanded (memoised per node: aliases
    share their node, so this is linear in the document)."""
    if id(node) in memo:
        return memo[id(node)]
    n = 1
    if isinstance(node, yaml.MappingNode):
        n += sum(_expanded_nodes(k, memo) + _expanded_nodes(v, memo) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        n += sum(_expanded_nodes(v, memo) for v in node.value)
    memo[id(node)] = n
    return n


def load_yaml(text: str) -> Any:
    """`yaml.safe_load(text)`, refusing a document whose aliases expand past `MAX_YAML_NODES`
    nodes (checked on the composed graph, before anything is built) or that nests too deep.

    Raises:
        ValueError: the refusal (the expanded size, or the nesting).
        yaml.YAMLError: invalid YAML.
    """
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_nodes(node, {})
        if size > MAX_YAML_NODES:
            raise ValueError(f"the YAML expands to {size:,} nodes through its aliases (at most "
                             f"{MAX_YAML_NODES:,}); refused (an alias bomb?)")
        return loader.construct_document(node)
    except RecursionError:
        raise ValueError("the YAML nests too deep") from None
    finally:
        loader.dispose()
