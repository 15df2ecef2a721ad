"""A config's inputs before validation: the YAML file, dotted `key=value` overrides and the
command-line options merged into one dict (`gather`), and pydantic's errors as one
`config error: KEY: ...` line per key (`format_error`). `agentrl.config` validates the dict
against its schema (`agentrl.config.load_config`).

Like `agentrl.config`, this module imports no torch and no runtime module of agentrl.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from agentrl.algos.configs import ALGO_CONFIGS, refused_algo_key, saved_algo_keys
from agentrl.yaml_safe import load_yaml


class ConfigError(ValueError):
    """A configuration error with the offending key and what is allowed."""


def _set_dotted(d: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    cur = d
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
        if not isinstance(cur, dict):
            raise ConfigError(f"{key}: {p!r} is not a section")
    cur[parts[-1]] = value


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def format_error(e: ValidationError, root: type[BaseModel], prefix: tuple[str, ...] = ()) -> str:
    """One `config error: KEY: what is wrong` line per error of `e` (`root`: the config's
    schema, whose sections name the keys allowed where a key is unknown; `prefix`: the location
    of the validated value in the config, e.g. `("algo",)`)."""
    lines = []
    for err in e.errors():
        loc = prefix + tuple(str(p) for p in err["loc"])
        tag = loc[1] if loc[:1] == ("algo",) and len(loc) > 1 and loc[1] in ALGO_CONFIGS else None
        if tag is not None:  # the union's member: `algo.<tag>.<key>` is the user's `algo.<key>`
            loc = loc[:1] + loc[2:]
        key = ".".join(loc)
        msg = err["msg"]
        if err["type"] == "extra_forbidden" and tag is not None:
            lines.append(f"config error: {refused_algo_key(loc[-1], err.get('input'), tag)}")
            continue
        if err["type"] == "extra_forbidden":
            section: Any = root
            for p in loc[:-1]:
                ann = section.model_fields.get(str(p))
                section = ann.annotation if ann is not None else section
            allowed = ", ".join(getattr(section, "model_fields", {}))
            msg = f"unknown key; allowed here: {allowed}"
        elif err["type"] == "union_tag_invalid":
            key = ".".join(loc + ("name",))
            msg = f"unknown algorithm {err['ctx']['tag']!r}; allowed: {', '.join(ALGO_CONFIGS)}"
        elif err["type"] == "literal_error":
            msg = f"{msg} (got {err.get('input')!r})"
        elif err["type"] == "value_error":  # a validator's own message, without pydantic's
            msg = str(err.get("ctx", {}).get("error", msg))  # "Value error, " before it
            if key and msg.startswith(key + "."):  # it names its keys itself: no section
                key = ""
        lines.append(f"config error: {key}: {msg}" if key else f"config error: {msg}")
    return "\n".join(lines)


def gather(yaml_path: str | Path | None, overrides: list[str] | None, top: dict[str, Any],
           flag_names: dict[str, str] | None = None) -> dict[str, Any]:
    """The config's inputs as one dict, not yet validated: the YAML file (a run's saved `.json`
    config too, its `algo` keys of other algorithms dropped), then the `key=value` overrides
    (values parsed as YAML scalars), then the command-line options `top` (dotted keys, None: not
    given). `agentrl.config.load_config` documents the order and validates the result.

    Raises:
        ConfigError: a missing or malformed file, a malformed override, or an option and an
            override that set the same key to different values (`flag_names` spells the options).
    """
    data: dict[str, Any] = {}
    if yaml_path:
        p = Path(yaml_path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}" if not p.exists()
                              else f"config file {p} is not a file")
        try:
            loaded = load_yaml(p.read_text()) or {}
        except ValueError as e:  # an alias bomb (agentrl.yaml_safe)
            raise ConfigError(f"{p}: {e}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: invalid YAML ({' '.join(str(e).split())})") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of sections")
        if p.suffix == ".json":  # a run's saved config.json (e.g. `agentrl eval -c RUN/config.json`)
            name = top.get("algo.name") or next((o.partition("=")[2].strip() for o in overrides or []
                                                 if o.partition("=")[0].strip() == "algo.name"), None)
            loaded = saved_algo_keys(loaded, {"algo": {"name": name}} if name else {})
        data = _merge(data, loaded)
    given: dict[str, tuple[Any, str]] = {}  # override key -> (parsed value, as written)
    for ov in overrides or []:
        if "=" not in ov:
            raise ConfigError(f"override {ov!r} must be key=value (e.g. train.lr=1e-4)")
        k, _, v = ov.partition("=")
        try:
            # `None` (Python's spelling, as docs/config.md and our error hints write it) is null
            value = load_yaml(v) if v not in ("", "None") else None
        except ValueError as e:
            raise ConfigError(f"override {k.strip()}: {e}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"override {k.strip()}: invalid value {v!r} "
                              f"({' '.join(str(e).split())})") from None
        _set_dotted(data, k.strip(), value)
        given[k.strip()] = (value, v)
    for k, v in top.items():
        if v is None:
            continue
        if k in given and given[k][0] != v:
            flag = (flag_names or {}).get(k, f"the option for {k}")
            shown = flag if v is True else f"{flag} {v}"
            raise ConfigError(f"config error: {k} is set twice, to different values: by {shown} and by the "
                              f"override {k}={given[k][1]}; give one of them")
        _set_dotted(data, k, v)
    return data
